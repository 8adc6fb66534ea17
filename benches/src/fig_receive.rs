//! Figure 3 at each RTT (0: loopback; above: through a latency proxy that
//! both sides share): micro-batches received through the server and
//! committed, against raw aws-sdk-sqs receive(10) + DeleteMessageBatch
//! loops keeping as many calls in flight; and the latency-hiding row, ours
//! at an RTT against ours at 0 ms.

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use aws_sdk_sqs::Client;
use sqs_flight_server::config::plan::{
    DEFAULT_MAX_MESSAGES, DEFAULT_PARTITIONS, DEFAULT_RECEIVERS,
};
use sqs_flight_server::registry::receive::width_at;
use sqs_flight_tests::rustack::Rustack;
use sqs_flight_tests::sqs::queue_counts;

use crate::chart::{Chart, Series};
use crate::fig_sqs::{
    Batches, Commits, Cpu, DEADLINE, Settings, best_of, cores, cpu_now, cpu_since, loaded_server,
    note_state_dir, read_and_commit,
};
use crate::report::{Better, Figure, Params, Row};
use crate::sqs::{self, Link, Rtts};

/// Calls per ten messages of a raw drain loop: a receive and a delete.
const DRAIN_CALLS_PER_TEN: u64 = 2;
/// The RTT at which the latency-hiding row has a target.
const SQS_RTT_MS: u64 = 20;

/// One run of ours: a fresh queue of `b.count` messages of `size` bytes
/// read and committed through a server whose SQS calls take `link`.
/// Messages/s and the CPU it cost.
async fn ours_once(
    setup: &Client,
    link: &Link,
    s: &Settings,
    size: usize,
    b: Batches,
) -> Result<(f64, Cpu)> {
    let (q, server) = loaded_server(setup, link, s, "recv-ours", b.count, size).await?;
    let (start, cpu) = (Instant::now(), cpu_now(s.emulator_pid, link));
    let (rows, deleted) = read_and_commit(&server, "bench", b, s.commits).await?;
    let t = start.elapsed();
    let cpu = cpu_since(cpu, s.emulator_pid, link, b.count);
    server.stop().await;
    ensure!(
        rows == b.count && deleted == b.count,
        "ours: read {rows}, deleted {deleted} of {}",
        b.count
    );
    let left = queue_counts(setup, &q).await;
    ensure!(
        left == (0, 0),
        "ours left {left:?} (visible, in flight) in the queue"
    );
    Ok((b.count as f64 / t.as_secs_f64(), cpu))
}

/// One run of the raw baseline: `workers` receive + delete loops through
/// `link` over a fresh queue of `count` messages. Messages/s and CPU.
async fn raw_once(
    setup: &Client,
    link: &Link,
    s: &Settings,
    size: usize,
    count: u64,
    workers: u64,
) -> Result<(f64, Cpu)> {
    let q = sqs::new_queue(setup, "recv-raw").await;
    sqs::fill(setup, &q, count, size).await;
    let cpu = cpu_now(s.emulator_pid, link);
    let t = sqs::raw_drain(&link.sqs, &q, count, workers as usize, DEADLINE).await?;
    Ok((
        count as f64 / t.as_secs_f64(),
        cpu_since(cpu, s.emulator_pid, link, count),
    ))
}

/// One case of figure 3: a body size, partitions, receivers per partition.
#[derive(Debug, Clone, Copy)]
struct Case {
    size: usize,
    partitions: u64,
    receivers: u64,
}

impl Case {
    /// Loops of the raw baseline: as many calls in flight as ours keeps on
    /// a busy queue at the link's round trip (past 32 a partition grows only
    /// as far as the round trip calls for).
    fn workers(&self, link: &Link) -> u64 {
        self.partitions * width_at(Duration::from_millis(link.rtt_ms), self.receivers)
    }

    /// The row's identity across runs (`compare`).
    fn params(&self, link: &Link) -> Params {
        Params::from([
            ("rtt_ms".to_string(), link.rtt_ms.into()),
            ("size_b".to_string(), self.size.into()),
            ("partitions".to_string(), self.partitions.into()),
            ("receivers".to_string(), self.receivers.into()),
        ])
    }

    /// `256 B, N = 4, R = 8`
    fn label(&self) -> String {
        format!(
            "{} B, N = {}, R = {}",
            self.size, self.partitions, self.receivers
        )
    }
}

/// Figure 3 for one case at one link: a row, and the points of the chart.
async fn receive_case(
    setup: &Client,
    link: &Link,
    s: &Settings,
    rtts: &Rtts,
    case: Case,
    fig: &mut Figure,
) -> Result<(f64, f64)> {
    let target = link.scaled(s.messages, case.workers(link), DRAIN_CALLS_PER_TEN, rtts);
    let b = Batches::new(
        target,
        case.partitions,
        s.batch_messages,
        Some(case.receivers),
    );
    eprintln!(
        "figure 3: {}, {}: {} messages (raw: {} loops)",
        link.label(),
        case.label(),
        b.count,
        case.workers(link)
    );
    let ((ours, oc), (raw, rc)) = best_of(
        s.reps,
        async || ours_once(setup, link, s, case.size, b).await,
        async || raw_once(setup, link, s, case.size, b.count, case.workers(link)).await,
    )
    .await?;
    fig.note(format!(
        "{}, {}: CPU per 1000 messages (last run), ours vs raw: server + client {:.0} vs {:.0} ms, \
         latency proxy {:.0} vs {:.0} ms, rustack {:.0} vs {:.0} ms; cores busy {:.2} vs {:.2} \
         (of {})",
        link.label(),
        case.label(),
        oc.bench,
        rc.bench,
        oc.proxy,
        rc.proxy,
        oc.emulator,
        rc.emulator,
        oc.cores,
        rc.cores,
        cores()
    ));
    fig.rows.push(Row {
        case: format!(
            "{}, {} (raw: {} loops), {} msgs",
            link.label(),
            case.label(),
            case.workers(link),
            b.count
        ),
        ours,
        baseline: raw,
        params: case.params(link),
        unit: "msg/s".into(),
        better: Better::Higher,
        target: Some(0.9),
    });
    Ok((ours, raw))
}

/// The latency-hiding row at `link`: ours at the server's default settings
/// (2 partitions, default receivers) at the link's RTT against ours at 0 ms,
/// same count.
async fn latency_hiding(
    setup: &Client,
    direct: &Link,
    link: &Link,
    s: &Settings,
    rtts: &Rtts,
    fig: &mut Figure,
) -> Result<()> {
    let p = DEFAULT_PARTITIONS;
    let size = s.sizes.first().copied().unwrap_or(256);
    let width = width_at(Duration::from_millis(link.rtt_ms), DEFAULT_RECEIVERS);
    let target = link.scaled(s.messages, p * width, DRAIN_CALLS_PER_TEN, rtts);
    let b = Batches::new(target, p, s.batch_messages, None);
    eprintln!(
        "figure 3: latency hiding, ours at {} and at 0 ms: {} messages of {size} B",
        link.label(),
        b.count
    );
    let ((far, fc), (near, nc)) = best_of(
        s.reps,
        async || ours_once(setup, link, s, size, b).await,
        async || ours_once(setup, direct, s, size, b).await,
    )
    .await?;
    // What the machine's cores could do at the CPU a message cost at the
    // RTT, if they were never idle: the ceiling of the row's numerator.
    let per_message = (fc.bench + fc.proxy + fc.emulator) / 1e6;
    let ceiling = cores() as f64 / per_message;
    fig.note(format!(
        "latency hiding, {}: CPU per 1000 messages (last run), at the RTT vs at 0 ms: server + \
         client {:.0} vs {:.0} ms, latency proxy {:.0} ms, rustack {:.0} vs {:.0} ms; cores busy \
         {:.2} vs {:.2} (of {}). At the RTT's {:.0} ms per 1000 messages, {} busy cores would \
         read {:.0} msg/s, {:.2} of ours at 0 ms: the row cannot go above that on this machine",
        link.label(),
        fc.bench,
        nc.bench,
        fc.proxy,
        fc.emulator,
        nc.emulator,
        fc.cores,
        nc.cores,
        cores(),
        per_message * 1e6,
        cores(),
        ceiling,
        ceiling / near
    ));
    fig.rows.push(Row {
        case: format!(
            "latency hiding: ours at {} / ours at 0 ms ({size} B, N = {p}, default R = \
             {DEFAULT_RECEIVERS}), {} msgs",
            link.label(),
            b.count
        ),
        ours: far,
        baseline: near,
        params: Case {
            size,
            partitions: p,
            receivers: DEFAULT_RECEIVERS,
        }
        .params(link)
        .into_iter()
        .chain([("row".to_string(), "latency hiding".into())])
        .collect(),
        unit: "msg/s".into(),
        better: Better::Higher,
        target: (link.rtt_ms == SQS_RTT_MS).then_some(0.8),
    });
    Ok(())
}

/// Runs figure 3 at every RTT of `rtts`.
pub async fn run(rustack: &Rustack, rtts: &Rtts, s: &Settings) -> Result<Figure> {
    let mut fig = Figure::new(
        "3. End to end over the SQS protocol (rustack 0.12.0; RTT 0 = loopback, else through a latency proxy): receive + commit",
        match s.commits {
            Commits::Overlapped => {
                "micro-batches: GetFlightInfo (N partitions, R receives in flight each) + concurrent DoGets, the commit of each batch overlapping the next batch's read; server in-process"
            }
            _ => {
                "micro-batches: GetFlightInfo (N partitions, R receives in flight each) + concurrent DoGets + commit, then the next batch; server in-process"
            }
        },
        "as many concurrent aws-sdk-sqs loops as ours keeps ReceiveMessage calls (N x R up to R = 32, N x 32 up to 10 ms; see `width_at`) of ReceiveMessage(10, same attributes) + DeleteMessageBatch, through the same proxy",
    );
    note_state_dir(&mut fig, s);
    let setup = rustack.client().await;
    let direct = Link::open(rustack, 0, rtts.jitter).await?;
    let mut chart = Chart::new(
        "Figure 3: receive + commit through the server vs raw aws-sdk-sqs loops",
        "added round trip (ms)",
        "messages/s",
    );
    for &size in &s.sizes {
        for &partitions in &s.partitions {
            for &receivers in &s.receivers {
                let case = Case {
                    size,
                    partitions,
                    receivers,
                };
                let mut ours = Series::new(format!("ours, {}", case.label()), false);
                let mut raw = Series::new(
                    format!("raw, as many loops as ours keeps calls, {size} B"),
                    true,
                );
                for &rtt in &rtts.ms {
                    let link = Link::open(rustack, rtt, rtts.jitter).await?;
                    let (o, r) = receive_case(&setup, &link, s, rtts, case, &mut fig).await?;
                    link.close().await;
                    ours.points.push((rtt as f64, o));
                    raw.points.push((rtt as f64, r));
                }
                chart.pair(ours, raw);
            }
        }
    }
    for &rtt in rtts.ms.iter().filter(|&&r| r > 0) {
        let link = Link::open(rustack, rtt, rtts.jitter).await?;
        latency_hiding(&setup, &direct, &link, s, rtts, &mut fig).await?;
        link.close().await;
    }
    direct.close().await;
    let batches = match s.batch_messages {
        0 => "one batch holding every message".to_string(),
        n => format!(
            "batches of {n} messages per partition (the server's default max_messages is {DEFAULT_MAX_MESSAGES})"
        ),
    };
    fig.note(format!(
        "{} messages per run at 0 ms; above 0 ms fewer, so that the raw loops take about {} s \
         (each row says the count used), a fresh queue per run, best of {} runs (order \
         alternated). Ours reads {batches}, each committed {} ({} concurrent \
         DeleteMessageBatch calls per commit); the raw loop \
         deletes after each receive. Queues are created and filled directly (untimed); every \
         timed SQS call of both sides goes through the proxy of its RTT. rustack scans every \
         in-flight message on each ReceiveMessage (`StandardQueueStorage::return_expired_inflight`), \
         so its cost per receive grows with the messages a batch holds; SQS has no such scan.",
        s.messages,
        rtts.budget.as_secs(),
        s.reps,
        match s.commits {
            Commits::Overlapped => {
                "while the next batch is planned and read, in order, as the Spark source does"
            }
            _ => "after it is read, before the next is planned",
        },
        s.batch_concurrency
    ));
    if rtts.ms.iter().any(|&r| r > 0) {
        fig.note(
            "Latency hiding rows: the baseline column is ours at 0 ms, same count and settings; \
             the target (>= 0.8) is set at 20 ms, SQS's round trip from EC2 in the same region."
                .to_string(),
        );
    }
    if !rtts.jitter.is_zero() {
        fig.note(format!(
            "Each one-way delay varies by up to ±{} ms.",
            rtts.jitter.as_millis()
        ));
    }
    fig.chart = Some(("fig3.svg".into(), chart));
    Ok(fig)
}
