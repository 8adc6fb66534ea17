//! Several ReceiveMessage calls in flight per partition (`receivers`): rule 1
//! (docs/protocol.md#the-rules) holds, a partition still ends exactly at its limits, a busy table's next
//! batch opens its width after one full receive (also after an idle batch
//! between; a burst no wider than its depth fills), and an idle queue costs one long poll per partition whatever
//! `receivers` is, also right after a busy batch.
//!
//! Tests that count calls in flight put a latency proxy between the server
//! and rustack: calls issued together then overlap for a whole round trip,
//! however loaded the machine, so a peak is a property of the server, not
//! of the scheduler.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use arrow_array::RecordBatch;
use serde_json::json;
use sqs_flight_server::sqs::{Received, SqsError};
use sqs_flight_tests::latency::LatencyProxy;
use sqs_flight_tests::moto;
use sqs_flight_tests::rustack::rustack;
use sqs_flight_tests::server::TestServer;
use sqs_flight_tests::sqs::sqs_client;

use sqs_flight_tests::prelude::*;

/// Counts a queue's ReceiveMessage calls: how many were made, how many were
/// in flight at most, and how many messages they brought in all.
#[derive(Default)]
struct Counting {
    calls: AtomicUsize,
    now: AtomicUsize,
    peak: AtomicUsize,
    received: AtomicU64,
}

impl Counting {
    /// Starts counting calls and the peak afresh.
    fn reset(&self) {
        self.calls.store(0, Ordering::SeqCst);
        self.peak.store(0, Ordering::SeqCst);
    }
}

impl ReceiveWatch for Counting {
    fn before(&self) {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(n, Ordering::SeqCst);
    }
    fn after(&self, got: &Result<Vec<Received>, SqsError>) {
        self.now.fetch_sub(1, Ordering::SeqCst);
        if let Ok(got) = got {
            self.received.fetch_add(got.len() as u64, Ordering::SeqCst);
        }
    }
}

/// A server whose table `t` is `url`, its receives counted.
async fn counted(sqs: &aws_sdk_sqs::Client, url: &str) -> (TestServer, Arc<Counting>) {
    let counting = Arc::new(Counting::default());
    (watched(sqs, url, Arc::clone(&counting)).await, counting)
}

/// Like [`counted`], the server reaching SQS through a proxy that adds
/// `rtt` to every round trip (the proxy is returned to be stopped).
async fn counted_behind(url: &str, rtt: Duration) -> (TestServer, Arc<Counting>, LatencyProxy) {
    let proxy = LatencyProxy::start(rustack().addr(), rtt, Duration::ZERO)
        .await
        .expect("latency proxy");
    let through = sqs_client(&proxy.endpoint()).await;
    let (server, counting) = counted(&through, url).await;
    (server, counting, proxy)
}

/// Plans the one-partition batch `cmd` and reads its ticket to the end.
async fn read_one(
    flight: &mut arrow_flight::FlightClient,
    cmd: serde_json::Value,
) -> Vec<RecordBatch> {
    let info = plan_on(flight, &cmd).await.unwrap();
    read_on(flight, &tickets(&info)[0]).await.unwrap()
}

/// A rustack queue holding `n` messages `m0..`, and its URL.
async fn rustack_queue(n: usize) -> (aws_sdk_sqs::Client, String) {
    let sqs = rustack().client().await;
    let url = moto::queue_holding(&sqs, "recv", n).await;
    (sqs, url)
}

/// Batch `batch` of one partition: at most `max` messages, up to
/// `receivers` calls, ending after a second without a message.
fn one_partition(batch: u64, max: u64, receivers: u64) -> serde_json::Value {
    json!({"table": "t", "batch": batch, "partitions": 1, "receivers": receivers,
           "max_messages": max, "max_wait_ms": 1000})
}

/// A server reading a rustack queue through a 200 ms proxy, its receives
/// counted, after a busy batch took the queue's 200 messages with up to
/// `receivers` calls (`busy`: its most calls in flight) and an idle batch
/// found nothing (every message is in flight, as after a drain).
struct AfterIdle {
    sqs: aws_sdk_sqs::Client,
    url: String,
    server: TestServer,
    queue: Arc<Counting>,
    proxy: LatencyProxy,
    flight: arrow_flight::FlightClient,
    busy: usize,
}

async fn busy_then_idle(receivers: u64) -> AfterIdle {
    let (sqs, url) = rustack_queue(200).await;
    let (server, queue, proxy) = counted_behind(&url, Duration::from_millis(200)).await;
    let mut flight = server.client().await;
    let rows = read_one(&mut flight, one_partition(1, 200, receivers)).await;
    assert_eq!(bodies(&rows).len(), 200);
    let busy = queue.peak.load(Ordering::SeqCst);
    assert!(bodies(&read_one(&mut flight, one_partition(2, 200, receivers)).await).is_empty());
    AfterIdle {
        sqs,
        url,
        server,
        queue,
        proxy,
        flight,
        busy,
    }
}

impl AfterIdle {
    async fn stop(self) {
        self.server.stop().await;
        self.proxy.stop().await;
    }
}

#[tokio::test]
async fn with_several_receivers_every_message_is_read_once_and_replays_in_order() {
    let (sqs, url) = rustack_queue(600).await;
    let mut f = Fixture::serve(sqs, url, |_| {}, |_| {}).await;
    let info = f
        .plan(json!({"table": "t", "partitions": 2, "receivers": 4,
                     "max_messages": 1000, "max_wait_ms": 1000}))
        .await
        .unwrap();
    let tickets = tickets(&info);
    // Both partitions read at once, as an engine's workers do.
    let mut a = f.server.client().await;
    let mut b = f.server.client().await;
    let (first_a, first_b) =
        tokio::join!(read_on(&mut a, &tickets[0]), read_on(&mut b, &tickets[1]));
    let (first_a, first_b) = (first_a.unwrap(), first_b.unwrap());
    let ids: Vec<_> = strings(&first_a, "message_id")
        .into_iter()
        .chain(strings(&first_b, "message_id"))
        .map(Option::unwrap)
        .collect();
    assert_eq!(ids.len(), 600, "every message was read");
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 600, "none twice");
    for (ticket, first) in tickets.iter().zip([&first_a, &first_b]) {
        let again = f.read(ticket).await.unwrap();
        assert_eq!(
            concat(first),
            concat(&again),
            "a replay differs from the first read"
        );
    }
    assert_eq!(f.counts().await, (0, 600));
    let done = f.commit("default", 1).await;
    assert_eq!(done["deleted"], 600);
    assert_eq!(f.counts().await, (0, 0));
}

#[tokio::test]
async fn a_partition_never_receives_more_than_max_messages() {
    let (sqs, url) = rustack_queue(300).await;
    let (server, queue) = counted(&sqs, &url).await;
    let mut flight = server.client().await;
    for (batch, max) in [(1, 25u64), (2, 7)] {
        let before = queue.received.load(Ordering::SeqCst);
        let rows = read_one(
            &mut flight,
            json!({"table": "t", "batch": batch, "partitions": 1, "receivers": 8,
                    "max_messages": max, "max_wait_ms": 1000}),
        )
        .await;
        assert_eq!(bodies(&rows).len() as u64, max);
        let received = queue.received.load(Ordering::SeqCst) - before;
        assert_eq!(
            received, max,
            "the calls asked SQS for more than max_messages"
        );
    }
    assert_eq!(moto::queue_counts(&sqs, &url).await, (268, 32));
}

#[tokio::test]
async fn what_comes_in_past_max_bytes_is_visible_again_at_once() {
    let (sqs, url) = rustack_queue(400).await;
    let (server, queue) = counted(&sqs, &url).await;
    let mut flight = server.client().await;
    let rows = read_one(
        &mut flight,
        json!({"table": "t", "partitions": 1, "receivers": 8,
                "max_bytes": 3000, "max_wait_ms": 1000}),
    )
    .await;
    let kept = bodies(&rows).len() as i64;
    assert!(
        kept > 0 && kept < 400,
        "{kept} rows under a 3000-byte limit"
    );
    // The stream ends at once; calls still in flight then come back (on a
    // busy queue, within a round trip) and what they bring is handed back.
    let expected = (400 - kept, kept);
    let within = std::time::Duration::from_secs(10);
    let counts = poll(
        within,
        async || moto::queue_counts(&sqs, &url).await,
        |c| *c == expected,
    );
    assert_eq!(
        counts.await,
        Ok(expected),
        "only the recorded rows stay in flight"
    );
    let received = queue.received.load(Ordering::SeqCst) as i64;
    assert!(
        received > kept,
        "the test made the server receive past its limit"
    );
}

#[tokio::test]
async fn a_busy_queue_gets_several_calls_in_flight_but_never_more_than_receivers() {
    let (sqs, url) = rustack_queue(500).await;
    let (server, queue) = counted(&sqs, &url).await;
    let mut flight = server.client().await;
    let rows = read_one(
        &mut flight,
        json!({"table": "t", "partitions": 1, "receivers": 4,
                "max_messages": 500, "max_wait_ms": 1000}),
    )
    .await;
    assert_eq!(bodies(&rows).len(), 500);
    let peak = queue.peak.load(Ordering::SeqCst);
    assert!((2..=4).contains(&peak), "{peak} calls in flight at most");
}

#[tokio::test]
async fn after_a_busy_batch_the_next_opens_its_width_after_one_full_receive() {
    let (_sqs, url) = rustack_queue(400).await;
    let (server, queue, proxy) = counted_behind(&url, Duration::from_millis(200)).await;
    let mut flight = server.client().await;
    let cmd = |batch: u64, max: u64| one_partition(batch, max, 4);
    // A busy first batch grows to four calls and ends there.
    assert_eq!(bodies(&read_one(&mut flight, cmd(1, 200)).await).len(), 200);
    // Exact: calls issued together overlap for the proxy's whole round trip.
    assert_eq!(
        queue.peak.load(Ordering::SeqCst),
        4,
        "the first batch got every receiver"
    );
    queue.reset();
    // Forty messages are four calls of ten. A cold start never has more
    // than two in flight (one call, then two, then the last one); a warm
    // one sends one call, then the three others together.
    assert_eq!(bodies(&read_one(&mut flight, cmd(2, 40)).await).len(), 40);
    let (calls, peak) = (
        queue.calls.load(Ordering::SeqCst),
        queue.peak.load(Ordering::SeqCst),
    );
    assert_eq!(calls, 4, "one call per ten messages");
    assert!(
        peak >= 3,
        "{peak} calls in flight at most: the batch did not start warm"
    );
    server.stop().await;
    proxy.stop().await;
}

#[tokio::test]
async fn an_idle_batch_between_two_busy_ones_leaves_the_width_warm() {
    let mut t = busy_then_idle(4).await;
    assert_eq!(t.busy, 4, "the busy batch");
    moto::send_bodies(&t.sqs, &t.url, (0..40).map(|i| format!("n{i}"))).await;
    t.queue.reset();
    // As in `after_a_busy_batch_the_next_opens_its_width_after_one_full_receive`:
    // a warm start sends one call, then the three others together; had the
    // idle batch reset the width, no more than two would be in flight.
    assert_eq!(
        bodies(&read_one(&mut t.flight, one_partition(3, 40, 4)).await).len(),
        40
    );
    let (calls, peak) = (
        t.queue.calls.load(Ordering::SeqCst),
        t.queue.peak.load(Ordering::SeqCst),
    );
    assert_eq!(calls, 4, "one call per ten messages");
    assert!(
        peak >= 3,
        "{peak} calls in flight at most: the idle batch narrowed the width"
    );
    t.stop().await;
}

#[tokio::test]
async fn a_burst_after_an_idle_batch_opens_only_the_calls_its_depth_fills() {
    let mut t = busy_then_idle(8).await;
    let busy = t.busy;
    assert!(busy >= 6, "{busy}: the busy batch did not grow wide");
    // A burst of 15, its depth read as the Spark source reads it before
    // each plan: a full first receive opens two calls, not the drain's
    // width (whose other calls would long-poll the emptied queue).
    moto::send_bodies(&t.sqs, &t.url, (0..15).map(|i| format!("b{i}"))).await;
    let status = action_on(&mut t.flight, "status", &json!({"table": "t"}))
        .await
        .unwrap();
    assert_eq!(status["tables"]["t"]["approximate_depth"], 15);
    t.queue.reset();
    assert_eq!(
        bodies(&read_one(&mut t.flight, one_partition(3, 200, 8)).await).len(),
        15
    );
    let peak = t.queue.peak.load(Ordering::SeqCst);
    assert!(
        peak <= 2,
        "{peak} calls in flight for a burst of 15 (the busy batch had {busy})"
    );
    t.stop().await;
}

#[tokio::test]
async fn after_a_busy_batch_an_idle_partition_makes_one_or_two_calls() {
    let (sqs, url) = rustack_queue(200).await;
    let (server, queue, proxy) = counted_behind(&url, Duration::from_millis(100)).await;
    let mut flight = server.client().await;
    let cmd = |batch: u64, max: u64, wait: u64| {
        json!({"table": "t", "batch": batch, "partitions": 1, "receivers": 8,
               "max_messages": max, "max_wait_ms": wait})
    };
    // A busy batch takes every message and ends at max_messages, wide open.
    assert_eq!(
        bodies(&read_one(&mut flight, cmd(1, 200, 1000)).await).len(),
        200
    );
    let peak = queue.peak.load(Ordering::SeqCst);
    assert!(peak >= 4, "{peak}: the busy batch did not grow wide");
    queue.reset();
    // The queue is idle now: three seconds of waiting cost one long poll
    // (two if the first comes back a little before the idle deadline).
    assert!(bodies(&read_one(&mut flight, cmd(2, 200, 3000)).await).is_empty());
    let calls = queue.calls.load(Ordering::SeqCst);
    assert!(
        (1..=2).contains(&calls),
        "{calls} ReceiveMessage calls for an idle partition after a busy batch"
    );
    assert_eq!(moto::queue_counts(&sqs, &url).await, (0, 200));
    server.stop().await;
    proxy.stop().await;
}

#[tokio::test]
async fn an_idle_queue_costs_one_call_in_flight_whatever_receivers_is() {
    let sqs = moto::moto().client().await;
    let url = moto::create_queue(&sqs, "idle", &[]).await;
    let (server, queue) = counted(&sqs, &url).await;
    let mut flight = server.client().await;
    let rows = read_one(
        &mut flight,
        json!({"table": "t", "partitions": 1, "receivers": 16, "max_wait_ms": 2000}),
    )
    .await;
    assert!(bodies(&rows).is_empty());
    assert_eq!(queue.peak.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn fifo_groups_keep_their_order_with_several_receivers() {
    // rustack: moto's receive is not atomic under concurrent calls.
    let sqs = rustack().client().await;
    let url = moto::create_fifo_queue(&sqs, "fifo", &[]).await;
    // Twenty groups: a receive of ten can come back full, so a partition
    // opens more calls (with a few groups every receive is short and a
    // partition never has more than one call in flight).
    let (groups, per_group) = (20, 3);
    let messages: Vec<(String, String)> = (0..groups * per_group)
        .map(|i| {
            let g = i % groups;
            (format!("g{g:02}"), format!("g{g:02}-{:02}", i / groups))
        })
        .collect();
    moto::send_fifo_bodies(&sqs, &url, messages).await;
    let (server, queue, proxy) = counted_behind(&url, Duration::from_millis(100)).await;
    let mut flight = server.client().await;
    let mut rows = Vec::new();
    for batch in 1..=20u64 {
        let cmd = json!({"table": "t", "batch": batch, "partitions": 1, "receivers": 4,
                         "max_messages": 60, "max_wait_ms": 300});
        let got = read_one(&mut flight, cmd).await;
        rows.extend(
            strings(&got, "message_group_id")
                .into_iter()
                .zip(bodies(&got)),
        );
        let body = json!({"table": "t", "consumer": "default", "batch": batch});
        action_on(&mut flight, "commit", &body).await.unwrap();
        if rows.len() >= groups * per_group {
            break;
        }
    }
    let peak = queue.peak.load(Ordering::SeqCst);
    assert!(
        peak >= 2,
        "{peak}: several calls were never in flight at once"
    );
    assert_eq!(rows.len(), groups * per_group, "every message read once");
    assert_each_group_in_order(rows, per_group);
    assert_eq!(moto::queue_counts(&sqs, &url).await, (0, 0));
    server.stop().await;
    proxy.stop().await;
}

#[tokio::test]
async fn a_bad_receivers_value_is_refused_naming_the_field_and_the_limit() {
    let mut f = Fixture::standard(3).await;
    for (value, words) in [
        (json!(0), vec!["`receivers`", "at least 1"]),
        (json!(129), vec!["`receivers`", "129", "limit 128"]),
        (json!("4"), vec!["`receivers`"]),
        (json!(-1), vec!["`receivers`"]),
    ] {
        let e = f
            .plan(json!({"table": "t", "receivers": value}))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{value}: {e}");
        for w in words {
            assert!(
                e.message().contains(w),
                "{value}: {:?} lacks {w}",
                e.message()
            );
        }
    }
    let status = f.action("status", json!({"table": "t"})).await.unwrap();
    assert_eq!(
        status["tables"]["t"]["consumers"],
        json!({}),
        "a refused plan created no consumer"
    );
    assert_eq!(f.counts().await, (3, 0), "nothing was received");
}

/// Past 32 calls a partition grows only as far as its round trip calls for
/// (the calls that bring 32,000 messages a second: 64 at 20 ms): on
/// loopback a busy queue gets at most 32 in flight although the plan
/// allows 128, and 20 ms away it gets more, but not all 128 (100 leaves
/// 11 ms for the server's and rustack's own time in the quickest call).
#[tokio::test]
async fn past_32_calls_a_partition_grows_only_as_far_as_its_round_trip_calls_for() {
    let n = 3000;
    let cmd = json!({"table": "t", "partitions": 1, "receivers": 128,
                     "max_messages": n, "max_wait_ms": 1000});

    let (sqs, url) = rustack_queue(n).await;
    let (server, near) = counted(&sqs, &url).await;
    let mut flight = server.client().await;
    assert_eq!(bodies(&read_one(&mut flight, cmd.clone()).await).len(), n);
    let near = near.peak.load(Ordering::SeqCst);
    assert!(near <= 32, "{near} calls in flight at most on loopback");
    server.stop().await;

    let (_sqs, url) = rustack_queue(n).await;
    let (server, far, proxy) = counted_behind(&url, Duration::from_millis(20)).await;
    let mut flight = server.client().await;
    assert_eq!(bodies(&read_one(&mut flight, cmd).await).len(), n);
    let far = far.peak.load(Ordering::SeqCst);
    assert!(
        (33..=100).contains(&far),
        "{far} calls in flight at most at 20 ms"
    );
    server.stop().await;
    proxy.stop().await;
}
