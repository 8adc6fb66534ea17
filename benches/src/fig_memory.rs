//! Figure 6: server RSS per in-flight message held for replay. The real
//! server binary runs as a child process; its VmRSS is read before and
//! after reading N messages without committing them.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use aws_sdk_sqs::Client;
use sqs_flight_schemas::{MessageBatchBuilder, SqsMessage};
use sqs_flight_tests::server_process::ServerProcess;
use sqs_flight_tests::sqs::send_message;

use crate::flight::{self, Plan};
use crate::report::{Better, Figure, Row};
use crate::sqs;

/// Overhead per message beyond the body that the issue allows.
const ALLOWED_OVERHEAD: f64 = 200.0;
const PARTITIONS: u64 = 4;

/// The release server binary serving table `t` = `queue_url` on
/// `endpoint`, as a child process (the harness's, killed on drop), and the
/// address it listens on.
fn start_server(
    bin: &Path,
    endpoint: &str,
    queue_url: &str,
) -> Result<(ServerProcess, SocketAddr)> {
    let table = format!("t={queue_url}");
    let args = [
        "--listen",
        "127.0.0.1:0",
        "--sqs-endpoint",
        endpoint,
        "--table",
        &table,
    ];
    let env = [
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
        ("AWS_REGION", "us-east-1"),
        ("AWS_EC2_METADATA_DISABLED", "true"),
        ("RUST_LOG", "warn"),
    ];
    let server = ServerProcess::start_bin(bin, &args, &env);
    let addr = server.url.trim_start_matches("grpc://");
    let addr = addr
        .parse()
        .with_context(|| format!("bad address {:?}", server.url))?;
    Ok((server, addr))
}

/// VmRSS of process `pid` in bytes.
fn rss(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .context("no VmRSS line")?;
    let kb: u64 = line
        .split_whitespace()
        .nth(1)
        .context("VmRSS without a value")?
        .parse()?;
    Ok(kb * 1024)
}

/// Settings of figure 6.
pub struct Settings<'a> {
    pub server_bin: &'a Path,
    pub endpoint: &'a str,
    /// Cumulative in-flight counts at which RSS is read (ascending).
    pub counts: Vec<u64>,
    pub sizes: Vec<usize>,
    /// The plans' `receivers` (None: the server's default).
    pub receivers: Option<u64>,
}

/// Reads `n` more messages as batch `batch` of consumer `hold`, uncommitted.
async fn hold(server: SocketAddr, batch: u64, n: u64, receivers: Option<u64>) -> Result<()> {
    let mut client = flight::connect(server).await?;
    let p = Plan {
        table: "t",
        consumer: "hold",
        batch,
        partitions: PARTITIONS,
        max_messages: n / PARTITIONS,
        max_wait_ms: 2000,
        receivers,
        read_ahead: None,
    };
    let tickets = flight::plan(&mut client, &p).await?;
    let read = flight::read_all(server, tickets).await?;
    ensure!(read.rows == n, "batch {batch} read {} of {n}", read.rows);
    Ok(())
}

/// One size: (count, RSS growth) pairs.
async fn measure(sqs_client: &Client, s: &Settings<'_>, size: usize) -> Result<Vec<(u64, u64)>> {
    let warm = 200;
    let max = *s.counts.last().context("no counts")?;
    let url = sqs::new_queue(sqs_client, "memory").await;
    sqs::fill(sqs_client, &url, warm + max, size).await;
    let (server, addr) = start_server(s.server_bin, s.endpoint, &url)?;
    // Warm up: a read and commit, so that pools, connections and the
    // runtime's threads exist before the first RSS reading.
    let mut client = flight::connect(addr).await?;
    let receivers = s.receivers;
    let p = Plan {
        table: "t",
        consumer: "warm",
        batch: 1,
        partitions: PARTITIONS,
        max_messages: warm / PARTITIONS,
        max_wait_ms: 2000,
        receivers,
        read_ahead: None,
    };
    let tickets = flight::plan(&mut client, &p).await?;
    flight::read_all(addr, tickets).await?;
    flight::commit(&mut client, "t", "warm", 1).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let base = rss(server.pid())?;
    let mut points = Vec::new();
    let mut held = 0;
    for (i, &n) in s.counts.iter().enumerate() {
        ensure!(
            n % PARTITIONS == 0 && n > held,
            "counts must ascend in multiples of {PARTITIONS}"
        );
        hold(addr, i as u64 + 1, n - held, s.receivers).await?;
        held = n;
        tokio::time::sleep(Duration::from_millis(500)).await;
        points.push((n, rss(server.pid())?.saturating_sub(base)));
    }
    Ok(points)
}

/// Arrow bytes per message of a 10-row batch built as the server builds
/// one per receive (`RecordBatch::get_array_memory_size` / 10).
fn arrow_bytes_per_message(size: usize) -> f64 {
    let mut builder = MessageBatchBuilder::with_capacity(10);
    for n in 0..10u64 {
        builder.append(&SqsMessage {
            message_id: format!("{n:08x}-2f1c-4b8e-9d3a-5c7e1f2a9b40"),
            body: sqs::body(n, size),
            md5_of_body: Some("9e107d9d372bb6826bd81d3542a419d6".into()),
            sent_timestamp: Some(1_764_460_800_000),
            first_receive_timestamp: Some(1_764_460_800_500),
            receive_count: Some(1),
            sender_id: Some("AIDAIT2UOQQY3AUEKVGXU".into()),
            ..SqsMessage::default()
        });
    }
    let batch = builder.finish(1, 0).expect("a batch of the table schema");
    batch.get_array_memory_size() as f64 / 10.0
}

/// Length of the receipt handle the emulator gives out.
async fn receipt_handle_len(sqs_client: &Client) -> Result<usize> {
    let url = sqs::new_queue(sqs_client, "handle").await;
    send_message(sqs_client, &url, "x".into()).await;
    let got = sqs::receive(sqs_client, &url, 1).await;
    got.first()
        .map(|(_, h)| h.len())
        .context("no message received for the handle length")
}

/// Runs figure 6.
pub async fn run(sqs_client: &Client, s: &Settings<'_>) -> Result<Figure> {
    let mut fig = Figure::new(
        "6. Memory: server RSS per in-flight message held for replay (rustack 0.12.0)",
        "VmRSS growth of the server binary per uncommitted message (after a warm-up read + commit)",
        "the body bytes of the message (the target allows 200 B more)",
    );
    for &size in &s.sizes {
        eprintln!("figure 6: {size} B bodies, in flight {:?}", s.counts);
        let points = measure(sqs_client, s, size).await?;
        let mut prev = (0u64, 0u64);
        for &(n, grown) in &points {
            let per = grown as f64 / n as f64;
            fig.rows.push(Row {
                case: format!("{size} B, {n} held: RSS growth / message"),
                ours: per,
                baseline: size as f64,
                params: Default::default(),
                unit: "B/msg".into(),
                better: Better::Lower,
                target: Some((size as f64 + ALLOWED_OVERHEAD) / size as f64),
            });
            if prev.0 > 0 {
                let slope = (grown as f64 - prev.1 as f64) / (n - prev.0) as f64;
                fig.rows.push(Row {
                    case: format!("{size} B, {}..{n}: marginal RSS / message", prev.0),
                    ours: slope,
                    baseline: size as f64,
                    params: Default::default(),
                    unit: "B/msg".into(),
                    better: Better::Lower,
                    target: Some((size as f64 + ALLOWED_OVERHEAD) / size as f64),
                });
            }
            fig.note(format!(
                "{size} B, {n} held: RSS +{:.1} MiB, {:.0} B per message beyond the body",
                grown as f64 / (1 << 20) as f64,
                per - size as f64
            ));
            prev = (n, grown);
        }
    }
    for &size in &s.sizes {
        fig.note(format!(
            "Evidence: a 10-row record batch built by MessageBatchBuilder (the server builds one \
             per ReceiveMessage) holds {:.0} B of Arrow buffers per message for {size} B bodies.",
            arrow_bytes_per_message(size)
        ));
    }
    fig.note(format!(
        "Each held message also keeps its receipt handle ({} B from rustack).",
        receipt_handle_len(sqs_client).await?
    ));
    fig.note(
        "RSS counts what the allocator keeps, not only live bytes; the target reads as \
         ratio <= (body + 200) / body.",
    );
    Ok(fig)
}
