//! The product crate's integration tests, in one binary (one link instead of twelve, and
//! the files' tests run side by side rather than binary after binary: most of them wait on
//! processes, fsyncs and PostgreSQL servers, not on the CPU).

mod architecture;
mod consumer_guarantees;
mod dead_letters;
mod e2e;
mod liveness_processes;
mod postgres_conformance;
mod postgres_e2e;
mod postgres_pgbouncer;
mod postgres_records;
mod postgres_store;
mod sqlite_conformance;
mod telemetry;
