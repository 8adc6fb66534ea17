//! A moto (`moto_server`) SQS emulator for the integration tests.
//!
//! One `moto_server` is started lazily per test process by [`moto()`], on
//! 127.0.0.1 with `-p 0` (werkzeug binds a free port and prints
//! `Running on http://127.0.0.1:PORT` on stderr, which is parsed). The child
//! is spawned from a dedicated thread that never exits and carries
//! `PR_SET_PDEATHSIG(SIGKILL)`, so it dies with the test process, including
//! on panic or abort.
//!
//! The binary is `$SQSF_MOTO_SERVER` (set by `scripts/test.sh` to the repo's
//! `.venv/bin/moto_server`), else `moto_server` on `PATH`. Tests are written
//! against moto 5.2.5.
//!
//! moto walks the whole queue on every call (a receive of 10 takes ~0.6 s at
//! 300 messages): keep queues to a few hundred messages and use a fresh
//! queue per test ([`create_queue`], [`create_fifo_queue`]) instead of
//! PurgeQueue (one purge per queue per 60 s).

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

// The SDK helpers live in `crate::sqs`; these names stay for the tests
// that import them from here.
pub use crate::sqs::{
    DRAIN_VISIBILITY_TIMEOUT_SECS, create_fifo_queue, create_queue, delete_messages, drain_visible,
    queue_counts, queue_holding, send_bodies, send_fifo_bodies, sqs_client,
};

/// Environment variable naming the `moto_server` executable.
pub const MOTO_SERVER_ENV: &str = "SQSF_MOTO_SERVER";
/// The account id in the URL of every moto queue (rustack's is all zeros).
pub const ACCOUNT: &str = "123456789012";
/// The environment of a server process that talks to moto.
pub const AWS_ENV: [(&str, &str); 3] = [
    ("AWS_ACCESS_KEY_ID", "test"),
    ("AWS_SECRET_ACCESS_KEY", "test"),
    ("AWS_REGION", "us-east-1"),
];

/// How long moto may take to print its port, and then to answer ListQueues.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How much of moto's output is kept for error messages.
const LOG_LIMIT: usize = 64 * 1024;

/// A running moto server, shared by every test of the process.
#[derive(Debug)]
pub struct Moto {
    /// `http://127.0.0.1:PORT`
    pub endpoint: String,
    /// The last [`LOG_LIMIT`] bytes of moto's stdout and stderr (werkzeug
    /// logs one line per request on stderr).
    log: Arc<Mutex<LogTail>>,
}

impl Moto {
    /// The last 64 KiB of moto's output (startup lines and request log), for
    /// failure messages.
    pub fn output(&self) -> String {
        self.log.lock().unwrap().text()
    }

    /// A new SQS client for this server (see [`sqs_client`]).
    pub async fn client(&self) -> aws_sdk_sqs::Client {
        sqs_client(&self.endpoint).await
    }
}

/// Where moto's request recorder (`/moto-api/recorder/`, off unless a test
/// starts it) writes: a file of this test process in the temp directory,
/// not moto's working directory (the repository).
pub fn recording_path() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("sqsf-moto-recording-{}.jsonl", std::process::id()))
}

/// The moto server of this test process, started on first use. Blocks for
/// up to about two minutes (start plus readiness); panics with moto's output
/// if it cannot be started. Safe to call from inside a tokio runtime (the
/// readiness check runs on its own thread and runtime); the first call blocks
/// the calling thread while moto starts (about 1-3 s).
pub fn moto() -> &'static Moto {
    static MOTO: OnceLock<Result<Moto, String>> = OnceLock::new();
    match MOTO.get_or_init(start_moto) {
        Ok(m) => m,
        Err(e) => panic!("{e}"),
    }
}

/// Keeps the tail of a child's output.
#[derive(Debug, Default)]
struct LogTail {
    buf: VecDeque<u8>,
}

impl LogTail {
    fn push_line(&mut self, line: &str) {
        self.buf.extend(line.as_bytes());
        self.buf.push_back(b'\n');
        let excess = self.buf.len().saturating_sub(LOG_LIMIT);
        self.buf.drain(..excess);
    }

    fn text(&self) -> String {
        let (a, b) = self.buf.as_slices();
        let mut v = a.to_vec();
        v.extend_from_slice(b);
        String::from_utf8_lossy(&v).into_owned()
    }
}

enum Event {
    Port(u16),
    Exited(String),
}

fn moto_binary() -> (String, &'static str) {
    match std::env::var(MOTO_SERVER_ENV) {
        Ok(p) if !p.is_empty() => (p, "from $SQSF_MOTO_SERVER"),
        _ => (
            "moto_server".to_string(),
            "from PATH ($SQSF_MOTO_SERVER unset)",
        ),
    }
}

fn install_hint() -> String {
    format!(
        "Install moto by running scripts/test.sh (it creates .venv with moto and sets \
         ${MOTO_SERVER_ENV}), or `pip install 'moto[server]==5.2.5'` and put moto_server on \
         PATH or point ${MOTO_SERVER_ENV} at it."
    )
}

/// Extracts PORT from a werkzeug line such as
/// ` * Running on http://127.0.0.1:40475` (possibly wrapped in ANSI colours).
fn parse_port(line: &str) -> Option<u16> {
    let rest = &line[line.find("Running on http://")? + "Running on http://".len()..];
    let after_colon = &rest[rest.find(':')? + 1..];
    let digits: String = after_colon
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse().ok().filter(|p| *p != 0)
}

fn start_moto() -> Result<Moto, String> {
    let (bin, origin) = moto_binary();
    let log = Arc::new(Mutex::new(LogTail::default()));
    let (tx, rx) = mpsc::channel::<Event>();
    let (spawn_tx, spawn_rx) = mpsc::channel::<Result<u32, String>>();

    // PR_SET_PDEATHSIG fires when the *thread* that forked the child exits,
    // so the child is forked from a thread that never exits: it waits for the
    // child, then parks forever.
    {
        let bin = bin.clone();
        let log = log.clone();
        std::thread::Builder::new()
            .name("moto-server".into())
            .spawn(move || {
                let mut cmd = Command::new(&bin);
                cmd.args(["-H", "127.0.0.1", "-p", "0"])
                    .env("PYTHONUNBUFFERED", "1")
                    .env("MOTO_RECORDER_FILEPATH", recording_path())
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped());
                crate::process::die_with_parent(&mut cmd);
                let mut child = match cmd.spawn() {
                    Ok(c) => c,
                    Err(e) => {
                        let _ = spawn_tx.send(Err(format!(
                            "cannot start moto_server `{bin}` ({origin}): {e}. {}",
                            install_hint()
                        )));
                        loop {
                            std::thread::park();
                        }
                    }
                };
                let _ = spawn_tx.send(Ok(child.id()));
                let stdout = child.stdout.take().unwrap();
                let stderr = child.stderr.take().unwrap();
                let readers = [
                    spawn_reader("moto-stdout", stdout, log.clone(), tx.clone()),
                    spawn_reader("moto-stderr", stderr, log.clone(), tx.clone()),
                ];
                let status = child.wait();
                // Let the readers drain what the child wrote before it died.
                for r in readers {
                    let _ = r.join();
                }
                let _ = tx.send(Event::Exited(match status {
                    Ok(s) => s.to_string(),
                    Err(e) => format!("wait failed: {e}"),
                }));
                loop {
                    std::thread::park();
                }
            })
            .map_err(|e| format!("cannot spawn the moto-server thread: {e}"))?;
    }

    let started = Instant::now();
    let pid = match spawn_rx.recv_timeout(START_TIMEOUT) {
        Ok(Ok(pid)) => pid,
        Ok(Err(e)) => return Err(e),
        Err(e) => return Err(format!("moto-server thread did not report: {e}")),
    };
    let fail = |what: String| -> String {
        format!(
            "moto_server `{bin}` ({origin}, pid {pid}) {what}. Its output:\n{}\n{}",
            log.lock().unwrap().text(),
            install_hint()
        )
    };

    let port = match rx.recv_timeout(START_TIMEOUT.saturating_sub(started.elapsed())) {
        Ok(Event::Port(p)) => p,
        Ok(Event::Exited(status)) => {
            return Err(fail(format!("exited ({status}) before printing its port")));
        }
        Err(_) => {
            return Err(fail(format!(
                "did not print `Running on http://127.0.0.1:PORT` within {START_TIMEOUT:?}"
            )));
        }
    };
    let endpoint = format!("http://127.0.0.1:{port}");

    // Readiness: a real SigV4-signed ListQueues (moto routes by credential
    // scope; an unsigned request would reach its S3 backend). Runs on its own
    // thread and runtime so that moto() may be called from async code.
    let ep = endpoint.clone();
    let ready = std::thread::spawn(move || -> Result<(), String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot build a tokio runtime: {e}"))?;
        rt.block_on(async {
            let client = sqs_client(&ep).await;
            let deadline = Instant::now() + START_TIMEOUT;
            let mut last_err = String::new();
            while Instant::now() < deadline {
                let attempt =
                    tokio::time::timeout(Duration::from_secs(10), client.list_queues().send());
                match attempt.await {
                    Ok(Ok(_)) => return Ok(()),
                    Ok(Err(e)) => {
                        last_err = format!("{:?}", aws_sdk_sqs::error::DisplayErrorContext(e))
                    }
                    Err(_) => last_err = "ListQueues timed out after 10 s".into(),
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(last_err)
        })
    })
    .join()
    .unwrap_or_else(|_| Err("readiness thread panicked".into()));
    if let Err(e) = ready {
        return Err(fail(format!(
            "listens on {endpoint} but did not answer ListQueues within {START_TIMEOUT:?}: {e}"
        )));
    }
    // Leave a trace in the test output (shown for failing tests).
    eprintln!(
        "moto_server ({bin}) ready at {endpoint} after {:.2} s",
        started.elapsed().as_secs_f64()
    );
    Ok(Moto { endpoint, log })
}

fn spawn_reader(
    name: &str,
    pipe: impl Read + Send + 'static,
    log: Arc<Mutex<LogTail>>,
    tx: mpsc::Sender<Event>,
) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            // Keep reading until EOF: werkzeug logs every request, and a full
            // pipe would block moto.
            let mut reader = BufReader::new(pipe);
            let mut line = Vec::new();
            let mut port_sent = false;
            loop {
                line.clear();
                match reader.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                let text = String::from_utf8_lossy(&line);
                let text = text.trim_end();
                if !port_sent && let Some(p) = parse_port(text) {
                    let _ = tx.send(Event::Port(p));
                    port_sent = true;
                }
                log.lock().unwrap().push_line(text);
            }
        })
        .expect("spawn moto output reader thread")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    use aws_sdk_sqs::types::{
        ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry,
        MessageSystemAttributeName,
    };

    #[test]
    fn parses_werkzeug_port_line() {
        assert_eq!(
            parse_port(" * Running on http://127.0.0.1:40475"),
            Some(40475)
        );
        assert_eq!(
            parse_port("\x1b[0m * Running on http://127.0.0.1:8\x1b[0m"),
            Some(8)
        );
        assert_eq!(parse_port("Press CTRL+C to quit"), None);
        assert_eq!(parse_port(" * Running on http://127.0.0.1:0"), None);
    }

    #[tokio::test]
    async fn moto_starts_and_counts_messages() {
        let m = moto();
        assert!(
            m.endpoint.starts_with("http://127.0.0.1:"),
            "{}",
            m.endpoint
        );
        let client = m.client().await;
        let url = create_queue(&client, "harness", &[]).await;
        let ids = send_bodies(&client, &url, (0..25).map(|i| format!("body-{i}"))).await;
        assert_eq!(ids.len(), 25);
        assert_eq!(queue_counts(&client, &url).await, (25, 0));

        let got = drain_visible(&client, &url).await;
        assert_eq!(got.len(), 25);
        let bodies: HashSet<_> = got.iter().map(|m| m.body().unwrap().to_string()).collect();
        assert_eq!(bodies, (0..25).map(|i| format!("body-{i}")).collect());
        let attrs = got[0].attributes().expect("system attributes");
        assert!(
            attrs.contains_key(&MessageSystemAttributeName::SentTimestamp),
            "{attrs:?}"
        );
        assert_eq!(queue_counts(&client, &url).await, (0, 25));
        assert_eq!(delete_messages(&client, &url, &got).await, 0);
        assert_eq!(queue_counts(&client, &url).await, (0, 0));
    }

    /// The moto behaviours the server's tests rely on; fails loudly if a
    /// different moto version changes them.
    #[tokio::test]
    async fn moto_behaviours_the_tests_rely_on() {
        let client = moto().client().await;
        let url = create_queue(&client, "facts", &[]).await;
        send_bodies(&client, &url, ["a".to_string()]).await;

        // MessageSystemAttributeNames is honoured (only what was asked for).
        let out = client
            .receive_message()
            .queue_url(&url)
            .visibility_timeout(0)
            .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
            .send()
            .await
            .unwrap();
        let m = &out.messages()[0];
        let attrs = m.attributes().unwrap();
        assert_eq!(attrs.len(), 1, "{attrs:?}");
        assert_eq!(
            attrs[&MessageSystemAttributeName::ApproximateReceiveCount],
            "1"
        );

        // Garbage receipt handles are reported per entry as Failed.
        let good = m.receipt_handle().unwrap();
        let out = client
            .change_message_visibility_batch()
            .queue_url(&url)
            .entries(
                ChangeMessageVisibilityBatchRequestEntry::builder()
                    .id("bad")
                    .receipt_handle("garbage")
                    .visibility_timeout(5)
                    .build()
                    .unwrap(),
            )
            .entries(
                ChangeMessageVisibilityBatchRequestEntry::builder()
                    .id("good")
                    .receipt_handle(good)
                    .visibility_timeout(0)
                    .build()
                    .unwrap(),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(out.failed().len(), 1, "{out:?}");
        assert_eq!(out.failed()[0].id(), "bad");
        assert_eq!(out.failed()[0].code(), "ReceiptHandleIsInvalid");
        assert_eq!(out.successful().len(), 1);
        let out = client
            .delete_message_batch()
            .queue_url(&url)
            .entries(
                DeleteMessageBatchRequestEntry::builder()
                    .id("bad")
                    .receipt_handle("garbage")
                    .build()
                    .unwrap(),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(out.failed().len(), 1, "{out:?}");
        assert_eq!(out.failed()[0].code(), "ReceiptHandleIsInvalid");

        // A missing queue maps to the SDK's QueueDoesNotExist variant.
        let err = client
            .receive_message()
            .queue_url(format!(
                "{}/123456789012/no-such-queue-{}",
                moto().endpoint,
                std::process::id()
            ))
            .send()
            .await
            .unwrap_err();
        assert!(
            err.as_service_error()
                .is_some_and(|e| e.is_queue_does_not_exist()),
            "{err:?}"
        );

        // FIFO: a receive hands out several messages of one group, and the
        // group stays locked while any of them is in flight.
        let fifo = create_fifo_queue(&client, "facts", &[]).await;
        send_fifo_bodies(
            &client,
            &fifo,
            [("A", "a0"), ("A", "a1"), ("A", "a2"), ("B", "b0")]
                .map(|(g, b)| (g.to_string(), b.to_string())),
        )
        .await;
        let first = client
            .receive_message()
            .queue_url(&fifo)
            .max_number_of_messages(2)
            .send()
            .await
            .unwrap();
        let bodies: Vec<_> = first.messages().iter().map(|m| m.body().unwrap()).collect();
        assert_eq!(bodies, ["a0", "a1"]);
        let second = client
            .receive_message()
            .queue_url(&fifo)
            .max_number_of_messages(10)
            .send()
            .await
            .unwrap();
        let bodies: Vec<_> = second
            .messages()
            .iter()
            .map(|m| m.body().unwrap())
            .collect();
        assert_eq!(bodies, ["b0"]);
    }
}
