//! The ledger the verdict reads: the store every instance and every `reconcile` run
//! share (a SQLite file, the `cosmos-emulator`'s container, or a PostgreSQL database),
//! opened for the run, and its payments read back as the verifier's rows.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use claims_payments::seams::store::{Listed, PaymentRecord, Store};
use claims_payments_settings::names;
use claims_payments_testkit::process::{CosmosEmulator, TempDir};

use super::options::{SimStore, SimulateArgs};
use super::pg;
use super::report::LedgerRow;

/// Converts the store's payment records into the verifier's rows.
/// The listed payments as the verifier reads them; a row that does not read fails the
/// verification, naming it.
pub fn ledger_rows(records: &[Listed<PaymentRecord>]) -> anyhow::Result<Vec<LedgerRow>> {
    records
        .iter()
        .map(|r| {
            let r = r
                .as_ref()
                .map_err(|corrupt| anyhow::anyhow!("a payment does not read: {corrupt}"))?;
            Ok(LedgerRow {
                claim_id: r.claim_id.to_string(),
                // The stored string (scale included), as the verifier always read it.
                amount: r.money.amount_string().parse().with_context(|| {
                    format!(
                        "ledger amount {:?} is not a decimal",
                        r.money.amount_string()
                    )
                })?,
                currency: r.money.currency().code().to_owned(),
                status: r.status.as_str().to_owned(),
                message_id: r.message_id.to_string(),
                bank_payment_id: r.bank_payment_id.clone(),
            })
        })
        .collect()
}

/// The store the handlers share, read for the verdict.
pub(super) enum Ledger {
    Sqlite(PathBuf),
    Cosmos(Box<claims_payments_cosmos::CosmosStore>),
    Postgres(Box<claims_payments_postgres::PostgresStore>),
}

impl Ledger {
    /// Connects to the Cosmos container that `env` (the emulator's lines) names.
    async fn cosmos(env: &[(String, String)]) -> anyhow::Result<Ledger> {
        let settings = claims_payments_cosmos::CosmosSettings::from_lookup(|name| {
            env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
        })
        .map_err(|e| anyhow::anyhow!("invalid Cosmos setting {e}"))?;
        let store = claims_payments_cosmos::CosmosStore::connect(
            &settings,
            Duration::from_secs(30 * 86_400),
        )
        .await
        .context("cannot connect to the emulator's Cosmos container")?;
        Ok(Ledger::Cosmos(Box::new(store)))
    }

    /// Every payment, as the verifier reads them: the listing, and for Cosmos a point
    /// read of each of `claims` the listing did not return (a cross-partition query is
    /// the emulator's model; a point read is the store's own path). Returns the rows
    /// and how many only the point reads found.
    pub(super) async fn all_rows(
        &self,
        limit: usize,
        claims: &[String],
    ) -> anyhow::Result<(Vec<LedgerRow>, usize)> {
        let mut rows = self.rows(limit).await?;
        let Ledger::Cosmos(store) = self else {
            return Ok((rows, 0));
        };
        let listed: std::collections::HashSet<String> = rows
            .iter()
            .filter_map(|r| claims_payments::ClaimId::parse(&r.claim_id).ok())
            .map(|c| c.to_string())
            .collect();
        let mut found = Vec::new();
        for claim in claims {
            let Ok(id) = claims_payments::ClaimId::parse(claim) else {
                continue;
            };
            if listed.contains(&id.to_string()) {
                continue;
            }
            let read = store
                .payment(id, claims_payments::Purpose::Payout)
                .await
                .map_err(|e| anyhow::anyhow!("cannot read the payment of claim {id}: {e}"))?;
            if let Some(payment) = read {
                found.push(Ok(payment.record));
            }
        }
        let missed = found.len();
        rows.extend(ledger_rows(&found)?);
        Ok((rows, missed))
    }

    /// At most `limit` payments, as the verifier reads them.
    pub(super) async fn rows(&self, limit: usize) -> anyhow::Result<Vec<LedgerRow>> {
        match self {
            Ledger::Sqlite(path) => read_sqlite_ledger(path, limit).await,
            Ledger::Cosmos(store) => {
                let records = store
                    .list_payments(limit)
                    .await
                    .map_err(|e| anyhow::anyhow!("cannot list payments in Cosmos: {e}"))?;
                ledger_rows(&records)
            }
            Ledger::Postgres(store) => {
                // A restart of the server may have cut the pool's connections.
                let mut tries = 0;
                loop {
                    tries += 1;
                    match store.list_payments(limit).await {
                        Ok(records) => return ledger_rows(&records),
                        Err(e) if tries < 10 => {
                            tracing::debug!(error = %e, "listing payments in PostgreSQL; trying again");
                            tokio::time::sleep(Duration::from_millis(500)).await;
                        }
                        Err(e) => bail!("cannot list payments in PostgreSQL: {e}"),
                    }
                }
            }
        }
    }
}

/// Reads every payment from a SQLite ledger file.
pub async fn read_sqlite_ledger(
    path: &std::path::Path,
    limit: usize,
) -> anyhow::Result<Vec<LedgerRow>> {
    let store = claims_payments_sqlite::SqliteStore::open(path)
        .with_context(|| format!("cannot open the ledger {}", path.display()))?;
    let records = store
        .list_payments(limit)
        .await
        .map_err(|e| anyhow::anyhow!("cannot list payments: {e}"))?;
    ledger_rows(&records)
}

/// The store every instance and every `reconcile` run share: its settings for `serve`,
/// the ledger the verdict reads, and the emulator or server that must outlive the run.
pub(super) struct SimLedger {
    pub(super) env: Vec<(String, String)>,
    pub(super) ledger: Ledger,
    pub(super) emulator: Option<CosmosEmulator>,
    pub(super) postgres: Option<pg::SimPostgres>,
}

pub(super) async fn open_store(
    opts: &SimulateArgs,
    store: SimStore,
    temp: &TempDir,
    exe: &std::path::Path,
) -> anyhow::Result<SimLedger> {
    let mut store_env: Vec<(String, String)> = Vec::new();
    let mut emulator = None;
    let mut postgres = None;
    let ledger = match store {
        SimStore::Sqlite => {
            let db = match &opts.sqlite_path {
                Some(path) => {
                    ensure!(
                        !path.exists(),
                        "{} exists; the simulator needs a new ledger to reconcile against",
                        path.display()
                    );
                    path.clone()
                }
                None => temp.path().join("payments.db"),
            };
            store_env.push((names::PAYMENTS_STORE.to_owned(), "sqlite".to_owned()));
            store_env.push((
                names::PAYMENTS_SQLITE_PATH.to_owned(),
                db.to_string_lossy().into_owned(),
            ));
            Ledger::Sqlite(db)
        }
        SimStore::Cosmos => {
            let path = opts
                .cosmos_emulator
                .clone()
                .unwrap_or_else(|| exe.with_file_name("cosmos-emulator"));
            let started =
                CosmosEmulator::start(&path, Some(&temp.path().join("cosmos-emulator.log")))
                    .await?;
            store_env.extend(started.env.iter().cloned());
            let ledger = Ledger::cosmos(&store_env).await?;
            emulator = Some(started);
            ledger
        }
        SimStore::Postgres => {
            let pg = pg::SimPostgres::start(opts.postgres_url.as_deref()).await?;
            ensure!(
                opts.restart_store_at.is_empty() || pg.throwaway(),
                "--restart-store-at needs the simulator's own server"
            );
            store_env.extend(pg.env());
            let ledger = Ledger::Postgres(Box::new(pg.ledger().await?));
            postgres = Some(pg);
            ledger
        }
    };

    Ok(SimLedger {
        env: store_env,
        ledger,
        emulator,
        postgres,
    })
}
