//! SQS's at-least-once deliveries, deduplicated by message id (issue 33).
//!
//! The emulators never deliver a message twice on their own, so the fault
//! proxy of `sqs_flight_tests::faults` does it, the way SQS does:
//! [`Faults::duplicate_receives`] hands a message received once to another
//! receive with a new receipt (only the newest receipt works from then on),
//! and [`Faults::redeliver_deleted`] hands a deleted message out again.
//!
//! The contract the server tests are held to:
//! - while a message id is held in an open batch of any consumer of a
//!   table, receiving it again adds no row; the held row keeps the newest
//!   receipt for its extensions, delete and give-back, and the older one is
//!   never used again (`sqsf_duplicates_dropped_total{reason="held"}`);
//! - an id a commit deleted is remembered for `--dedup-window-secs` (900)
//!   and `--dedup-window-ids` (1,000,000): received again, it is deleted
//!   with its new receipt and not delivered (`reason="committed"`);
//! - `status` shows both as `tables.T.duplicates_dropped`
//!   (`{"held": n, "committed": n}`).
//!
//! FIFO queues keep their order and deliver each message once: that is
//! `fifo::each_message_group_keeps_its_order_across_batches` (the proxy's
//! rules are for standard queues: a FIFO queue never delivers a message
//! twice while it is in flight).

use std::collections::{BTreeMap, HashSet};

use arrow_flight::FlightClient;
use aws_sdk_sqs::types::QueueAttributeName;
use serde_json::json;
use sqs_flight_tests::faults::{
    DUPLICATED, FaultProxy, Faults, NEW_RECEIPT, REDELIVERED, REDELIVERED_RECEIPT, STALE_RECEIPT,
};
use sqs_flight_tests::http::get;
use sqs_flight_tests::moto::{self, moto};
use sqs_flight_tests::server_process::ServerProcess;
use sqs_flight_tests::sqs::receive_ten;

use sqs_flight_tests::prelude::*;

const RECEIVE: &str = "ReceiveMessage";
const DELETE: &str = "DeleteMessageBatch";
const VISIBILITY: &str = "ChangeMessageVisibilityBatch";

/// The value of `sqsf_duplicates_dropped_total` for table `t` and `reason`,
/// whatever the order of its labels.
fn dropped_metric(text: &str, reason: &str) -> Option<f64> {
    let reason = format!(r#"reason="{reason}""#);
    text.lines()
        .filter(|l| l.starts_with("sqsf_duplicates_dropped_total{"))
        .filter(|l| l.contains(r#"table="t""#) && l.contains(&reason))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

/// `tables.t.duplicates_dropped.<reason>` of the server's `status`.
async fn dropped_status(flight: &mut FlightClient, reason: &str) -> Option<u64> {
    let status = action_on(flight, "status", &json!({"table": "t"}))
        .await
        .expect("status");
    status["tables"]["t"]["duplicates_dropped"][reason].as_u64()
}

/// The server binary on a free port serving `url` as table `t` through
/// `proxy`, with its metrics on a free port too.
fn server_through(proxy: &FaultProxy, url: &str) -> (ServerProcess, std::net::SocketAddr) {
    server_through_with(proxy, url, &[])
}

/// [`server_through`] with `extra` flags.
fn server_through_with(
    proxy: &FaultProxy,
    url: &str,
    extra: &[&str],
) -> (ServerProcess, std::net::SocketAddr) {
    let ops = free_addr();
    let ops_arg = ops.to_string();
    let mut args = vec!["--metrics-listen", &ops_arg];
    args.extend_from_slice(extra);
    let server = server_process_via(&proxy.endpoint, url, &args);
    (server, ops)
}

/// Batch `batch` of consumer `c` on table `t`, one partition, read and
/// committed: its message ids.
async fn read_and_commit(flight: &mut FlightClient, batch: u64) -> Vec<String> {
    let plan = json!({"table": "t", "consumer": "c", "batch": batch, "partitions": 1,
                      "max_wait_ms": 500});
    let info = plan_on(flight, &plan).await.expect("plan");
    let got = message_ids(&read_on(flight, &tickets(&info)[0]).await.expect("DoGet"));
    let commit = json!({"table": "t", "consumer": "c", "batch": batch});
    action_on(flight, "commit", &commit).await.expect("commit");
    got
}

/// The ids that occur more than once in `seen`, with how often.
fn repeated(seen: &[String]) -> BTreeMap<&String, usize> {
    let mut times: BTreeMap<&String, usize> = BTreeMap::new();
    for id in seen {
        *times.entry(id).or_default() += 1;
    }
    times.retain(|_, n| *n > 1);
    times
}

/// The proxy's rule on its own, straight from aws-sdk-sqs: a received
/// message is received once more with a new receipt, the old receipt's
/// delete "succeeds" without deleting, the new one deletes.
#[tokio::test]
async fn the_proxy_duplicates_a_receive_and_only_the_newest_receipt_deletes() {
    let direct = moto().client().await;
    let attrs = [(QueueAttributeName::VisibilityTimeout, "600")];
    let url = moto::create_queue(&direct, "dup-proxy", &attrs).await;
    moto::send_bodies(&direct, &url, (0..10).map(|i| format!("m{i}"))).await;
    let proxy = FaultProxy::start(&moto().endpoint, 1).await;
    proxy.set(Faults::none().duplicate_receives(1.0));
    let sqs = sqs_flight_tests::sqs::sqs_client(&proxy.endpoint).await;

    let first = receive_ten(&sqs, &url, 0, None).await;
    let again = receive_ten(&sqs, &url, 0, None).await;
    let key = |m: &aws_sdk_sqs::types::Message| {
        (
            m.message_id().unwrap().to_string(),
            m.body().unwrap().to_string(),
        )
    };
    let mut a: Vec<_> = first.iter().map(key).collect();
    let mut b: Vec<_> = again.iter().map(key).collect();
    a.sort();
    b.sort();
    assert_eq!(a.len(), 10);
    assert_eq!(a, b, "the same messages, handed again");
    assert_eq!(proxy.count(RECEIVE, DUPLICATED), 10);
    assert_eq!(proxy.duplicated_ids().len(), 10);
    let handles = |ms: &[aws_sdk_sqs::types::Message]| -> HashSet<String> {
        ms.iter()
            .map(|m| m.receipt_handle().unwrap().to_string())
            .collect()
    };
    assert!(
        handles(&first).is_disjoint(&handles(&again)),
        "new receipts"
    );

    assert_eq!(moto::delete_messages(&sqs, &url, &first).await, 0);
    assert_eq!(proxy.count(DELETE, STALE_RECEIPT), 10);
    assert_eq!(
        moto::queue_counts(&direct, &url).await,
        (0, 10),
        "the old receipts deleted nothing"
    );
    assert_eq!(moto::delete_messages(&sqs, &url, &again).await, 0);
    assert_eq!(proxy.count(DELETE, NEW_RECEIPT), 10);
    assert_eq!(moto::queue_counts(&direct, &url).await, (0, 0));
    assert!(
        receive_ten(&sqs, &url, 0, None).await.is_empty(),
        "deleted messages are not duplicated:\n{}",
        proxy.report()
    );
}

/// The other rule on its own: a deleted message comes back, the same id,
/// body and attributes, under a receipt the proxy answers for itself.
#[tokio::test]
async fn the_proxy_redelivers_a_deleted_message_under_a_receipt_it_answers() {
    let direct = moto().client().await;
    let url = moto::queue_holding(&direct, "redeliver-proxy", 3).await;
    let proxy = FaultProxy::start(&moto().endpoint, 2).await;
    proxy.set(Faults::none().redeliver_deleted(1.0));
    let sqs = sqs_flight_tests::sqs::sqs_client(&proxy.endpoint).await;

    let first = receive_ten(&sqs, &url, 0, None).await;
    assert_eq!(first.len(), 3);
    assert_eq!(moto::delete_messages(&sqs, &url, &first).await, 0);
    assert_eq!(moto::queue_counts(&direct, &url).await, (0, 0));
    let again = receive_ten(&sqs, &url, 0, None).await;
    let key = |m: &aws_sdk_sqs::types::Message| {
        (
            m.message_id().unwrap().to_string(),
            m.body().unwrap().to_string(),
        )
    };
    let mut a: Vec<_> = first.iter().map(key).collect();
    let mut b: Vec<_> = again.iter().map(key).collect();
    a.sort();
    b.sort();
    assert_eq!(a, b, "the deleted messages, handed again");
    assert_eq!(proxy.count(RECEIVE, REDELIVERED), 3);
    assert_eq!(moto::delete_messages(&sqs, &url, &again).await, 0);
    assert_eq!(proxy.count(DELETE, REDELIVERED_RECEIPT), 3);
    assert!(
        receive_ten(&sqs, &url, 0, None).await.is_empty(),
        "redelivered once:\n{}",
        proxy.report()
    );
}

/// 250 messages, one consumer, two partitions of 100: the proxy hands a
/// third of the messages received to a second receive (of the same
/// partition or the other one). Every message reaches the consumer once,
/// none is lost, the queue ends empty, and once a message's second receipt
/// was handed out its first is never used again, neither by the heartbeat
/// (the first batch is held until it extended) nor by the commit.
///
/// The queue's visibility timeout (10 s) outlasts the heartbeat's first
/// ticks (the server learns the timeout at its first receive, and its tick
/// is 5 s until then): no message comes back on its own, so every repeat
/// is one the proxy made.
///
/// The partitions are read one after the other: moto's ReceiveMessage is
/// not atomic, and two receives at once could make duplicates of their own
/// that the proxy does not know of.
#[tokio::test]
async fn a_message_received_twice_while_held_reaches_the_consumer_once() {
    let n = 250;
    let direct = moto().client().await;
    let attrs = [(QueueAttributeName::VisibilityTimeout, "10")];
    let url = moto::create_queue(&direct, "dup-held", &attrs).await;
    let sent: HashSet<String> = moto::send_bodies(&direct, &url, (0..n).map(|i| format!("m{i}")))
        .await
        .into_iter()
        .collect();
    let proxy = FaultProxy::start(&moto().endpoint, 33).await;
    proxy.set(Faults::none().duplicate_receives(0.3));
    let (server, ops) = server_through(&proxy, &url);
    let mut flight = connect(&server.url).await;

    let mut seen: Vec<String> = Vec::new();
    // Batches until one reads nothing, every id was seen and the queue is
    // empty: a copy a receive overlapping another made at moto (its
    // ReceiveMessage is not atomic) comes back once its 10 s visibility
    // ends, and the server must delete it, not deliver it.
    for batch in 1..=40u64 {
        let plan = json!({"table": "t", "consumer": "c", "batch": batch, "partitions": 2,
                          "max_messages": 100, "max_wait_ms": 500});
        let info = plan_on(&mut flight, &plan).await.expect("plan");
        let mut rows = 0;
        for ticket in tickets(&info) {
            let got = message_ids(&read_on(&mut flight, &ticket).await.expect("DoGet"));
            rows += got.len();
            seen.extend(got);
        }
        if batch == 1 {
            // The first batch is held until the heartbeat has extended it.
            let extended = async || proxy.count(VISIBILITY, "calls") >= 1;
            poll(STEP, extended, |&done| done)
                .await
                .expect("a heartbeat extension of the held batch");
        }
        let commit = json!({"table": "t", "consumer": "c", "batch": batch});
        action_on(&mut flight, "commit", &commit)
            .await
            .expect("commit");
        let distinct: HashSet<&String> = seen.iter().collect();
        if rows == 0 && distinct.len() >= n && moto::queue_counts(&direct, &url).await == (0, 0) {
            break;
        }
    }
    let metrics = get(ops, "/metrics").await.1;
    let held_metric = dropped_metric(&metrics, "held");
    let held_status = dropped_status(&mut flight, "held").await;
    let twice = repeated(&seen);
    let stale: u64 = proxy.total(STALE_RECEIPT);
    println!(
        "{} rows, {} distinct ids of {n}; ids delivered more than once: {}; \
         old receipts used after the new one: {stale}; dropped (held): \
         metric {held_metric:?}, status {held_status:?}\n{}",
        seen.len(),
        seen.iter().collect::<HashSet<_>>().len(),
        twice.len(),
        proxy.report()
    );

    let duplicated = proxy.count(RECEIVE, DUPLICATED);
    assert!(duplicated > 0, "the proxy duplicated nothing");
    let distinct: HashSet<String> = seen.iter().cloned().collect();
    assert_eq!(distinct, sent, "every message read, and only those");
    assert_eq!(
        moto::queue_counts(&direct, &url).await,
        (0, 0),
        "queue empty"
    );
    assert_eq!(
        proxy.count(DELETE, NEW_RECEIPT),
        duplicated,
        "each message handed twice was deleted with its newest receipt"
    );
    // Nothing but the proxy's duplicates came twice (no visibility ran out).
    let made = proxy.duplicated_ids();
    let other: Vec<_> = twice
        .iter()
        .filter(|(id, n)| **n > 2 || !made.contains(**id))
        .collect();
    assert!(
        other.is_empty(),
        "repeats the proxy did not make: {other:?}"
    );

    // The deduplication contract (issue 33).
    let mut broken = Vec::new();
    if !twice.is_empty() {
        let some: Vec<_> = twice.iter().take(3).collect();
        broken.push(format!(
            "{} message ids reached the consumer more than once ({some:?}...)",
            twice.len()
        ));
    }
    if stale > 0 {
        broken.push(format!(
            "old receipts used after the new one was handed out: {stale} \
             (delete {}, extension or give-back {})",
            proxy.count(DELETE, STALE_RECEIPT),
            proxy.count(VISIBILITY, STALE_RECEIPT)
        ));
    }
    if held_metric.is_none_or(|v| v <= 0.0) {
        broken.push(format!(
            r#"sqsf_duplicates_dropped_total{{table="t",reason="held"}} is {held_metric:?}, not > 0"#
        ));
    }
    if held_status.is_none_or(|v| v == 0) {
        broken.push(format!(
            "status tables.t.duplicates_dropped.held is {held_status:?}, not > 0"
        ));
    }
    assert!(
        broken.is_empty(),
        "duplicates not dropped:\n- {}",
        broken.join("\n- ")
    );
}

/// A message a commit deleted comes back in a later receive (SQS may
/// redeliver even a deleted message): it is deleted again with its new
/// receipt and not delivered.
#[tokio::test]
async fn a_committed_message_received_again_is_deleted_not_delivered() {
    let n = 5;
    let direct = moto().client().await;
    let url = moto::queue_holding(&direct, "dup-committed", n).await;
    let proxy = FaultProxy::start(&moto().endpoint, 34).await;
    proxy.set(Faults::none().redeliver_deleted(1.0));
    let (server, ops) = server_through(&proxy, &url);
    let mut flight = connect(&server.url).await;
    let first = read_and_commit(&mut flight, 1).await;
    assert_eq!(first.len(), n, "batch 1");
    let second = read_and_commit(&mut flight, 2).await;
    assert_eq!(proxy.count(RECEIVE, REDELIVERED), n as u64, "redelivered");
    // Deleted when received, or at the next commit: both are done by now,
    // or soon after.
    let deleted = async || proxy.total(REDELIVERED_RECEIPT);
    let ghost_deletes = poll(STEP, deleted, |&d| d >= n as u64).await;
    let metrics = get(ops, "/metrics").await.1;
    let committed_metric = dropped_metric(&metrics, "committed");
    let committed_status = dropped_status(&mut flight, "committed").await;
    println!(
        "batch 2 delivered {second:?}; redelivered receipts deleted: {ghost_deletes:?}; \
         dropped (committed): metric {committed_metric:?}, status {committed_status:?}\n{}",
        proxy.report()
    );
    assert_eq!(
        moto::queue_counts(&direct, &url).await,
        (0, 0),
        "queue empty"
    );

    // The deduplication contract (issue 33).
    let mut broken = Vec::new();
    if !second.is_empty() {
        let again: Vec<_> = second.iter().filter(|id| first.contains(id)).collect();
        broken.push(format!(
            "{} committed messages delivered again in batch 2: {again:?}",
            again.len()
        ));
    }
    let by_delete = proxy.count(DELETE, REDELIVERED_RECEIPT)
        + proxy.count("DeleteMessage", REDELIVERED_RECEIPT);
    if by_delete != n as u64 {
        broken.push(format!(
            "{by_delete} of the {n} redelivered receipts deleted (visibility changes: {})",
            proxy.count(VISIBILITY, REDELIVERED_RECEIPT)
        ));
    }
    if committed_metric != Some(n as f64) {
        broken.push(format!(
            r#"sqsf_duplicates_dropped_total{{table="t",reason="committed"}} is {committed_metric:?}, not {n}"#
        ));
    }
    if committed_status != Some(n as u64) {
        broken.push(format!(
            "status tables.t.duplicates_dropped.committed is {committed_status:?}, not {n}"
        ));
    }
    assert!(
        broken.is_empty(),
        "duplicates not dropped:\n- {}",
        broken.join("\n- ")
    );
}

/// A give-back (`release`) of a batch holding messages received twice uses
/// each one's newest receipt: every message is visible again at once, and
/// no older receipt is used.
#[tokio::test]
async fn a_give_back_of_a_message_received_twice_uses_its_newest_receipt() {
    let n = 20;
    let direct = moto().client().await;
    let attrs = [(QueueAttributeName::VisibilityTimeout, "600")];
    let url = moto::create_queue(&direct, "dup-release", &attrs).await;
    moto::send_bodies(&direct, &url, (0..n).map(|i| format!("m{i}"))).await;
    let proxy = FaultProxy::start(&moto().endpoint, 35).await;
    // Every message received is handed once more, to the next receive.
    proxy.set(Faults::none().duplicate_receives(1.0));
    let (server, ops) = server_through(&proxy, &url);
    let mut flight = connect(&server.url).await;
    let plan = json!({"table": "t", "consumer": "c", "batch": 1, "partitions": 1,
                      "max_messages": n, "max_wait_ms": 500});
    let info = plan_on(&mut flight, &plan).await.expect("plan");
    let got = message_ids(
        &read_on(&mut flight, &tickets(&info)[0])
            .await
            .expect("DoGet"),
    );
    let duplicated = proxy.count(RECEIVE, DUPLICATED);
    assert!(duplicated >= 10, "{}", proxy.report());

    let release = json!({"table": "t", "consumer": "c"});
    action_on(&mut flight, "release", &release)
        .await
        .expect("release");
    let visible = async || moto::queue_counts(&direct, &url).await;
    let counts = poll(STEP, visible, |&c| c == (n as i64, 0)).await;
    let held_metric = dropped_metric(&get(ops, "/metrics").await.1, "held");
    let stale = proxy.count(VISIBILITY, STALE_RECEIPT)
        + proxy.count("ChangeMessageVisibility", STALE_RECEIPT);
    println!(
        "read {} rows ({} distinct); queue (visible, in flight) after the release: {counts:?}; \
         old receipts used after the new one: {stale}; dropped (held): {held_metric:?}\n{}",
        got.len(),
        got.iter().collect::<HashSet<_>>().len(),
        proxy.report()
    );
    assert_eq!(
        counts,
        Ok((n as i64, 0)),
        "every message given back at once"
    );
    assert_eq!(
        proxy.count(VISIBILITY, NEW_RECEIPT) + proxy.count("ChangeMessageVisibility", NEW_RECEIPT),
        duplicated,
        "each message handed twice given back with its newest receipt"
    );

    // The deduplication contract (issue 33).
    let mut broken = Vec::new();
    let twice = repeated(&got);
    if !twice.is_empty() {
        broken.push(format!(
            "{} message ids read more than once in one batch",
            twice.len()
        ));
    }
    if stale > 0 {
        broken.push(format!(
            "the give-back used {stale} old receipts after the new one was handed out"
        ));
    }
    if held_metric != Some(duplicated as f64) {
        broken.push(format!(
            r#"sqsf_duplicates_dropped_total{{table="t",reason="held"}} is {held_metric:?}, not {duplicated}"#
        ));
    }
    assert!(
        broken.is_empty(),
        "duplicates not dropped:\n- {}",
        broken.join("\n- ")
    );
}

/// What a new user sees on moto, which hands one message to two concurrent
/// ReceiveMessage calls now and then: queues of 250 messages drained by
/// one consumer with the default receivers, 2 partitions read at once, 100
/// messages a partition a batch. No message id reaches the consumer twice,
/// none is lost and the queue ends empty. `SQSF_DEDUP_DRAINS` drains (2 by
/// default; before deduplication, 6 drains in 16 delivered an id twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drains_on_moto_with_the_defaults_deliver_each_message_once() {
    let drains: u32 = std::env::var("SQSF_DEDUP_DRAINS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let n = 250;
    let direct = moto().client().await;
    let mut dropped = 0;
    for drain in 0..drains {
        let url = moto::create_queue(&direct, &format!("drain-{drain}"), &[]).await;
        let sent: HashSet<String> =
            moto::send_bodies(&direct, &url, (0..n).map(|i| format!("m{i}")))
                .await
                .into_iter()
                .collect();
        // The fixture reads moto with one call per partition; a user gets
        // the default receivers.
        let default_receivers = |t: &mut sqs_flight_server::config::TableConfig| {
            t.defaults.receivers = sqs_flight_server::config::PlanParams::DEFAULTS.receivers;
        };
        let f = Fixture::serve(direct.clone(), url.clone(), default_receivers, |_| {}).await;
        let server = &f.server;
        let mut flight = connect(&server.url).await;
        let mut seen: Vec<String> = Vec::new();
        // Until a batch reads nothing and the queue is empty: a copy that
        // moto's overlapping receives made (and a call in flight handed
        // back) is visible again, and the server must delete it through the
        // committed window, not deliver it; one hidden comes back after
        // moto's 30 s visibility timeout.
        for batch in 1..=100u64 {
            let plan = json!({"table": "t", "consumer": "c", "batch": batch, "partitions": 2,
                              "max_messages": 100, "max_wait_ms": 500});
            let info = plan_on(&mut flight, &plan).await.expect("plan");
            let reads = tickets(&info).into_iter().map(|t| {
                let url = server.url.clone();
                async move { read_on(&mut connect(&url).await, &t).await }
            });
            let mut rows = 0;
            for got in futures::future::join_all(reads).await {
                let got = message_ids(&got.expect("DoGet"));
                rows += got.len();
                seen.extend(got);
            }
            let commit = json!({"table": "t", "consumer": "c", "batch": batch});
            action_on(&mut flight, "commit", &commit)
                .await
                .expect("commit");
            if rows == 0 && moto::queue_counts(&direct, &url).await == (0, 0) {
                break;
            }
        }
        dropped += dropped_status(&mut flight, "held").await.unwrap_or(0);
        let twice = repeated(&seen);
        assert!(
            twice.is_empty(),
            "drain {drain}: delivered twice: {twice:?}"
        );
        let distinct: HashSet<String> = seen.iter().cloned().collect();
        assert_eq!(
            distinct, sent,
            "drain {drain}: every message, and only those"
        );
        // Calls still in flight when the last read ended hand back what
        // they bring, and delete again what was committed, after it:
        // the queue empties once they are answered.
        let counts = poll(
            STEP,
            async || moto::queue_counts(&direct, &url).await,
            |c| *c == (0, 0),
        )
        .await;
        assert_eq!(counts, Ok((0, 0)), "drain {drain}: queue empty");
    }
    println!("{drains} drains of {n}: {dropped} duplicates dropped (held)");
}

/// `--dedup-window 0` turns the committed window off: a committed message
/// SQS delivers again is a row again (and is deleted by its next commit).
#[tokio::test]
async fn with_the_window_off_a_committed_message_received_again_is_delivered() {
    let n = 3;
    let direct = moto().client().await;
    let url = moto::queue_holding(&direct, "dup-window-off", n).await;
    let proxy = FaultProxy::start(&moto().endpoint, 35).await;
    proxy.set(Faults::none().redeliver_deleted(1.0));
    let (server, _ops) = server_through_with(&proxy, &url, &["--dedup-window", "0"]);
    let mut flight = connect(&server.url).await;
    let mut first = read_and_commit(&mut flight, 1).await;
    first.sort();
    assert_eq!(first.len(), n);
    let mut second = read_and_commit(&mut flight, 2).await;
    second.sort();
    assert_eq!(second, first, "delivered again: the window is off");
    assert_eq!(dropped_status(&mut flight, "committed").await, Some(0));
}
