//! Every hook a development build uses, in one place: a store decorator, another handler
//! behind `POST /ClaimApproved` or another router ([`Seams`], given to
//! `startup::serve`), crashes between the consumer's steps ([`CrashHook`]), a SQLite
//! sync that is held or fails ([`SyncHook`]), and the application state on services
//! the simulator built ([`app_state`], [`router`]). Production sets none of them.

mod surface;
pub use surface::{
    ambient, bank, cli, configuration, consumer, dead_letters, env_setting, functions,
    payments_api, reconcile, servicebus, services, startup, store, telemetry,
};

use std::sync::Arc;

use axum::Router;

pub use crate::consumer::crash::{CrashHook, Step};
pub use crate::lease::liveness::{end_registration_of, Registered};

/// The state the product serves on `services`, with the HTTP API's caller
/// authentication set as `HTTP_AUTH` sets it and every other setting at its default.
pub fn app_state(services: &Services, auth: crate::payments_api::CallerAuth) -> AppState {
    AppState::new(
        crate::configuration::default_function_settings(auth, services.policy.lease),
        services,
    )
}

/// The product's router over `state`, for serving in-process (the deterministic
/// simulator sends it requests without sockets).
pub fn router(state: Arc<AppState>) -> Router {
    crate::functions::router(state)
}
use crate::functions::claim_approved::ClaimHandler;
use crate::functions::AppState;
use crate::services::Services;
pub use crate::store::sqlite::sync_hook::SyncHook;
use crate::store::DynStore;

/// A store decorator.
pub type StoreLayer = Box<dyn FnOnce(DynStore) -> DynStore + Send>;
/// Builds what answers `ClaimApproved` from the services the consumer would use.
pub type HandlerFactory = Box<dyn FnOnce(&Services) -> Arc<dyn ClaimHandler> + Send>;
/// Builds the router from the state.
pub type RouterFactory = Box<dyn FnOnce(Arc<AppState>) -> Router + Send>;

/// Where a development build changes the composition. Production uses the default:
/// the store as opened, the consumer, [`crate::functions::router`].
#[derive(Default)]
pub struct Seams {
    /// Wraps the store every part uses (a decorator is itself a `Store`).
    pub store_layer: Option<StoreLayer>,
    /// Replaces the consumer behind `POST /ClaimApproved`.
    pub claim_handler: Option<HandlerFactory>,
    /// Replaces the router.
    pub router: Option<RouterFactory>,
    /// Named in the start-up log line (`handler`), so a log shows what served.
    pub label: Option<&'static str>,
}
