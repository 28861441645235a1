//! The bank's settings: where payouts go, with what credential, how long a request may
//! take and how long the bank remembers an Idempotency-Key. Read from the environment by
//! the process that composes the engine (the product crate's `bank::settings`).

use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use url::Url;

/// Where payouts go. Absent: ledger-only mode (payments are recorded, no bank is called).
/// How long the bank remembers an Idempotency-Key unless `BANK_KEY_WINDOW_*` says.
pub const DEFAULT_KEY_WINDOW: Duration = Duration::from_secs(24 * 3600);

#[derive(Debug, Clone)]
pub struct BankSettings {
    /// Scheme, host and path only: a credential never travels in the URL.
    pub url: Url,
    /// `BANK_API_KEY`, sent as `Authorization: Bearer`. Never logged or echoed
    /// (`SecretString` prints as redacted).
    pub api_key: Option<SecretString>,
    /// Per request.
    pub timeout: Duration,
    /// How long after a payout was first requested the bank still recognises its
    /// Idempotency-Key. Past it, resending could pay twice, so we stop and reconcile.
    pub key_window: Duration,
}

impl PartialEq for BankSettings {
    fn eq(&self, other: &Self) -> bool {
        self.url == other.url
            && self.api_key.as_ref().map(|k| k.expose_secret())
                == other.api_key.as_ref().map(|k| k.expose_secret())
            && self.timeout == other.timeout
            && self.key_window == other.key_window
    }
}
