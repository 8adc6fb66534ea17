//! A rustack SQS emulator for the volume tests (moto slows down with queue
//! length: its send and receive walk the whole queue).
//!
//! One rustack per test process, started lazily by [`rustack()`] on a free
//! loopback port from `$SQSF_RUSTACK` (set by `scripts/test.sh`, which
//! installs it with `cargo install rustack-cli`). Like moto, the child is
//! forked from a thread that never exits and carries PR_SET_PDEATHSIG, so it
//! dies with the test process.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Environment variable naming the `rustack` executable.
pub const RUSTACK_ENV: &str = "SQSF_RUSTACK";
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A running rustack, shared by every test of the process.
#[derive(Debug)]
pub struct Rustack {
    /// `http://127.0.0.1:PORT`
    pub endpoint: String,
    /// The emulator's process id (the benchmarks read its CPU time).
    pub pid: u32,
}

impl Rustack {
    /// `127.0.0.1:PORT`, for a proxy in front of it.
    pub fn addr(&self) -> std::net::SocketAddr {
        let authority = self.endpoint.trim_start_matches("http://");
        authority
            .parse()
            .unwrap_or_else(|e| panic!("rustack endpoint {}: {e}", self.endpoint))
    }

    /// A new SQS client for this server (dummy credentials).
    pub async fn client(&self) -> aws_sdk_sqs::Client {
        crate::sqs::sqs_client(&self.endpoint).await
    }
}

/// The rustack of this test process, started on first use.
pub fn rustack() -> &'static Rustack {
    static RUSTACK: OnceLock<Result<Rustack, String>> = OnceLock::new();
    match RUSTACK.get_or_init(start) {
        Ok(r) => r,
        Err(e) => panic!("{e}"),
    }
}

fn free_port() -> Result<u16, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("no free port: {e}"))?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

/// rustack's own budgets: 256 connections and 128 requests at once, past
/// which it answers 503. SQS has no such limit near these numbers, and a
/// benchmark with 4 partitions of 32 receivers plus a commit's 128 batch
/// calls goes past both; so the harness raises them (`RUSTACK_CONFIG`).
pub const BUDGETS_YAML: &str = "budgets:\n  connections: 4096\n  requests: 4096\n";

/// Writes [`BUDGETS_YAML`] to a file of this process; its path.
fn budget_file() -> Result<std::path::PathBuf, String> {
    let path = std::env::temp_dir().join(format!("sqsf-rustack-{}.yaml", std::process::id()));
    std::fs::write(&path, BUDGETS_YAML).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

fn start() -> Result<Rustack, String> {
    let bin = std::env::var(RUSTACK_ENV).map_err(|_| {
        format!(
            "${RUSTACK_ENV} is not set: run the tests with scripts/test.sh, which installs rustack \
             (cargo install rustack-cli@0.12.0 --no-default-features --features sqs --root DIR) \
             and points ${RUSTACK_ENV} at DIR/bin/rustack"
        )
    })?;
    let port = free_port()?;
    let config = budget_file()?;
    let config_path = config.clone();
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("rustack".into())
        .spawn(move || {
            let mut cmd = Command::new(&bin);
            cmd.env("GATEWAY_LISTEN", format!("127.0.0.1:{port}"))
                .env("SERVICES", "sqs")
                .env("LOG_LEVEL", "warn")
                .env("RUSTACK_CONFIG", &config)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit());
            crate::process::die_with_parent(&mut cmd);
            match cmd.spawn() {
                Ok(mut child) => {
                    let _ = tx.send(Ok(child.id()));
                    let _ = child.wait();
                }
                Err(e) => {
                    let _ = tx.send(Err(format!("cannot start rustack `{bin}`: {e}")));
                }
            }
            loop {
                std::thread::park();
            }
        })
        .map_err(|e| e.to_string())?;
    let pid = rx
        .recv_timeout(START_TIMEOUT)
        .map_err(|e| e.to_string())??;
    let deadline = Instant::now() + START_TIMEOUT;
    while Instant::now() < deadline {
        if health(port).is_some_and(|body| {
            body.contains("\"sqs\":\"running\"") || body.contains("\"sqs\": \"running\"")
        }) {
            // Read at start: the file is not needed past this point.
            let _ = std::fs::remove_file(&config_path);
            return Ok(Rustack {
                endpoint: format!("http://127.0.0.1:{port}"),
                pid,
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!(
        "rustack did not report sqs running on port {port} within {START_TIMEOUT:?}"
    ))
}

/// GET /_localstack/health, the body as text.
fn health(port: u16) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let req = format!("GET /_localstack/health HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    s.write_all(req.as_bytes()).ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    Some(body)
}
