//! PostgreSQL beside SQLite: the consumer on each store, ledger-only, in the same rounds
//! (order rotating): fresh messages, then every process restarted and the same messages
//! again (duplicates at the store). The PostgreSQL server is a throwaway local one (the
//! testkit's, Debian's `postgresql-15`) with fsync on, as SQLite syncs its WAL; it runs on
//! this machine, unpinned, and its CPU (the postmaster and its backends, from
//! `/proc/<pid>/schedstat`) is reported beside `serve`'s. Round trips per message are the
//! deltas of the handler's `storeRoundTrips` counter (every statement sent, prepares
//! included), as for the other stores.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use serde::Serialize;

use super::{
    envelopes, load, measured, spec, store_round_trips, Accumulated, GeneratorPin, PhaseDeltas,
    PhaseFigures, Pinning, Run, StoreRoundTrips,
};
use super::{BenchArgs, ServeProcess, ServeSpec};
use claims_payments_settings::names;
use claims_payments_testkit::postgres::{PgServer, PG_BIN};

/// One store's consumer, ledger-only.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StorePhases {
    pub store: String,
    pub fresh: PhaseFigures,
    pub duplicate_at_store: PhaseFigures,
    /// CPU the database server's processes spent per message (PostgreSQL only; SQLite
    /// runs inside `serve`).
    pub db_server_cpu_us_fresh: Option<f64>,
    pub db_server_cpu_us_duplicate_at_store: Option<f64>,
}

/// SQLite and PostgreSQL measured in the same rounds.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StoreComparison {
    pub postgres_server: String,
    pub requests_per_phase: usize,
    pub rounds: usize,
    pub sqlite: StorePhases,
    pub postgres: StorePhases,
}

/// CPU time of the postmaster and its children (the backends), microseconds.
fn postgres_cpu_us(postmaster: u32) -> f64 {
    let mut total = super::task_cpu_us(Path::new(&format!("/proc/{postmaster}"))).unwrap_or(0.0);
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return total;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // ppid is the second field after the command's closing ')'.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(postmaster) {
            total += super::task_cpu_us(&entry.path()).unwrap_or(0.0);
        }
    }
    total
}

/// `serve` on the PostgreSQL database `url`.
fn postgres_spec(mut spec: ServeSpec, url: &str) -> ServeSpec {
    spec.env
        .retain(|(k, _)| k != names::PAYMENTS_STORE && k != names::PAYMENTS_SQLITE_PATH);
    let mut spec = spec
        .env(names::PAYMENTS_STORE, "postgres")
        .env(names::PAYMENTS_POSTGRES_URL, url)
        .env(names::PAYMENTS_POSTGRES_AUTH, "password");
    spec.ready_timeout = std::time::Duration::from_secs(60);
    spec
}

/// The comparison and the PostgreSQL row of the round-trip table; `Err` says why they
/// were not measured.
pub(super) async fn beside_sqlite(
    args: &BenchArgs,
    exe: &Path,
    dir: &Path,
    client: &reqwest::Client,
    pinning: &Pinning,
) -> Result<(StoreComparison, StoreRoundTrips), String> {
    if args.skip_postgres {
        return Err("--skip-postgres".into());
    }
    if !Path::new(PG_BIN).join("pg_ctl").is_file() {
        return Err(format!(
            "no PostgreSQL server binaries in {PG_BIN} (apt-get install postgresql-15)"
        ));
    }
    measure(args, exe, dir, client, pinning)
        .await
        .map_err(|e| format!("the PostgreSQL measurement failed: {e:#}"))
}

async fn measure(
    args: &BenchArgs,
    exe: &Path,
    dir: &Path,
    client: &reqwest::Client,
    pinning: &Pinning,
) -> anyhow::Result<(StoreComparison, StoreRoundTrips)> {
    let server = tokio::task::spawn_blocking(PgServer::start_durable)
        .await
        .context("starting PostgreSQL")?
        .context("cannot start a throwaway PostgreSQL server")?;
    server.stop_when_this_process_exits();
    let url = server.url("postgres");
    let settings = claims_payments_postgres::PostgresSettings::from_url(&url)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    claims_payments_postgres::provision(&settings).await?;
    let postmaster = server
        .postmaster_pid()
        .context("no postmaster.pid in the throwaway server's directory")?;

    let comparison = phases(args, exe, dir, client, pinning, &url, postmaster).await?;
    let round_trips = store_round_trips(
        "postgres (throwaway local server, fsync on)",
        "",
        |name| postgres_spec(spec(exe, dir, &format!("rt-postgres-{name}")), &url),
        args.sample,
        args.concurrency,
        client,
    )
    .await?;
    Ok((comparison, round_trips))
}

/// The interleaved rounds: index 0 SQLite, 1 PostgreSQL.
async fn phases(
    args: &BenchArgs,
    exe: &Path,
    dir: &Path,
    client: &reqwest::Client,
    pinning: &Pinning,
    url: &str,
    postmaster: u32,
) -> anyhow::Result<StoreComparison> {
    const STORES: [&str; 2] = ["sqlite", "postgres"];
    let specs: Vec<ServeSpec> = STORES
        .iter()
        .map(|store| {
            let base = spec(exe, dir, &format!("cmp-{store}"))
                .env(names::PAYMENTS_DEV_HANDLER, "consumer");
            let s = match *store {
                "postgres" => postgres_spec(base, url),
                _ => base,
            };
            match pinning.serve_cpu {
                Some(cpu) => s.on_cpus(vec![cpu]),
                None => s,
            }
        })
        .collect();
    let _pinned = GeneratorPin::new(pinning)?;
    let mut processes = Vec::new();
    for spec in &specs {
        processes.push(ServeProcess::start(spec).await?);
    }
    let per_round = (args.requests / args.rounds).max(1);
    let warmup = (per_round / 10).clamp(50, 500);
    for (store, process) in STORES.iter().zip(&processes) {
        let (fresh, again) = envelopes(warmup, &format!("cmp-warmup-{store}"));
        let url = process.base_url();
        load(client, &url, Arc::new(fresh), args.concurrency, "recorded").await;
        load(client, &url, Arc::new(again), args.concurrency, "duplicate").await;
    }
    let mut fresh: [Accumulated; 2] = Default::default();
    let mut at_store: [Accumulated; 2] = Default::default();
    let mut db_cpu = [0.0f64; 2];
    for round in 0..args.rounds {
        let batches: Vec<(Arc<Vec<_>>, Arc<Vec<_>>)> = STORES
            .iter()
            .map(|store| {
                let (a, b) = envelopes(per_round, &format!("cmp-{store}-{round}"));
                (Arc::new(a), Arc::new(b))
            })
            .collect();
        let order = [round % 2, (round + 1) % 2];
        for (phase, db_cpu) in db_cpu.iter_mut().enumerate() {
            if phase == 1 {
                // Forget what each process saw: the duplicates now go to the store.
                for (i, process) in std::mem::take(&mut processes).into_iter().enumerate() {
                    process.stop().await;
                    processes.push(ServeProcess::start(&specs[i]).await?);
                }
            }
            for &i in &order {
                let bodies = if phase == 0 {
                    batches[i].0.clone()
                } else {
                    batches[i].1.clone()
                };
                let expected = if phase == 0 { "recorded" } else { "duplicate" };
                let db_before = (i == 1).then(|| postgres_cpu_us(postmaster));
                let (run, delta): (Run, PhaseDeltas) =
                    measured(client, &processes[i], bodies, args.concurrency, expected).await?;
                if let Some(before) = db_before {
                    *db_cpu += postgres_cpu_us(postmaster) - before;
                }
                let accumulated = if phase == 0 {
                    &mut fresh
                } else {
                    &mut at_store
                };
                accumulated[i].add(run, delta);
            }
        }
    }
    for process in processes {
        process.stop().await;
    }
    let [sqlite_fresh, postgres_fresh] = fresh.map(Accumulated::figures);
    let [sqlite_at_store, postgres_at_store] = at_store.map(Accumulated::figures);
    let pg_db = |total: f64, f: &PhaseFigures| super::per(total, f.requests as f64);
    Ok(StoreComparison {
        postgres_server: "throwaway local PostgreSQL 15 on this machine (fsync on, unpinned)"
            .to_owned(),
        requests_per_phase: per_round * args.rounds,
        rounds: args.rounds,
        postgres: StorePhases {
            store: "postgres".to_owned(),
            db_server_cpu_us_fresh: Some(pg_db(db_cpu[0], &postgres_fresh)),
            db_server_cpu_us_duplicate_at_store: Some(pg_db(db_cpu[1], &postgres_at_store)),
            fresh: postgres_fresh,
            duplicate_at_store: postgres_at_store,
        },
        sqlite: StorePhases {
            store: "sqlite".to_owned(),
            fresh: sqlite_fresh,
            duplicate_at_store: sqlite_at_store,
            db_server_cpu_us_fresh: None,
            db_server_cpu_us_duplicate_at_store: None,
        },
    })
}

impl StoreComparison {
    /// The side-by-side table with PostgreSQL / SQLite ratios.
    pub fn render(&self, o: &mut impl std::fmt::Write) {
        let _ = writeln!(
            o,
            "postgresql beside sqlite (consumer, ledger-only, {} per phase in {} rounds, interleaved; postgres: {}):",
            self.requests_per_phase, self.rounds, self.postgres_server
        );
        let _ = writeln!(
            o,
            "  {:<24} {:<9} {:>9} {:>8} {:>8} {:>8} {:>11} {:>11} {:>11}",
            "phase",
            "store",
            "inv/s",
            "p50 ms",
            "p99 ms",
            "rt/msg",
            "serve us",
            "db srv us",
            "cpu us/msg"
        );
        let total =
            |f: &PhaseFigures, db: Option<f64>| f.server_cpu_us_per_message + db.unwrap_or(0.0);
        for (label, s, p) in [
            (
                "fresh",
                (&self.sqlite.fresh, self.sqlite.db_server_cpu_us_fresh),
                (&self.postgres.fresh, self.postgres.db_server_cpu_us_fresh),
            ),
            (
                "duplicate at the store",
                (
                    &self.sqlite.duplicate_at_store,
                    self.sqlite.db_server_cpu_us_duplicate_at_store,
                ),
                (
                    &self.postgres.duplicate_at_store,
                    self.postgres.db_server_cpu_us_duplicate_at_store,
                ),
            ),
        ] {
            for (store, (f, db)) in [("sqlite", s), ("postgres", p)] {
                let _ = writeln!(
                    o,
                    "  {:<24} {:<9} {:>9.0} {:>8.2} {:>8.2} {:>8.3} {:>11.0} {:>11} {:>11.0}{}",
                    label,
                    store,
                    f.invocations_per_second,
                    f.p50_ms,
                    f.p99_ms,
                    f.store_round_trips_per_message,
                    f.server_cpu_us_per_message,
                    db.map_or("-".to_owned(), |d| format!("{d:.0}")),
                    total(f, db),
                    if f.errors + f.unexpected_outcomes > 0 {
                        format!(
                            "  ({} errors, {} unexpected)",
                            f.errors, f.unexpected_outcomes
                        )
                    } else {
                        String::new()
                    }
                );
            }
            let (sf, sdb) = s;
            let (pf, pdb) = p;
            let _ = writeln!(
                o,
                "  {:<24} {:<9} {:>8.2}x {:>7.2}x {:>7.2}x {:>7.2}x {:>10.2}x {:>11} {:>10.2}x",
                "",
                "pg/sqlite",
                super::ratio(pf.invocations_per_second, sf.invocations_per_second),
                super::ratio(pf.p50_ms, sf.p50_ms),
                super::ratio(pf.p99_ms, sf.p99_ms),
                super::ratio(
                    pf.store_round_trips_per_message,
                    sf.store_round_trips_per_message
                ),
                super::ratio(pf.server_cpu_us_per_message, sf.server_cpu_us_per_message),
                "",
                super::ratio(total(pf, pdb), total(sf, sdb)),
            );
        }
    }
}
