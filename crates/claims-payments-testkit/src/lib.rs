//! What the tests of `claims-payments` and `claims-payments-dev` share, so each exists
//! once: the SDK's in-process Cosmos DB emulator ([`emulator`]), a fake bank and the
//! consumer and record builders ([`fake_bank`]), the real binary as a child process with
//! host envelopes ([`service`]), a steerable SQLite sync hook ([`sync_gate`]). Never shipped: only tests and the dev
//! crate depend on it.

pub mod emulator;
pub mod fake_bank;
pub mod service;
pub mod sync_gate;
