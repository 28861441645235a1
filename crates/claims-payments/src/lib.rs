//! claims-payments: pays each approved insurance claim exactly once, although the
//! broker that asks for the payment delivers at least once.
//!
//! The crate is a facade: every module is private. The root exports the message contract
//! and what `main.rs` runs; [`seams`] is the development crate's only way in.
//!
//! Layout, from the wire inwards:
//! - [`startup`]: the composition root: `Application::build` (settings -> store -> services
//!   -> state -> router -> listener) and `run_until_stopped` (the process's lifecycle), and
//!   `Composition`, the same wiring without a socket (the simulator, `reconcile`);
//! - [`functions`]: the wire edge: the router, one module per function of the app
//!   (`ClaimApproved`, `Payments`, `Reconcile`, `Purge`, mirroring `function-app/`), the
//!   custom-handler protocol (invocation envelope in, JSON answer out) and the body limits;
//! - [`payments_api`]: `POST /api/payments` with an Idempotency-Key, on the same engine;
//! - [`store`]: the engine's store port and its adapters (SQLite embedded, Cosmos DB,
//!   PostgreSQL: each a crate of its own, `claims_payments_{sqlite,cosmos,postgres}`, named
//!   here as `store::{sqlite, cosmos, postgres}`), and the traced decorator;
//! - [`bank`]: the engine's payout client on the HTTPS transport, and its settings;
//! - [`dead_letters`]: the operator's dead-letter tool (list, resubmit, discard), on
//!   [`servicebus`], the queue's REST client;
//! - [`env_setting`]: setting names and the one settings error, below every reader, and
//!   [`entra`]: which Microsoft Entra identity a part uses (one rule) and its credential,
//!   built once per process and shared by the stores, telemetry and the dead-letter tool
//!   (both the crate `claims_payments_settings`, which the store adapters share);
//! - [`configuration`]: settings from the environment, read once for `serve` and the
//!   operator commands, composed from each module's parser;
//! - [`hooks`]: where a development build changes the composition's parts (a store
//!   decorator, another handler, another router);
//! - [`seams`]: the development crate's only way in: the hooks it sets (production
//!   sets none) and the lists of what it may name;
//! - [`telemetry`]: logs, counters, OpenTelemetry traces and metrics;
//! - [`cli`]: the operator commands (`ledger`, `inbox`, `provision`, `purge`, `reconcile`).
//!
//! The guarantee itself (the `ClaimApproved` contract, the wall clock and randomness,
//! the store port, leases, the consumer, reconciliation, the bank client and the
//! services one process shares) is the engine crate, `claims_payments_engine`, which
//! Cargo keeps free of the web framework, the drivers, the HTTP client and the Azure SDK;
//! its modules are named here at their old paths (`crate::domain`, `crate::consumer`, ...).
//!
//! Each module imports only from the layers below it (`tests/product/architecture.rs` holds the
//! layers and fails on an import that goes up). The simulator, the benchmark and the
//! baselines are in `crates/claims-payments-dev`.

// These docs are for the people who work on the service, read with
// `cargo doc --document-private-items`: they link to private items freely.
#![allow(rustdoc::private_intra_doc_links)]

// The engine's modules, at the paths the product's own modules name them by.
use claims_payments_engine::{ambient, consumer, domain, lease, reconcile, services};
// The settings vocabulary and the Entra identity rule, a crate below the store adapters
// and the product, at the paths the product's modules name them by.
use claims_payments_settings::{self as env_setting, entra};

mod bank;
mod cli;
mod configuration;
mod dead_letters;
mod functions;
mod hooks;
mod payments_api;
pub mod seams;
mod servicebus;
mod startup;
mod store;
mod telemetry;

// The message contract and the domain types it is parsed into.
pub use domain::redrive;
pub use domain::{
    ClaimApproved, ClaimId, Currency, IdempotencyKey, InvalidMessage, MessageId, Money,
    OutcomeKind, PayeeRef, PayloadHash, Purpose, TenantId,
};
// Running the service, as `main.rs` does: its settings (which start telemetry), the
// server and the operator commands.
pub use cli::{run as run_operator_command, OperatorCommand};
pub use configuration::Settings;
pub use startup::serve;
pub use telemetry::{quiet_library_backtraces, LogFormat};
