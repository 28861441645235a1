//! Where a development build changes the composition root's parts ([`Seams`], given to
//! `startup::Application::build` and `startup::Composition::new`): a store decorator,
//! another handler behind `POST /ClaimApproved`, another router, the simulator's clock
//! and bank. Production passes the default, which changes nothing.

use std::sync::Arc;

use axum::Router;

use crate::ambient::Ambient;
use crate::bank::transport::BankTransport;
use crate::functions::claim_approved::ClaimHandler;
use crate::functions::AppState;
use crate::services::Services;
use crate::store::DynStore;

/// A store decorator.
pub type StoreLayer = Box<dyn FnOnce(DynStore) -> DynStore + Send>;
/// Builds what answers `ClaimApproved` from the services the consumer would use.
pub type HandlerFactory = Box<dyn FnOnce(&Services) -> Arc<dyn ClaimHandler> + Send>;
/// Builds the router from the state.
pub type RouterFactory = Box<dyn FnOnce(Arc<AppState>) -> Router + Send>;

/// Where a development build changes the composition. Production uses the default:
/// the store as opened, the consumer, [`crate::functions::router`], the system's clock
/// and randomness, the bank over HTTPS.
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
    /// The clock, randomness and process identity every part uses (the simulator's
    /// virtual ones), instead of the system's.
    pub ambient: Option<Ambient>,
    /// What the bank client sends through (a simulated bank), instead of HTTPS to
    /// `BANK_API_URL`; the bank's settings still apply.
    pub bank_transport: Option<Arc<dyn BankTransport>>,
}
