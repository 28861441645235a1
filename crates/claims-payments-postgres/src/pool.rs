//! Connections: rustls TLS, the login (a password, or an Entra token fetched for every new
//! connection), and a deadpool pool whose connections retire before their token expires.
//!
//! Our own [`deadpool::managed::Manager`] rather than deadpool-postgres's: each connection
//! here carries the deadline of the token it logged in with, which deadpool-postgres's
//! client wrapper has no place for. A connection past its deadline (or its maximum age, or
//! closed by the server) is dropped when the pool would hand it out, and a new one logs in
//! with the credential's current token.
//!
//! **Two ways to use a connection** ([`Pooler`]). Straight to PostgreSQL, a connection is
//! one server session: each statement is prepared once on it (named) and the session's
//! limits are `SET` when it opens. Through a PgBouncer that pools by transaction, the next
//! statement may run on another server session, where a named statement of ours is missing
//! or, worse, another client's of the same name, and a `SET` would change some other
//! client's session: there every statement goes unnamed (`query_typed`: Parse, Bind and
//! Execute in one exchange), its parameter types learnt once per process inside a
//! transaction (which PgBouncer keeps on one server session), and the limits are the
//! role's own defaults. The store's statements need nothing else from a session: each is
//! one statement in its own transaction (the claim and the finalize are one function call
//! each), and no statement reads what an earlier one left on the session.
//!
//! **Which one answers.** PostgreSQL's BackendKeyData names the backend process of the
//! session; a pooler must hand out keys of its own (it routes cancel requests itself). So
//! on every direct connection the announced process is compared with `pg_backend_pid()`,
//! and a connection where they differ is refused: without `PAYMENTS_POSTGRES_POOLER` the
//! store never uses named statements or session settings through a pooler.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use azure_core::credentials::TokenCredential;
use deadpool::managed::{Metrics, RecycleError, RecycleResult};
use time::OffsetDateTime;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Row, SimpleQueryMessage, Statement};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::settings::{Pooler, PostgresAuth, PostgresSettings};

/// The scope of Azure Database for PostgreSQL's Entra tokens.
pub const ENTRA_SCOPE: &str = "https://ossrdbms-aad.database.windows.net/.default";
/// No connection lives longer than this, whatever its login: a bound on how long a
/// connection to a server that failed over (and came back read-only) can linger.
pub const MAX_LIFETIME: Duration = Duration::from_secs(30 * 60);
/// A connection retires this long before its token expires.
pub const TOKEN_MARGIN: Duration = Duration::from_secs(5 * 60);
/// Set on every direct connection: no statement or lock wait holds an invocation for
/// longer. Through a transaction pooler the same limits are the role's defaults
/// ([`SESSION_LIMITS`]). The process id is the session's, compared with the one the server
/// announced (see the module's documentation).
pub const SESSION_SETUP: &str = "SET statement_timeout = '10s'; SET lock_timeout = '5s'; \
                             SET idle_in_transaction_session_timeout = '30s'; \
                             SELECT pg_backend_pid()";
/// The limits a session must have, with the values set on direct connections: through a
/// transaction pooler they must be the role's defaults (`ALTER ROLE ... SET`).
pub const SESSION_LIMITS: [(&str, &str); 3] = [
    ("statement_timeout", "10s"),
    ("lock_timeout", "5s"),
    ("idle_in_transaction_session_timeout", "30s"),
];

/// Parameter types of the unnamed statements, learnt once per process (the statements are
/// this build's constants, the schema is checked at start-up).
type Signatures = Arc<Mutex<HashMap<&'static str, Arc<[Type]>>>>;

pub type Pool = deadpool::managed::Pool<Manager>;

/// One pooled connection with its prepared statements (direct), or the parameter types of
/// its unnamed ones (through a transaction pooler).
pub struct Connection {
    pub client: Client,
    pooler: Pooler,
    statements: HashMap<&'static str, Statement>,
    signatures: Signatures,
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
    /// Round trips the next run of `sql` costs before its own exchange: direct, 1 for the
    /// prepare on its first use on this connection; through a transaction pooler, 3 on its
    /// first use in this process (BEGIN, the describe, COMMIT), then none.
    pub fn setup_round_trips(&self, sql: &'static str) -> u64 {
        match self.pooler {
            Pooler::None => u64::from(!self.statements.contains_key(sql)),
            Pooler::PgBouncerTransaction => {
                if self.signature(sql).is_some() {
                    0
                } else {
                    3
                }
            }
        }
    }

    /// Gets `sql` ready to run with `params`: direct, its statement (prepared on its first
    /// use on this connection); through a transaction pooler, the parameters with their
    /// types (learnt once per process). Nothing of the statement itself has been sent
    /// when this returns, so a connection lost here never ran it.
    pub async fn prepare<'a>(
        &mut self,
        sql: &'static str,
        params: &'a [&'a (dyn ToSql + Sync)],
    ) -> Result<Prepared<'a>, tokio_postgres::Error> {
        Ok(match self.pooler {
            Pooler::None => Prepared::Named(self.statement(sql).await?, params),
            Pooler::PgBouncerTransaction => Prepared::Unnamed(sql, self.typed(sql, params).await?),
        })
    }

    /// Runs a prepared statement and returns its rows: one Bind/Execute exchange (direct),
    /// or one Parse/Bind/Execute exchange of the unnamed statement.
    pub async fn query(&self, prepared: &Prepared<'_>) -> Result<Vec<Row>, tokio_postgres::Error> {
        match prepared {
            Prepared::Named(statement, params) => self.client.query(statement, params).await,
            Prepared::Unnamed(sql, typed) => self.client.query_typed(sql, typed).await,
        }
    }

    /// Like [`query`](Self::query) for a statement without rows: how many it changed.
    pub async fn execute(&self, prepared: &Prepared<'_>) -> Result<u64, tokio_postgres::Error> {
        match prepared {
            Prepared::Named(statement, params) => self.client.execute(statement, params).await,
            Prepared::Unnamed(sql, typed) => self.client.execute_typed(sql, typed).await,
        }
    }

    /// The statement for `sql`, prepared once per connection (the first use costs one
    /// extra round trip; every later one is a single Bind/Execute exchange).
    async fn statement(&mut self, sql: &'static str) -> Result<Statement, tokio_postgres::Error> {
        if let Some(statement) = self.statements.get(sql) {
            return Ok(statement.clone());
        }
        let statement = self.client.prepare(sql).await?;
        self.statements.insert(sql, statement.clone());
        Ok(statement)
    }

    fn signature(&self, sql: &'static str) -> Option<Arc<[Type]>> {
        let known = self.signatures.lock().unwrap_or_else(|e| e.into_inner());
        known.get(sql).cloned()
    }

    /// `params` with the types the server gave `sql`'s parameters. Learnt inside a
    /// transaction, which a transaction pooler keeps on one server session, so the
    /// statement it names is described and closed where it was parsed.
    async fn typed<'a>(
        &mut self,
        sql: &'static str,
        params: &[&'a (dyn ToSql + Sync)],
    ) -> Result<Vec<(&'a (dyn ToSql + Sync), Type)>, tokio_postgres::Error> {
        let types = match self.signature(sql) {
            Some(types) => types,
            None => {
                let transaction = self.client.transaction().await?;
                let statement = transaction.prepare(sql).await?;
                let types: Arc<[Type]> = statement.params().into();
                // Closed before the COMMIT, so on the same server session.
                drop(statement);
                transaction.commit().await?;
                let mut known = self.signatures.lock().unwrap_or_else(|e| e.into_inner());
                known.insert(sql, types.clone());
                types
            }
        };
        Ok(params.iter().copied().zip(types.iter().cloned()).collect())
    }
}

/// A statement ready to run ([`Connection::prepare`]).
pub enum Prepared<'a> {
    /// Prepared on this connection (direct).
    Named(Statement, &'a [&'a (dyn ToSql + Sync)]),
    /// The unnamed statement with typed parameters (through a transaction pooler).
    Unnamed(&'static str, Vec<(&'a (dyn ToSql + Sync), Type)>),
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
    /// A connection pooler answered where PostgreSQL itself was expected.
    #[error(
        "a connection pooler (PgBouncer or the like) answers at this address, not PostgreSQL \
         itself (the server announced process {announced}, the session runs in process \
         {session}); named prepared statements and session settings would be shared with \
         other clients' sessions. For PgBouncer with pool_mode=transaction (Azure's built-in \
         one on port 6432) set PAYMENTS_POSTGRES_POOLER=pgbouncer-transaction and give the \
         role its limits (docs/reference.md, PgBouncer); or use the server's own port (5432), \
         which `provision` always needs"
    )]
    Pooled { announced: i32, session: i32 },
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
    pooler: Pooler,
    signatures: Signatures,
}

impl Manager {
    pub fn new(settings: &PostgresSettings) -> anyhow::Result<Self> {
        let login = match &settings.auth {
            PostgresAuth::Password => Login::Password,
            PostgresAuth::Entra(identity) => {
                Login::Entra(claims_payments_settings::entra::credential(identity)?)
            }
        };
        Ok(Manager {
            config: settings.config.clone(),
            tls: tls_connector()?,
            login,
            pooler: settings.pooler,
            signatures: Signatures::default(),
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
            pooler: settings.pooler,
            signatures: Signatures::default(),
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
            pooler: self.pooler,
            statements: HashMap::new(),
            signatures: self.signatures.clone(),
            retire_at,
            task,
        };
        if self.pooler == Pooler::None {
            // One round trip, as the SETs alone were.
            let answer = connection.client.simple_query(SESSION_SETUP).await?;
            let session = answer.iter().find_map(|m| match m {
                SimpleQueryMessage::Row(row) => row.get(0)?.parse::<i32>().ok(),
                _ => None,
            });
            if let (Some(announced), Some(session)) =
                (announced_process(&connection.client).await, session)
            {
                if announced != session {
                    return Err(ConnectError::Pooled { announced, session });
                }
            }
        }
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

/// The pool: at most `settings.pool_size` connections; a caller waits at most
/// `wait` for one (then the store answers Transient: the pool is exhausted).
pub fn build(settings: &PostgresSettings, wait: Duration) -> anyhow::Result<Pool> {
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

/// Whether the connection's server session is the one its server announced: `false`
/// through a pooler, `true` straight to PostgreSQL (or a plain TCP proxy); `None` when it
/// cannot be told.
pub async fn own_session(client: &Client) -> Option<bool> {
    let row = client
        .query_typed("SELECT pg_backend_pid()", &[])
        .await
        .ok()?;
    let session: i32 = row.first()?.try_get(0).ok()?;
    Some(announced_process(client).await? == session)
}

/// The process id the server announced for this connection (its BackendKeyData).
/// tokio-postgres keeps it to itself, but writes it into a cancel request: the request is
/// written into memory here (nothing is sent anywhere) and read back. A TLS connection's
/// request starts with an SSLRequest, answered "willing" and then carried without TLS.
async fn announced_process(client: &Client) -> Option<i32> {
    let (mut ours, theirs) = tokio::io::duplex(64);
    ours.write_all(b"S").await.ok()?;
    client
        .cancel_token()
        .cancel_query_raw(theirs, InMemory)
        .await
        .ok()?;
    let mut bytes = Vec::new();
    ours.read_to_end(&mut bytes).await.ok()?;
    // CancelRequest: length 16, code 80877102, process id, secret key.
    let request = bytes.get(bytes.len().checked_sub(16)?..)?;
    if request[..8] != [0, 0, 0, 16, 0x04, 0xd2, 0x16, 0x2e] {
        return None;
    }
    Some(i32::from_be_bytes(request[8..12].try_into().ok()?))
}

/// The "TLS" of [`announced_process`]'s in-memory cancel request: none.
struct InMemory;

impl tokio_postgres::tls::TlsConnect<DuplexStream> for InMemory {
    type Stream = Plain;
    type Error = std::io::Error;
    type Future = std::future::Ready<Result<Plain, std::io::Error>>;

    fn connect(self, stream: DuplexStream) -> Self::Future {
        std::future::ready(Ok(Plain(stream)))
    }
}

struct Plain(DuplexStream);

impl tokio_postgres::tls::TlsStream for Plain {
    fn channel_binding(&self) -> tokio_postgres::tls::ChannelBinding {
        tokio_postgres::tls::ChannelBinding::none()
    }
}

impl AsyncRead for Plain {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Plain {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// Through a transaction pooler: refuses a role without the limits that direct
/// connections set on their sessions (a statement or a lock wait could hold an invocation,
/// and a server session, without bound), naming the statements that give them.
pub async fn check_role_limits(client: &Client) -> anyhow::Result<()> {
    let rows = client
        .query_typed(
            "SELECT name, setting, quote_ident(current_user) FROM pg_settings \
             WHERE name = ANY($1)",
            &[(
                &SESSION_LIMITS.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
                Type::TEXT_ARRAY,
            )],
        )
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot read the session limits: {}",
                super::describe::describe_postgres_error(&e)
            )
        })?;
    let unset: Vec<&str> = SESSION_LIMITS
        .iter()
        .map(|(name, _)| *name)
        .filter(|name| {
            !rows.iter().any(|r| {
                r.try_get::<_, &str>(0).ok() == Some(*name)
                    && r.try_get::<_, &str>(1).is_ok_and(|v| v != "0")
            })
        })
        .collect();
    if unset.is_empty() {
        return Ok(());
    }
    let role: String = rows
        .first()
        .and_then(|r| r.try_get(2).ok())
        .unwrap_or_else(|| "<the login role>".into());
    let fix: Vec<String> = SESSION_LIMITS
        .iter()
        .map(|(name, value)| format!("ALTER ROLE {role} SET {name} = '{value}';"))
        .collect();
    anyhow::bail!(
        "PAYMENTS_POSTGRES_POOLER=pgbouncer-transaction: the login role has no {} (0 means \
         none), and through a transaction pooler the service sets nothing on a session; as \
         an administrator run {} (then new server sessions have them; docs/reference.md, \
         PgBouncer)",
        unset.join(", "),
        fix.join(" ")
    )
}
