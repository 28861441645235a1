//! `claims-payments-dev serve`: the product's composition root
//! ([`claims_payments::seams::startup::Application`]) with a baseline or faults plugged into its seams,
//! chosen by the dev-only settings the product refuses:
//!
//! - `PAYMENTS_DEV_HANDLER`: `consumer` (default), `naive` or `noop`;
//! - `PAYMENTS_FAULT_CRASH_AFTER_COMMIT`: probability of a SIGKILL after commit, before answering;
//! - `PAYMENTS_FAULT_STORE_DELAY_MS`: added to every store call of the message path.

use std::sync::Arc;
use std::time::Duration;

use claims_payments::seams::configuration::{Settings, DEV_ONLY_SETTINGS};
use claims_payments::seams::functions::claim_approved::ClaimHandler;
use claims_payments::seams::services::Services;
use claims_payments::seams::startup;
use claims_payments::seams::store::DynStore;
use claims_payments::seams::Seams;
use claims_payments_settings::ConfigError;

use crate::baselines::{noop_router, Naive};
use crate::faults::{CrashAfterCommit, SlowStore};
use claims_payments_settings::names;

/// Which handler answers `POST /ClaimApproved`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handler {
    /// The product's guarded consumer.
    Consumer,
    /// Check-then-insert without the atomic guard ([`Naive`]).
    Naive,
    /// Answers 200 without decoding or storing anything ([`noop_router`]).
    Noop,
}

impl Handler {
    pub fn as_str(self) -> &'static str {
        match self {
            Handler::Consumer => "consumer",
            Handler::Naive => "naive",
            Handler::Noop => "noop",
        }
    }
}

/// The dev-only settings.
#[derive(Debug, Clone, PartialEq)]
pub struct DevKnobs {
    pub handler: Handler,
    pub crash_after_commit: f64,
    pub store_delay: Duration,
}

impl DevKnobs {
    /// Reads the dev-only settings through `lookup`; blank counts as unset.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let handler = match get(names::PAYMENTS_DEV_HANDLER).as_deref().map(str::trim) {
            None | Some("consumer") => Handler::Consumer,
            Some("naive") => Handler::Naive,
            Some("noop") => Handler::Noop,
            Some(other) => {
                return Err(ConfigError::new(
                    names::PAYMENTS_DEV_HANDLER,
                    format!("{other:?} is not a handler; use consumer, naive or noop"),
                ))
            }
        };
        let crash_after_commit = match get(names::PAYMENTS_FAULT_CRASH_AFTER_COMMIT) {
            None => 0.0,
            Some(v) => v
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|p| (0.0..=1.0).contains(p))
                .ok_or_else(|| {
                    ConfigError::new(
                        names::PAYMENTS_FAULT_CRASH_AFTER_COMMIT,
                        "must be a probability 0..=1",
                    )
                })?,
        };
        let store_delay = match get(names::PAYMENTS_FAULT_STORE_DELAY_MS) {
            None => Duration::ZERO,
            Some(v) => v
                .trim()
                .parse::<u64>()
                .ok()
                .filter(|ms| *ms <= 60_000)
                .map(Duration::from_millis)
                .ok_or_else(|| {
                    ConfigError::new(
                        names::PAYMENTS_FAULT_STORE_DELAY_MS,
                        format!("{v:?} is not a number of milliseconds within 0..=60000"),
                    )
                })?,
        };
        Ok(DevKnobs {
            handler,
            crash_after_commit,
            store_delay,
        })
    }

    /// The product's seams with these knobs plugged in.
    pub fn seams(&self) -> Seams {
        let mut seams = Seams {
            label: Some(self.handler.as_str()),
            ..Seams::default()
        };
        if !self.store_delay.is_zero() {
            let delay = self.store_delay;
            seams.store_layer = Some(Box::new(move |store: DynStore| {
                Arc::new(SlowStore::new(store, delay)) as DynStore
            }));
        }
        let (handler, crash) = (self.handler, self.crash_after_commit);
        seams.claim_handler = Some(Box::new(move |services: &Services| {
            let inner: Arc<dyn ClaimHandler> = match handler {
                Handler::Naive => Arc::new(Naive::new(services)),
                Handler::Consumer | Handler::Noop => Arc::new(services.consumer()),
            };
            if crash > 0.0 {
                Arc::new(CrashAfterCommit {
                    inner,
                    probability: crash,
                })
            } else {
                inner
            }
        }));
        if handler == Handler::Noop {
            seams.router = Some(Box::new(|_state| noop_router()));
        }
        seams
    }
}

/// The product's settings from the environment, without the dev-only ones (which the
/// product refuses and [`DevKnobs`] reads).
pub fn product_settings() -> Result<Settings, ConfigError> {
    Settings::from_lookup(|name| {
        if DEV_ONLY_SETTINGS.contains(&name) {
            None
        } else {
            std::env::var(name).ok()
        }
    })
}

/// Reads the product's settings and the dev knobs from the environment, then serves.
pub async fn serve() -> anyhow::Result<()> {
    let knobs = DevKnobs::from_lookup(|name| std::env::var(name).ok())?;
    let settings = product_settings()?;
    let telemetry = settings.start_telemetry()?;
    let result = match startup::Application::build(settings, knobs.seams()).await {
        Ok(application) => application.run_until_stopped().await,
        Err(e) => Err(e),
    };
    if let Some(guard) = telemetry {
        guard.shutdown().await;
    }
    result
}
