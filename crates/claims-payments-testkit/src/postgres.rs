//! A real PostgreSQL server for tests: the one named by `PAYMENTS_TEST_POSTGRES_URL`, or
//! else a throwaway one started here with Debian's `postgresql-15` binaries
//! (`/usr/lib/postgresql/15/bin`, not on PATH): a fresh cluster in a temporary directory,
//! on a free port, listening on 127.0.0.1 only, run as an unprivileged user (`nobody` when
//! the tests run as root: PostgreSQL refuses to run as root), stopped when dropped.
//!
//! Without the binaries and without the setting, a test is skipped with a loud SKIP line,
//! unless `CI` is set: then it fails, so CI cannot pass without having run them.
//!
//! Tests of one process share one server ([`shared`]); each gets its own database
//! ([`TestDatabase`]). A test that restarts or stops the server starts its own ([`PgServer`]).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use anyhow::Context;

/// Where Debian's package installs the server binaries.
pub const PG_BIN: &str = "/usr/lib/postgresql/15/bin";
/// An existing server to test against instead (a superuser's or a role with CREATEDB's
/// libpq URI); its tests create and drop their own databases.
pub const TEST_URL_SETTING: &str = "PAYMENTS_TEST_POSTGRES_URL";
/// The unprivileged user a root test process runs the server as.
const SERVER_USER: &str = "nobody";

/// Whether PostgreSQL tests can run here. `false` after printing a SKIP line when neither
/// the setting nor the binaries exist; panics instead when `CI` is set.
pub fn available() -> bool {
    if std::env::var_os(TEST_URL_SETTING).is_some() || binaries_present() {
        return true;
    }
    let why = format!(
        "no PostgreSQL: {TEST_URL_SETTING} is not set and {PG_BIN}/initdb is missing \
         (apt-get install postgresql)"
    );
    if std::env::var_os("CI").is_some() {
        panic!("{why}; CI must run the PostgreSQL tests");
    }
    eprintln!("SKIP ***** PostgreSQL tests skipped: {why} *****");
    false
}

/// Whether this machine can start servers of its own (tests that restart or stop one).
/// `false` after a SKIP line when only `PAYMENTS_TEST_POSTGRES_URL` is there.
pub fn can_start_servers() -> bool {
    if binaries_present() {
        return true;
    }
    eprintln!(
        "SKIP ***** this test starts its own PostgreSQL server and {PG_BIN} is missing *****"
    );
    false
}

fn binaries_present() -> bool {
    ["initdb", "pg_ctl"]
        .iter()
        .all(|b| Path::new(PG_BIN).join(b).is_file())
}

/// A throwaway PostgreSQL cluster, stopped (immediately: it holds nothing to keep) and
/// deleted when dropped.
pub struct PgServer {
    dir: tempfile::TempDir,
    port: u16,
    password: String,
    /// fsync and full-page writes on (the benchmark); off for tests (nothing to keep).
    durable: bool,
}

impl PgServer {
    /// initdb + pg_ctl start on a free loopback port. Password (SCRAM) authentication for
    /// TCP, so tests also see that no password reaches a log.
    pub fn start() -> anyhow::Result<PgServer> {
        Self::start_with(false)
    }

    /// [`start`](Self::start) with fsync and full-page writes on, as a real server
    /// commits: for measurements that compare it with a store that syncs its writes.
    pub fn start_durable() -> anyhow::Result<PgServer> {
        Self::start_with(true)
    }

    fn start_with(durable: bool) -> anyhow::Result<PgServer> {
        let dir = tempfile::Builder::new().prefix("cp-postgres-").tempdir()?;
        let password = format!("pw-{}", uuid::Uuid::new_v4().simple());
        let pwfile = dir.path().join("pwfile");
        std::fs::write(&pwfile, &password)?;
        if as_root() {
            // The cluster belongs to the server's user, which must reach its directory.
            chown_to_server_user(dir.path())?;
            chown_to_server_user(&pwfile)?;
        }
        let data = dir.path().join("data");
        run(pg_command("initdb")
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "-E", "UTF8", "--no-locale"])
            .args(["--auth-local=trust", "--auth-host=scram-sha-256"])
            .arg(format!("--pwfile={}", pwfile.display())))
        .context("initdb")?;
        let port = crate::process::free_port()?;
        let server = PgServer {
            dir,
            port,
            password,
            durable,
        };
        server.pg_ctl(&["start", "-w", "-t", "60"])?;
        Ok(server)
    }

    /// The superuser's URI for database `db`.
    pub fn url(&self, db: &str) -> String {
        format!(
            "postgresql://postgres:{}@127.0.0.1:{}/{db}",
            self.password, self.port
        )
    }

    /// The superuser's password (tests check it never reaches a log).
    pub fn password(&self) -> &str {
        &self.password
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `pg_ctl restart -m immediate`: every connection is cut as in a crash, and the
    /// server recovers from its WAL on the way up.
    pub fn restart_immediate(&self) -> anyhow::Result<()> {
        self.pg_ctl(&["restart", "-m", "immediate", "-w", "-t", "60"])
    }

    /// `pg_ctl stop -m immediate`: the server is gone (as in a failover's first moments)
    /// until [`start_again`](Self::start_again); its data stays.
    pub fn stop_immediate(&self) -> anyhow::Result<()> {
        self.pg_ctl(&["stop", "-m", "immediate", "-w", "-t", "60"])
    }

    /// Starts the stopped server again on the same port, with the same data.
    pub fn start_again(&self) -> anyhow::Result<()> {
        self.pg_ctl(&["start", "-w", "-t", "60"])
    }

    /// Stops the server and deletes its directory once this process is gone, however it
    /// ends (a SIGKILL skips `Drop`): for a long-lived tool such as the simulator.
    pub fn stop_when_this_process_exits(&self) {
        watch_for_exit(self);
    }

    /// The postmaster's process id (its backends are its children), while it runs.
    pub fn postmaster_pid(&self) -> Option<u32> {
        let pid = std::fs::read_to_string(self.data().join("postmaster.pid")).ok()?;
        pid.lines().next()?.trim().parse().ok()
    }

    /// The server's log, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn pg_ctl(&self, args: &[&str]) -> anyhow::Result<()> {
        // 127.0.0.1 only; the Unix socket lives in the cluster's own directory.
        let options = format!(
            "-c listen_addresses=127.0.0.1 -c port={} -c unix_socket_directories='{}' \
             -c max_connections=300 {}{}",
            self.port,
            self.dir.path().display(),
            if self.durable {
                "-c fsync=on -c full_page_writes=on"
            } else {
                "-c fsync=off -c full_page_writes=off"
            },
            if Path::new("/usr/lib/postgresql/15/lib/pg_stat_statements.so").is_file() {
                // Lets tests count the statements the server ran.
                " -c shared_preload_libraries=pg_stat_statements"
            } else {
                ""
            }
        );
        run(pg_command("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .arg("-l")
            .arg(self.dir.path().join("server.log"))
            .args(["-o", &options])
            .args(args))
        .with_context(|| format!("pg_ctl {}; server log: {}", args.join(" "), self.log()))
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        let _ = self.pg_ctl(&["stop", "-m", "immediate", "-w", "-t", "30"]);
    }
}

fn as_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn chown_to_server_user(path: &Path) -> anyhow::Result<()> {
    run(Command::new("chown")
        .arg(format!("{SERVER_USER}:"))
        .arg(path))
}

/// A PostgreSQL binary, run as the unprivileged user when we are root.
fn pg_command(binary: &str) -> Command {
    let exe = Path::new(PG_BIN).join(binary);
    if as_root() {
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", SERVER_USER, "--"]).arg(exe);
        cmd
    } else {
        Command::new(exe)
    }
}

fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    anyhow::ensure!(
        out.status.success(),
        "{:?} exited with {}: {}{}",
        cmd.get_program(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// The server the tests of this process share.
pub enum SharedServer {
    /// `PAYMENTS_TEST_POSTGRES_URL`.
    External(String),
    /// Started here. A static is never dropped, so a watchdog stops it once the test
    /// process has ended (however it ended).
    Local(PgServer),
}

impl SharedServer {
    /// The administrative URI for database `db` on this server.
    pub fn url(&self, db: &str) -> String {
        match self {
            SharedServer::External(url) => {
                let mut url =
                    reqwest::Url::parse(url).expect("PAYMENTS_TEST_POSTGRES_URL is a URI");
                url.set_path(&format!("/{db}"));
                url.to_string()
            }
            SharedServer::Local(server) => server.url(db),
        }
    }

    /// The database an administrative connection uses.
    fn admin_db(&self) -> String {
        match self {
            SharedServer::External(url) => reqwest::Url::parse(url)
                .ok()
                .map(|u| u.path().trim_start_matches('/').to_owned())
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| "postgres".into()),
            SharedServer::Local(_) => "postgres".into(),
        }
    }
}

/// The shared server, started on first use. Call [`available`] first.
pub fn shared() -> &'static SharedServer {
    static SERVER: OnceLock<SharedServer> = OnceLock::new();
    SERVER.get_or_init(|| match std::env::var(TEST_URL_SETTING) {
        Ok(url) => SharedServer::External(url),
        Err(_) => {
            let server = PgServer::start().expect("a throwaway PostgreSQL server starts");
            watch_for_exit(&server);
            SharedServer::Local(server)
        }
    })
}

/// Stops `server` and deletes its directory once this process is gone: a shell that
/// polls for our pid (the shared server lives in a static, which is never dropped).
fn watch_for_exit(server: &PgServer) {
    let pg_ctl = Path::new(PG_BIN).join("pg_ctl");
    let runner = if as_root() {
        format!("runuser -u {SERVER_USER} -- ")
    } else {
        String::new()
    };
    let script = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 1; done; \
         {runner}{pg_ctl} -D '{data}' stop -m immediate -w -t 30 >/dev/null 2>&1; rm -rf '{dir}'",
        pid = std::process::id(),
        pg_ctl = pg_ctl.display(),
        data = server.data().display(),
        dir = server.dir.path().display(),
    );
    let _ = Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
}

/// A database of its own on the shared server, for one test. Dropped with the server
/// (a throwaway one), or dropped by [`TestDatabase::drop`] on an external one.
pub struct TestDatabase {
    pub name: String,
    pub url: String,
}

impl TestDatabase {
    /// `CREATE DATABASE cp_test_<uuid>` on the shared server.
    pub async fn create() -> TestDatabase {
        let server = shared();
        let name = format!("cp_test_{}", uuid::Uuid::new_v4().simple());
        admin(server, &format!("CREATE DATABASE {name}"))
            .await
            .unwrap_or_else(|e| panic!("CREATE DATABASE {name}: {e:#}"));
        TestDatabase {
            url: server.url(&name),
            name,
        }
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        if !matches!(shared(), SharedServer::External(_)) {
            return;
        }
        // Drop may run inside a runtime: a thread of its own with its own runtime.
        let name = self.name.clone();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            rt.block_on(admin(
                shared(),
                &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
            ))
            .ok()
        })
        .join();
    }
}

/// Runs one administrative statement on the shared server's admin database.
async fn admin(server: &SharedServer, sql: &str) -> anyhow::Result<()> {
    let client = connect(&server.url(&server.admin_db())).await?;
    client.batch_execute(sql).await?;
    Ok(())
}

/// A plain connection to `url` (loopback, no TLS), its driver task spawned.
pub async fn connect(url: &str) -> anyhow::Result<tokio_postgres::Client> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}
