//! SQS faults, on purpose: the server's SQS client talks to the emulator
//! through the fault-injecting proxy of `sqs_flight_tests::faults`, which
//! fails a seeded share of the calls (HTTP 500, throttling, connection
//! resets), answers chosen delete / change-visibility entries as expired
//! receipts, and refuses marked calls as SQS refuses a bad request.

use std::collections::HashSet;
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch, StringArray};
use serde_json::json;
use sqs_flight_tests::faults::{CALLS, EXPIRED, Fault, FaultProxy, Faults, REFUSED};
use sqs_flight_tests::moto::{self, moto};
use sqs_flight_tests::rustack::rustack;
use tonic::Code;

use sqs_flight_tests::http::{get, metric};
use sqs_flight_tests::prelude::*;

/// The operations the receive, heartbeat and commit paths call.
const RECEIVE: &str = "ReceiveMessage";
const DELETE: &str = "DeleteMessageBatch";
const VISIBILITY: &str = "ChangeMessageVisibilityBatch";

#[tokio::test]
async fn a_queue_drains_completely_while_a_quarter_of_the_calls_fail() {
    let n = 3000;
    let direct = rustack().client().await;
    let url = moto::create_queue(&direct, "faulty", &[]).await;
    let sent: HashSet<String> = moto::send_bodies(&direct, &url, (0..n).map(|i| format!("m{i}")))
        .await
        .into_iter()
        .collect();
    let proxy = FaultProxy::start(&rustack().endpoint, 20_261_130).await;
    proxy.set(
        Faults::of(&Fault::ALL)
            .on(RECEIVE, 0.25)
            .on(DELETE, 0.25)
            .on(VISIBILITY, 0.25),
    );
    let sqs = proxy.retrying_client(5).await;
    let (mut f, ops) = Fixture::serve_with_metrics(sqs, url.clone()).await;
    let (mut read, mut deleted, mut expired) = (Vec::new(), 0, 0);
    let (mut read_failures, mut commit_failures) = (0, 0);
    for batch in 1..=30u64 {
        let info = f
            .plan(
                json!({"table": "t", "consumer": "c", "batch": batch, "partitions": 4,
                         "max_messages": 500, "max_wait_ms": 500}),
            )
            .await
            .expect("planning calls no SQS");
        let mut rows = 0;
        for ticket in tickets(&info) {
            // An engine retries a failed read; the retry replays what the
            // ticket holds (rule 1, docs/protocol.md#the-rules) and receives nothing new.
            let batches = loop {
                match f.read(&ticket).await {
                    Ok(b) => break b,
                    Err(s) => {
                        assert_eq!(s.code(), Code::Unavailable, "{s:?}");
                        println!("read failed past the retries: {}", s.message());
                        read_failures += 1;
                    }
                }
            };
            rows += batches.iter().map(RecordBatch::num_rows).sum::<usize>();
            read.extend(message_ids(&batches));
        }
        let commit = json!({"table": "t", "consumer": "c", "batch": batch});
        let answer = loop {
            match f.action("commit", commit.clone()).await {
                Ok(a) => break a,
                Err(s) => {
                    assert_eq!(s.code(), Code::Unavailable, "{s:?}");
                    println!("commit failed past the retries: {}", s.message());
                    commit_failures += 1;
                }
            }
        };
        deleted += answer["deleted"].as_u64().unwrap();
        expired += answer["expired"].as_u64().unwrap();
        if rows == 0 && read.len() >= n {
            break;
        }
    }
    println!(
        "read {} rows ({} distinct) of {n}; deleted {deleted}, expired {expired}; \
         DoGets failed past the retries: {read_failures}, commits: {commit_failures}\n{}",
        read.len(),
        read.iter().collect::<HashSet<_>>().len(),
        proxy.report()
    );
    let distinct: HashSet<String> = read.into_iter().collect();
    let missing: Vec<_> = sent.difference(&distinct).take(5).collect();
    assert!(missing.is_empty(), "messages never read: {missing:?}...");
    assert_eq!(distinct.len(), n, "only the messages sent were read");
    // A commit that failed past the retries deleted some receipts without
    // an answer to say so; the metric counts every delete.
    let text = get(ops, "/metrics").await.1;
    let total = metric(
        &text,
        r#"sqsf_messages_deleted_total{table="t",consumer="c"}"#,
    )
    .unwrap_or(0.0);
    assert_eq!(total, n as f64, "each message deleted once");
    assert!(deleted <= n as u64 && (commit_failures > 0 || deleted == n as u64));
    assert_eq!(expired, 0);
    assert_eq!(
        moto::queue_counts(&direct, &url).await,
        (0, 0),
        "queue empty"
    );
    for op in [RECEIVE, DELETE] {
        let faults: u64 = Fault::ALL.iter().map(|k| proxy.count(op, k.name())).sum();
        assert!(faults > 0, "{op}: no fault injected\n{}", proxy.report());
    }
}

#[tokio::test]
async fn past_the_retries_reads_and_commits_are_unavailable_with_the_sqs_code() {
    let n = 20;
    let direct = moto().client().await;
    let url = moto::queue_holding(&direct, "outage", n).await;
    let proxy = FaultProxy::start(&moto().endpoint, 7).await;
    let attempts = 3;
    let mut f = Fixture::serve(
        proxy.retrying_client(attempts).await,
        url.clone(),
        |_| {},
        |_| {},
    )
    .await;
    let plan = |batch: u64| {
        json!({"table": "t", "consumer": "c", "batch": batch, "partitions": 1,
               "max_wait_ms": 300})
    };
    let info = f.plan(plan(1)).await.unwrap();
    let first = tickets(&info)[0].clone();
    assert_eq!(message_ids(&f.read(&first).await.unwrap()).len(), n);

    // Every receive fails, in each way: the DoGet of a new batch fails
    // with UNAVAILABLE naming the code, after exactly `attempts` calls.
    let cases: [(Fault, &[&str]); 4] = [
        (Fault::InternalError, &["InternalError"]),
        (
            Fault::Throttled,
            &["RequestThrottled", "ThrottlingException"],
        ),
        (Fault::Reset, &["Unreachable"]),
        // An answer without an error code is named by its HTTP status.
        (Fault::Overloaded, &["HTTP 503"]),
    ];
    for (batch, (fault, codes)) in (2..).zip(cases) {
        proxy.set(Faults::of(&[fault]).on(RECEIVE, 1.0).on(DELETE, 1.0));
        proxy.clear_counts();
        let info = f.plan(plan(batch)).await.unwrap();
        let err = f.read(&tickets(&info)[0]).await.unwrap_err();
        assert_eq!(err.code(), Code::Unavailable, "{err:?}");
        assert!(err.message().contains(RECEIVE), "{}", err.message());
        assert!(
            codes
                .iter()
                .any(|c| err.message().contains(&format!("({c})"))),
            "{fault:?}: {}",
            err.message()
        );
        assert_eq!(
            proxy.count(RECEIVE, fault.name()),
            u64::from(attempts),
            "one DoGet = one receive, tried {attempts} times\n{}",
            proxy.report()
        );
    }

    // The commit of batch 1 fails the same way and deletes nothing.
    proxy.set(Faults::of(&[Fault::InternalError]).on(DELETE, 1.0));
    proxy.clear_counts();
    let commit = json!({"table": "t", "consumer": "c", "batch": 1});
    let err = f.action("commit", commit.clone()).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(
        err.message().contains("DeleteMessageBatch") && err.message().contains("(InternalError)"),
        "{}",
        err.message()
    );
    let calls = (n as u64).div_ceil(10);
    assert_eq!(
        proxy.count(DELETE, "InternalError"),
        calls * u64::from(attempts),
        "{}",
        proxy.report()
    );
    assert_eq!(
        moto::queue_counts(&direct, &url).await,
        (0, n as i64),
        "nothing deleted"
    );

    // SQS is back: the same commit deletes what the failed one could not.
    proxy.set(Faults::none());
    let answer = f.action("commit", commit).await.unwrap();
    assert_eq!(answer["deleted"], n);
    assert_eq!(answer["expired"], 0);
    assert_eq!(moto::queue_counts(&direct, &url).await, (0, 0));
    println!("{}", proxy.report());
}

#[tokio::test]
async fn receipts_sqs_calls_expired_are_counted_as_expired_at_commit() {
    let (n, k) = (30, 7);
    let direct = moto().client().await;
    let url = moto::queue_holding(&direct, "expired", n).await;
    let proxy = FaultProxy::start(&moto().endpoint, 11).await;
    let sqs = proxy.retrying_client(3).await;
    let (mut f, ops) = Fixture::serve_with_metrics(sqs, url.clone()).await;
    let info = f
        .plan(json!({"table": "t", "consumer": "c", "partitions": 1, "max_wait_ms": 300}))
        .await
        .unwrap();
    assert_eq!(
        message_ids(&f.read(&tickets(&info)[0]).await.unwrap()).len(),
        n
    );
    let series = r#"sqsf_messages_expired_total{table="t",consumer="c"}"#;
    let before = metric(&get(ops, "/metrics").await.1, series).unwrap_or(0.0);

    proxy.expire(DELETE, k);
    let answer = f.commit("c", 1).await;
    assert_eq!(answer["expired"], k, "{answer}");
    assert_eq!(answer["deleted"], n - k, "{answer}");
    assert_eq!(proxy.count(DELETE, EXPIRED), k as u64);
    let after = metric(&get(ops, "/metrics").await.1, series).unwrap_or(0.0);
    assert_eq!(after - before, k as f64, "the expired counter moved by {k}");
    // The refused receipts were never deleted: their messages stay in flight.
    let counts = moto::queue_counts(&direct, &url).await;
    assert_eq!(
        counts,
        (0, k as i64),
        "(visible, in flight)\n{}",
        proxy.report()
    );
}

#[tokio::test]
async fn calls_sqs_refuses_are_invalid_argument_naming_what_was_refused() {
    let direct = moto().client().await;
    let url = moto::create_queue(&direct, "refused", &[]).await;
    let proxy = FaultProxy::start(&moto().endpoint, 3).await;
    // SQS refuses a whole SendMessageBatch for one bad entry (moto does so
    // for a bad attribute name, which the server already refuses itself):
    // here any batch holding the body `poison`.
    proxy.set(
        Faults::none()
            .refuse("SendMessageBatch", "poison", "InvalidParameterValue")
            .refuse(RECEIVE, "", "InvalidParameterValue"),
    );
    let mut f = Fixture::serve(proxy.retrying_client(5).await, url.clone(), |_| {}, |_| {}).await;
    let rows: Vec<String> = ["a0", "a1", "poison", "a3", "a4"].map(String::from).into();
    let batch =
        RecordBatch::try_from_iter([("body", Arc::new(StringArray::from(rows)) as ArrayRef)])
            .unwrap();
    let err = f.put(vec![batch]).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    let msg = err.message();
    assert!(
        msg.contains("row 2: SQS refused the message (InvalidParameterValue)"),
        "{msg}"
    );
    assert!(msg.ends_with("; 2 rows were sent before it"), "{msg}");
    assert_eq!(
        moto::queue_counts(&direct, &url).await,
        (2, 0),
        "rows 0 and 1"
    );
    // The batch, then row 2 alone; refusals are not retried.
    assert_eq!(
        proxy.count("SendMessageBatch", REFUSED),
        2,
        "{}",
        proxy.report()
    );

    // A refused receive: INVALID_ARGUMENT at once, not UNAVAILABLE after retries.
    let info = f
        .plan(json!({"table": "t", "consumer": "c", "partitions": 1, "max_wait_ms": 300}))
        .await
        .unwrap();
    let err = f.read(&tickets(&info)[0]).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message()
            .contains("SQS refused ReceiveMessage (InvalidParameterValue)"),
        "{}",
        err.message()
    );
    assert_eq!(proxy.count(RECEIVE, REFUSED), 1);
}

#[tokio::test]
async fn refused_and_failed_heartbeats_are_logged_and_the_read_goes_on() {
    let (n, k) = (30, 4);
    // Keeps what the server logs at WARN and above, on this thread.
    let logs = LogBuffer::default();
    let writer = logs.clone();
    // The test runtime runs every task on this thread, the server's too.
    let _logs = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish(),
    );
    let direct = moto().client().await;
    let vt = [(
        aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout,
        "2",
    )];
    let url = moto::create_queue(&direct, "heartbeat", &vt).await;
    moto::send_bodies(&direct, &url, (0..n).map(|i| format!("m{i}"))).await;
    let proxy = FaultProxy::start(&moto().endpoint, 5).await;
    let mut f = Fixture::serve(proxy.retrying_client(2).await, url.clone(), |_| {}, |_| {}).await;
    let info = f
        .plan(json!({"table": "t", "consumer": "c", "partitions": 1, "max_wait_ms": 300}))
        .await
        .unwrap();
    let ticket = tickets(&info)[0].clone();
    let first = message_ids(&f.read(&ticket).await.unwrap());
    assert_eq!(first.len(), n);

    // k receipts expire at their next extension, and a third of the
    // extension calls fail (twice in a row, with 2 attempts, now and then).
    proxy.expire(VISIBILITY, k);
    proxy.set(Faults::of(&[Fault::InternalError, Fault::Reset]).on(VISIBILITY, 0.33));
    // Until a dozen extension calls went out and a tick saw the refusal.
    let logged = || logs.text();
    let seen = async || {
        proxy.count(VISIBILITY, CALLS) >= 12
            && logged().contains("visibility heartbeat: SQS refused some receipts")
    };
    poll(STEP, seen, |&seen| seen)
        .await
        .expect("a dozen extension calls, and a tick saw the refusal");
    proxy.set(Faults::none());
    println!("{}{}", proxy.report(), logged());
    assert!(
        proxy.count(VISIBILITY, EXPIRED) >= k as u64,
        "{}",
        proxy.report()
    );

    // The read is whole: a replay gives the same rows in the same order.
    assert_eq!(message_ids(&f.read(&ticket).await.unwrap()), first);
    // The commit reports the expired receipts and deletes the rest.
    let answer = f.commit("c", 1).await;
    assert_eq!(answer["expired"], k, "{answer}");
    assert_eq!(answer["deleted"], n - k, "{answer}");
}
