//! The relay's operator-facing texts in one place: the halts walpost stops with, the
//! refusals that explain what to fix, and the warnings an operator acts on (`walpost
//! check`'s findings, the slot alarm's reasons). The runbooks quote them verbatim, and
//! `crates/walpost/tests/runbooks.rs` holds each quote to the text here, so change a text
//! and its runbook together.
//!
//! Why a crate: every layer of the relay emits such texts (`postgres`, `kafka`,
//! `snapshot`, `monitor`, `ops`), and siblings of one layer may not use each other; below
//! them all, Cargo keeps this crate free of the relay's types. So a text takes plain
//! values (names, numbers, an error's text) and never a row, a payload or a secret: what
//! it says is what walpost knows about the servers and its own settings.
//!
//! `walpost inbox`'s texts are the inbox crate's (`inbox::messages`).

pub mod admin;
pub mod alarm;
pub mod check;
pub mod exactly_once;
pub mod failover;
pub mod kafka;
pub mod outbox;
pub mod replay;
pub mod runbook;
pub mod slot;
pub mod standby;
