//! Keeping `claims-payments-dev serve` running the way the Functions host does, on the
//! testkit's one spawner ([`ServeProcess`], [`ServeSpec`]).
//!
//! [`Supervisor`] keeps one running for the simulator: when it dies (a SIGKILL from the
//! crash fault knob, a kill requested by the driver, a function timeout) it starts a new
//! one on the same database, as the host restarts a handler that exited. The simulator runs one supervisor per handler
//! instance.
//!
//! Unlike the real host it never gives up after a few exits: the chaos rates kill the
//! handler far more often than a host tolerates. It counts instead how often the host
//! would have stopped itself ([`HostRestartLimit`]), so the report can say so.

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

/// The host's limit on restarting a handler that exited: `HttpWorkerProcess`
/// publishes an `HttpWorkerErrorEvent` for every exit with a code other than 0 and 200
/// (a SIGKILL is one), and `HttpFunctionInvocationDispatcher.WorkerError` pushes it on
/// a stack that is emptied only when the new error comes more than
/// `WorkerRestartErrorIntervalThresholdInMinutes` (30) after the last one; with
/// `ErrorEventsThreshold` (3) errors on it, `RestartWorkerChannel` stops the host
/// ("Exceeded http worker restart retry count. Shutting down Functions Host") instead of
/// restarting the handler. A restart the host asks for itself (function timeout,
/// `RestartWorkerWithInvocationIdAsync`) disposes the process first, so its exit is no
/// error. (azure-functions-host 89dc438, src/WebJobs.Script/Workers/Http/.)
#[derive(Debug, Default)]
pub struct HostRestartLimit {
    errors: Vec<std::time::Instant>,
}

impl HostRestartLimit {
    pub const ERROR_EVENTS_THRESHOLD: usize = 3;
    pub const WINDOW: Duration = Duration::from_secs(30 * 60);

    /// Records a handler exit at `at`; true when the real host would stop itself now
    /// rather than restart the handler (then a new host starts with no errors counted).
    pub fn exited(&mut self, at: std::time::Instant) -> bool {
        if self
            .errors
            .last()
            .is_some_and(|&top| at.duration_since(top) > Self::WINDOW)
        {
            self.errors.clear();
        }
        self.errors.push(at);
        if self.errors.len() >= Self::ERROR_EVENTS_THRESHOLD {
            self.errors.clear();
            return true;
        }
        false
    }
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
    /// Exits after which the real host would have stopped itself ([`HostRestartLimit`]).
    pub host_stops: AtomicU64,
    pub startup_micros: Mutex<Vec<u64>>,
    pub current_pid: AtomicU32,
    /// Restarts that failed and were tried again (the store was unreachable: a
    /// PostgreSQL server restarting), as the host keeps restarting a worker.
    pub failed_starts: AtomicU64,
}

/// Tries of a restart, one a second, before the supervisor gives up: a store that is
/// briefly unreachable (a server restart) makes `serve` exit before it is ready.
const START_TRIES: u32 = 60;

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
        let live = |s: &Slot| match s {
            Slot::Starting => false,
            Slot::Ready(_) => !self.current_exited(),
            Slot::Failed(_) | Slot::Stopped => true,
        };
        let ready = tokio::time::timeout(timeout, slot.wait_for(live))
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
    /// A process that has exited is not live even before this supervisor has reaped it:
    /// the host's dispatcher turns to "restarting" in the exit event itself, so nothing
    /// new is sent to the dead port meanwhile.
    pub fn ready(&self) -> Option<Endpoint> {
        match &*self.slot.borrow() {
            Slot::Ready(endpoint) if !self.current_exited() => Some(endpoint.clone()),
            _ => None,
        }
    }

    /// Whether the current process has exited (a zombie not yet reaped counts).
    fn current_exited(&self) -> bool {
        exited(self.stats.current_pid.load(Ordering::Relaxed))
    }

    /// Why the handler could not be restarted, once the supervisor gave up.
    pub fn failure(&self) -> Option<String> {
        match &*self.slot.borrow() {
            Slot::Failed(why) => Some(why.clone()),
            _ => None,
        }
    }

    /// Waits until `generation` is no longer the live process (it died and the
    /// supervisor noticed), at most `timeout`; longer, up to `hold`, once the process
    /// is known to have exited (the supervisor is only late to reap it).
    pub async fn wait_until_replaced(&self, generation: u64, timeout: Duration, hold: Duration) {
        let mut slot = self.slot.clone();
        let replaced = |s: &Slot| !matches!(s, Slot::Ready(e) if e.generation == generation);
        if tokio::time::timeout(timeout, slot.wait_for(replaced))
            .await
            .is_err()
            && self.current_exited()
        {
            let _ = tokio::time::timeout(hold, slot.wait_for(replaced)).await;
        }
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

/// Whether the child `pid` has exited, without reaping it (`waitid` with `WNOWAIT`):
/// true from the moment it is a zombie, and once it is reaped (then it is no child).
fn exited(pid: u32) -> bool {
    if pid == 0 {
        return false;
    }
    // SAFETY: a zeroed siginfo_t is a valid out-parameter; WNOWAIT leaves the child
    // for the supervisor to reap.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let rc = libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        );
        match rc {
            0 => info.si_pid() != 0,
            // No such child: reaped already.
            _ => std::io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD),
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
    let mut limit = HostRestartLimit::default();
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
        if requested != Some(KillReason::FunctionTimeout) && limit.exited(std::time::Instant::now())
        {
            stats.host_stops.fetch_add(1, Ordering::Relaxed);
        }
        classify_exit(&stats, requested, status, || process.last_log_line());
        restarts += 1;
        if restarts > max_restarts {
            slot.send_replace(Slot::Failed(format!(
                "it died {restarts} times; giving up (limit {max_restarts})"
            )));
            return;
        }
        let mut tries = 0;
        let next = loop {
            tries += 1;
            // The host restarts the handler on the port it picked once.
            let port = Some(process.port());
            match ServeProcess::start_on(&for_generation(&spec, generation + 1), port).await {
                Ok(next) => break next,
                Err(e) if tries < START_TRIES => {
                    stats.failed_starts.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(error = %format!("{e:#}"), "serve did not start; trying again");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Err(e) => {
                    slot.send_replace(Slot::Failed(format!("{e:#} (after {tries} tries)")));
                    return;
                }
            }
        };
        record_start(&stats, &next);
        process = next;
        generation += 1;
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn the_host_stops_at_the_third_exit_without_a_thirty_minute_gap() {
        let t0 = Instant::now();
        let min = |m: u64| t0 + Duration::from_secs(m * 60);
        let mut limit = HostRestartLimit::default();
        assert!(!limit.exited(min(0)));
        assert!(!limit.exited(min(20)));
        // 31 minutes after the last one: the count starts again.
        assert!(!limit.exited(min(51)));
        assert!(!limit.exited(min(60)));
        assert!(limit.exited(min(80)));
        // A new host counts from zero.
        assert!(!limit.exited(min(81)));
        assert!(!limit.exited(min(82)));
        assert!(limit.exited(min(83)));
    }
}
