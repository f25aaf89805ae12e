//! Operator commands: `walpost check` ([`check`], its failover part [`failover`]), `walpost slot status|create|drop`
//! ([`slot`]), `walpost replay` ([`replay`]) and `walpost import-debezium` ([`import_debezium`]).

pub mod check;
pub mod failover;
pub mod import_debezium;
pub mod replay;
pub mod slot;
