//! The real binary as a separate process, driven over HTTP as the Functions host drives
//! it: start and readiness, invocation envelopes, SIGKILL; and where it keeps its state.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::host::{envelope, DataType, DeliveryFields};
use crate::process::{free_port, probe_blocking, ServeSpec};

/// Where a `serve` process keeps its state: a SQLite file in a temporary directory, or
/// another store given by its settings (the dev crate's Cosmos DB emulator).
pub struct Backend {
    env: Vec<(String, String)>,
    _dir: tempfile::TempDir,
    _keep: Option<Box<dyn std::any::Any + Send>>,
}

impl Backend {
    pub fn sqlite() -> Backend {
        let dir = tempfile::tempdir().unwrap();
        let db = dir
            .path()
            .join("payments.db")
            .to_string_lossy()
            .into_owned();
        Backend {
            env: vec![("PAYMENTS_SQLITE_PATH".into(), db)],
            _dir: dir,
            _keep: None,
        }
    }

    /// Another store: `env` are its settings, `keep` whatever must live as long (an
    /// emulator serving the endpoint).
    pub fn other(env: Vec<(String, String)>, keep: Box<dyn std::any::Any + Send>) -> Backend {
        Backend {
            env,
            _dir: tempfile::tempdir().unwrap(),
            _keep: Some(keep),
        }
    }

    /// The settings a `serve` process needs for this backend.
    pub fn env(&self) -> Vec<(&str, &str)> {
        self.env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }
}

/// A `serve` child process of the real binary, killed when dropped: the blocking form
/// of [`crate::process::ServeProcess`] for tests without a runtime, started from the
/// same [`ServeSpec`] and ready by the same probe (`GET /` answers).
pub struct Handler {
    pub child: Child,
    pub port: u16,
}

impl Handler {
    /// Starts `exe serve` on the SQLite file `db`.
    pub fn start(exe: &str, db: &Path, extra_env: &[(&str, &str)]) -> Handler {
        let db = db.to_string_lossy();
        let mut env = vec![("PAYMENTS_SQLITE_PATH", db.as_ref())];
        env.extend_from_slice(extra_env);
        Handler::start_on(exe, &env)
    }

    /// Starts `exe serve` with `env` and waits until it is ready; panics if it exits.
    pub fn start_on(exe: &str, env: &[(&str, &str)]) -> Handler {
        Handler::try_start(exe, env, None).unwrap_or_else(|(status, stderr)| {
            panic!("serve exited with {status} before it was ready: {stderr}")
        })
    }

    /// Starts `serve` (as user `uid` if given) and waits until it is ready or exits; an
    /// exit comes back with its status and stderr. The settings a test does not give are
    /// the defaults, whatever the test's own environment says.
    pub fn try_start(
        exe: &str,
        env: &[(&str, &str)],
        uid: Option<u32>,
    ) -> Result<Handler, (std::process::ExitStatus, String)> {
        Handler::try_start_at(exe, env, uid, None)
    }

    /// Starts `exe serve` with `env` on `port`, as the Functions host restarts a handler
    /// on the port it picked once; panics if it exits.
    pub fn restart_on(exe: &str, env: &[(&str, &str)], port: u16) -> Handler {
        Handler::try_start_at(exe, env, None, Some(port)).unwrap_or_else(|(status, stderr)| {
            panic!("serve exited with {status} before it was ready: {stderr}")
        })
    }

    fn try_start_at(
        exe: &str,
        env: &[(&str, &str)],
        uid: Option<u32>,
        port: Option<u16>,
    ) -> Result<Handler, (std::process::ExitStatus, String)> {
        use std::io::Read;
        use std::os::unix::process::CommandExt;
        let spec = ServeSpec::new(exe)
            .env("LOG_FORMAT", "json")
            .env("RUST_LIB_BACKTRACE", "0")
            .envs(env.iter().copied());
        let port = port.unwrap_or_else(|| free_port().expect("a free loopback port"));
        let (mut cmd, _) = spec.command(port).expect("the serve command");
        cmd.stderr(Stdio::piped());
        if let Some(uid) = uid {
            cmd.uid(uid).gid(uid);
        }
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {exe} serve: {e}"));
        let deadline = Instant::now() + spec.ready_timeout;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                let mut stderr = String::new();
                let _ = child.stderr.take().unwrap().read_to_string(&mut stderr);
                return Err((status, stderr));
            }
            if probe_blocking(port) {
                return Ok(Handler { child, port });
            }
            assert!(
                Instant::now() < deadline,
                "serve neither answered GET / nor exited within {:?}",
                spec.ready_timeout
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// SIGKILL, as the platform kills a process.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Handler {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The repository's root (function-app/, infra/, host.json).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The envelope the host sends for our function.json: its binding's `dataType` decides
/// how the body travels.
pub fn host_envelope(body: &str, message_id: &str, delivery_count: u32) -> Value {
    let function: Value = serde_json::from_str(
        &std::fs::read_to_string(repo_root().join("function-app/ClaimApproved/function.json"))
            .unwrap(),
    )
    .unwrap();
    let data_type = match function["bindings"][0]["dataType"].as_str() {
        Some("binary") => DataType::Binary,
        _ => DataType::String,
    };
    envelope(
        &DeliveryFields::new(body.as_bytes(), message_id, delivery_count),
        data_type,
        "ClaimApproved",
    )
}

/// A `ClaimApproved` body with a payee.
pub fn claim_body(claim: &str, amount: &str) -> String {
    json!({"claimId": claim, "amount": amount, "currency": "EUR", "payee": "NL91ABNA0417164300"})
        .to_string()
}

/// POSTs one invocation envelope to `/ClaimApproved`; every answer must be JSON.
pub async fn invoke(
    client: &reqwest::Client,
    handler: &Handler,
    envelope: &Value,
) -> reqwest::Result<(u16, Value)> {
    let response = client
        .post(handler.url("/ClaimApproved"))
        .header("Content-Type", "application/json; charset=utf-8")
        .header(
            "X-Azure-Functions-InvocationId",
            uuid::Uuid::new_v4().to_string(),
        )
        .body(envelope.to_string())
        .send()
        .await?;
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    assert!(
        content_type.starts_with("application/json"),
        "every answer is JSON, got {content_type}"
    );
    Ok((status, response.json().await?))
}

/// The outcome label of an invocation answer.
pub fn outcome(answer: &Value) -> &str {
    answer["ReturnValue"]["outcome"].as_str().unwrap_or("")
}

/// Starts `exe serve` with `env`, delivers one new `ClaimApproved` (1250.50 EUR) five
/// times under MessageId `claim-approved-1`, asserts the answers (200; `recorded`, then
/// `duplicate` four times; the first log line names the outcome), stops the process and
/// returns the claim, for the caller to check its ledger.
pub async fn deliver_one_message_five_times(exe: &str, env: &[(&str, &str)]) -> String {
    let handler = Handler::start_on(exe, env);
    let client = reqwest::Client::new();
    let claim = crate::fixtures::new_claim();
    let body = claim_body(&claim, "1250.50");
    let mut outcomes = Vec::new();
    for n in 1..=5 {
        let (status, answer) = invoke(
            &client,
            &handler,
            &host_envelope(&body, "claim-approved-1", n),
        )
        .await
        .unwrap();
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["Logs"][0], format!("outcome: {}", outcome(&answer)));
        outcomes.push(outcome(&answer).to_owned());
    }
    assert_eq!(
        outcomes,
        [
            "recorded",
            "duplicate",
            "duplicate",
            "duplicate",
            "duplicate"
        ]
    );
    handler.kill();
    claim
}
