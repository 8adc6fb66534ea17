//! Figures 3 and 5, over the SQS protocol on rustack: receive through the
//! server and commit, against a raw aws-sdk-sqs receive(10) +
//! DeleteMessageBatch loop; and commit alone against raw DeleteMessageBatch.

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use aws_sdk_sqs::Client;
use sqs_flight_server::config::{Backend, Config, DEFAULT_MAX_MESSAGES, PlanParams, TableConfig};
use sqs_flight_server::sqs::batching::BATCH_CONCURRENCY;
use sqs_flight_tests::moto::queue_counts;

use crate::flight::{self, Plan};
use crate::report::{Better, Figure, Row};
use crate::sqs;

const TABLE: &str = "t";
/// Bound of every drain, read and commit.
const DEADLINE: Duration = Duration::from_secs(600);
/// Idle wait of the plans: a partition ends this long after the queue is empty.
const MAX_WAIT_MS: u64 = 1000;

/// A server in this process whose table `t` is the queue at `url`.
pub async fn sqs_server(sqs: &Client, url: &str) -> Result<flight::Running> {
    sqs_server_with(sqs, url, None).await
}

/// [`sqs_server`], with its registry in a fresh directory under `state`.
pub async fn sqs_server_with(
    sqs: &Client,
    url: &str,
    state: Option<&std::path::Path>,
) -> Result<flight::Running> {
    let table = TableConfig {
        name: TABLE.into(),
        backend: Backend::Sqs {
            queue_url: url.to_string(),
        },
        defaults: PlanParams::DEFAULTS,
        visibility_timeout: None,
        payload: None,
    };
    let mut config = Config::new("127.0.0.1:0".parse()?, vec![table]);
    config.state_dir = state.map(|dir| {
        let queue = url.rsplit('/').next().unwrap_or("queue");
        dir.join(format!("{queue}-{}", std::process::id()))
    });
    let registry = sqs_flight_server::server::registry(&config, Some(sqs.clone()))
        .await
        .expect("registry");
    flight::start_server(config, registry).await
}

/// Reads batches of `partitions` x `per_partition` until `count` rows were
/// read, committing each batch after it is read. Returns the rows deleted.
pub async fn read_and_commit(
    server: &flight::Running,
    consumer: &str,
    count: u64,
    partitions: u64,
    per_partition: u64,
    commit_each: bool,
) -> Result<(u64, u64)> {
    let mut client = server.client().await?;
    let (mut rows, mut deleted, mut batch) = (0, 0, 0);
    let start = Instant::now();
    while rows < count {
        ensure!(
            start.elapsed() < DEADLINE,
            "reading {count} rows took over {DEADLINE:?}"
        );
        batch += 1;
        let p = Plan {
            table: TABLE,
            consumer,
            batch,
            partitions,
            max_messages: per_partition,
            max_wait_ms: MAX_WAIT_MS,
        };
        let t0 = Instant::now();
        let tickets = flight::plan(&mut client, &p).await?;
        let t1 = Instant::now();
        rows += flight::read_all(server.addr, tickets).await?.rows;
        let t2 = Instant::now();
        if commit_each {
            deleted += flight::commit(&mut client, TABLE, consumer, batch).await?;
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
    Ok((rows, if commit_each { deleted } else { batch }))
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

/// CPU milliseconds per 1000 messages of this process and of the emulator.
#[derive(Debug, Clone, Copy, Default)]
struct Cpu {
    bench: f64,
    emulator: f64,
}

fn cpu_since(start: (f64, f64), emulator: u32, count: u64) -> Cpu {
    let per_k = |d: f64| d * 1e3 / (count as f64 / 1e3);
    Cpu {
        bench: per_k(cpu_seconds(std::process::id()) - start.0),
        emulator: per_k(cpu_seconds(emulator) - start.1),
    }
}

/// Settings of figures 3 and 5.
pub struct Settings {
    pub messages: u64,
    pub sizes: Vec<usize>,
    pub partitions: Vec<u64>,
    /// Messages per partition of each figure-3 batch (0: all in one batch).
    pub batch_messages: u64,
    pub commit_messages: u64,
    pub reps: usize,
    /// The emulator's pid, for its CPU time.
    pub emulator_pid: u32,
    /// Run our side with a durable registry under this directory.
    pub state_dir: Option<std::path::PathBuf>,
}

/// Figure 3 for one size and partition count: (ours, raw) messages/s, and
/// the CPU each side cost in its last run.
async fn receive_case(
    sqs: &Client,
    s: &Settings,
    size: usize,
    p: u64,
) -> Result<(f64, f64, Cpu, Cpu)> {
    let count = s.messages.div_ceil(p) * p;
    let per_partition = match s.batch_messages {
        0 => count / p,
        n => n.min(count / p),
    };
    let (mut ours, mut raw) = (0f64, 0f64);
    let (mut ours_cpu, mut raw_cpu) = (Cpu::default(), Cpu::default());
    let now = || (cpu_seconds(std::process::id()), cpu_seconds(s.emulator_pid));
    for rep in 0..s.reps {
        let q_ours = sqs::new_queue(sqs, "recv-ours").await;
        let q_raw = sqs::new_queue(sqs, "recv-raw").await;
        sqs::fill(sqs, &q_ours, count, size).await;
        sqs::fill(sqs, &q_raw, count, size).await;
        let server = sqs_server_with(sqs, &q_ours, s.state_dir.as_deref()).await?;
        let run_ours = async || -> Result<()> {
            let (start, cpu) = (Instant::now(), now());
            let (rows, deleted) =
                read_and_commit(&server, "bench", count, p, per_partition, true).await?;
            let t = start.elapsed();
            ours_cpu = cpu_since(cpu, s.emulator_pid, count);
            ensure!(
                rows == count && deleted == count,
                "ours: read {rows}, deleted {deleted} of {count}"
            );
            ours = ours.max(count as f64 / t.as_secs_f64());
            Ok(())
        };
        let run_raw = async || -> Result<()> {
            let cpu = now();
            let t = sqs::raw_drain(sqs, &q_raw, count, p as usize, DEADLINE).await?;
            raw_cpu = cpu_since(cpu, s.emulator_pid, count);
            raw = raw.max(count as f64 / t.as_secs_f64());
            Ok(())
        };
        alternate(rep, run_ours, run_raw).await?;
        server.stop().await;
        let left = queue_counts(sqs, &q_ours).await;
        ensure!(
            left == (0, 0),
            "ours left {left:?} (visible, in flight) in the queue"
        );
    }
    Ok((ours, raw, ours_cpu, raw_cpu))
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

/// Runs figure 3.
pub async fn run_receive(sqs: &Client, s: &Settings) -> Result<Figure> {
    let mut fig = Figure::new(
        "3. End to end over the SQS protocol (rustack 0.12.0): receive + commit",
        "micro-batches: GetFlightInfo (N partitions) + concurrent DoGets + commit, then the next batch; server in-process",
        "N concurrent aws-sdk-sqs loops of ReceiveMessage(10, same attributes) + DeleteMessageBatch",
    );
    if s.state_dir.is_some() {
        fig.note(
            "ours runs with --state-dir: every plan, receive and commit is written to redb \
             (fsync, group commit) before it is acted on"
                .to_string(),
        );
    }
    for &size in &s.sizes {
        for &p in &s.partitions {
            eprintln!(
                "figure 3: {} messages of {size} B, {p} partitions",
                s.messages
            );
            let (ours, raw, oc, rc) = receive_case(sqs, s, size, p).await?;
            fig.note(format!(
                "{size} B, N = {p}: CPU per 1000 messages (last run): bench process (server + \
                 client) {:.0} ms ours vs {:.0} ms raw; rustack {:.0} ms ours vs {:.0} ms raw",
                oc.bench, rc.bench, oc.emulator, rc.emulator
            ));
            fig.rows.push(Row {
                case: format!("{size} B, N = {p}"),
                ours,
                baseline: raw,
                unit: "msg/s",
                better: Better::Higher,
                target: Some(0.9),
            });
        }
    }
    let batches = match s.batch_messages {
        0 => "one batch holding every message".to_string(),
        n => format!(
            "batches of {n} messages per partition (the server's default max_messages is {DEFAULT_MAX_MESSAGES})"
        ),
    };
    fig.note(format!(
        "{} messages per run, a fresh queue per run, best of {} runs (order alternated). \
         Ours reads {batches}, each committed after it is read ({BATCH_CONCURRENCY} concurrent \
         DeleteMessageBatch calls per commit); the raw loop deletes after each receive. \
         rustack scans every in-flight message on each ReceiveMessage \
         (`StandardQueueStorage::return_expired_inflight`), so its cost per receive grows with \
         the messages a batch holds; SQS has no such scan.",
        s.messages, s.reps
    ));
    Ok(fig)
}

/// Runs figure 5.
pub async fn run_commit(sqs: &Client, s: &Settings) -> Result<Figure> {
    let mut fig = Figure::new(
        "5. Commit (rustack 0.12.0): deletes/s",
        "DoAction commit of one batch holding every message (timed alone, after the read)",
        &format!(
            "DeleteMessageBatch of the same number of handles, {BATCH_CONCURRENCY} calls at a time"
        ),
    );
    if s.state_dir.is_some() {
        fig.note(
            "ours runs with --state-dir: every plan, receive and commit is written to redb \
             (fsync, group commit) before it is acted on"
                .to_string(),
        );
    }
    let count = s.commit_messages;
    let partitions = 4u64;
    let per = count.div_ceil(partitions);
    let count = per * partitions;
    let (mut ours, mut raw, mut read_t) = (0f64, 0f64, Duration::ZERO);
    for rep in 0..s.reps {
        eprintln!(
            "figure 5: commit of {count} messages (run {} of {})",
            rep + 1,
            s.reps
        );
        let run_ours = async || -> Result<()> {
            let (t, read) = commit_ours(sqs, s, count, partitions).await?;
            ours = ours.max(count as f64 / t.as_secs_f64());
            read_t = read;
            Ok(())
        };
        let run_raw = async || -> Result<()> {
            let t = commit_raw(sqs, count, partitions).await?;
            raw = raw.max(count as f64 / t.as_secs_f64());
            Ok(())
        };
        alternate(rep, run_ours, run_raw).await?;
    }
    fig.rows.push(Row {
        case: format!("{count} messages"),
        ours,
        baseline: raw,
        unit: "deletes/s",
        better: Better::Higher,
        target: Some(0.9),
    });
    fig.note(format!(
        "Best of {} runs (order alternated), a fresh queue per run. Reading the {count} \
         messages into the server before the commit took {:.1} s ({partitions} partitions, \
         untimed in this figure); the raw side receives its handles first, untimed too.",
        s.reps,
        read_t.as_secs_f64()
    ));
    Ok(fig)
}

/// One commit of `count` messages read into a fresh server: (commit time,
/// read time).
async fn commit_ours(
    sqs: &Client,
    s: &Settings,
    count: u64,
    partitions: u64,
) -> Result<(Duration, Duration)> {
    let q = sqs::new_queue(sqs, "commit-ours").await;
    sqs::fill(sqs, &q, count, 256).await;
    let server = sqs_server_with(sqs, &q, s.state_dir.as_deref()).await?;
    let read_start = Instant::now();
    let (rows, last_batch) = read_and_commit(
        &server,
        "bench",
        count,
        partitions,
        count / partitions,
        false,
    )
    .await?;
    let read_t = read_start.elapsed();
    ensure!(rows == count, "read {rows} of {count}");
    let mut client = server.client().await?;
    let start = Instant::now();
    let deleted = flight::commit(&mut client, TABLE, "bench", last_batch).await?;
    let t = start.elapsed();
    server.stop().await;
    ensure!(deleted == count, "commit deleted {deleted} of {count}");
    Ok((t, read_t))
}

/// Raw DeleteMessageBatch of `count` handles, [`BATCH_CONCURRENCY`] calls at
/// a time: the time of the deletes alone.
async fn commit_raw(sqs: &Client, count: u64, partitions: u64) -> Result<Duration> {
    let q = sqs::new_queue(sqs, "commit-raw").await;
    sqs::fill(sqs, &q, count, 256).await;
    let handles = sqs::receive_handles(sqs, &q, count, partitions as usize, DEADLINE).await?;
    let (t, deleted) = sqs::raw_delete(sqs, &q, &handles, BATCH_CONCURRENCY).await?;
    ensure!(deleted == count, "raw deleted {deleted} of {count}");
    Ok(t)
}
