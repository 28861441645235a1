//! Where the operator's dead-letter tool finds the queue: read with the process's other
//! settings, used only by `dead-letters`.
//!
//! | setting | meaning |
//! |---|---|
//! | `CLAIM_APPROVED_QUEUE` | the queue, default `claim-approved` (the app's own setting) |
//! | `ServiceBusConnection__fullyQualifiedNamespace` | the namespace (the app's own setting); needed unless `SERVICEBUS_ENDPOINT` is set |
//! | `SERVICEBUS_ENDPOINT` | a loopback stand-in instead of the namespace (no token) |
//! | `SERVICEBUS_TIMEOUT_MS` | per request, default 30000 |
//! | `SERVICEBUS_MANAGED_IDENTITY_CLIENT_ID` | the user-assigned managed identity, where the host provides one |
//!
//! The identity follows [`crate::entra`]'s rule for the operator's tool: the managed
//! identity where the host provides one (a pipeline), else the developer's own login.

use std::time::Duration;

use crate::entra::{self, EntraIdentity, Fallback};
use crate::env_setting::{names, ConfigError};

/// Where and how `dead-letters` reaches the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct QueueSettings {
    pub(crate) queue: String,
    /// Per request (each try of it).
    pub(crate) timeout: Duration,
    pub(crate) endpoint: QueueEndpoint,
}

/// The broker the tool talks to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum QueueEndpoint {
    /// `SERVICEBUS_ENDPOINT`: a loopback stand-in, no token.
    Loopback(String),
    /// The app's namespace (`None`: unset, refused when the tool runs, since `serve`
    /// does not need it), with an Entra token of `identity`.
    Namespace {
        namespace: Option<String>,
        identity: EntraIdentity,
    },
}

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Reads the settings through `get` (blank values already count as unset).
pub(crate) fn from_lookup(
    get: &dyn Fn(&str) -> Option<String>,
) -> Result<QueueSettings, ConfigError> {
    let queue = get(names::CLAIM_APPROVED_QUEUE).unwrap_or_else(|| "claim-approved".into());
    let timeout = match get(names::SERVICEBUS_TIMEOUT_MS) {
        Some(ms) => Duration::from_millis(ms.parse().map_err(|_| {
            ConfigError::new(
                names::SERVICEBUS_TIMEOUT_MS,
                "must be a number of milliseconds",
            )
        })?),
        None => DEFAULT_TIMEOUT,
    };
    let endpoint = match get(names::SERVICEBUS_ENDPOINT) {
        Some(endpoint) => QueueEndpoint::Loopback(endpoint),
        None => QueueEndpoint::Namespace {
            namespace: get(names::SERVICE_BUS_NAMESPACE),
            identity: entra::choose(
                get,
                get(names::SERVICEBUS_MANAGED_IDENTITY_CLIENT_ID),
                Fallback::DeveloperTools,
            ),
        },
    };
    Ok(QueueSettings {
        queue,
        timeout,
        endpoint,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> Result<QueueSettings, ConfigError> {
        let lookup = crate::env_setting::lookup_in(pairs);
        from_lookup(&|name| lookup(name).filter(|v| !v.trim().is_empty()))
    }

    #[test]
    fn defaults_and_the_loopback_stand_in() {
        let s = settings(&[]).unwrap();
        assert_eq!(
            (s.queue.as_str(), s.timeout),
            ("claim-approved", DEFAULT_TIMEOUT)
        );
        assert_eq!(
            s.endpoint,
            QueueEndpoint::Namespace {
                namespace: None,
                identity: EntraIdentity::DeveloperTools
            }
        );
        let s = settings(&[
            ("SERVICEBUS_ENDPOINT", "http://127.0.0.1:5300"),
            ("SERVICEBUS_TIMEOUT_MS", "500"),
        ])
        .unwrap();
        assert_eq!(
            s.endpoint,
            QueueEndpoint::Loopback("http://127.0.0.1:5300".into())
        );
        assert_eq!(s.timeout, Duration::from_millis(500));
    }

    #[test]
    fn a_timeout_that_is_no_number_is_named_without_its_value() {
        let err = settings(&[("SERVICEBUS_TIMEOUT_MS", "soon-ish")]).unwrap_err();
        assert_eq!(err.setting, "SERVICEBUS_TIMEOUT_MS", "{err}");
        assert!(!err.to_string().contains("soon-ish"), "{err}");
    }
}
