//! The rustack SQS emulator as a child process on a free loopback port.
//!
//! It dies with the bench process (PR_SET_PDEATHSIG) and is killed on drop.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// How long rustack may take to report SQS running.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A running rustack.
pub struct Rustack {
    /// `http://127.0.0.1:PORT`
    pub endpoint: String,
    child: Child,
}

impl Rustack {
    /// Starts `bin` and waits until its health endpoint shows SQS running.
    pub fn start(bin: &Path) -> Result<Self> {
        let port = free_port()?;
        let mut cmd = Command::new(bin);
        cmd.env("GATEWAY_LISTEN", format!("127.0.0.1:{port}"))
            .env("SERVICES", "sqs")
            .env("LOG_LEVEL", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        die_with_parent(&mut cmd);
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start rustack {}", bin.display()))?;
        let mut me = Self {
            endpoint: format!("http://127.0.0.1:{port}"),
            child,
        };
        let deadline = Instant::now() + START_TIMEOUT;
        while Instant::now() < deadline {
            if let Some(status) = me.child.try_wait()? {
                bail!("rustack exited with {status} before it was ready");
            }
            if health(port).is_some_and(|b| b.contains("\"sqs\":\"running\"")) {
                return Ok(me);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!("rustack did not report sqs running on port {port} within {START_TIMEOUT:?}")
    }

    /// The emulator's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Rustack {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Makes the child get SIGKILL when this process dies.
pub fn die_with_parent(cmd: &mut Command) {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

/// A loopback port free right now.
pub fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("no free loopback port")?;
    Ok(l.local_addr()?.port())
}

/// GET /_localstack/health, the body as text.
fn health(port: u16) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let req = format!("GET /_localstack/health HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    s.write_all(req.as_bytes()).ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    Some(body.replace(' ', ""))
}
