//! Running `claims-payments-dev serve` as a child process, the way the Functions host does.
//!
//! [`ServeProcess`] starts one process on a fresh loopback port (the host picks a new
//! random port on every start) and waits until `GET /` answers, like the host's
//! readiness probe (any HTTP answer counts). [`Supervisor`] keeps one running for the
//! simulator: when it dies (a SIGKILL from the crash fault knob, a kill requested by
//! the driver, a function timeout) it starts a new one on the same database, as the
//! host restarts a handler that exited. The simulator runs one supervisor per handler
//! instance. [`CosmosEmulator`] runs the `cosmos-emulator` dev binary that instances
//! share as their store. Every child is SIGKILLed when its handle is dropped
//! (`kill_on_drop`), so no exit path leaves a process behind.

use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use claims_payments::config::names;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

/// Settings the simulator and the benchmark always control, removed from the
/// inherited environment so a developer's shell cannot change a run behind its back:
/// every setting the product reads, and the dev-only ones.
pub fn controlled_env() -> impl Iterator<Item = &'static str> {
    names::PRODUCT
        .iter()
        .copied()
        .chain(claims_payments::config::DEV_ONLY_SETTINGS)
}

/// In a [`ServeSpec`] environment value, replaced by the supervisor's generation
/// number of the process being started (1 for the first, then one more per restart),
/// so that what a process sends can be traced back to that very process.
pub const GENERATION_TOKEN: &str = "{generation}";

/// How to start the handler.
#[derive(Debug, Clone)]
pub struct ServeSpec {
    pub exe: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// stdout and stderr of every start are appended here (none: discarded).
    pub log: Option<PathBuf>,
    pub ready_timeout: Duration,
    /// CPUs the process may run on (`sched_setaffinity` before exec, so every thread
    /// inherits it and the runtime sizes itself to them); `None`: inherited.
    pub cpus: Option<Vec<usize>>,
}

impl ServeSpec {
    pub fn new(exe: PathBuf) -> Self {
        ServeSpec {
            exe,
            args: vec!["serve".to_owned()],
            env: Vec::new(),
            log: None,
            ready_timeout: Duration::from_secs(20),
            cpus: None,
        }
    }

    /// Runs the process on these CPUs only.
    pub fn on_cpus(mut self, cpus: Vec<usize>) -> Self {
        self.cpus = Some(cpus);
        self
    }

    pub fn env(mut self, key: &str, value: impl Into<String>) -> Self {
        self.env.push((key.to_owned(), value.into()));
        self
    }

    /// This spec with [`GENERATION_TOKEN`] replaced by `generation` in the environment.
    pub fn for_generation(&self, generation: u64) -> ServeSpec {
        let mut spec = self.clone();
        for (_, value) in &mut spec.env {
            if value.contains(GENERATION_TOKEN) {
                *value = value.replace(GENERATION_TOKEN, &generation.to_string());
            }
        }
        spec
    }
}

/// A free loopback port. The port is released before the child binds it; the race
/// with another process is handled by retrying the start.
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind(("127.0.0.1", 0))?
        .local_addr()?
        .port())
}

/// At most the last `max` bytes written to a log file after offset `from`, for
/// error messages.
pub fn log_since(path: &Path, from: u64, max: u64) -> String {
    let Ok(mut file) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = file.seek(SeekFrom::Start(from.max(len.saturating_sub(max))));
    let mut bytes = Vec::new();
    let _ = file.read_to_end(&mut bytes);
    String::from_utf8_lossy(&bytes).trim().to_owned()
}

/// Peak resident set size (`VmHWM`) of a live process, in KiB.
pub fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// One running handler process.
#[derive(Debug)]
pub struct ServeProcess {
    child: Child,
    pub pid: u32,
    pub port: u16,
    /// Where this start's output begins in the spec's log file.
    log: Option<(PathBuf, u64)>,
    /// From exec to the first answer on `GET /`.
    pub startup: Duration,
}

enum NotReady {
    Exited(ExitStatus),
    TimedOut,
}

impl ServeProcess {
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub async fn start(spec: &ServeSpec) -> anyhow::Result<ServeProcess> {
        let mut last_error = String::new();
        for _attempt in 0..3 {
            let port = free_port().context("no free loopback port")?;
            let mut command = Command::new(&spec.exe);
            command
                .args(&spec.args)
                .stdin(Stdio::null())
                .kill_on_drop(true);
            for key in controlled_env() {
                command.env_remove(key);
            }
            command
                .envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
                .env(names::FUNCTIONS_CUSTOMHANDLER_PORT, port.to_string());
            let log_start = match &spec.log {
                Some(path) => {
                    let file = OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(path)
                        .with_context(|| format!("cannot open {}", path.display()))?;
                    let start = file.metadata().map(|m| m.len()).unwrap_or(0);
                    command.stdout(file.try_clone()?).stderr(file);
                    start
                }
                None => {
                    command.stdout(Stdio::null()).stderr(Stdio::null());
                    0
                }
            };
            if let Some(cpus) = spec.cpus.clone() {
                // SAFETY: the closure runs in the forked child before exec and only calls
                // the async-signal-safe sched_setaffinity on a set built before the fork.
                let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
                for cpu in cpus {
                    unsafe { libc::CPU_SET(cpu, &mut set) };
                }
                unsafe {
                    command.pre_exec(move || {
                        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
                            != 0
                        {
                            return Err(std::io::Error::last_os_error());
                        }
                        Ok(())
                    });
                }
            }
            let started = Instant::now();
            let mut child = command
                .spawn()
                .with_context(|| format!("cannot start {}", spec.exe.display()))?;
            let pid = child.id().unwrap_or(0);
            match wait_ready(&mut child, port, spec.ready_timeout).await {
                Ok(()) => {
                    return Ok(ServeProcess {
                        child,
                        pid,
                        port,
                        log: spec.log.clone().map(|p| (p, log_start)),
                        startup: started.elapsed(),
                    })
                }
                Err(NotReady::TimedOut) => {
                    let _ = child.start_kill();
                    bail!(
                        "`{} {}` did not answer GET / within {:?}",
                        spec.exe.display(),
                        spec.args.join(" "),
                        spec.ready_timeout
                    );
                }
                Err(NotReady::Exited(status)) => {
                    // Only what this start wrote: earlier starts append to the same log.
                    let output = spec
                        .log
                        .as_deref()
                        .map(|p| log_since(p, log_start, 4096))
                        .unwrap_or_default();
                    last_error = format!("exited with {status} before it was ready: {output}");
                    // Another process may have taken the port between our probe and the
                    // child's bind: try again on a new port. Anything else is final.
                    if !output.to_ascii_lowercase().contains("address") {
                        break;
                    }
                }
            }
        }
        bail!("`{} serve` {last_error}", spec.exe.display())
    }

    /// SIGKILL, without waiting.
    pub fn kill(&mut self) {
        let _ = self.child.start_kill();
    }

    pub fn peak_rss_kib(&self) -> Option<u64> {
        peak_rss_kib(self.pid)
    }

    /// The last line this process wrote to the log, if it has one.
    pub fn last_log_line(&self) -> Option<String> {
        let (path, from) = self.log.as_ref()?;
        let tail = log_since(path, *from, 2048);
        tail.lines().last().map(|l| l.chars().take(400).collect())
    }

    pub async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        self.child.wait().await
    }

    /// Kills the process and reaps it (bounded).
    pub async fn stop(mut self) {
        self.kill();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await;
    }
}

/// Polls `GET /` over a raw socket until any HTTP answer arrives, the child exits,
/// or the timeout passes. A raw request keeps the probe's own cost out of the
/// measured start-up time.
async fn wait_ready(child: &mut Child, port: u16, timeout: Duration) -> Result<(), NotReady> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(NotReady::Exited(status));
        }
        if probe(port).await {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(NotReady::TimedOut);
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

async fn probe(port: u16) -> bool {
    let attempt = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        stream
            .write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            .await?;
        let mut head = [0u8; 5];
        stream.read_exact(&mut head).await?;
        Ok::<bool, std::io::Error>(&head == b"HTTP/")
    };
    matches!(
        tokio::time::timeout(Duration::from_millis(500), attempt).await,
        Ok(Ok(true))
    )
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
        let first = ServeProcess::start(&spec.for_generation(1)).await?;
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
        match ServeProcess::start(&spec.for_generation(generation + 1)).await {
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

/// A running `cosmos-emulator` (the dev binary that serves the Cosmos SDK's in-memory
/// emulator over HTTP) and the settings it printed. Killed on drop; its data is gone
/// with it.
#[derive(Debug)]
pub struct CosmosEmulator {
    child: Child,
    /// `PAYMENTS_STORE=cosmos` and the `COSMOS_*` lines the emulator printed: what a
    /// `serve` or an operator command needs to use its container.
    pub env: Vec<(String, String)>,
}

impl CosmosEmulator {
    /// Starts `exe --port 0 --provision` (a free port, the service's database and
    /// container created) and waits (bounded) for its `ready` line. Its stderr goes to
    /// `log` if given.
    pub async fn start(exe: &Path, log: Option<&Path>) -> anyhow::Result<CosmosEmulator> {
        use tokio::io::AsyncBufReadExt;
        let mut command = Command::new(exe);
        command
            .args(["--port", "0", "--provision"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        for key in controlled_env() {
            command.env_remove(key);
        }
        match log {
            Some(path) => {
                let file = OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .with_context(|| format!("cannot open {}", path.display()))?;
                command.stderr(file);
            }
            None => {
                command.stderr(Stdio::null());
            }
        }
        let mut child = command.spawn().with_context(|| {
            format!(
                "cannot start {} (build it with `cargo build --bins`)",
                exe.display()
            )
        })?;
        let stdout = child
            .stdout
            .take()
            .context("no stdout from cosmos-emulator")?;
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let mut env = vec![(names::PAYMENTS_STORE.to_owned(), "cosmos".to_owned())];
        let read = async {
            while let Some(line) = lines.next_line().await? {
                if line.trim() == "ready" {
                    return anyhow::Ok(true);
                }
                if let Some((key, value)) = line.split_once('=') {
                    if key.starts_with("COSMOS_") {
                        env.push((key.to_owned(), value.trim().to_owned()));
                    }
                }
            }
            anyhow::Ok(false)
        };
        let ready = tokio::time::timeout(Duration::from_secs(60), read)
            .await
            .context("cosmos-emulator did not print `ready` within 60 s")??;
        let why = log.map(|p| log_since(p, 0, 2048)).unwrap_or_default();
        anyhow::ensure!(ready, "cosmos-emulator exited before it was ready: {why}");
        for name in [names::COSMOS_ENDPOINT, names::COSMOS_KEY] {
            anyhow::ensure!(
                env.iter().any(|(k, _)| k == name),
                "cosmos-emulator printed no {name}"
            );
        }
        // Keep draining stdout so the emulator can never block on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(CosmosEmulator { child, env })
    }

    /// Kills the emulator and reaps it (bounded).
    pub async fn stop(mut self) {
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await;
    }
}

/// A directory under the system temp dir, removed on drop.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(prefix: &str) -> std::io::Result<TempDir> {
        let path = std::env::temp_dir().join(format!("{prefix}-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&path)?;
        Ok(TempDir(path))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
