//! The only way in for development, above every other module: the hooks a development
//! build sets ([`Seams`], given to `startup::serve`; production passes the default),
//! crashes between the consumer's steps ([`CrashHook`]), a SQLite sync that is held or
//! fails ([`SyncHook`]), the application state and router on services the simulator
//! built ([`app_state`], [`router`]), and [`surface`]'s lists of what the development
//! crate, the test kit and the tests may name.

mod surface;
pub use surface::{
    ambient, bank, cli, configuration, consumer, dead_letters, env_setting, functions,
    payments_api, reconcile, servicebus, services, startup, store, telemetry,
};

use std::sync::Arc;

use axum::Router;

pub use crate::consumer::crash::{CrashHook, Step};
use crate::functions::AppState;
pub use crate::hooks::{HandlerFactory, RouterFactory, Seams, StoreLayer};
pub use crate::lease::liveness::{end_registration_of, Registered};
use crate::services::Services;
pub use crate::store::sqlite::sync_hook::SyncHook;

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
