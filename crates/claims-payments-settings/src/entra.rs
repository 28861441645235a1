//! The Microsoft Entra credential: which identity a part gets its tokens for, decided by
//! one rule ([`choose`]) for every part that asks (Cosmos DB, PostgreSQL, the Service Bus
//! of the dead-letter tool, Application Insights), and the credentials themselves
//! (`credential`, with the crate's `credential` feature), built once per process for each
//! identity and shared by every part that names it, so one token cache serves them all.
//!
//! The rule: a managed identity where the host provides one (it sets `IDENTITY_ENDPOINT`,
//! or `MSI_ENDPOINT` on older hosts), user-assigned when the part's client id setting
//! names one; elsewhere the developer's own login (Azure CLI, azd), for the parts that
//! allow it ([`Fallback`]). A client id is only ever an identifier, never a secret, and
//! no token is ever logged or put in an error.

#[cfg(feature = "credential")]
use std::sync::{Arc, Mutex, OnceLock};

#[cfg(feature = "credential")]
use azure_core::credentials::TokenCredential;
#[cfg(feature = "credential")]
use azure_identity::{
    DeveloperToolsCredential, ManagedIdentityCredential, ManagedIdentityCredentialOptions,
    UserAssignedId,
};

use crate::names;

/// Which identity a part authenticates as.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum EntraIdentity {
    /// A managed identity: system-assigned, or user-assigned when a client id is given.
    ManagedIdentity { client_id: Option<String> },
    /// The developer's Azure CLI / Azure Developer CLI login.
    DeveloperTools,
}

/// Where a part may fall back to the developer's login.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// The stores: a managed identity in Azure, or wherever a client id is named (a host
    /// that reaches the instance metadata service without setting `IDENTITY_ENDPOINT`);
    /// the developer tools otherwise.
    DeveloperToolsUnlessNamed,
    /// The operator's dead-letter tool: a managed identity only where the host provides
    /// one (its client id then says which), so a developer's shell that carries the
    /// app's settings still uses the developer's own login.
    DeveloperTools,
    /// Telemetry uploads: always the app's managed identity (a developer's login has no
    /// business publishing the app's telemetry).
    Never,
}

/// The one rule: the identity a part uses, from its client id setting's value and
/// whether the host provides a managed identity (read through `get`).
pub fn choose(
    get: &dyn Fn(&str) -> Option<String>,
    client_id: Option<String>,
    fallback: Fallback,
) -> EntraIdentity {
    let hosted = get(names::IDENTITY_ENDPOINT).is_some() || get(names::MSI_ENDPOINT).is_some();
    let managed = match fallback {
        Fallback::DeveloperToolsUnlessNamed => hosted || client_id.is_some(),
        Fallback::DeveloperTools => hosted,
        Fallback::Never => true,
    };
    if managed {
        EntraIdentity::ManagedIdentity { client_id }
    } else {
        EntraIdentity::DeveloperTools
    }
}

/// The credentials this process built, one per identity.
#[cfg(feature = "credential")]
type Built = Vec<(EntraIdentity, Arc<dyn TokenCredential>)>;

/// The credential of `identity`: built the first time a part asks, then the same one for
/// every part that names the same identity, for the rest of the process.
#[cfg(feature = "credential")]
pub fn credential(identity: &EntraIdentity) -> anyhow::Result<Arc<dyn TokenCredential>> {
    static BUILT: OnceLock<Mutex<Built>> = OnceLock::new();
    let mut built = BUILT
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some((_, credential)) = built.iter().find(|(known, _)| known == identity) {
        return Ok(credential.clone());
    }
    let credential = build(identity)?;
    built.push((identity.clone(), credential.clone()));
    Ok(credential)
}

/// A new credential for `identity`. Construction reads no token: a failure here is a
/// setting the SDK refuses, and its message carries no secret.
#[cfg(feature = "credential")]
fn build(identity: &EntraIdentity) -> anyhow::Result<Arc<dyn TokenCredential>> {
    Ok(match identity {
        EntraIdentity::ManagedIdentity { client_id } => {
            let options = ManagedIdentityCredentialOptions {
                user_assigned_id: client_id.clone().map(UserAssignedId::ClientId),
                ..Default::default()
            };
            ManagedIdentityCredential::new(Some(options)).map_err(|e| {
                anyhow::anyhow!("cannot create the managed identity credential: {e}")
            })?
        }
        EntraIdentity::DeveloperTools => DeveloperToolsCredential::new(None)
            .map_err(|e| anyhow::anyhow!("cannot create the developer tools credential: {e}"))?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chosen(
        pairs: &[(&str, &str)],
        client_id: Option<&str>,
        fallback: Fallback,
    ) -> EntraIdentity {
        let get = crate::lookup_in(pairs);
        choose(&get, client_id.map(str::to_owned), fallback)
    }

    const ID: &str = "6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b";

    #[test]
    fn the_host_decides_and_a_client_id_names_which_identity() {
        let managed = |client_id: Option<&str>| EntraIdentity::ManagedIdentity {
            client_id: client_id.map(str::to_owned),
        };
        for hosted in [
            ("IDENTITY_ENDPOINT", "http://localhost:42356/msi/token"),
            ("MSI_ENDPOINT", "http://127.0.0.1:41741/MSI/token/"),
        ] {
            for fallback in [
                Fallback::DeveloperToolsUnlessNamed,
                Fallback::DeveloperTools,
                Fallback::Never,
            ] {
                assert_eq!(chosen(&[hosted], None, fallback), managed(None));
                assert_eq!(chosen(&[hosted], Some(ID), fallback), managed(Some(ID)));
            }
        }
        // Outside Azure: the developer's login, where the part allows it.
        for fallback in [
            Fallback::DeveloperToolsUnlessNamed,
            Fallback::DeveloperTools,
        ] {
            assert_eq!(chosen(&[], None, fallback), EntraIdentity::DeveloperTools);
        }
        assert_eq!(chosen(&[], None, Fallback::Never), managed(None));
        // A client id alone means a managed identity for the stores, not for the
        // operator's tool.
        assert_eq!(
            chosen(&[], Some(ID), Fallback::DeveloperToolsUnlessNamed),
            managed(Some(ID))
        );
        assert_eq!(
            chosen(&[], Some(ID), Fallback::DeveloperTools),
            EntraIdentity::DeveloperTools
        );
    }

    #[cfg(feature = "credential")]
    #[test]
    fn each_identity_is_built_once_per_process() {
        let system = EntraIdentity::ManagedIdentity { client_id: None };
        let user = EntraIdentity::ManagedIdentity {
            client_id: Some(ID.to_owned()),
        };
        let first = credential(&system).unwrap();
        assert!(Arc::ptr_eq(&first, &credential(&system).unwrap()));
        assert!(!Arc::ptr_eq(&first, &credential(&user).unwrap()));
        assert!(Arc::ptr_eq(
            &credential(&user).unwrap(),
            &credential(&user).unwrap()
        ));
    }
}
