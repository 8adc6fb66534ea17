//! aws-sdk-sqs for the figures: the path the measured calls take at each
//! RTT ([`Link`]), the bench's queues and bodies, and the raw baselines
//! (receive + DeleteMessageBatch loops without the server). Queues, sends,
//! receives, deletes and counts are the harness's (`sqs_flight_tests::sqs`),
//! as is the latency proxy (`sqs_flight_tests::latency`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::QueueAttributeName;
use futures::{StreamExt, TryStreamExt, stream};
use sqs_flight_tests::latency::LatencyProxy;
use sqs_flight_tests::rustack::Rustack;
use sqs_flight_tests::sqs::{create_queue, delete_batch, receive_ten, send_many, sqs_client};

/// Pause of a raw loop after an empty receive (the server's short-poll pause).
const EMPTY_PAUSE: Duration = Duration::from_millis(50);
/// Visibility timeout of bench queues: long, so that nothing comes back
/// while a figure runs.
const QUEUE_VISIBILITY_SECS: u32 = 600;
/// Fewest messages a run is cut to at a high RTT.
const MIN_SCALED_MESSAGES: u64 = 500;

/// The RTTs a figure runs at, and how its message counts shrink with them.
#[derive(Debug, Clone)]
pub struct Rtts {
    /// Added round trips in milliseconds; 0 is rustack on loopback, no proxy.
    pub ms: Vec<u64>,
    /// Each one-way delay varies by up to this much (uniform).
    pub jitter: Duration,
    /// Above 0 ms a run's count is cut so that the raw baseline takes about
    /// this long ([`Link::scaled`]).
    pub budget: Duration,
}

/// [`Link::scaled`] at a round trip of `rtt_ms`, on any backend.
pub fn scaled(
    rtt_ms: u64,
    configured: u64,
    in_flight: u64,
    calls_per_ten: u64,
    rtts: &Rtts,
) -> u64 {
    if rtt_ms == 0 {
        return configured;
    }
    let seconds_per_ten = calls_per_ten.max(1) as f64 * rtt_ms as f64 / 1e3;
    let rate = in_flight.max(1) as f64 * 10.0 / seconds_per_ten;
    let fit = (rate * rtts.budget.as_secs_f64()) as u64;
    configured.min(fit.max(MIN_SCALED_MESSAGES))
}

/// Where the measured SQS calls of one RTT go: rustack itself at 0 ms,
/// else a [`LatencyProxy`] in front of it. The server's client and the raw
/// baseline both use [`Link::sqs`]; queues are created, filled and counted
/// (untimed set-up) with a direct client.
pub struct Link {
    pub rtt_ms: u64,
    /// An SQS client whose every call takes the link's round trip.
    pub sqs: Client,
    proxy: Option<LatencyProxy>,
}

impl Link {
    /// A link of `rtt_ms` to `rustack` (a proxy when above 0).
    pub async fn open(rustack: &Rustack, rtt_ms: u64, jitter: Duration) -> Result<Self> {
        if rtt_ms == 0 {
            return Ok(Self {
                rtt_ms,
                sqs: rustack.client().await,
                proxy: None,
            });
        }
        let rtt = Duration::from_millis(rtt_ms);
        let proxy = LatencyProxy::start(rustack.addr(), rtt, jitter)
            .await
            .context("start the latency proxy")?;
        Ok(Self {
            rtt_ms,
            sqs: sqs_client(&proxy.endpoint()).await,
            proxy: Some(proxy),
        })
    }

    /// `RTT 20 ms`, how rows name their link.
    pub fn label(&self) -> String {
        format!("RTT {} ms", self.rtt_ms)
    }

    /// `configured` messages at 0 ms; above, as many as a baseline keeping
    /// `in_flight` calls going, each `calls_per_ten` round trips per ten
    /// messages, would get through in `rtts.budget` (never more than
    /// `configured`, never fewer than [`MIN_SCALED_MESSAGES`]).
    pub fn scaled(&self, configured: u64, in_flight: u64, calls_per_ten: u64, rtts: &Rtts) -> u64 {
        scaled(self.rtt_ms, configured, in_flight, calls_per_ten, rtts)
    }

    /// CPU seconds the link's proxy has used so far (0 without one).
    pub fn proxy_cpu_seconds(&self) -> f64 {
        self.proxy.as_ref().map_or(0.0, LatencyProxy::cpu_seconds)
    }

    /// Stops the proxy, if any.
    pub async fn close(self) {
        if let Some(proxy) = self.proxy {
            proxy.stop().await;
        }
    }
}

/// A fresh standard queue whose messages stay hidden long enough that
/// nothing comes back while a figure runs; its URL.
pub async fn new_queue(sqs: &Client, name: &str) -> String {
    let vt = QUEUE_VISIBILITY_SECS.to_string();
    create_queue(sqs, name, &[(QueueAttributeName::VisibilityTimeout, &vt)]).await
}

/// A JSON body of exactly `size` bytes (at least 32): `{"n":N,"pad":"xx.."}`.
pub fn body(n: u64, size: usize) -> String {
    let head = format!("{{\"n\":{n},\"pad\":\"");
    let pad = size.saturating_sub(head.len() + 2);
    let mut s = String::with_capacity(size);
    s.push_str(&head);
    s.extend(std::iter::repeat_n('x', pad));
    s.push_str("\"}");
    s
}

/// Sends `count` bench bodies of `size` bytes (the harness's concurrent
/// SendMessageBatch runs).
pub async fn fill(sqs: &Client, url: &str, count: u64, size: usize) {
    send_many(sqs, url, count, |n| body(n, size)).await;
}

/// One ReceiveMessage as the server makes it (ten, every attribute):
/// `(body, receipt handle)` pairs.
pub async fn receive(sqs: &Client, url: &str, wait_secs: i32) -> Vec<(String, String)> {
    receive_ten(sqs, url, wait_secs, None)
        .await
        .into_iter()
        .filter_map(|m| Some((m.body?, m.receipt_handle?)))
        .collect()
}

/// One DeleteMessageBatch call; the number deleted.
pub async fn delete(sqs: &Client, url: &str, handles: &[String]) -> u64 {
    let out = delete_batch(sqs, url, handles.iter().map(String::as_str)).await;
    out.successful().len() as u64
}

/// The raw baseline of figure 3: `workers` loops of receive(10) +
/// DeleteMessageBatch until `count` messages were received and deleted.
/// Like the server's receive loop with a short idle wait, a loop polls
/// without waiting and pauses [`EMPTY_PAUSE`] after an empty receive.
/// Returns the elapsed time.
pub async fn raw_drain(
    sqs: &Client,
    url: &str,
    count: u64,
    workers: usize,
    deadline: Duration,
) -> Result<Duration> {
    let received = Arc::new(AtomicU64::new(0));
    let deleted = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let loops = (0..workers).map(|_| {
        let (received, deleted) = (Arc::clone(&received), Arc::clone(&deleted));
        async move {
            while received.load(Ordering::Relaxed) < count {
                if start.elapsed() > deadline {
                    bail!("raw drain did not finish within {deadline:?}");
                }
                let got = receive(sqs, url, 0).await;
                if got.is_empty() {
                    tokio::time::sleep(EMPTY_PAUSE).await;
                    continue;
                }
                received.fetch_add(got.len() as u64, Ordering::Relaxed);
                let handles: Vec<String> = got.into_iter().map(|(_, h)| h).collect();
                deleted.fetch_add(delete(sqs, url, &handles).await, Ordering::Relaxed);
            }
            Ok(())
        }
    });
    futures::future::try_join_all(loops).await?;
    let t = start.elapsed();
    let n = deleted.load(Ordering::Relaxed);
    if n != count {
        bail!("raw drain deleted {n} of {count}");
    }
    Ok(t)
}

/// Receives `count` messages with `workers` loops and keeps their handles
/// (the untimed setup of the raw commit baseline).
pub async fn receive_handles(
    sqs: &Client,
    url: &str,
    count: u64,
    workers: usize,
    deadline: Duration,
) -> Result<Vec<String>> {
    let start = Instant::now();
    let got = Arc::new(std::sync::Mutex::new(Vec::with_capacity(count as usize)));
    let loops = (0..workers).map(|_| {
        let got = Arc::clone(&got);
        async move {
            loop {
                if got.lock().expect("not poisoned").len() as u64 >= count {
                    return Ok(());
                }
                if start.elapsed() > deadline {
                    bail!("receiving {count} handles did not finish within {deadline:?}");
                }
                let batch = receive(sqs, url, 0).await;
                if batch.is_empty() {
                    tokio::time::sleep(EMPTY_PAUSE).await;
                }
                got.lock()
                    .expect("not poisoned")
                    .extend(batch.into_iter().map(|(_, h)| h));
            }
        }
    });
    futures::future::try_join_all(loops).await?;
    let handles = std::mem::take(&mut *got.lock().expect("not poisoned"));
    Ok(handles)
}

/// The raw baseline of figure 5: DeleteMessageBatch of every handle, ten
/// per call, `concurrency` calls at a time. Returns the elapsed time and
/// the number deleted.
pub async fn raw_delete(
    sqs: &Client,
    url: &str,
    handles: &[String],
    concurrency: usize,
) -> Result<(Duration, u64)> {
    let start = Instant::now();
    let deleted: Vec<u64> = stream::iter(handles.chunks(10))
        .map(|chunk| async move { anyhow::Ok(delete(sqs, url, chunk).await) })
        .buffer_unordered(concurrency)
        .try_collect()
        .await?;
    Ok((start.elapsed(), deleted.iter().sum()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rtts() -> Rtts {
        Rtts {
            ms: vec![0, 20],
            jitter: Duration::ZERO,
            budget: Duration::from_secs(10),
        }
    }

    fn link(rtt_ms: u64) -> Link {
        let config = aws_sdk_sqs::Config::builder()
            .behavior_version(aws_sdk_sqs::config::BehaviorVersion::latest())
            .build();
        Link {
            rtt_ms,
            sqs: Client::from_conf(config),
            proxy: None,
        }
    }

    #[test]
    fn counts_shrink_with_the_rtt() {
        let r = rtts();
        assert_eq!(link(0).scaled(20_000, 1, 2, &r), 20_000);
        // 1 loop at 20 ms: 10 messages per 40 ms, 250/s, 2,500 in 10 s.
        assert_eq!(link(20).scaled(20_000, 1, 2, &r), 2_500);
        assert_eq!(link(50).scaled(20_000, 1, 2, &r), 1_000);
        assert_eq!(link(20).scaled(20_000, 32, 2, &r), 20_000);
        assert_eq!(link(500).scaled(20_000, 1, 2, &r), MIN_SCALED_MESSAGES);
        assert_eq!(link(20).scaled(100, 1, 2, &r), 100);
        assert_eq!(link(20).label(), "RTT 20 ms");
    }
}
