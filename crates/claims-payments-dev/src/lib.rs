//! Developer tools for claims-payments. Never packaged: `scripts/package.sh` builds the
//! product crate alone.
//!
//! - [`dev_serve`]: `claims-payments-dev serve`, the product's composition root with the
//!   seams below plugged in from `PAYMENTS_DEV_*` / `PAYMENTS_FAULT_*`;
//! - [`baselines`]: the naive check-then-insert consumer and the do-nothing handler, to
//!   show what the guard buys and what the machine can do;
//! - [`emulator`]: the SDK's in-process Cosmos DB emulator, in-process or served over
//!   HTTP (the `cosmos-emulator` binary, the Cosmos tests, simulate and bench on Cosmos);
//! - [`faults`]: a slow store and a crash after commit, as a store decorator and a
//!   handler decorator;
//! - [`memory_store`]: an in-memory store with the SQLite adapter's semantics, for a
//!   deterministic simulator;
//! - [`sim`]: `simulate`, at-least-once delivery with faults against real `serve`
//!   processes, and the verdict;
//! - [`dst`]: `dst`, the deterministic simulation of the real service: one thread,
//!   virtual time, faults at every edge, replayable from a seed;
//! - [`bench`]: `bench`, throughput, latency, CPU, round trips and request units.

pub mod baselines;
pub mod bench;
pub mod dev_serve;
pub mod dst;
pub mod emulator;
pub mod faults;
pub mod memory_store;
pub mod sim;
