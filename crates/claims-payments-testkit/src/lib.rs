//! What the tests of `claims-payments` and `claims-payments-dev` share, so each exists
//! once. Never shipped: only tests and the dev crate depend on it.
//!
//! - [`fake_bank`]: a scriptable fake bank, messages, deliveries and consumers;
//! - [`host`]: the invocation envelope the Functions host sends, built once;
//! - [`service`]: the real binary as a child process, host envelopes, store backends;
//! - [`sync_gate`]: a SQLite sync hook that holds or fails WAL syncs.

pub mod fake_bank;
pub mod host;
pub mod service;
pub mod sync_gate;
