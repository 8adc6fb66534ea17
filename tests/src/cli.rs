//! The client and CLI tests' harness: the embedded demo table, and the real
//! `sqs-flight` binary (the harness does not link the Rust client, so that
//! the benches can use it without building DataFusion).
//!
//! The binary belongs to another package, so `CARGO_BIN_EXE_sqs-flight` is
//! not available here. It is looked up in this test's own target directory
//! (`<target>/<profile>/sqs-flight`), where `cargo test --workspace` has
//! built it. When it is missing or older than the client's sources (as after
//! `cargo test -p sqs-flight-tests`), it is built once per test process
//! ([`workspace_binary`]).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use crate::process::wait_with_deadline;
use crate::server::TestServer;
use crate::server_process::workspace_binary;

/// Bound on one run of the CLI.
pub const CLI_DEADLINE: Duration = Duration::from_secs(60);

/// A server (no SQS queue) with the embedded demo table `demo` of 20 sample
/// order events, as `sqs-flight-server` serves without `--table`.
pub async fn demo_server() -> TestServer {
    TestServer::in_memory("demo", 20, |_| {}).await
}

/// What a CLI run left behind.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// Panics with the output unless the run exited with `code`.
    pub fn expect_code(&self, code: i32) -> &Self {
        assert_eq!(self.code, code, "exit status; the run: {self:#?}");
        self
    }
}

/// Runs `sqs-flight ARGS...` with a clean environment of `SQSF_*` variables,
/// off the runtime (the server under test runs on it), killed after
/// [`CLI_DEADLINE`].
pub async fn sqs_flight(args: &[&str]) -> Run {
    sqs_flight_with_stdin(args, None).await
}

/// [`sqs_flight`] with `stdin` as the CLI's standard input (empty when
/// `None`).
pub async fn sqs_flight_with_stdin(args: &[&str], stdin: Option<Vec<u8>>) -> Run {
    run_cli(cli_binary().to_path_buf(), args, stdin).await
}

/// Runs `program` (a CLI: the client's binary, or the server's under the
/// name `sqs-flight`) as [`sqs_flight_with_stdin`] does.
pub async fn run_cli(program: PathBuf, args: &[&str], stdin: Option<Vec<u8>>) -> Run {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let mut cmd = Command::new(program);
        cmd.args(&args);
        for var in ["SQSF_URL", "SQSF_TOKEN", "SQSF_CONSUMER", "SQSF_CA_CERT"] {
            cmd.env_remove(var);
        }
        let out = run_bounded_with(cmd, CLI_DEADLINE, stdin);
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    })
    .await
    .expect("CLI runner thread")
}

/// Runs `cmd` to completion, killing it after `deadline`, writing `stdin`
/// to its standard input from a thread of its own (so that a full pipe
/// cannot block the wait).
fn run_bounded_with(mut cmd: Command, deadline: Duration, stdin: Option<Vec<u8>>) -> Output {
    let mut child = cmd
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    let feeder = child.stdin.take().zip(stdin).map(|(mut pipe, bytes)| {
        std::thread::spawn(move || {
            use std::io::Write;
            // The command may exit before reading it all (a bad line): a
            // broken pipe here is its business, not the test's.
            let _ = pipe.write_all(&bytes);
        })
    });
    let out = wait_with_deadline(child.id(), deadline, || {
        child.wait_with_output().expect("wait for the CLI")
    });
    if let Some(feeder) = feeder {
        feeder.join().expect("stdin feeder thread");
    }
    out
}

/// The `sqs-flight` executable, built if needed.
pub fn cli_binary() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let sources = [
            "client/src",
            "client/Cargo.toml",
            "schemas/src",
            "Cargo.lock",
        ];
        workspace_binary("sqs-flight-client", "sqs-flight", &sources)
    })
}
