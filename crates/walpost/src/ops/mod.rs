//! Operator commands: `walpost check` ([`check`], its failover part [`failover`], decoding
//! on a standby [`check_standby`], managed services [`check_managed`]; `walpost check inbox` is the `inbox` crate's), `walpost slot status|create|drop`
//! ([`slot`]), `walpost replay` ([`replay`]), `walpost contracts check|push` ([`contracts`]) and
//! `walpost import-debezium` ([`import_debezium`]), and `walpost ctl` ([`ctl`]), the admin
//! API from a terminal.

pub mod check;
pub(crate) mod check_managed;
pub(crate) mod check_standby;
pub mod contracts;
pub(crate) mod ctl;
pub(crate) mod failover;
pub(crate) mod import_debezium;
pub(crate) mod migrate;
pub(crate) mod replay;
pub(crate) mod slot;
