//! Connections: rustls TLS, the login (a password, or an Entra token fetched for every new
//! connection), and a deadpool pool whose connections retire before their token expires.
//!
//! Our own [`deadpool::managed::Manager`] rather than deadpool-postgres's: each connection
//! here carries the deadline of the token it logged in with, which deadpool-postgres's
//! client wrapper has no place for. A connection past its deadline (or its maximum age, or
//! closed by the server) is dropped when the pool would hand it out, and a new one logs in
//! with the credential's current token.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use azure_core::credentials::TokenCredential;
use azure_identity::{
    DeveloperToolsCredential, ManagedIdentityCredential, ManagedIdentityCredentialOptions,
    UserAssignedId,
};
use deadpool::managed::{Metrics, RecycleError, RecycleResult};
use time::OffsetDateTime;
use tokio_postgres::{Client, Statement};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::settings::{EntraIdentity, PostgresAuth, PostgresSettings};

/// The scope of Azure Database for PostgreSQL's Entra tokens.
pub(crate) const ENTRA_SCOPE: &str = "https://ossrdbms-aad.database.windows.net/.default";
/// No connection lives longer than this, whatever its login: a bound on how long a
/// connection to a server that failed over (and came back read-only) can linger.
pub(crate) const MAX_LIFETIME: Duration = Duration::from_secs(30 * 60);
/// A connection retires this long before its token expires.
pub(crate) const TOKEN_MARGIN: Duration = Duration::from_secs(5 * 60);
/// Set on every connection: no statement or lock wait holds an invocation for longer.
pub(crate) const SESSION_SETUP: &str = "SET statement_timeout = '10s'; SET lock_timeout = '5s'; \
                             SET idle_in_transaction_session_timeout = '30s'";

pub(crate) type Pool = deadpool::managed::Pool<Manager>;

/// One pooled connection with its prepared statements.
pub struct Connection {
    pub client: Client,
    statements: HashMap<&'static str, Statement>,
    /// When this connection must stop being used (its token's expiry less the margin, or
    /// its maximum age).
    retire_at: Instant,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Connection {
    /// Whether `sql` is prepared on this connection already.
    pub(crate) fn is_prepared(&self, sql: &'static str) -> bool {
        self.statements.contains_key(sql)
    }

    /// The statement for `sql`, prepared once per connection (the first use costs one
    /// extra round trip; every later one is a single Bind/Execute exchange).
    pub(crate) async fn statement(
        &mut self,
        sql: &'static str,
    ) -> Result<Statement, tokio_postgres::Error> {
        if let Some(statement) = self.statements.get(sql) {
            return Ok(statement.clone());
        }
        let statement = self.client.prepare(sql).await?;
        self.statements.insert(sql, statement.clone());
        Ok(statement)
    }
}

/// Why a connection could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("{0}")]
    Postgres(#[from] tokio_postgres::Error),
    /// The Entra token could not be had (the credential's own message: no token in it).
    #[error("cannot get an Entra token for PostgreSQL: {0}")]
    Token(String),
    #[error("connecting timed out after {0:?}")]
    Timeout(Duration),
}

/// The login of new connections.
enum Login {
    Password,
    Entra(Arc<dyn TokenCredential>),
}

pub struct Manager {
    config: tokio_postgres::Config,
    tls: MakeRustlsConnect,
    login: Login,
}

impl Manager {
    pub(crate) fn new(settings: &PostgresSettings) -> anyhow::Result<Self> {
        let login = match &settings.auth {
            PostgresAuth::Password => Login::Password,
            PostgresAuth::Entra(identity) => Login::Entra(credential(identity)?),
        };
        Ok(Manager {
            config: settings.config.clone(),
            tls: tls_connector()?,
            login,
        })
    }

    /// Logs in with Entra tokens from `credential`, whatever `settings.auth` says (tests,
    /// and callers that bring their own credential).
    pub fn with_credential(
        settings: &PostgresSettings,
        credential: Arc<dyn TokenCredential>,
    ) -> anyhow::Result<Self> {
        Ok(Manager {
            config: settings.config.clone(),
            tls: tls_connector()?,
            login: Login::Entra(credential),
        })
    }

    async fn connect(&self) -> Result<Connection, ConnectError> {
        let mut config = self.config.clone();
        let mut retire_at = Instant::now() + MAX_LIFETIME;
        if let Login::Entra(credential) = &self.login {
            let token = credential
                .get_token(&[ENTRA_SCOPE], None)
                .await
                .map_err(|e| ConnectError::Token(e.to_string()))?;
            let left = token.expires_on - OffsetDateTime::now_utc();
            let usable = left
                .try_into()
                .unwrap_or(Duration::ZERO)
                .saturating_sub(TOKEN_MARGIN);
            retire_at = retire_at.min(Instant::now() + usable);
            config.password(token.token.secret());
        }
        // Host names stay names: tokio-postgres resolves them on every connect and nothing
        // here keeps an address, so after a failover a new connection follows the DNS name
        // to the new primary.
        let (client, connection) = config.connect(self.tls.clone()).await?;
        let task = tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "PostgreSQL connection ended");
            }
        });
        let connection = Connection {
            client,
            statements: HashMap::new(),
            retire_at,
            task,
        };
        connection.client.batch_execute(SESSION_SETUP).await?;
        Ok(connection)
    }
}

impl deadpool::managed::Manager for Manager {
    type Type = Connection;
    type Error = ConnectError;

    async fn create(&self) -> Result<Connection, ConnectError> {
        let budget = super::settings::CONNECT_TIMEOUT * 2;
        tokio::time::timeout(budget, self.connect())
            .await
            .map_err(|_| ConnectError::Timeout(budget))?
    }

    async fn recycle(&self, conn: &mut Connection, _: &Metrics) -> RecycleResult<ConnectError> {
        if conn.client.is_closed() {
            return Err(RecycleError::message("the connection was closed"));
        }
        if Instant::now() >= conn.retire_at {
            return Err(RecycleError::message(
                "the connection reached its lifetime (token expiry or maximum age)",
            ));
        }
        Ok(())
    }
}

/// rustls with the platform's certificate verifier (the system's roots, host name checked)
/// and the crypto provider the rest of the binary uses.
fn tls_connector() -> anyhow::Result<MakeRustlsConnect> {
    use rustls_platform_verifier::BuilderVerifierExt;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_platform_verifier()?
        .with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}

fn credential(identity: &EntraIdentity) -> anyhow::Result<Arc<dyn TokenCredential>> {
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

/// The pool: at most `settings.pool_size` connections; a caller waits at most
/// `wait` for one (then the store answers Transient: the pool is exhausted).
pub(crate) fn build(settings: &PostgresSettings, wait: Duration) -> anyhow::Result<Pool> {
    build_with(Manager::new(settings)?, settings.pool_size, wait)
}

/// [`build`] with a given manager.
pub fn build_with(manager: Manager, size: usize, wait: Duration) -> anyhow::Result<Pool> {
    Pool::builder(manager)
        .max_size(size)
        .wait_timeout(Some(wait))
        .create_timeout(Some(super::settings::CONNECT_TIMEOUT * 2))
        .recycle_timeout(Some(Duration::from_secs(5)))
        .runtime(deadpool::Runtime::Tokio1)
        .build()
        .map_err(|e| anyhow::anyhow!("cannot build the PostgreSQL pool: {e}"))
}
