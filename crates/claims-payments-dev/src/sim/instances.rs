//! The handler instances: how each `serve` process starts (store, timings, faults, its
//! bank client name and log file), the bank's mid-payout kill wired to the process that
//! sent the request, and how the processes fared, read from their supervisors and logs.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use claims_payments_settings::names;
use claims_payments_testkit::process::ServeSpec;

use super::bank::FakeBank;
use super::options::{SimStore, SimulateArgs, Timings};
use super::process::{self, Supervisor};
use super::queue::Queue;
use super::{chance, driver, report};

/// How every instance's `serve` starts: the store, the timings, the faults, the bank.
pub(super) fn serve_spec(
    opts: &SimulateArgs,
    exe: &std::path::Path,
    store_env: &[(String, String)],
    timings: Timings,
    bank: Option<&FakeBank>,
    store: SimStore,
) -> ServeSpec {
    let mut spec = ServeSpec::new(exe);
    for (key, value) in store_env {
        spec = spec.env(key, value.clone());
    }
    spec = spec
        .env(names::BANK_TIMEOUT_MS, timings.bank_timeout_ms.to_string())
        .env(names::RETRY_BUDGET_MS, timings.retry_budget_ms.to_string())
        .env(names::LEASE_MS, timings.lease_ms.to_string())
        .env(
            names::PAYMENTS_POSTGRES_OUTAGE_WAIT_MS,
            timings.postgres_outage_wait_ms.to_string(),
        )
        .env(
            names::INFLIGHT_WAIT_MS,
            timings.inflight_wait_ms.to_string(),
        )
        .env(
            names::MAX_DELIVERY_COUNT,
            opts.max_delivery_count.to_string(),
        )
        .env(names::LOG_FORMAT, "json")
        // The per-instance takeover count reads the consumer's info lines.
        .env("RUST_LOG", serve_log_filter(std::env::var("RUST_LOG").ok()))
        .env("RUST_LIB_BACKTRACE", "0")
        .env(names::PAYMENTS_DEV_HANDLER, opts.handler.as_str())
        .env(
            names::PAYMENTS_FAULT_CRASH_AFTER_COMMIT,
            opts.crash_rate.to_string(),
        )
        .env(
            names::PAYMENTS_FAULT_STORE_DELAY_MS,
            opts.slow_store_ms.to_string(),
        );
    if let Some(bank) = bank {
        spec = spec.env(names::BANK_API_URL, bank.url());
        if opts.bank_key_window_ms > 0 {
            spec = spec.env(
                names::BANK_KEY_WINDOW_MS,
                opts.bank_key_window_ms.to_string(),
            );
        }
    }
    if store != SimStore::Sqlite {
        // Connecting checks the container or the schema first; slower than a file.
        spec.ready_timeout = Duration::from_secs(60);
    }
    spec
}

/// One supervisor per instance, each with its own bank client name and log file (and
/// where its log started, for the takeover count).
pub(super) async fn start_instances(
    spec: &ServeSpec,
    bank: Option<&FakeBank>,
    store: SimStore,
    instances: usize,
    serve_log: &std::path::Path,
    max_restarts: u64,
) -> anyhow::Result<(Vec<Arc<Supervisor>>, Vec<(PathBuf, u64)>)> {
    let mut supervisors = Vec::with_capacity(instances);
    let mut logs = Vec::with_capacity(instances);
    for i in 0..instances {
        let mut spec = spec.clone();
        if let Some(bank) = bank {
            // The bank knows each process by its URL, so a mid-payout fault can kill
            // exactly the process that sent the request (see `mid_payout_client`).
            spec.env.retain(|(k, _)| k != names::BANK_API_URL);
            spec = spec.env(
                names::BANK_API_URL,
                bank.client_url(&format!(
                    "instance-{}-gen-{}",
                    i + 1,
                    process::GENERATION_TOKEN
                )),
            );
        }
        if store != SimStore::Sqlite {
            // What Azure sets on each instance (and the guard against a SQLite store).
            spec = spec.env(
                names::WEBSITE_INSTANCE_ID,
                format!("sim-instance-{}", i + 1),
            );
        }
        let log = instance_log(serve_log, i, instances);
        let log_from = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
        spec.log = Some(log.clone());
        logs.push((log, log_from));
        let supervisor = Supervisor::start(spec, max_restarts)
            .await
            .with_context(|| format!("instance {} did not start", i + 1))?;
        supervisors.push(Arc::new(supervisor));
    }
    Ok((supervisors, logs))
}

/// The bank's mid-payout fault: the process that sent the request dies while the bank
/// holds it, and some of those messages are orphaned (dead-lettered, never re-driven).
pub(super) fn wire_mid_payout(
    bank: Option<&FakeBank>,
    supervisors: &[Arc<Supervisor>],
    queue: &Arc<Queue>,
    orphan_rate: f64,
    seed: u64,
) {
    if let Some(bank) = bank {
        let supervisors: Vec<_> = supervisors.iter().map(Arc::downgrade).collect();
        let queue = queue.clone();
        bank.on_mid_payout(Arc::new(move |key: &str, client: Option<&str>| {
            if chance::hit(orphan_rate, seed, "orphan", key.as_bytes(), 0) {
                if let Some((_, claim)) = key.rsplit_once("claim-payment-") {
                    queue.orphan_claim(claim);
                }
            }
            // The process that sent the request dies while the bank holds it. A
            // request from `reconcile` (no client name) kills nobody.
            if let Some((instance, generation)) = client.and_then(mid_payout_client) {
                if let Some(supervisor) = supervisors.get(instance).and_then(|s| s.upgrade()) {
                    supervisor.kill(generation, process::KillReason::MidPayout);
                }
            }
        }));
    }
}

/// How the handler processes fared, in all and per instance.
pub(super) fn process_summaries(
    supervisors: &[Arc<Supervisor>],
    host_stats: &driver::HostStats,
    logs: &[(PathBuf, u64)],
) -> (report::ProcessSummary, Vec<report::InstanceSummary>) {
    let instances = supervisors.len();
    let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let mut processes = report::ProcessSummary::default();
    let mut startups = Vec::new();
    let mut per_instance = Vec::with_capacity(instances);
    for (i, supervisor) in supervisors.iter().enumerate() {
        let stats = &supervisor.stats;
        let seen = host_stats.instances.get(i).cloned().unwrap_or_default();
        let summary = report::InstanceSummary {
            instance: i + 1,
            starts: load(&stats.starts),
            deliveries: seen.deliveries,
            completed: seen.completed,
            failed: seen.failed,
            cross_instance_redeliveries: seen.cross_instance_redeliveries,
            lock_expiries: seen.lock_expiries,
            takeovers: count_takeovers(&logs[i].0, logs[i].1),
            crash_after_commit: load(&stats.self_kills),
            chaos_kills: load(&stats.chaos_kills),
            mid_payout_kills: load(&stats.mid_payout_kills),
            timeout_restarts: load(&stats.timeout_kills),
            unexpected_exits: load(&stats.unexpected_exits),
            outcomes: seen.outcomes,
        };
        processes.starts += summary.starts;
        processes.crash_after_commit += summary.crash_after_commit;
        processes.chaos_kills += summary.chaos_kills;
        processes.mid_payout_kills += summary.mid_payout_kills;
        processes.timeout_restarts += summary.timeout_restarts;
        processes.unexpected_exits += summary.unexpected_exits;
        processes.host_stops += load(&stats.host_stops);
        processes.failed_starts += load(&stats.failed_starts);
        if let Ok(v) = stats.unexpected_exit_statuses.lock() {
            processes
                .unexpected_exit_statuses
                .extend(v.iter().map(|status| match instances {
                    1 => status.clone(),
                    _ => format!("instance {}: {status}", i + 1),
                }));
        }
        if let Ok(v) = stats.startup_micros.lock() {
            startups.extend(v.iter().copied());
        }
        per_instance.push(summary);
    }
    processes.startup_median_ms = median_ms(&startups);
    (processes, per_instance)
}

fn median_ms(micros: &[u64]) -> f64 {
    if micros.is_empty() {
        return 0.0;
    }
    let mut v = micros.to_vec();
    v.sort_unstable();
    v[v.len() / 2] as f64 / 1000.0
}

/// The client name an instance's process uses at the sandbox bank
/// (`instance-<n>-gen-<generation>`, see the `BANK_API_URL` each instance gets), as
/// (0-based instance, generation).
fn mid_payout_client(client: &str) -> Option<(usize, u64)> {
    let (instance, generation) = client.strip_prefix("instance-")?.split_once("-gen-")?;
    let instance: usize = instance.parse().ok()?;
    Some((instance.checked_sub(1)?, generation.parse().ok()?))
}

/// The log file of instance `i`: `path` itself for a single instance, else
/// `<stem>.<n>.<extension>` next to it.
fn instance_log(path: &std::path::Path, i: usize, instances: usize) -> PathBuf {
    if instances == 1 {
        return path.to_path_buf();
    }
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "serve".to_owned());
    let name = match path.extension() {
        Some(ext) => format!("{stem}.{}.{}", i + 1, ext.to_string_lossy()),
        None => format!("{stem}.{}", i + 1),
    };
    path.with_file_name(name)
}

/// The leases of earlier attempts an instance took over, from its log (which every
/// start of the instance appends to, so a restart loses no count the way the
/// process's own `/metrics` counters would), from byte `from` on.
fn count_takeovers(log: &std::path::Path, from: u64) -> u64 {
    use std::io::{BufRead, Seek, SeekFrom};
    let Ok(mut file) = std::fs::File::open(log) else {
        return 0;
    };
    if file.seek(SeekFrom::Start(from)).is_err() {
        return 0;
    }
    std::io::BufReader::new(file)
        .split(b'\n')
        .map_while(Result::ok)
        .filter(|line| {
            line.windows(TAKEOVER_LINE.len())
                .any(|w| w == TAKEOVER_LINE.as_bytes())
        })
        .count() as u64
}

/// `serve`'s log filter: the shell's `RUST_LOG` (default `info`), with the consumer's
/// info events kept whatever it says.
fn serve_log_filter(shell: Option<String>) -> String {
    match shell.as_deref().map(str::trim) {
        None | Some("") => "info".to_owned(),
        Some(filter) => format!("{filter},claims_payments::seams::consumer=info"),
    }
}

/// The message `serve` logs (at info) when it takes over the lease of an earlier
/// attempt (claims-payments src/consumer/); the same event counts `takeovers` in `/metrics`.
const TAKEOVER_LINE: &str = "took over the lease of an earlier attempt";

#[cfg(test)]
mod tests {
    use super::*;
    use claims_payments_testkit::process::TempDir;

    #[test]
    fn a_bank_client_name_is_an_instance_and_a_generation() {
        let url_part = format!("instance-3-gen-{}", process::GENERATION_TOKEN);
        let spec = ServeSpec::new("x").env("BANK_API_URL", format!("http://b/clients/{url_part}"));
        let started = process::for_generation(&spec, 12);
        assert_eq!(started.env[0].1, "http://b/clients/instance-3-gen-12");
        assert_eq!(mid_payout_client("instance-3-gen-12"), Some((2, 12)));
        assert_eq!(mid_payout_client("instance-0-gen-1"), None);
        assert_eq!(mid_payout_client("reconcile"), None);
        assert_eq!(mid_payout_client("instance-x-gen-1"), None);
    }

    #[test]
    fn instance_logs_sit_next_to_the_given_one() {
        let p = std::path::Path::new("/tmp/run/serve.log");
        assert_eq!(instance_log(p, 0, 1), p);
        assert_eq!(
            instance_log(p, 1, 3),
            std::path::Path::new("/tmp/run/serve.2.log")
        );
        assert_eq!(
            instance_log(std::path::Path::new("out"), 0, 2),
            std::path::Path::new("out.1")
        );
    }

    #[test]
    fn takeovers_are_counted_from_the_log_across_restarts() {
        let dir = TempDir::new("sim-takeovers").unwrap();
        let log = dir.path().join("serve.log");
        let line = |n: u32| {
            format!(
                "{{\"level\":\"INFO\",\"message\":\"{TAKEOVER_LINE}\",\"deliveryCount\":{n}}}\n"
            )
        };
        std::fs::write(&log, line(1)).unwrap();
        let from = std::fs::metadata(&log).unwrap().len();
        let mut more = String::new();
        more.push_str(&line(2));
        more.push_str("{\"message\":\"listening\"}\n");
        more.push_str(&line(3));
        // A process killed mid-line leaves a torn last line; it is not counted.
        more.push_str("{\"message\":\"took over the le");
        std::fs::write(&log, format!("{}{more}", line(1))).unwrap();
        assert_eq!(count_takeovers(&log, 0), 3);
        assert_eq!(count_takeovers(&log, from), 2);
        assert_eq!(count_takeovers(&dir.path().join("missing"), 0), 0);
        assert_eq!(serve_log_filter(None), "info");
        assert_eq!(
            serve_log_filter(Some("warn".into())),
            "warn,claims_payments::seams::consumer=info"
        );
    }
}
