//! The real `sqs-flight-server` binary as a child process, for tests that
//! must kill it (`kill -9`) or signal it, which an in-process server cannot
//! show.
//!
//! The binary belongs to another package, so `CARGO_BIN_EXE_*` is not set
//! here: it is looked up in this test's own target directory, and built
//! there once per test process (with the `cargo` that runs the tests) when
//! it is missing or older than the server's sources.
//!
//! Where a started server listens is learnt from its `--ready-file`, as the
//! Python launcher learns it: nothing parses its output.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use sqs_flight_server::instance::Ready;

use crate::process::{die_with_parent, wait_with_deadline};

/// Bound on building a binary when it is missing (a cold build of the
/// client and DataFusion takes minutes on two cores).
const BUILD_DEADLINE: Duration = Duration::from_secs(40 * 60);
/// Bound on the server's start (restoring a state dir included).
const START_DEADLINE: Duration = Duration::from_secs(60);
/// How often the ready file is looked for.
const READY_POLL: Duration = Duration::from_millis(20);

/// `<target>/<profile>`: the test executable lives in its `deps/`.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("path of the test executable");
    exe.parent()
        .and_then(Path::parent)
        .expect("test executable inside <target>/<profile>/deps")
        .to_path_buf()
}

fn newest(path: &Path) -> Option<SystemTime> {
    let mut newest = path.metadata().and_then(|m| m.modified()).ok();
    if let Ok(entries) = std::fs::read_dir(path) {
        for entry in entries.flatten() {
            newest = newest.max(self::newest(&entry.path()));
        }
    }
    newest
}

/// The `sqs-flight-server` executable, built if needed.
pub fn server_binary() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        // client/src: the binary is the CLI too (started as `sqs-flight`).
        let sources = [
            "server/src",
            "server/Cargo.toml",
            "client/src",
            "client/Cargo.toml",
            "schemas/src",
            "Cargo.lock",
        ];
        workspace_binary("sqs-flight-server", "sqs-flight-server", &sources)
    })
}

/// The executable `bin` of the workspace's `package`, looked up in this
/// test's own target directory and profile, and built there (with the
/// `cargo` that runs the tests, selecting this package too so that the
/// dependencies resolve with the same features and are not rebuilt) when
/// it is missing or older than any of `sources` (paths in the workspace).
pub fn workspace_binary(package: &str, bin: &str, sources: &[&str]) -> PathBuf {
    let profile = profile_dir();
    let path = profile.join(bin);
    // At run time: a test binary reused from a target directory another
    // checkout built names that checkout at compile time.
    let workspace = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
        .join("..");
    let newest_source = sources
        .iter()
        .filter_map(|p| newest(&workspace.join(p)))
        .max();
    let built = path.metadata().and_then(|m| m.modified()).ok();
    if built.is_none() || newest_source > built {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.current_dir(&workspace)
            .args(["build", "-p", "sqs-flight-tests", "-p", package])
            .args(["--bin", bin, "--target-dir"])
            .arg(profile.parent().expect("<target>"));
        if profile.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let status = run_with_deadline(cmd, BUILD_DEADLINE);
        assert!(status, "building {bin} failed (see cargo's output above)");
    }
    assert!(path.is_file(), "no {bin} binary at {}", path.display());
    path
}

fn run_with_deadline(mut cmd: Command, deadline: Duration) -> bool {
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    let status = wait_with_deadline(child.id(), deadline, || child.wait());
    status.expect("wait for cargo").success()
}

/// A running `sqs-flight-server` process.
pub struct ServerProcess {
    child: Child,
    /// `grpc://127.0.0.1:PORT` (or `grpc+tls://`), as its ready file says.
    pub url: String,
    /// What the server wrote on stderr so far is collected here.
    log: Arc<Mutex<String>>,
}

impl ServerProcess {
    /// Starts the server with `args` (add `--listen 127.0.0.1:0` for a free
    /// port) and waits for its ready file.
    pub fn start(args: &[&str]) -> Self {
        Self::start_with_env(args, &[])
    }

    /// [`start`](Self::start) with extra environment variables.
    pub fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::start_bin(server_binary(), args, env)
    }

    /// [`start_with_env`](Self::start_with_env) with the variables named in
    /// `unset` removed from the environment the server inherits.
    pub fn start_with_env_unset(args: &[&str], env: &[(&str, &str)], unset: &[&str]) -> Self {
        Self::spawn(server_binary(), args, env, unset)
    }

    /// [`start_with_env`](Self::start_with_env) of the server binary at
    /// `bin` (the benchmarks' release build, say).
    pub fn start_bin(bin: &Path, args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::spawn(bin, args, env, &[])
    }

    fn spawn(bin: &Path, args: &[&str], env: &[(&str, &str)], unset: &[&str]) -> Self {
        // The ready file's directory goes when the server is ready, or
        // when its start panics.
        let scratch = crate::temp::temp_dir("ready");
        let ready = scratch.path().join("ready.json");
        let (started, got) = mpsc::channel();
        // Spawned from a thread that lives as long as the test process, so
        // that die_with_parent follows the process, not a short-lived thread.
        let mut args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        args.extend(["--ready-file".to_string(), ready.display().to_string()]);
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let unset = unset.iter().map(|s| s.to_string()).collect();
        spawner()
            .send((bin.to_path_buf(), args, env, unset, started))
            .expect("spawner thread");
        let mut child = got
            .recv()
            .expect("spawner answers")
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        let log = Arc::new(Mutex::new(String::new()));
        let stderr = child.stderr.take().expect("piped stderr");
        let sink = Arc::clone(&log);
        let pump = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut l = sink.lock().unwrap_or_else(|e| e.into_inner());
                l.push_str(&line);
                l.push('\n');
            }
        });
        let url = wait_ready(&mut child, &ready, pump, &log);
        Self { child, url, log }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything the server logged on stderr so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Waits up to `deadline` for a log line containing `needle` (stderr is
    /// collected by a thread of its own, so it may lag the ready file).
    pub fn wait_for_log(&self, needle: &str, deadline: Duration) -> bool {
        let until = std::time::Instant::now() + deadline;
        loop {
            if self.log().contains(needle) {
                return true;
            }
            if std::time::Instant::now() >= until {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The exit status if the process has exited, `None` while it runs.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// SIGKILL, and reap it.
    pub fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends `signal` (e.g. `libc::SIGTERM`) without waiting.
    pub fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) on our own child, not reaped while `self` lives.
        unsafe { libc::kill(self.child.id() as libc::pid_t, signal) };
    }

    /// Waits up to `deadline` for the process to exit; its exit status, or
    /// `None` if it is still running (then it is killed).
    pub fn wait_exit(mut self, deadline: Duration) -> Option<std::process::ExitStatus> {
        let until = std::time::Instant::now() + deadline;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if std::time::Instant::now() >= until {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The URL in the ready file `child` writes once it listens (the file is
/// removed once read). Panics with the server's log if it exits first or
/// is not ready within [`START_DEADLINE`] (then it is killed).
fn wait_ready(child: &mut Child, path: &Path, pump: JoinHandle<()>, log: &Mutex<String>) -> String {
    let until = Instant::now() + START_DEADLINE;
    loop {
        let ready = std::fs::read(path)
            .ok()
            .and_then(|text| serde_json::from_slice::<Ready>(&text).ok());
        if let Some(ready) = ready.filter(|r| r.pid == child.id()) {
            let _ = std::fs::remove_file(path);
            return ready.url;
        }
        let exited = child.try_wait().ok().flatten();
        if exited.is_some() || Instant::now() >= until {
            let _ = child.kill();
            let status = child.wait();
            let _ = pump.join(); // stderr is closed: the log is whole
            let log = log.lock().unwrap_or_else(|e| e.into_inner()).clone();
            panic!(
                "sqs-flight-server did not start within {START_DEADLINE:?} ({status:?}):\n{log}"
            );
        }
        std::thread::sleep(READY_POLL);
    }
}

type SpawnRequest = (
    PathBuf,
    Vec<String>,
    Vec<(String, String)>,
    Vec<String>,
    mpsc::Sender<std::io::Result<Child>>,
);

/// One thread for the whole test process spawns the servers: children get
/// SIGKILL when it exits, which is when the test process exits.
fn spawner() -> &'static mpsc::Sender<SpawnRequest> {
    static TX: OnceLock<mpsc::Sender<SpawnRequest>> = OnceLock::new();
    TX.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::spawn(move || {
            for (bin, args, env, unset, answer) in rx {
                let mut cmd = Command::new(&bin);
                for name in unset {
                    cmd.env_remove(name);
                }
                if !env.iter().any(|(k, _)| k == "RUST_LOG") {
                    cmd.env("RUST_LOG", "info");
                }
                cmd.args(&args)
                    .envs(env)
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped());
                die_with_parent(&mut cmd);
                let _ = answer.send(cmd.spawn());
            }
        });
        tx
    })
}

/// The real server binary on a free port, serving `queue_url` (on moto) as
/// table `t`, with `extra` flags. The table reads with one ReceiveMessage
/// call per partition, as every table on moto does here (see
/// [`crate::fixture::Fixture::serve`]): the config file says so.
pub fn server_process_on_moto(queue_url: &str, extra: &[&str]) -> ServerProcess {
    server_process_via(&crate::moto::moto().endpoint, queue_url, extra)
}

/// [`server_process_on_moto`] with the SQS calls sent to `endpoint` (a
/// proxy in front of moto).
pub fn server_process_via(endpoint: &str, queue_url: &str, extra: &[&str]) -> ServerProcess {
    server_process_with(endpoint, queue_url, "", extra, &[])
}

/// [`server_process_via`] with `toml` after the table's lines (its
/// sections, `[tables.t.large_payloads]` say) and `env` beside the AWS
/// variables of moto.
pub fn server_process_with(
    endpoint: &str,
    queue_url: &str,
    toml: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> ServerProcess {
    let dir = crate::temp::temp_dir("tables");
    let config = dir.path().join("tables.toml");
    std::fs::write(
        &config,
        format!("[tables.t]\nqueue_url = \"{queue_url}\"\nreceivers = 1\n{toml}"),
    )
    .expect("write the table config");
    let config = config.to_str().expect("a UTF-8 temp path");
    let mut args = vec![
        "--listen",
        "127.0.0.1:0",
        "--config",
        config,
        "--sqs-endpoint",
        endpoint,
    ];
    args.extend_from_slice(extra);
    let mut all_env = crate::moto::AWS_ENV.to_vec();
    all_env.extend_from_slice(env);
    // Ready, the server has read its config: the file may go with `dir`.
    ServerProcess::start_with_env(&args, &all_env)
}

/// A field of `/proc/PID/status`, in KiB: `VmRSS:` (memory now) or
/// `VmHWM:` (its peak), for the tests that bound what a hostile input
/// costs the server.
pub fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the process runs");
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("no {field} in {status}"));
    line.split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .expect("a number of kB")
}
