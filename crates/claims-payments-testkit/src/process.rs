//! Starting the real binary and the `cosmos-emulator` binary as child processes, one
//! way for the tests, the simulator and the benchmark.
//!
//! [`ServeSpec`] says how to start `<exe> serve` (environment, log file, readiness
//! timeout, CPUs); [`ServeProcess`] starts one on a fresh loopback port (the Functions
//! host picks a new random port on every start) and waits until `GET /` answers, like
//! the host's readiness probe (any HTTP answer counts); it can be killed, stopped and
//! waited for. The simulator's supervisor (restarts, generations) builds on it; the
//! tests' blocking [`crate::service::Handler`] starts the same command and probes the
//! same way. [`CosmosEmulator`] runs the `cosmos-emulator` dev binary. Every child is
//! SIGKILLed when its handle is dropped (`kill_on_drop`), so no exit path leaves a
//! process behind.

use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use claims_payments_settings::names;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

/// Settings the simulator and the benchmark always control, removed from the
/// inherited environment so a developer's shell cannot change a run behind its back:
/// every setting the product reads, and the dev-only ones.
pub fn controlled_env() -> impl Iterator<Item = &'static str> {
    names::PRODUCT
        .iter()
        .copied()
        .chain(claims_payments::seams::configuration::DEV_ONLY_SETTINGS)
        .chain(claims_payments::seams::telemetry::export::SETTINGS)
}

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
    /// `exe serve`, ready within 20 s, output discarded.
    pub fn new(exe: impl Into<PathBuf>) -> Self {
        let exe = exe.into();
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

    pub fn envs<'a>(mut self, env: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        self.env
            .extend(env.into_iter().map(|(k, v)| (k.to_owned(), v.to_owned())));
        self
    }

    /// The command for one start on `port`, and where this start's output begins in
    /// the log file (0 without one): the controlled settings removed from the inherited
    /// environment, the spec's set, output to the log (or discarded), the CPUs pinned.
    pub fn command(&self, port: u16) -> anyhow::Result<(std::process::Command, u64)> {
        use std::os::unix::process::CommandExt;
        let mut command = std::process::Command::new(&self.exe);
        command.args(&self.args).stdin(Stdio::null());
        for key in controlled_env() {
            command.env_remove(key);
        }
        command
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env(names::FUNCTIONS_CUSTOMHANDLER_PORT, port.to_string());
        let log_start = match &self.log {
            Some(path) => {
                let file = open_log(path)?;
                let start = file.metadata().map(|m| m.len()).unwrap_or(0);
                command.stdout(file.try_clone()?).stderr(file);
                start
            }
            None => {
                command.stdout(Stdio::null()).stderr(Stdio::null());
                0
            }
        };
        if let Some(cpus) = self.cpus.clone() {
            // SAFETY: the closure runs in the forked child before exec and only calls
            // the async-signal-safe sched_setaffinity on a set built before the fork.
            let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
            for cpu in cpus {
                unsafe { libc::CPU_SET(cpu, &mut set) };
            }
            unsafe {
                command.pre_exec(move || {
                    if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        Ok((command, log_start))
    }
}

/// A log file shared by successive starts: opened for appending, created if missing.
fn open_log(path: &Path) -> anyhow::Result<std::fs::File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("cannot open {}", path.display()))
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

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub async fn start(spec: &ServeSpec) -> anyhow::Result<ServeProcess> {
        Self::start_on(spec, None).await
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// [`Self::start`] on `port` when it is free, as the Functions host restarts a handler
    /// on the port it picked once; a new free port otherwise.
    pub async fn start_on(spec: &ServeSpec, port: Option<u16>) -> anyhow::Result<ServeProcess> {
        let mut last_error = String::new();
        let mut preferred = port;
        for _attempt in 0..3 {
            let port = match preferred.take() {
                Some(port) => port,
                None => free_port().context("no free loopback port")?,
            };
            let (command, log_start) = spec.command(port)?;
            let mut command = Command::from(command);
            command.kill_on_drop(true);
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

/// Whether `GET /` on `port` gets an HTTP answer (any status), within 500 ms.
pub async fn probe(port: u16) -> bool {
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

/// [`probe`] for a caller without a runtime.
pub fn probe_blocking(port: u16) -> bool {
    use std::io::Write;
    let timeout = Duration::from_millis(500);
    let attempt = || {
        let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let mut stream = std::net::TcpStream::connect_timeout(&address, timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        stream.write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")?;
        let mut head = [0u8; 5];
        stream.read_exact(&mut head)?;
        Ok::<bool, std::io::Error>(&head == b"HTTP/")
    };
    matches!(attempt(), Ok(true))
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
                command.stderr(open_log(path)?);
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

    /// The value of a setting it printed (`COSMOS_ENDPOINT`, `COSMOS_KEY`, ...).
    pub fn setting(&self, name: &str) -> Option<&str> {
        self.env
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// SIGTERM, as an operator stops it, and its exit status (bounded wait).
    pub async fn terminate(mut self) -> anyhow::Result<ExitStatus> {
        let pid = self.child.id().context("cosmos-emulator already exited")?;
        // SAFETY: kill(2) on the pid of our own, not yet reaped, child.
        if unsafe { libc::kill(pid as i32, libc::SIGTERM) } != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        Ok(
            tokio::time::timeout(Duration::from_secs(60), self.child.wait())
                .await
                .context("cosmos-emulator did not exit within 60 s of SIGTERM")??,
        )
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
