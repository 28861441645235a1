//! `BANK_*`: the bank's settings read from the environment, checked before they matter
//! (a URL that carries a credential, an unresolved Key Vault reference).

use std::time::Duration;

use reqwest::Url;
use secrecy::SecretString;

use super::{BankSettings, DEFAULT_KEY_WINDOW};
use crate::env_setting::names;
use crate::env_setting::{millis, parse_u64, ConfigError};

/// `BANK_*`: the settings (`None` without `BANK_API_URL`: ledger-only mode), and
/// the per-request timeout, read either way because the retry budget is checked
/// against it.
pub(crate) fn from_lookup(
    get: &dyn Fn(&str) -> Option<String>,
) -> Result<(Option<BankSettings>, Duration), ConfigError> {
    let bank_timeout = match get(names::BANK_TIMEOUT_MS) {
        None => Duration::from_millis(5_000),
        Some(v) => millis(names::BANK_TIMEOUT_MS, &v, 1, 120_000)?,
    };
    let key_window = match (
        get(names::BANK_KEY_WINDOW_HOURS),
        get(names::BANK_KEY_WINDOW_MS),
    ) {
        (Some(_), Some(_)) => {
            return Err(ConfigError::new(
                names::BANK_KEY_WINDOW_MS,
                "set either BANK_KEY_WINDOW_HOURS or BANK_KEY_WINDOW_MS, not both",
            ))
        }
        (None, None) => DEFAULT_KEY_WINDOW,
        // For sandboxes and simulations, whose banks forget keys within minutes.
        (None, Some(v)) => millis(names::BANK_KEY_WINDOW_MS, &v, 1_000, 30 * 86_400_000)?,
        (Some(v), None) => {
            let hours = parse_u64(names::BANK_KEY_WINDOW_HOURS, &v)?;
            if hours == 0 {
                return Err(ConfigError::new(
                    names::BANK_KEY_WINDOW_HOURS,
                    "must be at least 1",
                ));
            }
            Duration::from_secs(hours * 3600)
        }
    };
    let bank = match get(names::BANK_API_URL) {
        None => None,
        Some(v) => Some(BankSettings {
            url: bank_url(&v)?,
            api_key: get(names::BANK_API_KEY).map(bank_api_key).transpose()?,
            timeout: bank_timeout,
            key_window,
        }),
    };
    Ok((bank, bank_timeout))
}

/// `BANK_API_URL`: an http(s) URL with a host, and no credential in it (userinfo or a
/// query string): the credential goes in `BANK_API_KEY`. Errors never echo the value,
/// which is exactly what could hold a secret.
fn bank_url(value: &str) -> Result<Url, ConfigError> {
    let url = Url::parse(value.trim()).map_err(|e| {
        ConfigError::new(
            names::BANK_API_URL,
            format!("is not a URL ({e}); the value is not shown"),
        )
    })?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return Err(ConfigError::new(
            names::BANK_API_URL,
            "must be an http(s) URL with a host",
        ));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(ConfigError::new(
            names::BANK_API_URL,
            "carries a user name or password; put the credential in BANK_API_KEY (a Key Vault reference in Azure); the value is not shown",
        ));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(ConfigError::new(
            names::BANK_API_URL,
            "carries a query string or fragment, where keys hide; put the credential in BANK_API_KEY (a Key Vault reference in Azure); the value is not shown",
        ));
    }
    Ok(url)
}

/// `BANK_API_KEY`. An app setting whose Key Vault reference the platform could not
/// resolve (missing secret, missing role) arrives as the reference text itself; sending
/// that as a credential would only fail every payout, so it is refused at start-up.
fn bank_api_key(value: String) -> Result<SecretString, ConfigError> {
    let value = value.trim();
    if value.starts_with("@Microsoft.KeyVault(") {
        return Err(ConfigError::new(
            names::BANK_API_KEY,
            "is an unresolved Key Vault reference: check that the secret exists and that the app's identity may read it (Key Vault Secrets User)",
        ));
    }
    Ok(SecretString::from(value.to_owned()))
}
