//! The dev crate's integration tests, in one binary (one link instead of ten): the
//! simulator, the Cosmos DB adapter on the SDK's emulator, the dev `serve` and its
//! baselines and faults.

mod chaos;
mod cosmos_conformance;
mod cosmos_consumer;
mod cosmos_emulator;
mod cosmos_store;
mod dev_serve;
mod dst;
mod memory_conformance;
mod naive;
mod sim_bank;
mod sim_host;
mod sim_instances;
mod sim_postgres;
