//! What figures 3, 5 and 7 share, over the SQS protocol on rustack: the
//! server in this process on a queue, micro-batches read (and committed)
//! through it, CPU time, and the best of alternating runs. Figure 3 is
//! `fig_receive`, figure 5 `fig_commit`.

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use aws_sdk_sqs::Client;
use sqs_flight_server::config::{
    Backend, Config, DEFAULT_SQS_BATCH_CONCURRENCY, PlanParams, TableConfig,
};

use crate::flight::{self, Plan};
use crate::report::Figure;
use crate::sqs::{self, Link};

pub const TABLE: &str = "t";
/// Bound of every drain, read and commit.
pub const DEADLINE: Duration = Duration::from_secs(600);
/// Idle wait of the plans: a partition ends this long after the queue is empty.
const MAX_WAIT_MS: u64 = 1000;

/// A server in this process whose table `t` is the queue at `url`.
pub async fn sqs_server(sqs: &Client, url: &str) -> Result<flight::Running> {
    sqs_server_with(sqs, url, None, DEFAULT_SQS_BATCH_CONCURRENCY).await
}

/// [`sqs_server`], with its registry in a fresh directory under `state`.
pub async fn sqs_server_with(
    sqs: &Client,
    url: &str,
    state: Option<&std::path::Path>,
    batch_concurrency: u32,
) -> Result<flight::Running> {
    let table = TableConfig {
        name: TABLE.into(),
        backend: Backend::Sqs {
            queue_url: url.to_string(),
            region: None,
        },
        defaults: PlanParams::DEFAULTS,
        visibility_timeout: None,
        payload: None,
        large_payloads: None,
        role: None,
    };
    let mut config = Config::new("127.0.0.1:0".parse()?, vec![table]);
    config.sqs_batch_concurrency = batch_concurrency;
    config.state_dir = state.map(|dir| {
        let queue = url.rsplit('/').next().unwrap_or("queue");
        dir.join(format!("{queue}-{}", std::process::id()))
    });
    let registry = sqs_flight_server::registry::Registry::build(&config, Some(sqs.clone()))
        .await
        .expect("registry");
    flight::start_server(config, registry).await
}

/// A fresh queue named after `name` holding `count` bench messages of
/// `size` bytes (created and filled directly, untimed), and a server on it
/// whose SQS calls take `link`: the queue's URL and the server.
pub async fn loaded_server(
    setup: &Client,
    link: &Link,
    s: &Settings,
    name: &str,
    count: u64,
    size: usize,
) -> Result<(String, flight::Running)> {
    let q = sqs::new_queue(setup, name).await;
    sqs::fill(setup, &q, count, size).await;
    let server =
        sqs_server_with(&link.sqs, &q, s.state_dir.as_deref(), s.batch_concurrency).await?;
    Ok((q, server))
}

/// How a run reads: `count` messages in batches of `partitions` x
/// `per_partition`, each partition keeping `receivers` receives in flight.
#[derive(Debug, Clone, Copy)]
pub struct Batches {
    pub count: u64,
    pub partitions: u64,
    pub per_partition: u64,
    pub receivers: Option<u64>,
    /// Plans with `read_ahead` 1, as the Spark source does by default.
    pub read_ahead: bool,
}

impl Batches {
    /// About `target` messages in batches of `batch_messages` per partition
    /// (0: one batch), rounded up to whole batches: a batch that asks for
    /// more than the queue holds would wait out its idle time.
    pub fn new(target: u64, partitions: u64, batch_messages: u64, receivers: Option<u64>) -> Self {
        let whole = target.div_ceil(partitions).max(1);
        let per_partition = match batch_messages {
            0 => whole,
            n => n.min(whole),
        };
        let per_batch = per_partition * partitions;
        Self {
            count: target.div_ceil(per_batch) * per_batch,
            partitions,
            per_partition,
            receivers,
            read_ahead: false,
        }
    }

    /// The same batches, planned with `read_ahead` 1.
    pub fn reading_ahead(self) -> Self {
        Self {
            read_ahead: true,
            ..self
        }
    }
}

/// When a run commits the batches it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commits {
    /// Never (the rows stay in flight).
    None,
    /// Each batch right after it is read, before the next is planned.
    InTurn,
    /// Each batch while the next one is planned and read, in order, as the
    /// Spark source does (its commits run on a background thread).
    Overlapped,
}

/// Reads batches until `b.count` rows were read, committing them as
/// `commits` says. Returns the rows read and the rows deleted (the last
/// batch, with [`Commits::None`]).
pub async fn read_and_commit(
    server: &flight::Running,
    consumer: &str,
    b: Batches,
    commits: Commits,
) -> Result<(u64, u64)> {
    let mut client = server.client().await?;
    let (mut rows, mut deleted, mut batch) = (0, 0, 0);
    let mut pending: Option<tokio::task::JoinHandle<Result<u64>>> = None;
    let start = Instant::now();
    while rows < b.count {
        ensure!(
            start.elapsed() < DEADLINE,
            "reading {} rows took over {DEADLINE:?}",
            b.count
        );
        batch += 1;
        let p = Plan {
            table: TABLE,
            consumer,
            batch,
            partitions: b.partitions,
            max_messages: b.per_partition,
            max_wait_ms: MAX_WAIT_MS,
            receivers: b.receivers,
            read_ahead: b.read_ahead.then_some(1),
        };
        let t0 = Instant::now();
        let tickets = flight::plan(&mut client, &p).await?;
        let t1 = Instant::now();
        rows += flight::read_all(server.addr, tickets).await?.rows;
        let t2 = Instant::now();
        match commits {
            Commits::None => {}
            Commits::InTurn => {
                deleted += flight::commit(&mut client, TABLE, consumer, batch).await?;
            }
            Commits::Overlapped => {
                if let Some(previous) = pending.take() {
                    deleted += previous.await??;
                }
                let mut committer = server.client().await?;
                let consumer = consumer.to_string();
                pending = Some(tokio::spawn(async move {
                    flight::commit(&mut committer, TABLE, &consumer, batch).await
                }));
            }
        }
        if std::env::var_os("SQSF_BENCH_TRACE").is_some() {
            eprintln!(
                "batch {batch}: plan {:?} read {:?} commit {:?}",
                t1 - t0,
                t2 - t1,
                t2.elapsed()
            );
        }
    }
    if let Some(last) = pending {
        deleted += last.await??;
    }
    Ok((
        rows,
        if commits == Commits::None {
            batch
        } else {
            deleted
        },
    ))
}

/// CPU seconds (user + system) a process has used so far.
pub fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return f64::NAN;
    };
    // Fields after the command name (which may hold spaces) start at 3.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        f.get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    // utime and stime are fields 14 and 15 of stat(5): 11 and 12 here.
    (ticks(11) + ticks(12)) / clock_ticks()
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// CPU milliseconds per 1000 messages: the bench process (apart from the
/// latency proxy's thread), the proxy, the emulator; and the cores busy.
#[derive(Debug, Clone, Copy, Default)]
pub struct Cpu {
    /// The bench process without the latency proxy's thread: server and client.
    pub bench: f64,
    /// The latency proxy's thread (0 without one).
    pub proxy: f64,
    pub emulator: f64,
    /// Cores busy on average: everything above over the wall time.
    pub cores: f64,
}

/// A CPU reading: seconds so far of this process, the proxy's thread, the
/// emulator, and when.
pub struct CpuMark {
    process: f64,
    proxy: f64,
    emulator: f64,
    at: std::time::Instant,
}

/// The machine's cores, as the figures' notes state them.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// CPU seconds so far of this process, `link`'s proxy and the emulator.
pub fn cpu_now(emulator: u32, link: &Link) -> CpuMark {
    CpuMark {
        process: cpu_seconds(std::process::id()),
        proxy: link.proxy_cpu_seconds(),
        emulator: cpu_seconds(emulator),
        at: std::time::Instant::now(),
    }
}

/// CPU milliseconds per 1000 of `count` messages since `start`.
pub fn cpu_since(start: CpuMark, emulator: u32, link: &Link, count: u64) -> Cpu {
    let now = cpu_now(emulator, link);
    let per_k = |d: f64| d * 1e3 / (count as f64 / 1e3);
    let (process, proxy, emulator) = (
        now.process - start.process,
        now.proxy - start.proxy,
        now.emulator - start.emulator,
    );
    Cpu {
        bench: per_k(process - proxy),
        proxy: per_k(proxy),
        emulator: per_k(emulator),
        cores: (process + emulator) / (now.at - start.at).as_secs_f64(),
    }
}

/// Settings of figures 3 and 5.
pub struct Settings {
    pub messages: u64,
    pub sizes: Vec<usize>,
    pub partitions: Vec<u64>,
    /// ReceiveMessage calls in flight per partition (figure 3).
    pub receivers: Vec<u64>,
    /// Batch calls our server keeps in flight per commit, and the raw commit's.
    pub batch_concurrency: u32,
    /// How figure 3 commits its batches.
    pub commits: Commits,
    /// Messages per partition of each figure-3 batch (0: all in one batch).
    pub batch_messages: u64,
    pub commit_messages: u64,
    pub reps: usize,
    /// The emulator's pid, for its CPU time.
    pub emulator_pid: u32,
    /// Run our side with a durable registry under this directory.
    pub state_dir: Option<std::path::PathBuf>,
}

/// Says so in `fig` when our side runs with a durable registry.
pub fn note_state_dir(fig: &mut Figure, s: &Settings) {
    if s.state_dir.is_some() {
        fig.note(
            "ours runs with --state-dir: every plan, receive and commit is written to redb \
             (fsync, group commit) before it is acted on",
        );
    }
}

/// Runs both sides of run `rep`, in an order that alternates from one run to
/// the next so that neither side always runs second.
async fn alternate(
    rep: usize,
    mut ours: impl AsyncFnMut() -> Result<()>,
    mut raw: impl AsyncFnMut() -> Result<()>,
) -> Result<()> {
    if rep.is_multiple_of(2) {
        ours().await?;
        raw().await
    } else {
        raw().await?;
        ours().await
    }
}

/// Best of `reps` of each side, order alternated: (ours, raw) messages/s
/// and the CPU of each side's last run.
pub async fn best_of(
    reps: usize,
    mut ours: impl AsyncFnMut() -> Result<(f64, Cpu)>,
    mut raw: impl AsyncFnMut() -> Result<(f64, Cpu)>,
) -> Result<((f64, Cpu), (f64, Cpu))> {
    let (mut o, mut r) = ((0f64, Cpu::default()), (0f64, Cpu::default()));
    for rep in 0..reps {
        let run_ours = async || -> Result<()> {
            let (rate, cpu) = ours().await?;
            o = (o.0.max(rate), cpu);
            Ok(())
        };
        let run_raw = async || -> Result<()> {
            let (rate, cpu) = raw().await?;
            r = (r.0.max(rate), cpu);
            Ok(())
        };
        alternate(rep, run_ours, run_raw).await?;
    }
    Ok((o, r))
}

#[cfg(test)]
mod tests {
    use super::Batches;

    #[test]
    fn batches_are_whole() {
        let b = Batches::new(20_000, 4, 1000, None);
        assert_eq!((b.count, b.per_partition), (20_000, 1000));
        let b = Batches::new(20_001, 3, 1000, Some(8));
        assert_eq!((b.count, b.per_partition), (21_000, 1000));
        let b = Batches::new(2_500, 4, 1000, None);
        assert_eq!((b.count, b.per_partition), (2_500, 625));
        let b = Batches::new(2_501, 4, 0, None);
        assert_eq!((b.count, b.per_partition), (2_504, 626));
    }
}
