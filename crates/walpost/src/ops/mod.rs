//! Operator commands: `walpost check` ([`check`], its failover part [`failover`]), `walpost slot status|create|drop`
//! ([`slot`]) and `walpost import-debezium` ([`import_debezium`]).

pub mod check;
pub mod failover;
pub mod import_debezium;
pub mod slot;
