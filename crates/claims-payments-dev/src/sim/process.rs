//! Keeping `claims-payments-dev serve` running the way the Functions host does, on the
//! testkit's one spawner ([`ServeProcess`], [`ServeSpec`]).
//!
//! [`Supervisor`] keeps one running for the simulator: when it dies (a SIGKILL from the
//! crash fault knob, a kill requested by the driver, a function timeout) it starts a new
//! one on the same database, as the host restarts a handler that exited. The simulator runs one supervisor per handler
//! instance.

use std::process::ExitStatus;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use claims_payments_testkit::process::{ServeProcess, ServeSpec};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

/// In a [`ServeSpec`] environment value, replaced by the supervisor's generation
/// number of the process being started (1 for the first, then one more per restart),
/// so that what a process sends can be traced back to that very process.
pub const GENERATION_TOKEN: &str = "{generation}";

/// `spec` with [`GENERATION_TOKEN`] replaced by `generation` in the environment.
pub fn for_generation(spec: &ServeSpec, generation: u64) -> ServeSpec {
    let mut spec = spec.clone();
    for (_, value) in &mut spec.env {
        if value.contains(GENERATION_TOKEN) {
            *value = value.replace(GENERATION_TOKEN, &generation.to_string());
        }
    }
    spec
}

/// Where the driver sends invocations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// Increases with every (re)start, so a kill request for a process that is
    /// already gone cannot hit its successor.
    pub generation: u64,
    pub base_url: Arc<str>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Slot {
    Starting,
    Ready(Endpoint),
    Failed(String),
    Stopped,
}

/// Why the driver kills the handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillReason {
    /// `--kill-rate`: a crash at a random moment.
    Chaos,
    /// An invocation exceeded functionTimeout: the host restarts the worker.
    FunctionTimeout,
    /// The sandbox bank holds a payout request of this process: it dies mid-payout.
    MidPayout,
}

enum Control {
    Kill(u64, KillReason),
    Stop(oneshot::Sender<()>),
}

/// How the handler processes ended.
#[derive(Debug, Default)]
pub struct ProcessStats {
    pub starts: AtomicU64,
    /// Died of SIGKILL that the driver did not send: the crash-after-commit fault.
    pub self_kills: AtomicU64,
    pub chaos_kills: AtomicU64,
    pub mid_payout_kills: AtomicU64,
    pub timeout_kills: AtomicU64,
    /// Any other exit (a panic, an error exit): always a finding.
    pub unexpected_exits: AtomicU64,
    pub unexpected_exit_statuses: Mutex<Vec<String>>,
    pub startup_micros: Mutex<Vec<u64>>,
    pub current_pid: AtomicU32,
}

/// Keeps one handler process alive and restarts it when it dies.
pub struct Supervisor {
    slot: watch::Receiver<Slot>,
    control: mpsc::UnboundedSender<Control>,
    task: JoinHandle<()>,
    pub stats: Arc<ProcessStats>,
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        // Dropping the task's future drops the child, which SIGKILLs it.
        self.task.abort();
    }
}

impl Supervisor {
    /// Starts the first process (errors surface here) and the restart loop.
    pub async fn start(spec: ServeSpec, max_restarts: u64) -> anyhow::Result<Supervisor> {
        let stats = Arc::new(ProcessStats::default());
        let first = ServeProcess::start(&for_generation(&spec, 1)).await?;
        record_start(&stats, &first);
        let (slot_tx, slot) = watch::channel(Slot::Starting);
        let (control, control_rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(supervise(
            spec,
            first,
            slot_tx,
            control_rx,
            stats.clone(),
            max_restarts,
        ));
        Ok(Supervisor {
            slot,
            control,
            task,
            stats,
        })
    }

    /// The live handler, waiting (bounded) while it restarts.
    pub async fn endpoint(&self, timeout: Duration) -> anyhow::Result<Endpoint> {
        let mut slot = self.slot.clone();
        let ready = tokio::time::timeout(timeout, slot.wait_for(|s| *s != Slot::Starting))
            .await
            .context("the handler did not come back after a restart")?
            .context("the supervisor stopped")?
            .clone();
        match ready {
            Slot::Ready(endpoint) => Ok(endpoint),
            Slot::Failed(why) => bail!("the handler cannot be restarted: {why}"),
            Slot::Stopped | Slot::Starting => bail!("the handler was stopped"),
        }
    }

    /// The live handler now, or None while it restarts (or after it stopped or failed).
    pub fn ready(&self) -> Option<Endpoint> {
        match &*self.slot.borrow() {
            Slot::Ready(endpoint) => Some(endpoint.clone()),
            _ => None,
        }
    }

    /// Why the handler could not be restarted, once the supervisor gave up.
    pub fn failure(&self) -> Option<String> {
        match &*self.slot.borrow() {
            Slot::Failed(why) => Some(why.clone()),
            _ => None,
        }
    }

    /// Waits until `generation` is no longer the live process (it died and the
    /// supervisor noticed), at most `timeout`.
    pub async fn wait_until_replaced(&self, generation: u64, timeout: Duration) {
        let mut slot = self.slot.clone();
        let _ = tokio::time::timeout(
            timeout,
            slot.wait_for(|s| !matches!(s, Slot::Ready(e) if e.generation == generation)),
        )
        .await;
    }

    /// Asks for a SIGKILL of `generation`; ignored if that process is already gone.
    pub fn kill(&self, generation: u64, reason: KillReason) {
        let _ = self.control.send(Control::Kill(generation, reason));
    }

    /// Asks for a SIGKILL of whichever process is live now (none while restarting).
    pub fn kill_current(&self, reason: KillReason) {
        if let Slot::Ready(endpoint) = &*self.slot.borrow() {
            self.kill(endpoint.generation, reason);
        }
    }

    /// Kills the current process and ends the restart loop.
    pub async fn stop(&self) {
        let (ack, done) = oneshot::channel();
        if self.control.send(Control::Stop(ack)).is_ok() {
            let _ = tokio::time::timeout(Duration::from_secs(10), done).await;
        }
    }
}

fn record_start(stats: &ProcessStats, process: &ServeProcess) {
    stats.starts.fetch_add(1, Ordering::Relaxed);
    stats.current_pid.store(process.pid, Ordering::Relaxed);
    if let Ok(mut v) = stats.startup_micros.lock() {
        v.push(process.startup.as_micros() as u64);
    }
}

async fn supervise(
    spec: ServeSpec,
    mut process: ServeProcess,
    slot: watch::Sender<Slot>,
    mut control: mpsc::UnboundedReceiver<Control>,
    stats: Arc<ProcessStats>,
    max_restarts: u64,
) {
    let mut generation = 1u64;
    let mut restarts = 0u64;
    loop {
        slot.send_replace(Slot::Ready(Endpoint {
            generation,
            base_url: Arc::from(process.base_url()),
        }));
        let mut requested: Option<KillReason> = None;
        let status = loop {
            tokio::select! {
                status = process.wait() => break status,
                message = control.recv() => match message {
                    Some(Control::Kill(g, reason)) if g == generation => {
                        requested.get_or_insert(reason);
                        process.kill();
                    }
                    Some(Control::Kill(..)) => {}
                    Some(Control::Stop(ack)) => {
                        slot.send_replace(Slot::Stopped);
                        process.stop().await;
                        let _ = ack.send(());
                        return;
                    }
                    None => {
                        slot.send_replace(Slot::Stopped);
                        process.stop().await;
                        return;
                    }
                },
            }
        };
        slot.send_replace(Slot::Starting);
        classify_exit(&stats, requested, status, || process.last_log_line());
        restarts += 1;
        if restarts > max_restarts {
            slot.send_replace(Slot::Failed(format!(
                "it died {restarts} times; giving up (limit {max_restarts})"
            )));
            return;
        }
        match ServeProcess::start(&for_generation(&spec, generation + 1)).await {
            Ok(next) => {
                record_start(&stats, &next);
                process = next;
                generation += 1;
            }
            Err(e) => {
                slot.send_replace(Slot::Failed(format!("{e:#}")));
                return;
            }
        }
    }
}

fn classify_exit(
    stats: &ProcessStats,
    requested: Option<KillReason>,
    status: std::io::Result<ExitStatus>,
    last_words: impl FnOnce() -> Option<String>,
) {
    use std::os::unix::process::ExitStatusExt;
    let killed = matches!(&status, Ok(s) if s.signal() == Some(9));
    match (requested, killed) {
        (Some(KillReason::Chaos), _) => stats.chaos_kills.fetch_add(1, Ordering::Relaxed),
        (Some(KillReason::FunctionTimeout), _) => {
            stats.timeout_kills.fetch_add(1, Ordering::Relaxed)
        }
        (Some(KillReason::MidPayout), _) => stats.mid_payout_kills.fetch_add(1, Ordering::Relaxed),
        (None, true) => stats.self_kills.fetch_add(1, Ordering::Relaxed),
        (None, false) => {
            let mut why = match status {
                Ok(s) => s.to_string(),
                Err(e) => e.to_string(),
            };
            if let Some(line) = last_words() {
                why.push_str(&format!(", last log line: {line}"));
            }
            if let Ok(mut v) = stats.unexpected_exit_statuses.lock() {
                v.push(why);
            }
            stats.unexpected_exits.fetch_add(1, Ordering::Relaxed)
        }
    };
}
