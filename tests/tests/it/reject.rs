//! Reject at commit (docs/protocol.md, "commit"): rejected messages go back
//! to SQS instead of being deleted, a redrive policy moves a poison message
//! to its dead-letter queue, and a reject that cannot be done changes
//! nothing.

use arrow_array::RecordBatch;
use arrow_array::cast::AsArray;
use arrow_array::types::Int32Type;
use aws_sdk_sqs::types::QueueAttributeName;
use serde_json::{Value, json};
use sqs_flight_tests::moto;

use sqs_flight_tests::prelude::*;

/// One row as a test looks at it.
#[derive(Debug, Clone)]
struct Row {
    id: String,
    body: String,
    receive_count: i32,
}

fn rows(batches: &[RecordBatch]) -> Vec<Row> {
    let mut out = Vec::new();
    for b in batches {
        let ids = b.column_by_name("message_id").unwrap().as_string::<i32>();
        let bodies = b.column_by_name("body").unwrap().as_string::<i32>();
        let counts = b.column_by_name("receive_count").unwrap();
        let counts = counts.as_primitive::<Int32Type>();
        for i in 0..b.num_rows() {
            out.push(Row {
                id: ids.value(i).to_string(),
                body: bodies.value(i).to_string(),
                receive_count: counts.value(i),
            });
        }
    }
    out
}

/// Plans batch `batch` of consumer `consumer` (one partition) and reads it.
async fn read_batch(f: &mut Fixture, consumer: &str, batch: u64, max: u64) -> Vec<Row> {
    let info = f
        .plan(json!({"table": "t", "consumer": consumer, "batch": batch,
                     "partitions": 1, "max_messages": max, "max_wait_ms": 500}))
        .await
        .expect("plan");
    rows(&f.read_all(&info).await)
}

async fn commit_with(f: &mut Fixture, body: Value) -> Result<Value, tonic::Status> {
    f.action("commit", body).await
}

/// The ARN of the queue at `url`.
async fn queue_arn(sqs: &aws_sdk_sqs::Client, url: &str) -> String {
    let out = sqs
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .expect("GetQueueAttributes");
    out.attributes().unwrap()[&QueueAttributeName::QueueArn].clone()
}

/// A queue whose redrive policy moves a message to a fresh dead-letter
/// queue after `max_receive` receives: (queue, dead-letter queue).
async fn queue_with_dlq(sqs: &aws_sdk_sqs::Client, max_receive: u32) -> (String, String) {
    let dlq = moto::create_queue(sqs, "dlq", &[]).await;
    let arn = queue_arn(sqs, &dlq).await;
    // A number, not a string: rustack refuses "2".
    let policy = json!({"deadLetterTargetArn": arn, "maxReceiveCount": max_receive}).to_string();
    let attrs = [(QueueAttributeName::RedrivePolicy, policy.as_str())];
    let url = moto::create_queue(sqs, "poison", &attrs).await;
    (url, dlq)
}

/// Every run reads a batch, rejects the poison message and commits the
/// rest. The poison message comes back each time with one more receive;
/// after `max_receive` runs the queue's redrive policy moves it to the
/// dead-letter queue, while every other message is deleted exactly once.
async fn poison_reaches_the_dead_letter_queue(sqs: aws_sdk_sqs::Client) {
    let max_receive = 2;
    let (url, dlq) = queue_with_dlq(&sqs, max_receive).await;
    moto::send_bodies(&sqs, &url, ["poison".to_string()]).await;
    let mut f = Fixture::serve(sqs.clone(), url.clone(), |_| {}, |_| {}).await;
    let mut sent = Vec::new();
    let mut deleted = Vec::new();
    let mut deleted_count = 0;
    for run in 1..=u64::from(max_receive) + 1 {
        let fresh: Vec<String> = (0..5).map(|i| format!("run{run}-m{i}")).collect();
        moto::send_bodies(&sqs, &url, fresh.clone()).await;
        sent.extend(fresh);
        let got = read_batch(&mut f, "etl", run, 100).await;
        let poison: Vec<&Row> = got.iter().filter(|r| r.body == "poison").collect();
        let rest: Vec<String> = got
            .iter()
            .filter(|r| r.body != "poison")
            .map(|r| r.body.clone())
            .collect();
        let reject: Vec<&str> = poison.iter().map(|r| r.id.as_str()).collect();
        if run <= u64::from(max_receive) {
            assert_eq!(poison.len(), 1, "run {run}: the poison message is read");
            assert_eq!(
                poison[0].receive_count, run as i32,
                "run {run}: receive_count counts every give-back"
            );
        } else {
            assert!(poison.is_empty(), "run {run}: moved to the DLQ: {poison:?}");
        }
        let answer = commit_with(
            &mut f,
            json!({"table": "t", "consumer": "etl", "batch": run, "reject": reject}),
        )
        .await
        .expect("commit");
        assert_eq!(answer["rejected"], reject.len(), "run {run}: {answer}");
        assert_eq!(answer["deleted"], rest.len(), "run {run}: {answer}");
        deleted_count += answer["deleted"].as_u64().unwrap();
        deleted.extend(rest);
    }
    assert_eq!(
        sorted(deleted),
        sorted(sent),
        "every other message lands exactly once"
    );
    assert_eq!(deleted_count, 5 * (u64::from(max_receive) + 1));
    assert_eq!(f.counts().await, (0, 0), "nothing is left in the queue");
    let dead = moto::drain_visible(&sqs, &dlq).await;
    let dead: Vec<String> = dead.into_iter().map(|m| m.body.unwrap()).collect();
    assert_eq!(dead, ["poison"], "the DLQ holds the poison message only");
    let s = f.action("status", json!({"table": "t"})).await.unwrap();
    assert_eq!(
        s["tables"]["t"]["consumers"]["etl"]["rejected"], max_receive,
        "{s}"
    );
}

#[tokio::test]
async fn a_poison_message_rejected_at_every_run_reaches_the_dlq_on_moto() {
    poison_reaches_the_dead_letter_queue(moto::moto().client().await).await;
}

#[tokio::test]
async fn a_poison_message_rejected_at_every_run_reaches_the_dlq_on_rustack() {
    let sqs = sqs_flight_tests::rustack::rustack().client().await;
    poison_reaches_the_dead_letter_queue(sqs).await;
}

/// Asserts `result` is INVALID_ARGUMENT whose message holds every `part`.
fn refused(result: Result<Value, tonic::Status>, parts: &[&str]) {
    let e = result.expect_err("the commit is refused");
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    for p in parts {
        assert!(e.message().contains(p), "{p:?} not in: {}", e.message());
    }
}

#[tokio::test]
async fn rejects_that_cannot_be_done_are_refused_and_change_nothing() {
    let mut f = Fixture::standard(0).await;
    moto::send_bodies(&f.sqs, &f.queue_url, (0..16).map(|i| format!("m{i}"))).await;
    let committed = read_batch(&mut f, "q", 1, 4).await;
    assert_eq!(f.commit("q", 1).await["deleted"], 4);
    let two = read_batch(&mut f, "q", 2, 4).await;
    let three = read_batch(&mut f, "q", 3, 4).await;
    let others = read_batch(&mut f, "other", 1, 4).await;
    assert_eq!(
        (two.len(), three.len(), others.len(), committed.len()),
        (4, 4, 4, 4)
    );
    let status_before = f.action("status", json!({"table": "t"})).await.unwrap();
    // The consumer as status shows it, but for its lag (an age, so it grows).
    let consumer = |s: &Value| {
        let mut q = s["tables"]["t"]["consumers"]["q"].clone();
        q.as_object_mut().map(|q| q.remove("oldest_age_ms"));
        q
    };
    let q_before = consumer(&status_before);
    assert_eq!(q_before["open_batches"], json!([2, 3]), "{status_before}");

    let commit =
        |reject: Value| json!({"table": "t", "consumer": "q", "batch": 2, "reject": reject});
    let cases: Vec<(Value, Vec<String>)> = vec![
        (commit(json!(["no-such-id"])), vec!["\"no-such-id\"".into()]),
        (
            commit(json!([two[0].id, "nope"])),
            vec!["1 id is not".into(), "\"nope\"".into()],
        ),
        (
            commit(json!([others[0].id])),
            vec![format!("{:?}", others[0].id)],
        ),
        (
            commit(json!([committed[0].id])),
            vec![format!("{:?}", committed[0].id)],
        ),
        (
            commit(json!([three[0].id])),
            vec![format!("{:?} (in open batch 3, above 2)", three[0].id)],
        ),
        (
            commit(json!([two[1].id, two[1].id])),
            vec!["more than once".into(), two[1].id.clone()],
        ),
        (commit(json!("x")), vec!["`reject`".into()]),
        (commit(json!([two[0].id, 7])), vec!["index 1".into()]),
        (
            json!({"table": "t", "consumer": "q", "batch": 2, "reject": [two[0].id],
                   "reject_delay_seconds": 43_201}),
            vec!["`reject_delay_seconds`".into()],
        ),
        (
            json!({"table": "t", "consumer": "q", "batch": 2, "reject_delay_seconds": 5}),
            vec![
                "`reject_delay_seconds`".into(),
                "nothing is rejected".into(),
            ],
        ),
        (
            commit(json!((0..15).map(|i| format!("u{i}")).collect::<Vec<_>>())),
            vec!["15 ids".into(), "and 5 more".into()],
        ),
        // A consumer that never read holds nothing to reject.
        (
            json!({"table": "t", "consumer": "nobody", "batch": 1, "reject": [two[0].id]}),
            vec![format!("{:?}", two[0].id)],
        ),
    ];
    for (body, parts) in cases {
        let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
        refused(commit_with(&mut f, body.clone()).await, &parts);
        assert_eq!(
            f.counts().await,
            (0, 12),
            "nothing moved in SQS after {body}"
        );
        let s = f.action("status", json!({"table": "t"})).await.unwrap();
        assert_eq!(
            consumer(&s),
            q_before,
            "watermark and open batches unchanged after {body}"
        );
        assert!(s["tables"]["t"]["consumers"].get("nobody").is_none(), "{s}");
    }
    // The batch is still held as it was: a replay gives the same rows, and
    // a plain commit deletes them.
    let again = read_batch(&mut f, "q", 2, 4).await;
    let ids = |rows: &[Row]| rows.iter().map(|r| r.id.clone()).collect::<Vec<_>>();
    assert_eq!(ids(&again), ids(&two));
    let answer = f.commit("q", 2).await;
    assert_eq!(
        answer,
        json!({"committed_batch": 2, "deleted": 4, "expired": 0, "rejected": 0})
    );
    assert_eq!(f.counts().await, (0, 8));
}

#[tokio::test]
async fn a_reject_delay_keeps_the_message_hidden_and_no_delay_gives_it_back_at_once() {
    let mut f = Fixture::standard(0).await;
    moto::send_bodies(&f.sqs, &f.queue_url, ["late".to_string(), "ok".to_string()]).await;
    let got = read_batch(&mut f, "q", 1, 10).await;
    let late = got.iter().find(|r| r.body == "late").unwrap().id.clone();
    let answer = commit_with(
        &mut f,
        json!({"table": "t", "consumer": "q", "batch": 1, "reject": [late],
               "reject_delay_seconds": 600}),
    )
    .await
    .unwrap();
    assert_eq!(
        answer,
        json!({"committed_batch": 1, "deleted": 1, "expired": 0, "rejected": 1})
    );
    let seen = sqs_flight_tests::sqs::receive_ten(&f.sqs, &f.queue_url, 0, None).await;
    assert!(seen.is_empty(), "hidden for its delay: {seen:?}");
    assert_eq!(f.counts().await, (0, 1), "given back, not deleted");

    moto::send_bodies(&f.sqs, &f.queue_url, ["now".to_string()]).await;
    let got = read_batch(&mut f, "q", 2, 10).await;
    assert_eq!(got.len(), 1);
    let answer = commit_with(
        &mut f,
        json!({"table": "t", "consumer": "q", "batch": 2, "reject": [got[0].id]}),
    )
    .await
    .unwrap();
    assert_eq!(answer["rejected"], 1, "{answer}");
    let seen = sqs_flight_tests::sqs::receive_ten(&f.sqs, &f.queue_url, 0, None).await;
    let seen: Vec<&str> = seen.iter().map(|m| m.body().unwrap()).collect();
    assert_eq!(seen, ["now"], "visible again at once");
}

fn payload_spec() -> sqs_flight_schemas::payload::PayloadSpec {
    serde_json::from_value(json!({"fields": [{"name": "n", "type": "int64"}]})).unwrap()
}

#[tokio::test]
async fn reject_payload_errors_gives_back_the_rows_that_did_not_decode() {
    let sqs = moto::moto().client().await;
    let url = moto::create_queue(&sqs, "payload-reject", &[]).await;
    let good: Vec<String> = (0..6).map(|i| format!(r#"{{"n": {i}}}"#)).collect();
    let bad = vec!["not json".to_string(), r#"{"n": "many"}"#.to_string()];
    moto::send_bodies(&sqs, &url, good.iter().chain(&bad).cloned()).await;
    let ops = free_addr();
    let table = |t: &mut sqs_flight_server::config::TableConfig| {
        t.payload = Some(payload_spec());
    };
    let config = |c: &mut sqs_flight_server::Config| {
        c.metrics_listen = Some(ops);
    };
    let mut f = Fixture::serve(sqs, url, table, config).await;
    // Two partitions; the second is never read and holds nothing.
    let info = f
        .plan(
            json!({"table": "t", "consumer": "q", "batch": 1, "partitions": 2,
                     "max_messages": 100, "max_wait_ms": 500}),
        )
        .await
        .unwrap();
    let first = f.read(&tickets(&info)[0]).await.unwrap();
    assert_eq!(rows(&first).len(), 8);
    let answer = commit_with(
        &mut f,
        json!({"table": "t", "consumer": "q", "batch": 1, "reject_payload_errors": true}),
    )
    .await
    .unwrap();
    assert_eq!(
        answer,
        json!({"committed_batch": 1, "deleted": 6, "expired": 0, "rejected": 2})
    );
    let back = read_batch(&mut f, "q", 2, 100).await;
    let bodies: Vec<String> = back.iter().map(|r| r.body.clone()).collect();
    assert_eq!(
        sorted(bodies),
        sorted(bad.clone()),
        "only the bad bodies came back"
    );
    assert!(back.iter().all(|r| r.receive_count == 2), "{back:?}");
    // Named ids and payload errors together; the delay applies to both.
    let answer = commit_with(
        &mut f,
        json!({"table": "t", "consumer": "q", "batch": 2, "reject": [back[0].id],
               "reject_payload_errors": true, "reject_delay_seconds": 600}),
    )
    .await
    .unwrap();
    assert_eq!(answer["rejected"], 2, "{answer}");
    assert_eq!(f.counts().await, (0, 2));
    let (_, text) = sqs_flight_tests::http::get(ops, "/metrics").await;
    let series = r#"sqsf_messages_rejected_total{table="t",consumer="q"} 4"#;
    assert!(text.contains(series), "{text}");
}

#[tokio::test]
async fn reject_payload_errors_on_a_table_without_a_payload_gives_back_nothing() {
    let mut f = Fixture::standard(3).await;
    assert_eq!(read_batch(&mut f, "q", 1, 10).await.len(), 3);
    let answer = commit_with(
        &mut f,
        json!({"table": "t", "consumer": "q", "batch": 1, "reject_payload_errors": true}),
    )
    .await
    .unwrap();
    assert_eq!(
        answer,
        json!({"committed_batch": 1, "deleted": 3, "expired": 0, "rejected": 0})
    );
    assert_eq!(f.counts().await, (0, 0));
}

/// With `--state-dir`: what a commit rejected is never deleted, by that
/// commit nor by any later one after a restart, and the consumer's other
/// messages are.
#[tokio::test]
async fn durable_rejects_are_never_deleted_across_a_restart() {
    let sqs = moto::moto().client().await;
    let url = moto::queue_holding(&sqs, "durable-reject", 6).await;
    let scratch = temp_dir("durable-reject");
    let state = scratch.path().join("state");
    let durable = |state: std::path::PathBuf| {
        move |c: &mut sqs_flight_server::Config| {
            c.state_dir = Some(state);
        }
    };
    let mut f = Fixture::serve(sqs.clone(), url.clone(), |_| {}, durable(state.clone())).await;
    let got = read_batch(&mut f, "q", 1, 3).await;
    let open = read_batch(&mut f, "q", 2, 3).await;
    assert_eq!((got.len(), open.len()), (3, 3));
    let answer = commit_with(
        &mut f,
        json!({"table": "t", "consumer": "q", "batch": 1, "reject": [got[0].id],
               "reject_delay_seconds": 600}),
    )
    .await
    .unwrap();
    assert_eq!(
        (answer["deleted"].clone(), answer["rejected"].clone()),
        (json!(2), json!(1))
    );
    f.server.stop().await;

    let mut f = Fixture::serve(sqs.clone(), url.clone(), |_| {}, durable(state.clone())).await;
    let answer = f.commit("q", 2).await;
    assert_eq!(answer["deleted"], 3, "the open batch came back: {answer}");
    assert_eq!(
        f.counts().await,
        (0, 1),
        "the rejected message is still in SQS"
    );
    f.server.stop().await;
}

/// A server that finds rejects in its store that the previous process
/// journaled but did not give back (it stopped between its commit's write
/// and the give-back) gives them back at its start.
#[tokio::test]
async fn rejects_journaled_by_a_previous_process_are_given_back_at_start() {
    let sqs = moto::moto().client().await;
    let url = moto::create_queue(&sqs, "journaled-reject", &[]).await;
    moto::send_bodies(&sqs, &url, ["a".to_string(), "b".to_string()]).await;
    // Received by "the previous process", hidden for ten minutes.
    let held = sqs_flight_tests::sqs::receive_ten(&sqs, &url, 1, Some(600)).await;
    assert_eq!(held.len(), 2);
    let scratch = temp_dir("journaled-reject");
    let state = scratch.path().join("state");
    let receipts = held
        .iter()
        .map(|m| m.receipt_handle().unwrap().to_string())
        .collect();
    sqs_flight_server::testing::journal_rejects_not_given_back(&state, "t", "q", 1, receipts)
        .await
        .expect("the store written as a stopped process left it");
    assert_eq!(moto::queue_counts(&sqs, &url).await, (0, 2));
    let config = |c: &mut sqs_flight_server::Config| {
        c.state_dir = Some(state.clone());
    };
    let mut f = Fixture::serve(sqs.clone(), url.clone(), |_| {}, config).await;
    poll(STEP, async || f.counts().await, |c| *c == (2, 0))
        .await
        .expect("the journaled rejects are given back");
    let s = f.action("status", json!({"table": "t"})).await.unwrap();
    assert_eq!(s["tables"]["t"]["consumers"]["q"]["rejected"], 2, "{s}");
    f.server.stop().await;
}

/// `sqs-flight commit --reject`: gives back the named message, deletes the
/// rest, prints the counts; an id not held exits 4 and changes nothing.
#[tokio::test]
async fn the_cli_commit_gives_back_what_reject_names() {
    let mut f = Fixture::standard(3).await;
    let got = read_batch(&mut f, "etl", 1, 10).await;
    assert_eq!(got.len(), 3);
    let url = f.server.url.clone();
    let base = [
        "--url",
        url.as_str(),
        "commit",
        "t",
        "1",
        "--consumer",
        "etl",
    ];
    let mut refused = base.to_vec();
    refused.extend(["--reject", "no-such-id"]);
    let run = sqs_flight_tests::cli::sqs_flight(&refused).await;
    run.expect_code(4);
    assert!(run.stderr.contains("\"no-such-id\""), "{run:#?}");
    assert_eq!(f.counts().await, (0, 3), "nothing changed");

    let mut ok = base.to_vec();
    ok.extend(["--reject", got[0].id.as_str(), "--reject-delay", "0"]);
    let run = sqs_flight_tests::cli::sqs_flight(&ok).await;
    run.expect_code(0);
    assert!(
        run.stdout
            .contains("committed batch 1; 2 messages deleted, 1 rejected, 0 expired"),
        "{run:#?}"
    );
    assert_eq!(
        f.counts().await,
        (1, 0),
        "the rejected message is visible again"
    );
}

/// A server killed (`kill -9`) after its commit journaled a reject, while
/// the delete and the give-back are still on their way to SQS, never
/// deletes the rejected message: not at the restart, not at the next
/// commit, which deletes everything else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_9_during_a_commit_with_rejects_never_deletes_the_rejected_message() {
    use std::time::Duration;

    use sqs_flight_tests::faults::{CALLS, FaultProxy, Faults};

    let sqs = moto::moto().client().await;
    // Messages read and never given back stay hidden for the whole test.
    let attrs = [(QueueAttributeName::VisibilityTimeout, "600")];
    let url = moto::create_queue(&sqs, "kill-reject", &attrs).await;
    moto::send_bodies(&sqs, &url, (0..4).map(|i| format!("m{i}"))).await;
    let proxy = FaultProxy::start(&moto::moto().endpoint, 24).await;
    let scratch = temp_dir("kill-reject");
    let state = scratch.path().join("state");
    let server = server_process_via(
        &proxy.endpoint,
        &url,
        &["--state-dir", state.to_str().unwrap()],
    );
    let mut flight = connect(&server.url).await;
    let plan = json!({"table": "t", "consumer": "c", "batch": 1, "partitions": 1,
        "max_messages": 10, "max_wait_ms": 500});
    let info = plan_on(&mut flight, &plan).await.expect("plan");
    let got = rows(
        &read_on(&mut flight, &tickets(&info)[0])
            .await
            .expect("read"),
    );
    assert_eq!(got.len(), 4);
    let poison = got.iter().find(|r| r.body == "m0").unwrap().clone();

    // Every SQS call now waits at the proxy: the commit has journaled and
    // sent its delete and its give-back when the server is killed.
    proxy.set(Faults::none().latency(Duration::from_secs(3)));
    let commit = json!({"table": "t", "consumer": "c", "batch": 1, "reject": [poison.id]});
    let mut committer = connect(&server.url).await;
    let pending = tokio::spawn(async move { action_on(&mut committer, "commit", &commit).await });
    poll(
        STEP,
        async || proxy.count("ChangeMessageVisibilityBatch", CALLS) >= 1,
        |&ok| ok,
    )
    .await
    .expect("the commit's give-back reached the proxy");
    server.kill9();
    pending.abort();

    proxy.set(Faults::none());
    let server = server_process_via(
        &proxy.endpoint,
        &url,
        &["--state-dir", state.to_str().unwrap()],
    );
    let mut flight = connect(&server.url).await;
    // Committing again retries the deletes the killed commit owed.
    let body = json!({"table": "t", "consumer": "c", "batch": 1});
    action_on(&mut flight, "commit", &body)
        .await
        .expect("commit");
    poll(
        STEP,
        async || moto::queue_counts(&sqs, &url).await == (1, 0),
        |&ok| ok,
    )
    .await
    .expect("everything but the rejected message is deleted");
    let left = moto::drain_visible(&sqs, &url).await;
    let left: Vec<String> = left.into_iter().map(|m| m.body.unwrap()).collect();
    assert_eq!(left, ["m0"], "the rejected message is back in the queue");
    drop(server);
}

/// A moto queue whose messages stay hidden `visibility_s` after a receive,
/// holding "bad" and "good", and a fault proxy (no faults yet) in front of
/// moto: (a client straight to moto, the queue, the proxy, a client
/// through it).
async fn bad_and_good_behind_a_proxy(
    name: &str,
    visibility_s: u32,
) -> (
    aws_sdk_sqs::Client,
    String,
    sqs_flight_tests::faults::FaultProxy,
    aws_sdk_sqs::Client,
) {
    let direct = moto::moto().client().await;
    let visibility = visibility_s.to_string();
    let attrs = [(QueueAttributeName::VisibilityTimeout, visibility.as_str())];
    let url = moto::create_queue(&direct, name, &attrs).await;
    moto::send_bodies(&direct, &url, ["bad".to_string(), "good".to_string()]).await;
    let proxy = sqs_flight_tests::faults::FaultProxy::start(&moto::moto().endpoint, 31).await;
    let via_proxy = sqs_flight_tests::sqs::sqs_client(&proxy.endpoint).await;
    (direct, url, proxy, via_proxy)
}

/// A give-back SQS fails: the commit still succeeds and deletes the rest,
/// the message is not deleted nor counted as rejected, and the failed call
/// is counted in `sqsf_sqs_errors_total`.
#[tokio::test]
async fn a_failed_give_back_deletes_nothing_it_should_not_and_is_counted() {
    use sqs_flight_tests::faults::{Fault, Faults};

    let (direct, url, proxy, via_proxy) = bad_and_good_behind_a_proxy("failed-reject", 600).await;
    let ops = free_addr();
    let config = |c: &mut sqs_flight_server::Config| {
        c.metrics_listen = Some(ops);
    };
    let mut f = Fixture::serve(via_proxy, url.clone(), |_| {}, config).await;
    let got = read_batch(&mut f, "q", 1, 10).await;
    let bad = got.iter().find(|r| r.body == "bad").unwrap().id.clone();
    proxy.set(Faults::of(&[Fault::InternalError]).on("ChangeMessageVisibilityBatch", 1.0));
    let answer = commit_with(
        &mut f,
        json!({"table": "t", "consumer": "q", "batch": 1, "reject": [bad]}),
    )
    .await
    .expect("the commit succeeds");
    assert_eq!(
        answer,
        json!({"committed_batch": 1, "deleted": 1, "expired": 0, "rejected": 0})
    );
    assert_eq!(
        moto::queue_counts(&direct, &url).await,
        (0, 1),
        "not deleted: it returns when its visibility timeout ends"
    );
    let (_, text) = sqs_flight_tests::http::get(ops, "/metrics").await;
    let failed = text.lines().any(|l| {
        l.starts_with("sqsf_sqs_errors_total{")
            && l.contains(r#"operation="ChangeMessageVisibilityBatch""#)
    });
    assert!(failed, "{text}");
    assert!(!text.contains("sqsf_messages_rejected_total{"), "{text}");
    f.server.stop().await;
}

/// A heartbeat extension on its way to SQS when a commit gives a message
/// back must land before the give-back: landing after it, it would hide
/// the message again for a whole visibility timeout (moto, like SQS for a
/// message still hidden by a reject delay, applies it). The proxy holds the
/// heartbeat's calls (`"VisibilityTimeout":2`, the queue's timeout) for two
/// seconds and lets the give-back (`0`) through at once.
#[tokio::test]
async fn a_give_back_waits_for_a_heartbeat_in_flight_and_is_not_undone_by_it() {
    use std::time::Duration;

    use sqs_flight_tests::faults::{CALLS, Faults, HELD_ANSWERED, HOLDING};

    let (direct, url, proxy, via_proxy) = bad_and_good_behind_a_proxy("raced-reject", 2).await;
    let hold = Duration::from_secs(2);
    proxy.set(Faults::none().hold(
        "ChangeMessageVisibilityBatch",
        r#""VisibilityTimeout":2"#,
        hold,
    ));
    let mut f = Fixture::serve(via_proxy, url.clone(), |_| {}, |_| {}).await;
    let got = read_batch(&mut f, "q", 1, 10).await;
    assert_eq!(got.len(), 2, "{got:?}");
    let bad = got.iter().find(|r| r.body == "bad").unwrap().id.clone();
    // The first extension comes about a second after the receive.
    poll(
        STEP,
        async || proxy.count("ChangeMessageVisibilityBatch", HOLDING) >= 1,
        |&ok| ok,
    )
    .await
    .expect("a heartbeat extension held at the proxy");
    let answer = commit_with(
        &mut f,
        json!({"table": "t", "consumer": "q", "batch": 1, "reject": [bad]}),
    )
    .await
    .expect("commit");
    assert_eq!(
        answer,
        json!({"committed_batch": 1, "deleted": 1, "expired": 0, "rejected": 1})
    );
    // Once moto has answered the held extension, it can hide nothing more.
    poll(
        STEP,
        async || proxy.count("ChangeMessageVisibilityBatch", HELD_ANSWERED) >= 1,
        |&ok| ok,
    )
    .await
    .expect("moto answered the held extension");
    let seen = sqs_flight_tests::sqs::receive_ten(&direct, &url, 0, None).await;
    let seen: Vec<&str> = seen.iter().map(|m| m.body().unwrap()).collect();
    assert_eq!(
        seen,
        ["bad"],
        "given back and visible, not hidden again by the extension: {}",
        proxy.report()
    );
    assert!(proxy.count("ChangeMessageVisibilityBatch", CALLS) >= 2);
    f.server.stop().await;
}
