//! The store: the engine's port ([`claims_payments_engine::store`]: the trait, its
//! records and errors, the decorator) and its adapters, each a crate of its own:
//! [`sqlite`] (the embedded default), [`cosmos`] (production) and [`postgres`] (several
//! instances on one PostgreSQL database), named here at the paths the product's modules
//! use. All pass the same conformance suite (the testkit's `conformance` module, run by
//! `tests/product/sqlite_conformance.rs`, `tests/product/postgres_conformance.rs` and the
//! dev crate's `cosmos_conformance.rs`). Which one a process opens is the composition
//! root's choice (`startup::open_store`); [`traced`] records each call as a dependency.

pub use claims_payments_engine::store::*;

pub use claims_payments_cosmos as cosmos;
pub use claims_payments_postgres as postgres;
pub use claims_payments_sqlite as sqlite;
pub(crate) mod traced;
