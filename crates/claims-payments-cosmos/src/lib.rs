//! The Cosmos DB adapter of the store port (production).
//!
//! One container, partitioned by `/claimId`, holds two document types per claim: the
//! expiring inbox document ("this message was handled") and the permanent payment
//! document. The guard is one transactional batch that creates both in the claim's
//! partition, under a unique key policy on `(/docType, /dedupKey)`, so neither a
//! second delivery nor a second message for the same claim can create a second payment.
//!
//! - [`documents`]: document shapes, deterministic ids, timestamp format;
//! - [`container`]: the container definition (the one place it is written in code),
//!   provisioning and verification of an existing container;
//! - [`settings`]: `COSMOS_*` settings, key or Entra ID auth, client construction;
//! - [`adapter`]: [`CosmosStore`], the [`Store`](claims_payments_engine::store::Store) implementation.
//!
//! The SDK's in-process emulator, for tests and local runs, is served by
//! `claims-payments-dev` (its `cosmos-emulator` binary; the testkit starts it).
//!
//! A crate of its own, on the engine's store port, the settings vocabulary and the SDK
//! alone: Cargo keeps the product out of it, and editing the product never rebuilds it.

pub mod adapter;
pub mod container;
pub mod documents;
mod errors;
pub mod settings;

pub use adapter::CosmosStore;
pub use container::provision;
pub use container::{
    container_definition, container_definition_json, provision_with_client, ProvisionReport,
};
pub use settings::{CosmosAuth, CosmosSettings};
