//! Figure 2: server overhead. DoGet through the sqs-flight server from the
//! embedded memory backend, against a raw Flight DoGet of the very same
//! record batches already built (the transport's own limit).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use arrow_array::RecordBatch;
use arrow_select::concat::concat_batches;
use sqs_flight_server::config::{Config, TableConfig};
use sqs_flight_server::sqs::OutgoingMessage;

use crate::flight::{self, Plan};
use crate::report::{Better, Figure, Row};
use crate::sqs::body;

const TABLE: &str = "mem";
/// Rows per ReceiveMessage, so per record batch the server builds.
const RECEIVE: usize = 10;
/// Target of the issue: ours / raw.
const TARGET: f64 = 0.8;

/// Settings of figure 2.
pub struct Settings {
    pub messages: u64,
    pub sizes: Vec<usize>,
    pub reps: usize,
}

/// A server whose one table is a memory queue holding `count` messages.
async fn loaded_server(count: u64, size: usize) -> Result<flight::Running> {
    let table = TableConfig {
        visibility_timeout: Some(Duration::from_secs(600)),
        ..TableConfig::memory(TABLE, 0)
    };
    let config = Config::new("127.0.0.1:0".parse()?, vec![table]);
    let registry = sqs_flight_server::registry::Registry::build(&config, None)
        .await
        .expect("registry");
    let table = registry.table(TABLE)?;
    let ids: Vec<u64> = (0..count).collect();
    for chunk in ids.chunks(1000) {
        let messages = chunk
            .iter()
            .map(|&n| OutgoingMessage {
                body: body(n, size),
                ..OutgoingMessage::default()
            })
            .collect();
        let (_, error) = table.send(messages, 0).await;
        ensure!(error.is_none(), "the memory queue refused messages");
    }
    flight::start_server(config, registry).await
}

/// Rows/s of the server's first read, of its replay, and of the raw
/// server, each the best of `reps`.
struct Rates {
    first: f64,
    replay: f64,
    /// The raw server sending the server's own batches: one per receive.
    raw: f64,
    /// The raw server sending the Flight messages the first read sent.
    raw_same: f64,
    mb: f64,
    /// Record batches the first read of the first run streamed.
    batches: usize,
}

/// `batches` cut into record batches of [`RECEIVE`] rows with buffers of
/// their own, as the server builds them (one per ReceiveMessage).
fn per_receive(batches: &[RecordBatch]) -> Result<Vec<RecordBatch>> {
    let schema = batches.first().context("no batch")?.schema();
    let all = concat_batches(&schema, batches)?;
    (0..all.num_rows())
        .step_by(RECEIVE)
        .map(|at| {
            let part = all.slice(at, RECEIVE.min(all.num_rows() - at));
            Ok(concat_batches(&schema, [&part])?)
        })
        .collect()
}

/// Rows/s of a raw server sending `batches`, the best of `reps` reads.
async fn raw_rate(batches: Vec<RecordBatch>, rows: u64, reps: usize) -> Result<f64> {
    let schema = batches.first().context("no batch")?.schema();
    let raw = flight::start_raw(schema, batches).await?;
    let mut client = raw.client().await?;
    let mut best = 0f64;
    for _ in 0..reps {
        let start = Instant::now();
        let read = flight::read_ticket(&mut client, arrow_flight::Ticket::new("raw")).await?;
        let t = start.elapsed();
        ensure!(read.rows == rows, "raw read got {} rows", read.rows);
        best = best.max(rate(read.rows, t));
    }
    raw.stop().await;
    Ok(best)
}

async fn measure(s: &Settings, size: usize) -> Result<Rates> {
    let mut best = Rates {
        first: 0.0,
        replay: 0.0,
        raw: 0.0,
        raw_same: 0.0,
        mb: 0.0,
        batches: 0,
    };
    let mut ready = None;
    let mut first_batches = 0;
    for rep in 0..s.reps {
        let server = loaded_server(s.messages, size).await?;
        let mut client = server.client().await?;
        let p = Plan {
            table: TABLE,
            consumer: "bench",
            batch: 1,
            partitions: 1,
            max_messages: s.messages,
            // The queue is full: every partition ends on max_messages.
            max_wait_ms: 1000,
            receivers: None,
            read_ahead: None,
        };
        let start = Instant::now();
        let tickets = flight::plan(&mut client, &p).await?;
        // The first read keeps what it got: the raw server sends the very
        // same record batches (a sealed ticket replays its rows coalesced).
        let got = flight::collect_ticket(&mut client, tickets[0].clone()).await?;
        let first = start.elapsed();
        let read = flight::Read {
            rows: got.iter().map(|b| b.num_rows() as u64).sum(),
            body_bytes: got.iter().map(flight::body_bytes).sum(),
        };
        ensure!(read.rows == s.messages, "first read got {} rows", read.rows);
        let start = Instant::now();
        let replay = flight::read_ticket(&mut client, tickets[0].clone()).await?;
        let replay_t = start.elapsed();
        ensure!(replay.rows == s.messages, "replay got {} rows", replay.rows);
        if rep == 0 {
            first_batches = got.len();
            ready = Some(got);
        }
        server.stop().await;
        best.first = best.first.max(rate(read.rows, first));
        best.replay = best.replay.max(rate(read.rows, replay_t));
        best.mb = read.body_bytes as f64 / 1e6;
    }
    let batches = ready.context("no batches collected")?;
    best.raw = raw_rate(per_receive(&batches)?, s.messages, s.reps).await?;
    best.raw_same = raw_rate(batches, s.messages, s.reps).await?;
    best.batches = first_batches;
    Ok(best)
}

fn rate(n: u64, t: Duration) -> f64 {
    n as f64 / t.as_secs_f64()
}

/// Runs figure 2.
pub async fn run(s: &Settings) -> Result<Figure> {
    let mut fig = Figure::new(
        "2. Server overhead: DoGet from the embedded backend vs raw Flight DoGet (loopback)",
        "sqs-flight server, memory backend, 1 partition, plan + first DoGet (receive, convert, record, stream)",
        "a minimal in-process Flight server streaming the server's own record batches (one per \
         receive of 10), already built, with the server's encoder settings",
    );
    for &size in &s.sizes {
        eprintln!("figure 2: {} messages of {size} B", s.messages);
        let r = measure(s, size).await?;
        let mb_per_row = r.mb / s.messages as f64;
        for (what, ours) in [("first read", r.first), ("replay of the ticket", r.replay)] {
            fig.rows.push(Row {
                case: format!("{size} B bodies, {what}"),
                ours,
                baseline: r.raw,
                params: Default::default(),
                unit: "rows/s".into(),
                better: Better::Higher,
                target: (what == "first read").then_some(TARGET),
            });
        }
        fig.rows.push(Row {
            case: format!("{size} B bodies, first read vs raw sending its very Flight messages"),
            ours: r.first,
            baseline: r.raw_same,
            params: Default::default(),
            unit: "rows/s".into(),
            better: Better::Higher,
            target: None,
        });
        fig.note(format!(
            "{size} B: first read {:.1} MB/s of bodies, raw {:.1} MB/s; the first read streamed \
             {} record batches (joined when ready together; a sealed ticket is one batch), the \
             raw server {:.1} MB/s sending those",
            r.first * mb_per_row,
            r.raw * mb_per_row,
            r.batches,
            r.raw_same * mb_per_row
        ));
    }
    fig.note(format!(
        "{} messages per read, best of {} runs each. The target's baseline sends the rows as the \
         server builds them, one record batch per receive of 10 (the issue's \"same batches \
         already built\"); the server may send them joined. The last row of each size compares \
         with a raw server sending exactly the Flight messages the first read sent.",
        s.messages, s.reps
    ));
    Ok(fig)
}
