//! The schema's versions: SQL migrations in `migrations/` (`V<n>__<name>.sql`), embedded
//! in the binary and applied by refinery, which records each in `refinery_schema_history`.
//!
//! `claims-payments provision` applies what is missing. `serve` and the operator commands
//! apply nothing: they refuse a database whose schema is missing, older or newer than this
//! build's, naming `claims-payments provision`, so two releases never write one database
//! with different ideas of its shape.

use std::fmt;

use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

use super::settings::PostgresSettings;

mod embedded {
    refinery::embed_migrations!("src/migrations");
}

/// The version of the newest migration this build carries.
pub const EXPECTED_SCHEMA_VERSION: u32 = 2;

/// What provisioning found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaReport {
    target: String,
    /// Migrations applied by this run, as `V<n>__<name>`.
    pub applied: Vec<String>,
    version: u32,
}

impl fmt::Display for SchemaReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.applied.is_empty() {
            write!(
                f,
                "PostgreSQL schema at {} is up to date (version {})",
                self.target, self.version
            )
        } else {
            write!(
                f,
                "PostgreSQL schema at {} migrated to version {} (applied {})",
                self.target,
                self.version,
                self.applied.join(", ")
            )
        }
    }
}

/// The embedded migrations: (version, name, checksum as refinery stores it).
fn expected() -> Vec<(u32, String, String)> {
    embedded::migrations::runner()
        .get_migrations()
        .iter()
        .map(|m| (m.version(), m.name().to_owned(), m.checksum().to_string()))
        .collect()
}

/// Refuses a database whose schema is not exactly this build's (read only: nothing is
/// created, not even refinery's history table).
pub async fn check_schema(client: &mut Client) -> anyhow::Result<()> {
    // Unnamed (one exchange): it also runs through a transaction pooler.
    let rows = match client
        .query_typed(
            "SELECT version, name, checksum FROM refinery_schema_history ORDER BY version",
            &[],
        )
        .await
    {
        Ok(rows) => rows,
        Err(e) if e.code() == Some(&SqlState::UNDEFINED_TABLE) => anyhow::bail!(
            "the database has no claims-payments schema; run `claims-payments provision` \
             with the same settings first"
        ),
        Err(e) => anyhow::bail!(
            "cannot read the schema version: {}",
            super::describe::describe_postgres_error(&e)
        ),
    };
    let applied: Vec<(u32, String, String)> = rows
        .iter()
        .map(|r| {
            let version: i32 = r.get(0);
            (u32::try_from(version).unwrap_or(0), r.get(1), r.get(2))
        })
        .collect();
    let newest = applied.last().map_or(0, |(v, _, _)| *v);
    if newest > EXPECTED_SCHEMA_VERSION {
        anyhow::bail!(
            "the schema is at version {newest}, newer than this build's {EXPECTED_SCHEMA_VERSION}: \
             a newer release migrated it; run that release (this one would misread its rows)"
        );
    }
    if newest < EXPECTED_SCHEMA_VERSION {
        anyhow::bail!(
            "the schema is at version {newest}, older than this build's {EXPECTED_SCHEMA_VERSION}; \
             run `claims-payments provision` with this release to migrate it"
        );
    }
    for (version, name, checksum) in &applied {
        let known = expected()
            .into_iter()
            .find(|(v, _, _)| v == version)
            .filter(|(_, n, c)| n == name && c == checksum);
        if known.is_none() {
            anyhow::bail!(
                "migration {version} ({name}) in the database differs from this build's: the \
                 schema was changed by hand or by another build; restore it, or run the build \
                 that wrote it"
            );
        }
    }
    Ok(())
}

/// The advisory lock that serialises `provision` runs on one database (advisory lock keys
/// are per database): "claims-p" in ASCII, a key no other tool is likely to take.
const MIGRATION_LOCK: i64 = 0x636c_6169_6d73_2d70;
/// How long a `provision` waits for another one to finish migrating.
const MIGRATION_LOCK_WAIT: &str = "5min";

/// Applies the missing migrations (each in its own transaction) and reports them.
///
/// Two runs at once (several instances' pipelines, or a pipeline and a person) would both
/// create refinery's history table and the schema, and one would fail on the catalog's
/// unique index. So the migrations run under a session-level advisory lock on the
/// migrating connection: the second run waits for the first, then finds every migration
/// applied and reports the schema up to date.
pub async fn provision(settings: &PostgresSettings) -> anyhow::Result<SchemaReport> {
    let target = settings.describe_target();
    // Migrations run as one session's work (its transactions, its statements); a
    // transaction pooler would spread them over other clients' sessions.
    anyhow::ensure!(
        settings.pooler == super::settings::Pooler::None,
        "provision needs PostgreSQL itself, not a transaction pooler: run it with the \
         server's own port (5432) in PAYMENTS_POSTGRES_URL and without \
         PAYMENTS_POSTGRES_POOLER (serve keeps both)"
    );
    let manager = super::pool::Manager::new(settings)?;
    let mut conn = deadpool::managed::Manager::create(&manager)
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot connect to PostgreSQL at {target} (PAYMENTS_POSTGRES_URL, {}): {}",
                settings.auth.describe(),
                super::errors::describe_connect_error(&e)
            )
        })?;
    let describe = |e: tokio_postgres::Error| super::describe::describe_postgres_error(&e);
    // For the lock's wait only: the session's lock_timeout (5 s) and statement_timeout
    // (10 s) would cut short the wait for another run's migrations. The migrations then run
    // under the pool's session settings again.
    conn.client
        .batch_execute(&format!(
            "SET lock_timeout = '{MIGRATION_LOCK_WAIT}'; SET statement_timeout = 0"
        ))
        .await
        .map_err(|e| anyhow::anyhow!("PostgreSQL at {target}: {}", describe(e)))?;
    conn.client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(|e| {
            if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) {
                anyhow::anyhow!(
                    "PostgreSQL at {target}: another `claims-payments provision` has been \
                     migrating this database for {MIGRATION_LOCK_WAIT}; let it finish (or find \
                     the session holding advisory lock {MIGRATION_LOCK} in pg_locks), then run \
                     provision again"
                )
            } else {
                anyhow::anyhow!(
                    "cannot take the migration lock at {target}: {}",
                    describe(e)
                )
            }
        })?;
    conn.client
        .batch_execute(super::pool::SESSION_SETUP)
        .await
        .map_err(|e| anyhow::anyhow!("PostgreSQL at {target}: {}", describe(e)))?;
    let migrated = embedded::migrations::runner()
        .set_abort_divergent(true)
        .set_abort_missing(true)
        .run_async(&mut conn.client)
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "migrating PostgreSQL at {target} failed: {}",
                super::describe::describe_refinery_error(&e)
            )
        });
    let checked = match &migrated {
        Ok(_) => check_schema(&mut conn.client).await,
        Err(_) => Ok(()),
    };
    // The session's end would release it too; unlocking says so, and lets a caller that
    // kept the connection go on without it.
    let _ = conn
        .client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
        .await;
    let report = migrated?;
    checked?;
    Ok(SchemaReport {
        target,
        applied: report
            .applied_migrations()
            .iter()
            .map(|m| format!("V{}__{}", m.version(), m.name()))
            .collect(),
        version: EXPECTED_SCHEMA_VERSION,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_expected_version_is_the_newest_embedded_migration() {
        let newest = expected().iter().map(|(v, _, _)| *v).max();
        assert_eq!(newest, Some(EXPECTED_SCHEMA_VERSION));
    }
}
