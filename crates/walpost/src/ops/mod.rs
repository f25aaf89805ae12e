//! Operator commands: `walpost check` ([`check`]), `walpost slot status|create|drop`
//! ([`slot`]) and `walpost import-debezium` ([`import_debezium`]).

pub mod check;
pub mod import_debezium;
pub mod slot;
