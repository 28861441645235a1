//! The only way in for development, above every other module: the hooks a development
//! build sets ([`Seams`], given to the composition root, `startup::Application::build`
//! and `startup::Composition::new`; production passes the default), crashes between the
//! consumer's steps ([`CrashHook`]), and [`surface`]'s lists of what the development crate,
//! the test kit and the tests may name. The settings vocabulary and the store adapters are
//! crates of their own, named directly (a SQLite sync that is held or fails is
//! `claims_payments_sqlite::SyncHook`).
//! The simulator wires its processes through the composition root itself
//! (`startup::Composition`).

mod surface;
pub use surface::{
    ambient, bank, cli, configuration, consumer, dead_letters, functions, payments_api, reconcile,
    servicebus, services, startup, store, telemetry,
};

pub use crate::consumer::crash::{CrashHook, Step};
pub use crate::hooks::{HandlerFactory, RouterFactory, Seams, StoreLayer};
pub use crate::lease::liveness::{end_registration_of, Registered};
