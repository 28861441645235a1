//! What the tests of `claims-payments` and `claims-payments-dev` share, so each exists
//! once. Never shipped: only tests and the dev crate depend on it.
//!
//! - [`bank`]: the one fake bank (scripted and seeded faults, ledger, control API),
//!   used by the tests, the simulator, the benchmark and `sandbox-bank`;
//! - [`chance`]: deterministic fault decisions from a seed;
//! - [`conformance`]: the store conformance suite, the same scenarios for every store
//!   adapter, instantiated by a store's test file with [`store_conformance!`];
//! - [`fixtures`]: messages, deliveries, policies and consumers;
//! - [`host`]: the invocation envelope the Functions host sends, built once;
//! - [`ingestion`]: a local Application Insights ingestion endpoint;
//! - [`otlp`]: a local OTLP/HTTP (protobuf) receiver;
//! - [`process`]: the one way to start `<exe> serve` and the `cosmos-emulator` binary
//!   (readiness, kill, stop, exit status, logs), for the tests, the simulator and the
//!   benchmark;
//! - [`pgbouncer`]: a real PgBouncer pooling by transaction in front of that server;
//! - [`postgres`]: a real PostgreSQL server (a throwaway one, or `PAYMENTS_TEST_POSTGRES_URL`)
//!   and a database per test;
//! - [`records`]: store records as the consumer writes them, and their later states;
//! - [`service`]: the real binary as a blocking child process, host envelopes, store
//!   backends;
//! - [`servicebus`]: a local Service Bus stand-in (REST subset: send with duplicate
//!   detection, dead-letter peek-lock, unlock, delete; faults);
//! - [`sync_gate`]: a SQLite sync hook that holds or fails WAL syncs;
//! - [`wait`]: bounded waits for a condition, instead of sleeps.

pub mod bank;
pub mod chance;
pub mod conformance;
pub mod corrupt_rows;
pub mod fixtures;
pub mod host;
pub mod ingestion;
pub mod otlp;
pub mod pgbouncer;
pub mod postgres;
pub mod process;
pub mod records;
pub mod service;
pub mod servicebus;
pub mod sync_gate;
pub mod wait;
