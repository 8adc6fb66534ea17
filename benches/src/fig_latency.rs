//! Figure 7: latency from SendMessage to the row in a Flight client, with
//! long polling, against a raw aws-sdk-sqs long-poll receive loop, at each
//! RTT (every SQS call of the sender, the server and the raw loop through
//! the same latency proxy above 0 ms).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use aws_sdk_sqs::Client;
use futures::TryStreamExt;

use sqs_flight_tests::rustack::Rustack;
use sqs_flight_tests::sqs::send_message;

use crate::fig_sqs::sqs_server;
use crate::flight::{self, Plan};
use crate::report::{Better, Figure, Row};
use crate::sqs::{self, Link, Rtts};

/// Settings of figure 7.
pub struct Settings {
    pub messages: u64,
    pub interval: Duration,
}

type SentAt = Arc<Mutex<Vec<Option<Instant>>>>;

/// The `n` of a bench body `{"n":N,...}`.
fn number_of(body: &str) -> Option<usize> {
    let rest = body.strip_prefix("{\"n\":")?;
    let end = rest.find(',')?;
    rest[..end].parse().ok()
}

/// Sends `count` messages, one every `interval`, recording when each send began.
async fn sender(sqs: Client, url: String, count: u64, every: Duration, sent: SentAt) -> Result<()> {
    let mut tick = tokio::time::interval(every);
    for n in 0..count {
        tick.tick().await;
        sent.lock().expect("not poisoned")[n as usize] = Some(Instant::now());
        send_message(&sqs, &url, sqs::body(n, 256)).await;
    }
    Ok(())
}

fn latency(sent: &SentAt, body: &str, now: Instant) -> Option<Duration> {
    let n = number_of(body)?;
    let at = sent
        .lock()
        .expect("not poisoned")
        .get(n)
        .copied()
        .flatten()?;
    Some(now.duration_since(at))
}

/// Ours: one partition planned for all messages, long-polling, streamed.
async fn ours(setup: &Client, link: &Link, s: &Settings) -> Result<Vec<Duration>> {
    use arrow_array::cast::AsArray;
    let url = sqs::new_queue(setup, "latency-ours").await;
    let server = sqs_server(&link.sqs, &url).await?;
    let mut client = server.client().await?;
    let p = Plan {
        table: "t",
        consumer: "latency",
        batch: 1,
        partitions: 1,
        max_messages: s.messages,
        max_wait_ms: 20_000,
        receivers: None,
        read_ahead: None,
    };
    let ticket = flight::plan(&mut client, &p).await?.remove(0);
    let mut stream = client.do_get(ticket).await?;
    let sent: SentAt = Arc::new(Mutex::new(vec![None; s.messages as usize]));
    // Let the receive loop start its first long poll.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let send = tokio::spawn(sender(
        link.sqs.clone(),
        url,
        s.messages,
        s.interval,
        Arc::clone(&sent),
    ));
    let mut out = Vec::new();
    let deadline = Duration::from_secs(60) + s.interval * s.messages as u32;
    let read = tokio::time::timeout(deadline, async {
        while let Some(b) = stream.try_next().await? {
            let now = Instant::now();
            let bodies = b
                .column_by_name("body")
                .context("no body column")?
                .as_string::<i32>();
            out.extend(
                bodies
                    .iter()
                    .flatten()
                    .filter_map(|body| latency(&sent, body, now)),
            );
            if out.len() as u64 >= s.messages {
                break;
            }
        }
        anyhow::Ok(())
    })
    .await;
    read.context("the Flight stream did not deliver every message in time")??;
    send.await??;
    flight::commit(&mut client, "t", "latency", 1).await?;
    server.stop().await;
    Ok(out)
}

/// Raw: one aws-sdk-sqs loop of ReceiveMessage (20 s long poll) + delete.
async fn raw(setup: &Client, link: &Link, s: &Settings) -> Result<Vec<Duration>> {
    let url = sqs::new_queue(setup, "latency-raw").await;
    let sent: SentAt = Arc::new(Mutex::new(vec![None; s.messages as usize]));
    let receiver = {
        let (sqs_client, url, sent) = (link.sqs.clone(), url.clone(), Arc::clone(&sent));
        let count = s.messages as usize;
        tokio::spawn(async move {
            let mut out = Vec::new();
            while out.len() < count {
                let got = sqs::receive(&sqs_client, &url, 20).await;
                let now = Instant::now();
                out.extend(got.iter().filter_map(|(body, _)| latency(&sent, body, now)));
                let handles: Vec<String> = got.into_iter().map(|(_, h)| h).collect();
                if !handles.is_empty() {
                    sqs::delete(&sqs_client, &url, &handles).await;
                }
            }
            anyhow::Ok(out)
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    sender(link.sqs.clone(), url, s.messages, s.interval, sent).await?;
    let deadline = Duration::from_secs(60);
    let out = tokio::time::timeout(deadline, receiver)
        .await
        .context("the raw receive loop did not get every message in time")???;
    Ok(out)
}

/// The `q` quantile (0..1) in milliseconds.
fn quantile_ms(sorted: &[Duration], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

/// Runs figure 7 at every RTT of `rtts`.
pub async fn run(rustack: &Rustack, rtts: &Rtts, s: &Settings) -> Result<Figure> {
    let mut fig = Figure::new(
        "7. Latency: SendMessage -> row visible in a Flight client (rustack 0.12.0, long polling; RTT 0 = loopback, else through a latency proxy)",
        "one partition planned for every message (max_wait_ms 20000: 19-20 s long polls), rows read as the DoGet streams them",
        "one aws-sdk-sqs loop of ReceiveMessage(10, WaitTimeSeconds 20) + DeleteMessageBatch, through the same proxy",
    );
    let setup = rustack.client().await;
    for &rtt in &rtts.ms {
        let link = Link::open(rustack, rtt, rtts.jitter).await?;
        eprintln!(
            "figure 7: {}, {} messages, one every {:?}",
            link.label(),
            s.messages,
            s.interval
        );
        let mut o = ours(&setup, &link, s).await?;
        let mut r = raw(&setup, &link, s).await?;
        link.close().await;
        ensure!(
            o.len() as u64 == s.messages && r.len() as u64 == s.messages,
            "lost samples"
        );
        o.sort();
        r.sort();
        for (name, q) in [("p50", 0.5), ("p99", 0.99), ("max", 1.0)] {
            let (ours, baseline) = (quantile_ms(&o, q), quantile_ms(&r, q));
            fig.rows.push(Row {
                better: Better::Lower,
                ..Row::new(format!("RTT {rtt} ms: {name}"), ours, baseline, "ms")
                    .param("rtt_ms", rtt)
                    .param("stat", name)
            });
        }
    }
    fig.note(format!(
        "{} messages of 256 B at each RTT, one SendMessage every {} ms (the sender's calls take \
         the RTT too); latency runs from just before SendMessage to the client holding the \
         row. The issue sets no target.",
        s.messages,
        s.interval.as_millis()
    ));
    Ok(fig)
}

#[cfg(test)]
mod tests {
    #[test]
    fn bench_bodies_carry_their_number() {
        assert_eq!(super::number_of(&crate::sqs::body(42, 256)), Some(42));
        assert_eq!(crate::sqs::body(7, 256).len(), 256);
    }
}
