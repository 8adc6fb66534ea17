//! Figure 5 at each RTT (0: loopback; above: through a latency proxy that
//! both sides share): the commit of one batch holding every message,
//! against raw DeleteMessageBatch with as many calls in flight.

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use aws_sdk_sqs::Client;
use sqs_flight_tests::rustack::Rustack;

use crate::fig_sqs::{
    Batches, Commits, Cpu, DEADLINE, Settings, TABLE, best_of, loaded_server, note_state_dir,
    read_and_commit,
};
use crate::flight;
use crate::report::{Better, Figure, Row};
use crate::sqs::{self, Link, Rtts};

/// Runs figure 5 at every RTT of `rtts`.
pub async fn run(rustack: &Rustack, rtts: &Rtts, s: &Settings) -> Result<Figure> {
    let concurrency = s.batch_concurrency as usize;
    let mut fig = Figure::new(
        "5. Commit (rustack 0.12.0; RTT 0 = loopback, else through a latency proxy): deletes/s",
        "DoAction commit of one batch holding every message (timed alone, after the read)",
        &format!(
            "DeleteMessageBatch of the same number of handles, {concurrency} calls at a time, through the same proxy"
        ),
    );
    note_state_dir(&mut fig, s);
    let setup = rustack.client().await;
    let partitions = 4u64;
    for &rtt in &rtts.ms {
        let link = Link::open(rustack, rtt, rtts.jitter).await?;
        let target = link.scaled(s.commit_messages, concurrency as u64, 1, rtts);
        let count = target.div_ceil(partitions) * partitions;
        let mut read_t = Duration::ZERO;
        eprintln!(
            "figure 5: {}, commit of {count} messages ({} runs)",
            link.label(),
            s.reps
        );
        let ((ours, _), (raw, _)) = best_of(
            s.reps,
            async || {
                let (t, read) = commit_ours(&setup, &link, s, count, partitions).await?;
                read_t = read;
                Ok((count as f64 / t.as_secs_f64(), Cpu::default()))
            },
            async || {
                let t = commit_raw(&setup, &link, count, partitions, concurrency).await?;
                Ok((count as f64 / t.as_secs_f64(), Cpu::default()))
            },
        )
        .await?;
        let case = format!("{}, {count} messages", link.label());
        fig.rows.push(Row {
            better: Better::Higher,
            target: Some(0.9),
            ..Row::new(case, ours, raw, "deletes/s").param("rtt_ms", link.rtt_ms)
        });
        fig.note(format!(
            "{}: reading the {count} messages into the server before the commit took {:.1} s \
             ({partitions} partitions, untimed in this figure).",
            link.label(),
            read_t.as_secs_f64()
        ));
        link.close().await;
    }
    fig.note(format!(
        "Best of {} runs (order alternated), a fresh queue per run; up to {} messages, fewer \
         above 0 ms (the raw deletes take about {} s), the count is in each row. The raw side \
         receives its handles first, directly and untimed; only its deletes go through the \
         proxy.",
        s.reps,
        s.commit_messages,
        rtts.budget.as_secs()
    ));
    Ok(fig)
}

/// One commit of `count` messages read into a fresh server: (commit time,
/// read time).
async fn commit_ours(
    setup: &Client,
    link: &Link,
    s: &Settings,
    count: u64,
    partitions: u64,
) -> Result<(Duration, Duration)> {
    let (_, server) = loaded_server(setup, link, s, "commit-ours", count, 256).await?;
    let read_start = Instant::now();
    let b = Batches::new(count, partitions, 0, None);
    let (rows, last_batch) = read_and_commit(&server, "bench", b, Commits::None).await?;
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

/// Raw DeleteMessageBatch of `count` handles through `link`, `concurrency`
/// calls at a time: the time of the deletes alone.
async fn commit_raw(
    setup: &Client,
    link: &Link,
    count: u64,
    partitions: u64,
    concurrency: usize,
) -> Result<Duration> {
    let q = sqs::new_queue(setup, "commit-raw").await;
    sqs::fill(setup, &q, count, 256).await;
    let handles = sqs::receive_handles(setup, &q, count, partitions as usize, DEADLINE).await?;
    let (t, deleted) = sqs::raw_delete(&link.sqs, &q, &handles, concurrency).await?;
    ensure!(deleted == count, "raw deleted {deleted} of {count}");
    Ok(t)
}
