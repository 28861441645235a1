//! `PAYMENTS_POSTGRES_*` settings: where the database is, how we log in, and the TLS rule.
//!
//! | setting | meaning |
//! |---|---|
//! | `PAYMENTS_POSTGRES_URL` | libpq URI, `postgresql://user[:password]@host[:port]/dbname[?sslmode=...]`; required with `PAYMENTS_STORE=postgres` |
//! | `PAYMENTS_POSTGRES_AUTH` | `password` (default: the URI's password) or `entra` (a Microsoft Entra token as the password) |
//! | `PAYMENTS_POSTGRES_MANAGED_IDENTITY_CLIENT_ID` | with `entra`: the user-assigned managed identity; unset: system-assigned in Azure, developer tools (Azure CLI, azd) locally |
//! | `PAYMENTS_POSTGRES_POOLER` | what answers at the URI: `none` (default: PostgreSQL itself, checked on every connection) or `pgbouncer-transaction` (PgBouncer pooling by transaction, such as Azure's built-in one on port 6432: no named prepared statements, no session settings; see [`Pooler`]) |
//! | `PAYMENTS_POSTGRES_OUTAGE_WAIT_MS` | how long one store call keeps trying to connect to a server it cannot reach (a failover, a restart) before answering `retry-later`; default 20000, 0 answers at once, at most 60000; `LEASE_MS` must exceed it plus the bank's budget |
//!
//! **TLS.** Required for every host that is not loopback: `sslmode=disable` or `prefer` is
//! refused at start-up for such a host, and no `sslmode` means `require`. With rustls,
//! `require` verifies the certificate chain against the system's roots *and* the host name
//! (what libpq calls `verify-full`); `verify-ca` and `verify-full` are accepted and mean the
//! same. A loopback host (127.0.0.0/8, ::1, `localhost`) or a Unix socket defaults to no TLS.
//!
//! Values are never echoed in errors: the URI may carry a password.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::time::Duration;

use tokio_postgres::config::{Host, SslMode, TargetSessionAttrs};
use url::Url;

use claims_payments_settings::entra::{self, EntraIdentity, Fallback};
use claims_payments_settings::names;
use claims_payments_settings::{millis, non_blank, ConfigError};

/// How the service logs in to PostgreSQL.
#[derive(Clone, PartialEq, Eq)]
pub enum PostgresAuth {
    /// The password in the URI (or none: trust, peer or a `.pgpass` are not read).
    Password,
    /// A Microsoft Entra access token for `https://ossrdbms-aad.database.windows.net/.default`
    /// as the password, fetched for every new connection.
    Entra(EntraIdentity),
}

impl fmt::Debug for PostgresAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PostgresAuth::Password => f.write_str("Password(<redacted>)"),
            PostgresAuth::Entra(identity) => f.debug_tuple("Entra").field(identity).finish(),
        }
    }
}

impl PostgresAuth {
    /// For logs: never the password, only how we log in.
    pub fn describe(&self) -> String {
        match self {
            PostgresAuth::Password => "password".to_owned(),
            PostgresAuth::Entra(EntraIdentity::ManagedIdentity {
                client_id: Some(id),
            }) => format!("Entra token of the user-assigned managed identity {id}"),
            PostgresAuth::Entra(EntraIdentity::ManagedIdentity { client_id: None }) => {
                "Entra token of the system-assigned managed identity".to_owned()
            }
            PostgresAuth::Entra(EntraIdentity::DeveloperTools) => {
                "Entra token of the developer tools credential (Azure CLI / azd)".to_owned()
            }
        }
    }
}

/// What answers at the URI, which decides what a connection may keep between statements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooler {
    /// PostgreSQL itself (or a plain TCP proxy): a connection is one server session, so
    /// statements are prepared once per connection and the session's limits are set on
    /// it. Checked on every new connection: one whose server announces a process that is
    /// not the session's own is refused (see `pool.rs`).
    None,
    /// A PgBouncer that pools by transaction (Azure Database for PostgreSQL's built-in one,
    /// port 6432): consecutive statements of one connection may run on different server
    /// sessions. Every statement goes unnamed (Parse/Bind/Execute in one exchange), nothing
    /// is `SET` on a session, and the limits must be the role's defaults (`ALTER ROLE ... SET`,
    /// checked at start-up). Works on PgBouncer of any version, whatever its
    /// `max_prepared_statements`, and on PostgreSQL itself.
    PgBouncerTransaction,
}

impl Pooler {
    pub fn as_str(self) -> &'static str {
        match self {
            Pooler::None => "none",
            Pooler::PgBouncerTransaction => "pgbouncer-transaction",
        }
    }
}

/// Where and how to reach the database. `Debug` shows no password (tokio-postgres redacts it).
#[derive(Debug, Clone, PartialEq)]
pub struct PostgresSettings {
    /// The parsed URI, with our TLS decision in `ssl_mode` and the timeouts below set.
    pub config: tokio_postgres::Config,
    pub auth: PostgresAuth,
    /// Connections the pool keeps at most.
    pub pool_size: usize,
    /// How long one store call keeps trying to connect while the server cannot be reached.
    pub outage_wait: Duration,
    /// What answers at the URI.
    pub pooler: Pooler,
}

/// Connections per process: an invocation holds one for one statement at a time.
pub const DEFAULT_POOL_SIZE: usize = 16;
/// A new connection (TCP, TLS, login) must be up within this.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// A failover takes one to two minutes; each store call rides out this much of it, so a
/// failover costs a message a few deliveries instead of all ten in a burst. The claim's
/// wait comes out of the lease taken before it, so the lease must still cover the bank's
/// budget after it (checked at start-up); two waits and the bank's worst case stay well
/// within the host's `functionTimeout` (3 min, host.json).
pub const DEFAULT_OUTAGE_WAIT: Duration = Duration::from_secs(20);
const MAX_OUTAGE_WAIT_MS: u64 = 60_000;
/// Unacknowledged data for this long means the peer is gone (a failover, a cut link): the
/// connection fails instead of waiting for TCP's own retransmission limit (minutes).
pub const TCP_USER_TIMEOUT: Duration = Duration::from_secs(15);

impl PostgresSettings {
    /// Reads the settings through `lookup` (the environment, or a map in tests). Empty
    /// values count as unset.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let get = |name: &str| non_blank(&lookup, name);
        let url = get(names::PAYMENTS_POSTGRES_URL).ok_or_else(|| {
            ConfigError::new(
                names::PAYMENTS_POSTGRES_URL,
                "is required when PAYMENTS_STORE=postgres \
                 (postgresql://user@host:5432/dbname?sslmode=require)",
            )
        })?;
        let mut config = parse_url(&url)?;

        let auth = match get(names::PAYMENTS_POSTGRES_AUTH).as_deref() {
            None | Some("password") => PostgresAuth::Password,
            Some("entra") => {
                let client_id = get(names::PAYMENTS_POSTGRES_MANAGED_IDENTITY_CLIENT_ID);
                if let Some(id) = &client_id {
                    uuid::Uuid::try_parse(id).map_err(|_| {
                        ConfigError::new(
                            names::PAYMENTS_POSTGRES_MANAGED_IDENTITY_CLIENT_ID,
                            "is not a client id (a GUID); the value is not shown",
                        )
                    })?;
                }
                PostgresAuth::Entra(entra::choose(
                    &get,
                    client_id,
                    Fallback::DeveloperToolsUnlessNamed,
                ))
            }
            Some(_) => {
                return Err(ConfigError::new(
                    names::PAYMENTS_POSTGRES_AUTH,
                    "is not an authentication; use password or entra",
                ))
            }
        };
        if matches!(auth, PostgresAuth::Entra(_)) {
            if config.get_password().is_some() {
                return Err(ConfigError::new(
                    names::PAYMENTS_POSTGRES_URL,
                    "carries a password, but PAYMENTS_POSTGRES_AUTH=entra logs in with an Entra \
                     token; remove the password from the URI (the value is not shown)",
                ));
            }
            if config.get_user().is_none() {
                return Err(ConfigError::new(
                    names::PAYMENTS_POSTGRES_URL,
                    "names no user; with PAYMENTS_POSTGRES_AUTH=entra the user is the Entra \
                     principal's name as created in the server (for a managed identity: its name)",
                ));
            }
        }
        if config.get_dbname().is_none() {
            return Err(ConfigError::new(
                names::PAYMENTS_POSTGRES_URL,
                "names no database (postgresql://user@host:5432/dbname)",
            ));
        }
        let outage_wait = match get(names::PAYMENTS_POSTGRES_OUTAGE_WAIT_MS) {
            None => DEFAULT_OUTAGE_WAIT,
            Some(v) => millis(
                names::PAYMENTS_POSTGRES_OUTAGE_WAIT_MS,
                &v,
                0,
                MAX_OUTAGE_WAIT_MS,
            )?,
        };
        let pooler = match get(names::PAYMENTS_POSTGRES_POOLER).as_deref() {
            None | Some("none") => Pooler::None,
            Some("pgbouncer-transaction") => Pooler::PgBouncerTransaction,
            Some(_) => {
                return Err(ConfigError::new(
                    names::PAYMENTS_POSTGRES_POOLER,
                    "is not a pooler; use none (PostgreSQL itself) or pgbouncer-transaction \
                     (PgBouncer with pool_mode=transaction, such as Azure's built-in one on \
                     port 6432)",
                ))
            }
        };
        // A new connection that reaches a read-only server (a standby, the old primary after
        // a failover, one mid-promotion) is refused as it is made, so the store waits for
        // the primary as it waits for an unreachable server, and never pools a connection
        // that cannot write. One `SHOW transaction_read_only` per new connection.
        config
            .target_session_attrs(TargetSessionAttrs::ReadWrite)
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_user_timeout(TCP_USER_TIMEOUT)
            .keepalives(true)
            .application_name("claims-payments");
        Ok(PostgresSettings {
            config,
            auth,
            pool_size: DEFAULT_POOL_SIZE,
            outage_wait,
            pooler,
        })
    }

    /// These settings with another [`Pooler`] (tests: one URI through PgBouncer).
    pub fn with_pooler(mut self, pooler: Pooler) -> Self {
        self.pooler = pooler;
        self
    }

    /// Settings for a test server on loopback (no TLS, password auth).
    pub fn from_url(url: &str) -> Result<Self, ConfigError> {
        Self::from_lookup(|name| (name == names::PAYMENTS_POSTGRES_URL).then(|| url.to_owned()))
    }

    /// Where we connect, for logs: hosts, port and database, never the user's password.
    pub fn describe_target(&self) -> String {
        let hosts: Vec<String> = self
            .config
            .get_hosts()
            .iter()
            .map(|h| match h {
                Host::Tcp(name) => name.clone(),
                Host::Unix(path) => path.display().to_string(),
            })
            .collect();
        let ports: Vec<String> = self.config.get_ports().iter().map(u16::to_string).collect();
        format!(
            "{} port {} database {}",
            hosts.join(","),
            if ports.is_empty() {
                "5432".to_owned()
            } else {
                ports.join(",")
            },
            self.config.get_dbname().unwrap_or("?")
        )
    }

    /// Whether TLS is used (it is for every host that is not loopback).
    pub fn uses_tls(&self) -> bool {
        self.config.get_ssl_mode() != SslMode::Disable
    }
}

/// Parses the libpq URI and decides TLS. `sslmode` is taken out before tokio-postgres
/// parses the rest, since it knows only disable/prefer/require.
fn parse_url(value: &str) -> Result<tokio_postgres::Config, ConfigError> {
    let setting = names::PAYMENTS_POSTGRES_URL;
    let mut url = Url::parse(value).map_err(|e| {
        ConfigError::new(
            setting,
            format!("is not a URI ({e}); expected postgresql://user@host:5432/dbname; the value is not shown"),
        )
    })?;
    if !matches!(url.scheme(), "postgres" | "postgresql") {
        return Err(ConfigError::new(
            setting,
            "must be a postgresql:// URI; the value is not shown",
        ));
    }
    let mut sslmode = None;
    let rest: Vec<(String, String)> = url
        .query_pairs()
        .filter_map(|(k, v)| {
            if k == "sslmode" {
                sslmode = Some(v.into_owned());
                None
            } else {
                Some((k.into_owned(), v.into_owned()))
            }
        })
        .collect();
    if rest.is_empty() {
        url.set_query(None);
    } else {
        url.query_pairs_mut().clear().extend_pairs(rest);
    }
    let mut config = tokio_postgres::Config::from_str(url.as_str()).map_err(|e| {
        // tokio-postgres names the option, never its value.
        ConfigError::new(
            setting,
            format!("cannot be parsed: {e}; the value is not shown"),
        )
    })?;
    if config.get_hosts().is_empty() {
        return Err(ConfigError::new(
            setting,
            "names no host; the value is not shown",
        ));
    }
    let local = config.get_hosts().iter().all(is_local);
    let mode = match sslmode.as_deref() {
        None if local => SslMode::Disable,
        None | Some("require" | "verify-ca" | "verify-full") => SslMode::Require,
        Some(mode @ ("disable" | "prefer" | "allow")) if !local => {
            return Err(ConfigError::new(
                setting,
                format!(
                    "sslmode={mode} is refused for a host that is not loopback: the password or \
                     token and every payment would cross the network unencrypted (or a \
                     downgrade could force that); use sslmode=require"
                ),
            ))
        }
        Some("disable") => SslMode::Disable,
        Some("prefer" | "allow") => SslMode::Prefer,
        Some(_) => {
            return Err(ConfigError::new(
                setting,
                "has an unknown sslmode; use require (or disable on loopback)",
            ))
        }
    };
    config.ssl_mode(mode);
    Ok(config)
}

/// Loopback or a Unix socket: traffic that never leaves the machine.
fn is_local(host: &Host) -> bool {
    match host {
        Host::Unix(_) => true,
        Host::Tcp(name) => {
            let name = name.trim_start_matches('[').trim_end_matches(']');
            name.eq_ignore_ascii_case("localhost")
                || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn settings(pairs: &[(&str, &str)]) -> Result<PostgresSettings, ConfigError> {
        let map: HashMap<&str, &str> = pairs.iter().copied().collect();
        PostgresSettings::from_lookup(|k| map.get(k).map(|v| v.to_string()))
    }

    fn url(value: &str) -> Result<PostgresSettings, ConfigError> {
        settings(&[("PAYMENTS_POSTGRES_URL", value)])
    }

    /// The URL and one more setting.
    fn url_and(value: &str, name: &str, setting: &str) -> Result<PostgresSettings, ConfigError> {
        settings(&[("PAYMENTS_POSTGRES_URL", value), (name, setting)])
    }

    #[test]
    fn connections_want_a_writable_server_and_keep_the_host_name() {
        let remote =
            url("postgresql://app@pg-claims.postgres.database.azure.com/payments").unwrap();
        assert_eq!(
            remote.config.get_target_session_attrs(),
            TargetSessionAttrs::ReadWrite
        );
        // No address is resolved ahead: each connect looks the name up again.
        assert!(remote.config.get_hostaddrs().is_empty());
        assert_eq!(
            remote.config.get_hosts(),
            [Host::Tcp("pg-claims.postgres.database.azure.com".into())]
        );
    }

    #[test]
    fn the_outage_wait_defaults_to_20_s_and_is_bounded() {
        let local = "postgresql://app:pw@127.0.0.1/payments";
        assert_eq!(url(local).unwrap().outage_wait, Duration::from_secs(20));
        let zero = url_and(local, "PAYMENTS_POSTGRES_OUTAGE_WAIT_MS", "0").unwrap();
        assert_eq!(zero.outage_wait, Duration::ZERO);
        for bad in ["60001", "-1", "30s"] {
            let err = url_and(local, "PAYMENTS_POSTGRES_OUTAGE_WAIT_MS", bad).unwrap_err();
            assert_eq!(err.setting, "PAYMENTS_POSTGRES_OUTAGE_WAIT_MS", "{bad}");
        }
    }

    #[test]
    fn the_pooler_is_none_unless_pgbouncer_transaction_is_named() {
        let local = "postgresql://app:pw@127.0.0.1:6432/payments";
        assert_eq!(url(local).unwrap().pooler, Pooler::None);
        for (value, pooler) in [
            ("none", Pooler::None),
            ("pgbouncer-transaction", Pooler::PgBouncerTransaction),
        ] {
            let s = url_and(local, "PAYMENTS_POSTGRES_POOLER", value).unwrap();
            assert_eq!(s.pooler, pooler, "{value}");
            assert_eq!(pooler.as_str(), value);
        }
        for bad in ["pgbouncer", "session", "transaction"] {
            let err = url_and(local, "PAYMENTS_POSTGRES_POOLER", bad).unwrap_err();
            assert_eq!(err.setting, "PAYMENTS_POSTGRES_POOLER", "{bad}");
            assert!(err.problem.contains("pgbouncer-transaction"), "{err}");
        }
    }

    #[test]
    fn a_remote_host_needs_tls_and_loopback_may_go_without() {
        let s = url("postgresql://app:pw@db.example.com:5432/payments").unwrap();
        assert_eq!(
            s.config.get_ssl_mode(),
            SslMode::Require,
            "no sslmode: require"
        );
        for mode in ["require", "verify-ca", "verify-full"] {
            let s = url(&format!(
                "postgresql://app@db.example.com/payments?sslmode={mode}"
            ))
            .unwrap();
            assert_eq!(s.config.get_ssl_mode(), SslMode::Require, "{mode}");
        }
        for mode in ["disable", "prefer", "allow"] {
            let err = url(&format!(
                "postgresql://app@db.example.com/payments?sslmode={mode}"
            ))
            .unwrap_err();
            assert_eq!(err.setting, "PAYMENTS_POSTGRES_URL");
            assert!(
                err.problem.contains(&format!("sslmode={mode} is refused")),
                "{err}"
            );
        }
        // One remote host among loopback ones is remote.
        let err =
            url("postgresql://app@127.0.0.1,db.example.com/payments?sslmode=disable").unwrap_err();
        assert!(err.problem.contains("refused"), "{err}");
        for local in ["127.0.0.1", "localhost", "[::1]", "127.0.0.2"] {
            let s = url(&format!("postgresql://app@{local}:5433/payments")).unwrap();
            assert_eq!(s.config.get_ssl_mode(), SslMode::Disable, "{local}");
            let s = url(&format!(
                "postgresql://app@{local}/payments?sslmode=require"
            ))
            .unwrap();
            assert_eq!(s.config.get_ssl_mode(), SslMode::Require, "{local}");
        }
        // Other query parameters survive the removal of sslmode.
        let s = url("postgresql://app@db.example.com/payments?sslmode=require&application_name=x")
            .unwrap();
        assert_eq!(s.config.get_application_name(), Some("claims-payments"));
    }

    #[test]
    fn every_problem_names_the_setting_and_never_the_password() {
        let secret = "pw-SECRET";
        for value in [
            format!("mysql://app:{secret}@db.example.com/payments"),
            format!("postgresql://app:{secret}@db.example.com:notaport/payments"),
            format!("postgresql://app:{secret}@db.example.com/payments?sslmode=disable"),
            format!("postgresql://app:{secret}@db.example.com/payments?sslmode=bogus"),
            format!("postgresql://app:{secret}@db.example.com"),
            format!("{secret} not a url"),
        ] {
            let err = url(&value).expect_err(&value);
            assert_eq!(err.setting, "PAYMENTS_POSTGRES_URL", "{err}");
            assert!(!err.to_string().contains("SECRET"), "{value}: {err}");
        }
        let s = url(&format!(
            "postgresql://app:{secret}@db.example.com/payments"
        ))
        .unwrap();
        assert_eq!(s.config.get_password(), Some(secret.as_bytes()));
        assert!(
            !format!("{s:?}").contains("SECRET"),
            "Debug must redact: {s:?}"
        );
        assert!(!s.describe_target().contains("SECRET"));
        let err = settings(&[]).unwrap_err();
        assert_eq!(err.setting, "PAYMENTS_POSTGRES_URL");
    }

    #[test]
    fn entra_takes_no_password_and_names_its_identity() {
        let remote = (
            "PAYMENTS_POSTGRES_URL",
            "postgresql://claims-payments-id@db.example.com/payments",
        );
        let s = settings(&[remote, ("PAYMENTS_POSTGRES_AUTH", "entra")]).unwrap();
        assert_eq!(s.auth, PostgresAuth::Entra(EntraIdentity::DeveloperTools));
        let s = settings(&[
            remote,
            ("PAYMENTS_POSTGRES_AUTH", "entra"),
            ("IDENTITY_ENDPOINT", "http://169.254.1.1"),
        ])
        .unwrap();
        assert_eq!(
            s.auth,
            PostgresAuth::Entra(EntraIdentity::ManagedIdentity { client_id: None })
        );
        let id = "7f0e4c1a-2b3d-4e5f-8a9b-0c1d2e3f4a5b";
        let s = settings(&[
            remote,
            ("PAYMENTS_POSTGRES_AUTH", "entra"),
            ("PAYMENTS_POSTGRES_MANAGED_IDENTITY_CLIENT_ID", id),
        ])
        .unwrap();
        assert_eq!(
            s.auth,
            PostgresAuth::Entra(EntraIdentity::ManagedIdentity {
                client_id: Some(id.into())
            })
        );
        let err = settings(&[
            remote,
            ("PAYMENTS_POSTGRES_AUTH", "entra"),
            ("PAYMENTS_POSTGRES_MANAGED_IDENTITY_CLIENT_ID", "not-a-guid"),
        ])
        .unwrap_err();
        assert_eq!(err.setting, "PAYMENTS_POSTGRES_MANAGED_IDENTITY_CLIENT_ID");
        let err = settings(&[
            (
                "PAYMENTS_POSTGRES_URL",
                "postgresql://id:pw-SECRET@db.example.com/payments",
            ),
            ("PAYMENTS_POSTGRES_AUTH", "entra"),
        ])
        .unwrap_err();
        assert_eq!(err.setting, "PAYMENTS_POSTGRES_URL");
        assert!(!err.to_string().contains("SECRET"), "{err}");
        let err = settings(&[remote, ("PAYMENTS_POSTGRES_AUTH", "kerberos")]).unwrap_err();
        assert_eq!(err.setting, "PAYMENTS_POSTGRES_AUTH");
    }
}
