//! A real PgBouncer in front of a test PostgreSQL server, pooling by transaction as Azure
//! Database for PostgreSQL's built-in one does: Debian's `pgbouncer` package
//! (`/usr/sbin/pgbouncer`), on a free loopback port, with an ini and an auth file of its
//! own in a temporary directory, run as `nobody` when the tests run as root, stopped when
//! dropped (and, for the one a test process shares, once that process has ended).
//!
//! Without the binary a test is skipped with a loud SKIP line, unless `CI` is set: then it
//! fails, as the PostgreSQL tests do ([`crate::postgres::available`]).

use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::Context;

/// Where Debian's package installs it.
pub const PGBOUNCER: &str = "/usr/sbin/pgbouncer";
/// The unprivileged user a root test process runs it as (PgBouncer refuses root).
const BOUNCER_USER: &str = "nobody";
/// Server sessions per (database, user): fewer than the store's pool has connections,
/// so the store's connections share server sessions, as they do behind Azure's.
pub const SHARED_POOL_SIZE: u32 = 2;

/// Whether PgBouncer tests can run here: PostgreSQL can ([`crate::postgres::available`])
/// and the binary exists. `false` after a SKIP line; panics instead when `CI` is set.
pub fn available() -> bool {
    if !crate::postgres::available() {
        return false;
    }
    if Path::new(PGBOUNCER).is_file() {
        return true;
    }
    let why = format!("no PgBouncer: {PGBOUNCER} is missing (apt-get install pgbouncer)");
    if std::env::var_os("CI").is_some() {
        panic!("{why}; CI must run the PgBouncer tests");
    }
    eprintln!("SKIP ***** PgBouncer tests skipped: {why} *****");
    false
}

/// A running PgBouncer with `pool_mode = transaction`.
pub struct PgBouncer {
    dir: tempfile::TempDir,
    port: u16,
    child: Child,
}

impl PgBouncer {
    /// PgBouncer for every database of the server `upstream` names (a libpq URI with a
    /// user and password, which PgBouncer also logs in with), `pool_size` server sessions
    /// per database and user.
    pub fn start(upstream: &str, pool_size: u32) -> anyhow::Result<PgBouncer> {
        let url = reqwest::Url::parse(upstream).context("the upstream is a URI")?;
        let host = url
            .host_str()
            .context("the upstream names a host")?
            .to_owned();
        let server_port = url.port().unwrap_or(5432);
        let user = url.username().to_owned();
        let password = url.password().unwrap_or_default().to_owned();
        let mut last = None;
        // A free port can be taken between the look-up and the bind: try another.
        for _ in 0..3 {
            match Self::start_on(&host, server_port, &user, &password, pool_size) {
                Ok(bouncer) => return Ok(bouncer),
                Err(e) => last = Some(e),
            }
        }
        Err(last.expect("tried"))
    }

    fn start_on(
        host: &str,
        server_port: u16,
        user: &str,
        password: &str,
        pool_size: u32,
    ) -> anyhow::Result<PgBouncer> {
        let dir = tempfile::Builder::new().prefix("cp-pgbouncer-").tempdir()?;
        let port = crate::process::free_port()?;
        let auth = dir.path().join("userlist.txt");
        // A plain-text password here lets PgBouncer answer SCRAM itself and log in to the
        // server with SCRAM too.
        std::fs::write(&auth, format!("\"{user}\" \"{password}\"\n"))?;
        let log = dir.path().join("pgbouncer.log");
        let ini = dir.path().join("pgbouncer.ini");
        std::fs::write(
            &ini,
            format!(
                "[databases]\n\
                 * = host={host} port={server_port}\n\
                 [pgbouncer]\n\
                 listen_addr = 127.0.0.1\n\
                 listen_port = {port}\n\
                 unix_socket_dir =\n\
                 auth_type = scram-sha-256\n\
                 auth_file = {auth}\n\
                 pool_mode = transaction\n\
                 default_pool_size = {pool_size}\n\
                 max_client_conn = 500\n\
                 logfile = {log}\n\
                 admin_users =\n",
                auth = auth.display(),
                log = log.display(),
            ),
        )?;
        let mut command = Command::new(PGBOUNCER);
        command
            .arg(&ini)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if as_root() {
            let (uid, gid) = bouncer_user()?;
            for path in [dir.path(), &auth, &ini] {
                std::os::unix::fs::chown(path, Some(uid), Some(gid))?;
            }
            command.uid(uid).gid(gid);
        }
        let mut child = command
            .spawn()
            .with_context(|| format!("cannot run {PGBOUNCER}"))?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                break;
            }
            if let Some(status) = child.try_wait()? {
                anyhow::bail!(
                    "pgbouncer exited with {status}: {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                anyhow::bail!("pgbouncer did not listen on {port} within 30 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(PgBouncer { dir, port, child })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `upstream` (a URI of the server behind it) with PgBouncer's address instead.
    pub fn url_for(&self, upstream: &str) -> String {
        let mut url = reqwest::Url::parse(upstream).expect("the upstream is a URI");
        url.set_host(Some("127.0.0.1")).expect("a host");
        url.set_port(Some(self.port)).expect("a port");
        url.to_string()
    }

    /// PgBouncer's log, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("pgbouncer.log")).unwrap_or_default()
    }

    /// Stops it once this process is gone, however it ends: a static is never dropped.
    fn stop_when_this_process_exits(&self) {
        let script = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 1; done; kill {bouncer} 2>/dev/null; \
             sleep 1; rm -rf '{dir}'",
            pid = std::process::id(),
            bouncer = self.child.id(),
            dir = self.dir.path().display(),
        );
        let _ = Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The PgBouncer the tests of one process share, in front of the shared PostgreSQL
/// server ([`crate::postgres::shared`]), with [`SHARED_POOL_SIZE`] server sessions per
/// database. Call [`available`] first.
pub fn shared() -> &'static PgBouncer {
    static BOUNCER: OnceLock<PgBouncer> = OnceLock::new();
    BOUNCER.get_or_init(|| {
        let upstream = crate::postgres::shared().url("postgres");
        let bouncer =
            PgBouncer::start(&upstream, SHARED_POOL_SIZE).expect("a throwaway PgBouncer starts");
        bouncer.stop_when_this_process_exits();
        bouncer
    })
}

fn as_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn bouncer_user() -> anyhow::Result<(u32, u32)> {
    let name = std::ffi::CString::new(BOUNCER_USER)?;
    // SAFETY: a NUL-terminated name; the record is read at once, before any other call.
    let entry = unsafe { libc::getpwnam(name.as_ptr()) };
    anyhow::ensure!(!entry.is_null(), "no user {BOUNCER_USER}");
    // SAFETY: non-null, as checked.
    let entry = unsafe { &*entry };
    Ok((entry.pw_uid, entry.pw_gid))
}
