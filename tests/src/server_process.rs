//! The real `sqs-flight-server` binary as a child process, for tests that
//! must kill it (`kill -9`) or signal it, which an in-process server cannot
//! show.
//!
//! The binary belongs to another package, so `CARGO_BIN_EXE_*` is not set
//! here: it is looked up in this test's own target directory, and built
//! there once per test process (with the `cargo` that runs the tests) when
//! it is missing or older than the server's sources.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::time::{Duration, SystemTime};

use crate::process::die_with_parent;

/// Bound on building a binary when it is missing (a cold build of the
/// client and DataFusion takes minutes on two cores).
const BUILD_DEADLINE: Duration = Duration::from_secs(40 * 60);
/// Bound on the server's start (restoring a state dir included).
const START_DEADLINE: Duration = Duration::from_secs(60);

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
        let sources = [
            "server/src",
            "server/Cargo.toml",
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
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
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
    let pid = child.id() as libc::pid_t;
    let (done, watched) = mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if watched.recv_timeout(deadline) == Err(mpsc::RecvTimeoutError::Timeout) {
            // SAFETY: kill(2) on our own, not yet reaped, child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    });
    let status = child.wait().expect("wait for cargo");
    let _ = done.send(());
    watchdog.join().expect("watchdog thread");
    status.success()
}

/// A running `sqs-flight-server` process.
pub struct ServerProcess {
    child: Child,
    /// `grpc://127.0.0.1:PORT` (or `grpc+tls://`), as the server printed it.
    pub url: String,
    /// What the server wrote on stderr so far is collected here.
    log: std::sync::Arc<std::sync::Mutex<String>>,
}

impl ServerProcess {
    /// Starts the server with `args` (add `--listen 127.0.0.1:0` for a free
    /// port) and waits for its `listening on` line.
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
        let (started, got) = mpsc::channel();
        // Spawned from a thread that lives as long as the test process, so
        // that die_with_parent follows the process, not a short-lived thread.
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
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
        let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let stderr = child.stderr.take().expect("piped stderr");
        let sink = std::sync::Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut l = sink.lock().unwrap_or_else(|e| e.into_inner());
                l.push_str(&line);
                l.push('\n');
            }
        });
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(url) = line.strip_prefix("sqs-flight-server listening on ") {
                    let _ = tx.send(url.trim().to_string());
                }
            }
        });
        let url = match rx.recv_timeout(START_DEADLINE) {
            Ok(url) => url,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                let log = log.lock().unwrap_or_else(|e| e.into_inner()).clone();
                panic!("sqs-flight-server did not start within {START_DEADLINE:?}:\n{log}");
            }
        };
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
    /// collected by a thread of its own, so it may lag the stdout line).
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
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped());
                die_with_parent(&mut cmd);
                let _ = answer.send(cmd.spawn());
            }
        });
        tx
    })
}
