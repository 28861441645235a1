//! The store: the engine's port ([`claims_payments_engine::store`]: the trait, its
//! records and errors, the decorator) and its adapters: [`sqlite`] (the embedded
//! default), [`cosmos`] (production) and [`postgres`] (several instances on one
//! PostgreSQL database). All pass the same conformance suite (the testkit's
//! `conformance` module, run by `tests/product/sqlite_conformance.rs`,
//! `tests/product/postgres_conformance.rs` and the dev crate's `cosmos_conformance.rs`).

pub use claims_payments_engine::store::*;

pub mod cosmos;
pub mod postgres;
pub mod sqlite;
pub(crate) mod traced;
