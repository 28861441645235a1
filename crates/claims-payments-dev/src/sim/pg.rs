//! `simulate --store postgres`: every instance on one real PostgreSQL server, a
//! throwaway one started here (the testkit's [`PgServer`]: Debian's `postgresql-15`
//! binaries, a fresh cluster on a free loopback port) or the database
//! `PAYMENTS_POSTGRES_URL` / `--postgres-url` names (it must hold no payments yet).
//! The schema is applied as `claims-payments provision` applies it.
//!
//! `--restart-store-at <fraction>` restarts the throwaway server with
//! `pg_ctl restart -m immediate` once that share of the messages has settled: every
//! connection is cut as in a crash, and the server recovers from its WAL, as in an
//! Azure Flexible Server failover.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use claims_payments::seams::store::Store;
use claims_payments_postgres::{Access, PostgresSettings, PostgresStore};
use claims_payments_settings::names;
use claims_payments_testkit::postgres::{PgServer, PG_BIN};
use indicatif::ProgressBar;
use serde::Serialize;

/// One restart of the server during a run.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StoreRestart {
    /// The `--restart-store-at` fraction.
    pub at: f64,
    /// Messages settled (of all sends) when it began.
    pub settled: u64,
    pub of: u64,
    /// Seconds into the run.
    pub at_secs: f64,
    /// How long `pg_ctl restart -m immediate -w` took (down, recovered, accepting).
    pub took_ms: u64,
}

/// The server the run's instances share.
pub struct SimPostgres {
    /// None: an existing server (`--postgres-url`), which is not restarted.
    server: Option<Arc<PgServer>>,
    url: String,
}

impl SimPostgres {
    /// The throwaway server (`url` None) or the given database, provisioned.
    pub async fn start(url: Option<&str>) -> anyhow::Result<SimPostgres> {
        let (server, url) = match url {
            Some(url) => (None, url.to_owned()),
            None => {
                ensure!(
                    std::path::Path::new(PG_BIN).join("pg_ctl").is_file(),
                    "--store postgres starts a throwaway PostgreSQL server with {PG_BIN}/initdb and \
                     pg_ctl, which are missing (apt-get install postgresql-15), or give an empty \
                     database with --postgres-url / PAYMENTS_POSTGRES_URL"
                );
                let server = tokio::task::spawn_blocking(PgServer::start)
                    .await
                    .context("starting PostgreSQL")?
                    .context("cannot start a throwaway PostgreSQL server")?;
                server.stop_when_this_process_exits();
                let url = server.url("postgres");
                (Some(Arc::new(server)), url)
            }
        };
        let settings = PostgresSettings::from_url(&url)
            .map_err(|e| anyhow::anyhow!("invalid PostgreSQL URL: {e}"))?;
        claims_payments_postgres::provision(&settings)
            .await
            .context("cannot provision the PostgreSQL schema")?;
        Ok(SimPostgres { server, url })
    }

    /// Whether the server is this run's own (and can be restarted).
    pub fn throwaway(&self) -> bool {
        self.server.is_some()
    }

    /// What `serve` and `reconcile` get.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            (names::PAYMENTS_STORE.to_owned(), "postgres".to_owned()),
            (names::PAYMENTS_POSTGRES_URL.to_owned(), self.url.clone()),
            (
                names::PAYMENTS_POSTGRES_AUTH.to_owned(),
                "password".to_owned(),
            ),
        ]
    }

    /// The store the verdict reads, connected as `serve` connects (schema checked);
    /// refuses a database that holds payments already.
    pub async fn ledger(&self) -> anyhow::Result<PostgresStore> {
        let settings = PostgresSettings::from_url(&self.url)
            .map_err(|e| anyhow::anyhow!("invalid PostgreSQL URL: {e}"))?;
        let store = PostgresStore::connect(&settings, Access::Checked).await?;
        let existing = store
            .list_payments(1)
            .await
            .map_err(|e| anyhow::anyhow!("cannot list payments in PostgreSQL: {e}"))?;
        ensure!(
            existing.is_empty(),
            "the PostgreSQL database at {} holds payments already; the simulator needs an empty one to reconcile against",
            store.target()
        );
        Ok(store)
    }

    /// Restarts the server (`pg_ctl restart -m immediate`) as the settled messages
    /// (`progress`'s position, of `total`) pass each of `fractions`, until `stop`.
    pub fn restarts(
        &self,
        fractions: &[f64],
        progress: ProgressBar,
        total: u64,
        started: Instant,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<anyhow::Result<Vec<StoreRestart>>> {
        let server = self.server.clone();
        let mut fractions = fractions.to_vec();
        fractions.sort_by(f64::total_cmp);
        tokio::spawn(async move {
            let mut done = Vec::new();
            let Some(server) = server else {
                return Ok(done);
            };
            for at in fractions {
                let target = ((at * total as f64).ceil() as u64).max(1);
                loop {
                    if *stop.borrow() {
                        return Ok(done);
                    }
                    if progress.position() >= target {
                        break;
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(20)) => {}
                        _ = stop.changed() => {}
                    }
                }
                let settled = progress.position();
                let at_secs = started.elapsed().as_secs_f64();
                let began = Instant::now();
                let server = server.clone();
                tokio::task::spawn_blocking(move || server.restart_immediate())
                    .await
                    .context("restarting PostgreSQL")??;
                tracing::info!(
                    at,
                    settled,
                    "PostgreSQL restarted (pg_ctl restart -m immediate)"
                );
                done.push(StoreRestart {
                    at,
                    settled,
                    of: total,
                    at_secs,
                    took_ms: began.elapsed().as_millis() as u64,
                });
            }
            Ok(done)
        })
    }
}
