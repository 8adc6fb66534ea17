//! Read-ahead (docs/protocol.md, rule 7) on the real server binary and
//! moto: the next batch of a consumer is received before it is planned,
//! its reads need no SQS call and replay identically, an idle queue still
//! costs one long poll per partition at a time, and a `kill -9` with a
//! state dir gives back what was read ahead, and a deleted queue fails only
//! the reads that must receive. A plan with `receive_at_plan` receives its
//! own batch before any DoGet (rule 4), and what it received survives a
//! `kill -9` with a state dir; on a deleted queue its reads fail as any
//! read would. The rules about which plan
//! takes the batch received ahead are unit tests (`registry::ahead`).

use std::time::Duration;

use arrow_flight::FlightClient;
use aws_sdk_sqs::types::QueueAttributeName;
use serde_json::{Value, json};
use sqs_flight_tests::faults::{CALLS, Fault, FaultProxy, Faults};
use sqs_flight_tests::moto::{self, moto};
use sqs_flight_tests::server_process::ServerProcess;
use sqs_flight_tests::sqs::queue_counts;

use sqs_flight_tests::prelude::*;

const RECEIVE: &str = "ReceiveMessage";

/// How long a receive of [`cmd`]'s batches long-polls an empty queue.
const LONG_POLL: Duration = Duration::from_secs(1);

/// Batch `batch` of consumer `c`: one partition of at most `max` messages,
/// read ahead.
fn cmd(batch: u64, partitions: u64, max: u64) -> Value {
    json!({"table": "t", "consumer": "c", "batch": batch, "partitions": partitions,
           "max_messages": max, "max_wait_ms": LONG_POLL.as_millis(), "read_ahead": 1})
}

/// The `message_id`s of every partition of `info`, read one after another.
async fn read_ids(flight: &mut FlightClient, info: &arrow_flight::FlightInfo) -> Vec<String> {
    let mut ids = Vec::new();
    for t in tickets(info) {
        let batches = read_on(flight, &t).await.expect("DoGet");
        ids.extend(message_ids(&batches));
    }
    ids
}

/// A moto queue `name` holding `n` messages (`m0`, `m1`, ...) and the server
/// reading it through a fault proxy: the SQS client, the queue's URL, the
/// proxy, the server and a Flight client of it.
async fn queue_behind_proxy(
    name: &str,
    n: usize,
) -> (
    aws_sdk_sqs::Client,
    String,
    FaultProxy,
    ServerProcess,
    FlightClient,
) {
    let sqs = moto().client().await;
    let url = moto::queue_holding(&sqs, name, n).await;
    let proxy = FaultProxy::start(&moto().endpoint, 3).await;
    let server = server_process_via(&proxy.endpoint, &url, &[]);
    let flight = connect(&server.url).await;
    (sqs, url, proxy, server, flight)
}

/// A moto queue of 30 messages (`m0`, `m1`, ...) that SQS hides for 10
/// minutes once received, unless given back or deleted, and the state dir
/// of the servers [`Durable::start`] runs on it.
struct Durable {
    sqs: aws_sdk_sqs::Client,
    url: String,
    state: std::path::PathBuf,
    _scratch: TempDir,
}

impl Durable {
    async fn new(name: &str) -> Self {
        let sqs = moto().client().await;
        let attrs = [(QueueAttributeName::VisibilityTimeout, "600")];
        let url = moto::create_queue(&sqs, name, &attrs).await;
        moto::send_bodies(&sqs, &url, (0..30).map(|i| format!("m{i}"))).await;
        let scratch = temp_dir(name);
        Self {
            sqs,
            url,
            state: scratch.path().join("state"),
            _scratch: scratch,
        }
    }

    /// A server on the queue with `--state-dir` (again after a kill -9).
    fn start(&self) -> ServerProcess {
        let state = self.state.to_str().expect("a UTF-8 temp path");
        server_process_on_moto(&self.url, &["--state-dir", state])
    }
}

/// Batch `batch` of consumer `c`: two partitions of at most 10 messages,
/// received at the plan, nothing read ahead.
fn at_plan(batch: u64) -> Value {
    json!({"table": "t", "consumer": "c", "batch": batch, "partitions": 2,
           "max_messages": 10, "max_wait_ms": 1000, "receive_at_plan": 1})
}

/// Waits until the batch received ahead holds `n` messages.
async fn read_ahead(flight: &mut FlightClient, n: u64) {
    poll(
        Duration::from_secs(20),
        async || consumer_on(flight, "c").await["read_ahead"].as_u64(),
        |held| *held == Some(n),
    )
    .await
    .expect("the batch ahead received");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_batch_is_received_before_its_plan_and_its_reads_need_no_sqs_call() {
    let (sqs, url, proxy, _server, mut flight) = queue_behind_proxy("ahead", 40).await;

    let one = plan_on(&mut flight, &cmd(1, 1, 20)).await.expect("plan 1");
    let first = read_ids(&mut flight, &one).await;
    assert_eq!(first.len(), 20);
    read_ahead(&mut flight, 20).await;
    let c = consumer_on(&mut flight, "c").await;
    assert_eq!(c["read_ahead_batch"], 2);
    assert_eq!(c["open_batches"], json!([1]), "not an open batch yet");

    // From now on every ReceiveMessage fails: batch 2 needs none.
    proxy.set(Faults::of(&[Fault::InternalError]).on(RECEIVE, 1.0));
    let two = plan_on(&mut flight, &cmd(2, 1, 20)).await.expect("plan 2");
    let second = read_ids(&mut flight, &two).await;
    assert_eq!(second.len(), 20, "batch 2's rows were received ahead");
    assert!(second.iter().all(|id| !first.contains(id)), "new messages");
    assert_eq!(
        read_ids(&mut flight, &two).await,
        second,
        "replayed the same"
    );
    let c = consumer_on(&mut flight, "c").await;
    assert_eq!(c["open_batches"], json!([1, 2]));
    assert_eq!(c["read_ahead_batch"], 3, "batch 3 is planned ahead in turn");
    proxy.set(Faults::none());

    let done = commit_on(&mut flight, "c", 2).await;
    assert_eq!(done["deleted"], 40);
    action_on(
        &mut flight,
        "release",
        &json!({"table": "t", "consumer": "c"}),
    )
    .await
    .expect("release");
    assert_eq!(
        queue_counts(&sqs, &url).await,
        (0, 0),
        "all 40 read once and deleted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_queue_costs_one_long_poll_per_partition_at_a_time() {
    let sqs = moto().client().await;
    let url = moto::create_queue(&sqs, "ahead-idle", &[]).await;
    let proxy = FaultProxy::start(&moto().endpoint, 4).await;
    let server = server_process_via(&proxy.endpoint, &url, &[]);
    let mut flight = connect(&server.url).await;

    let one = plan_on(&mut flight, &cmd(1, 2, 100)).await.expect("plan");
    assert!(read_ids(&mut flight, &one).await.is_empty());
    // Each partition: its long poll for batch 1, then one for batch 2,
    // received ahead; nothing after that until batch 2 is planned.
    poll(
        Duration::from_secs(20),
        async || {
            let receiving = consumer_on(&mut flight, "c").await["receives_in_flight"].as_u64();
            (proxy.count(RECEIVE, CALLS), receiving)
        },
        |&(calls, receiving)| calls >= 4 && receiving == Some(0),
    )
    .await
    .expect("the batch ahead long-polled and its polls came back");
    // No further call is no event to wait for: the calls are sampled for
    // one more long poll, time enough for a loop that polls on to call.
    let more = poll(LONG_POLL, async || proxy.count(RECEIVE, CALLS), |&n| n > 4).await;
    assert_eq!(more, Err(4), "{}", proxy.report());
    // Batch 2 came back empty: its plan does not take it, and receives afresh.
    let two = plan_on(&mut flight, &cmd(2, 2, 100)).await.expect("plan 2");
    assert!(read_ids(&mut flight, &two).await.is_empty());
    // 6, and batch 3's long polls once batch 2's partitions have received.
    let n = proxy.count(RECEIVE, CALLS);
    assert!((6..=8).contains(&n), "{}", proxy.report());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_with_a_state_dir_gives_back_what_was_read_ahead() {
    let d = Durable::new("ahead-kill").await;
    let (sqs, url) = (d.sqs.clone(), d.url.clone());
    let server = d.start();
    let mut flight = connect(&server.url).await;
    let one = plan_on(&mut flight, &cmd(1, 1, 10)).await.expect("plan");
    let first = read_ids(&mut flight, &one).await;
    assert_eq!(first.len(), 10);
    read_ahead(&mut flight, 10).await;
    assert_eq!(queue_counts(&sqs, &url).await, (10, 20));
    server.kill9();

    let server = d.start();
    let mut flight = connect(&server.url).await;
    // The heartbeat gives back the 10 read ahead; batch 1 stays held.
    poll(
        Duration::from_secs(20),
        async || queue_counts(&sqs, &url).await,
        |&counts| counts == (20, 10),
    )
    .await
    .expect("what was read ahead is visible again");
    let c = consumer_on(&mut flight, "c").await;
    assert_eq!(c["open_batches"], json!([1]));
    assert_eq!(c["read_ahead_batch"], Value::Null);
    assert_eq!(read_ids(&mut flight, &one).await, first, "batch 1 replays");
    // Counted when its give-back returned, before batch 1's replay above.
    let c = consumer_on(&mut flight, "c").await;
    assert_eq!(
        c["rejected"], 0,
        "giving back what was read ahead is no reject: {c}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_of_the_read_ahead_only_keeps_the_open_batches() {
    let sqs = moto().client().await;
    let url = moto::queue_holding(&sqs, "ahead-release", 30).await;
    let server = server_process_on_moto(&url, &[]);
    let mut flight = connect(&server.url).await;
    let one = plan_on(&mut flight, &cmd(1, 1, 10)).await.expect("plan");
    let first = read_ids(&mut flight, &one).await;
    read_ahead(&mut flight, 10).await;
    assert_eq!(queue_counts(&sqs, &url).await, (10, 20));
    let body = json!({"table": "t", "consumer": "c", "read_ahead_only": true});
    let answer = action_on(&mut flight, "release", &body)
        .await
        .expect("release");
    assert_eq!(answer["released"], 10);
    assert_eq!(
        queue_counts(&sqs, &url).await,
        (20, 10),
        "batch 1 still held"
    );
    let c = consumer_on(&mut flight, "c").await;
    assert_eq!(c["open_batches"], json!([1]));
    assert_eq!(c["read_ahead_batch"], Value::Null);
    assert_eq!(read_ids(&mut flight, &one).await, first, "batch 1 replays");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_deleted_under_a_batch_read_ahead_keeps_its_rows_and_fails_only_the_next_reads() {
    let sqs = moto().client().await;
    let url = moto::queue_holding(&sqs, "ahead-deleted", 10).await;
    let server = server_process_on_moto(&url, &[]);
    let mut flight = connect(&server.url).await;
    let one = plan_on(&mut flight, &cmd(1, 1, 5)).await.expect("plan");
    let first = read_ids(&mut flight, &one).await;
    assert_eq!(first.len(), 5);
    read_ahead(&mut flight, 5).await;

    sqs.delete_queue()
        .queue_url(&url)
        .send()
        .await
        .expect("delete the queue");
    // Batch 2 was received ahead: its rows are the server's, queue or not.
    let two = plan_on(&mut flight, &cmd(2, 1, 5))
        .await
        .expect("plan of batch 2");
    let second = read_ids(&mut flight, &two).await;
    assert_eq!(second.len(), 5);
    assert!(
        second.iter().all(|id| !first.contains(id)),
        "each message once"
    );
    assert_eq!(read_ids(&mut flight, &two).await, second, "and it replays");

    // Batch 3 (planned ahead by batch 2's plan) must receive: it fails,
    // saying why, and the server goes on answering.
    let three = plan_on(&mut flight, &cmd(3, 1, 5))
        .await
        .expect("plan of batch 3");
    let err = read_on(&mut flight, &tickets(&three)[0])
        .await
        .expect_err("no queue to receive from");
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err}");
    let m = err.message();
    assert!(
        m.contains("table \"t\"") && m.contains("queue does not exist"),
        "{err}"
    );
    assert_eq!(
        read_ids(&mut flight, &two).await,
        second,
        "the server is up and still holds batch 2"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_with_receive_at_plan_receives_before_any_doget_and_its_reads_stream_that() {
    let (sqs, url, proxy, _server, mut flight) = queue_behind_proxy("at-plan", 30).await;

    let one = plan_on(&mut flight, &at_plan(1)).await.expect("plan 1");
    // No DoGet yet: the plan's own receives take 10 a partition.
    poll(
        Duration::from_secs(20),
        async || queue_counts(&sqs, &url).await,
        |counts| *counts == (10, 20),
    )
    .await
    .expect("20 received at the plan");

    // From now on every ReceiveMessage fails: the reads need none.
    proxy.set(Faults::of(&[Fault::InternalError]).on(RECEIVE, 1.0));
    let first = read_ids(&mut flight, &one).await;
    assert_eq!(first.len(), 20, "the reads stream what the plan received");
    assert_eq!(
        read_ids(&mut flight, &one).await,
        first,
        "replayed the same"
    );
    proxy.set(Faults::none());

    let done = commit_on(&mut flight, "c", 1).await;
    assert_eq!(done["deleted"], 20);
    assert_eq!(
        queue_counts(&sqs, &url).await,
        (10, 0),
        "the other 10 untouched"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_with_a_state_dir_after_a_receive_at_plan_replays_what_the_plan_received() {
    let d = Durable::new("at-plan-kill").await;
    let (sqs, url) = (d.sqs.clone(), d.url.clone());
    let server = d.start();
    let mut flight = connect(&server.url).await;
    let one = plan_on(&mut flight, &at_plan(1)).await.expect("plan");
    poll(
        Duration::from_secs(20),
        async || queue_counts(&sqs, &url).await,
        |counts| *counts == (10, 20),
    )
    .await
    .expect("20 received at the plan");
    // SQS answered; the calls count until the server has written what they
    // brought to the journal and recorded it.
    poll(
        Duration::from_secs(20),
        async || consumer_on(&mut flight, "c").await,
        |c| c["receives_in_flight"] == 0,
    )
    .await
    .expect("the plan's receives recorded");
    // Dies before any DoGet: what the plan received is only in the journal.
    server.kill9();

    let server = d.start();
    let mut flight = connect(&server.url).await;
    let first = read_ids(&mut flight, &one).await;
    assert_eq!(first.len(), 20, "the restarted server streams the 20");
    let distinct: std::collections::HashSet<_> = first.iter().collect();
    assert_eq!(distinct.len(), 20, "each message once");
    assert_eq!(read_ids(&mut flight, &one).await, first, "and replays them");
    assert_eq!(
        queue_counts(&sqs, &url).await,
        (10, 20),
        "nothing received twice"
    );
    let done = commit_on(&mut flight, "c", 1).await;
    assert_eq!(done["deleted"], 20);
    assert_eq!(queue_counts(&sqs, &url).await, (10, 0), "nothing lost");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receive_at_plan_on_a_deleted_queue_fails_the_reads_and_the_server_stays_up() {
    let sqs = moto().client().await;
    let url = moto::create_queue(&sqs, "at-plan-deleted", &[]).await;
    let server = server_process_on_moto(&url, &[]);
    let mut flight = connect(&server.url).await;
    sqs.delete_queue()
        .queue_url(&url)
        .send()
        .await
        .expect("delete the queue");
    // The plan itself needs no SQS call; its receives fail in the background.
    let one = plan_on(&mut flight, &at_plan(1)).await.expect("plan");
    for ticket in tickets(&one) {
        let err = read_on(&mut flight, &ticket)
            .await
            .expect_err("no queue to receive from");
        assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err}");
        assert!(err.message().contains("queue does not exist"), "{err}");
    }
    // A status of every table answers, the deleted queue's counts null.
    let status = action_on(&mut flight, "status", &json!({}))
        .await
        .expect("status");
    let t = &status["tables"]["t"];
    assert_eq!(t["approximate_depth"], Value::Null, "{t}");
    assert_eq!(t["consumers"]["c"]["open_batches"], json!([1]), "{t}");
}
