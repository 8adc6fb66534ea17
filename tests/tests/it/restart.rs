//! The durable registry (`--state-dir`) across `kill -9`: the real server
//! binary is killed with SIGKILL and started again on the same state
//! directory; the same tickets replay the same rows, the same plan comes
//! back for the same batch, the heartbeat keeps the messages hidden, commit
//! deletes what was read, and a batch planned again after a release never
//! adopts what the released plan's receive wrote.

use std::time::Duration;

use arrow_array::RecordBatch;
use arrow_flight::{FlightClient, FlightInfo, Ticket};
use aws_sdk_sqs::types::QueueAttributeName;
use serde_json::json;
use sqs_flight_tests::faults::{CALLS, FaultProxy, Faults};
use sqs_flight_tests::moto::{self, moto};
use sqs_flight_tests::server_process::ServerProcess;
use tokio::time::Instant;

use sqs_flight_tests::prelude::{
    STEP, action_on, bodies, commit_on, connect, message_ids, plan_on, poll, read_on,
    server_process_on_moto, server_process_via, sorted, temp_dir, tickets,
};

/// The first test queue's visibility timeout: long enough that the
/// messages stay hidden while the server restarts, short enough that only
/// the resumed heartbeat keeps them hidden in the wait after it.
const VISIBILITY: Duration = Duration::from_secs(6);

fn start(queue_url: &str, state_dir: &std::path::Path) -> ServerProcess {
    server_process_on_moto(queue_url, &["--state-dir", state_dir.to_str().unwrap()])
}

async fn plan(flight: &mut FlightClient, batch: u64) -> FlightInfo {
    let cmd = json!({"table": "t", "consumer": "c", "batch": batch, "partitions": 2,
        "max_wait_ms": 500});
    plan_on(flight, &cmd).await.expect("plan")
}

async fn read(flight: &mut FlightClient, ticket: &Ticket) -> Vec<RecordBatch> {
    read_on(flight, ticket).await.expect("DoGet")
}

/// (message_id, body) of each row, in order.
fn rows(batches: &[RecordBatch]) -> Vec<(String, String)> {
    message_ids(batches)
        .into_iter()
        .zip(bodies(batches))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_then_restart_replays_the_same_rows_and_commit_deletes_them() {
    let sqs = moto().client().await;
    let seconds = VISIBILITY.as_secs().to_string();
    let attrs = [(QueueAttributeName::VisibilityTimeout, seconds.as_str())];
    let queue_url = moto::create_queue(&sqs, "restart", &attrs).await;
    moto::send_bodies(&sqs, &queue_url, (0..40).map(|i| format!("m{i}"))).await;
    let scratch = temp_dir("restart");
    let state = scratch.path().join("state");

    let server = start(&queue_url, &state);
    let mut flight = connect(&server.url).await;
    let info = plan(&mut flight, 1).await;
    let before: Vec<Vec<(String, String)>> = {
        let mut out = Vec::new();
        // One partition at a time: moto may hand a message to two
        // concurrent receives.
        for t in tickets(&info) {
            out.push(rows(&read(&mut flight, &t).await));
        }
        out
    };
    let read_n: usize = before.iter().map(Vec::len).sum();
    assert!(read_n > 0, "the first reads received messages");
    // Batch 2 is planned but never read before the kill.
    let unread = plan(&mut flight, 2).await;
    server.kill9();
    let killed_at = Instant::now();

    let server = start(&queue_url, &state);
    assert!(
        server.wait_for_log("restored open batches", Duration::from_secs(10)),
        "the server says it restored its registry:\n{}",
        server.log()
    );
    let mut flight = connect(&server.url).await;
    // Rule 4 (docs/protocol.md#the-rules) across the restart: the same batch has the same tickets.
    let again = plan(&mut flight, 1).await;
    assert_eq!(
        tickets(&again),
        tickets(&info),
        "re-planning batch 1 returns its plan"
    );
    for (t, expected) in tickets(&info).iter().zip(&before) {
        let replay = rows(&read(&mut flight, t).await);
        assert_eq!(&replay, expected, "a ticket replays its rows after kill -9");
    }
    // The heartbeat resumed: the rows read stay hidden for two visibility
    // timeouts after the kill. The last extension before the kill hid them
    // for at most one; past it only the restarted server's heartbeat hides
    // them. Staying hidden is no event to wait for, so the counts are
    // sampled until then, and the first change fails.
    let hidden = (40 - read_n as i64, read_n as i64);
    let until = killed_at + 2 * VISIBILITY + Duration::from_secs(1);
    let changed = poll(
        until.saturating_duration_since(Instant::now()),
        async || moto::queue_counts(&sqs, &queue_url).await,
        |&counts| counts != hidden,
    )
    .await;
    assert_eq!(
        changed,
        Err(hidden),
        "uncommitted messages stay hidden after the restart"
    );
    // The batch planned before the kill and never read receives now.
    let mut second = Vec::new();
    for t in tickets(&unread) {
        second.extend(rows(&read(&mut flight, &t).await));
    }
    let answer = commit_on(&mut flight, "c", 2).await;
    let total = read_n + second.len();
    assert_eq!(
        answer["deleted"],
        json!(total),
        "commit deletes every row read: {answer}"
    );
    assert_eq!(answer["expired"], json!(0), "{answer}");
    let mut all: Vec<String> = before.iter().flatten().map(|(_, b)| b.clone()).collect();
    all.extend(second.into_iter().map(|(_, b)| b));
    let unique = sorted(all.clone());
    assert_eq!(unique.len(), {
        let mut d = unique.clone();
        d.dedup();
        d.len()
    });
    let (visible, in_flight) = moto::queue_counts(&sqs, &queue_url).await;
    assert_eq!((visible, in_flight), (40 - total as i64, 0));
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_survives_kill_9_and_its_batches_stay_committed() {
    let sqs = moto().client().await;
    let queue_url = moto::queue_holding(&sqs, "restart-commit", 10).await;
    let scratch = temp_dir("restart-commit");
    let state = scratch.path().join("state");

    let server = start(&queue_url, &state);
    let mut flight = connect(&server.url).await;
    let info = plan(&mut flight, 1).await;
    for t in tickets(&info) {
        read(&mut flight, &t).await;
    }
    commit_on(&mut flight, "c", 1).await;
    server.kill9();

    let server = start(&queue_url, &state);
    let mut flight = connect(&server.url).await;
    let cmd = json!({"table": "t", "consumer": "c", "batch": 1});
    let refused = plan_on(&mut flight, &cmd)
        .await
        .expect_err("a committed batch cannot be planned again");
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{refused}");
    // The next batch the server hands out is above the watermark.
    let cmd = json!({"table": "t", "consumer": "c"});
    let next = plan_on(&mut flight, &cmd)
        .await
        .expect("plan the next batch");
    let meta: serde_json::Value = serde_json::from_slice(&next.app_metadata).unwrap();
    assert_eq!(meta["batch"], json!(2), "{meta}");
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_planned_again_after_a_release_does_not_adopt_the_old_receive_after_kill_9() {
    let sqs = moto().client().await;
    let queue_url = moto::queue_holding(&sqs, "replan", 5).await;
    let proxy = FaultProxy::start(&moto().endpoint, 8).await;
    let scratch = temp_dir("replan");
    let state = scratch.path().join("state");
    let server = server_process_via(
        &proxy.endpoint,
        &queue_url,
        &["--state-dir", state.to_str().unwrap()],
    );
    let mut flight = connect(&server.url).await;
    // max_messages 5: the old receive loop ends with its one call. A second
    // call would still be at the proxy at the kill -9 and could take the
    // handed-back messages into flight, where no server holds them.
    let cmd = json!({"table": "t", "consumer": "c", "batch": 1, "partitions": 1,
        "max_wait_ms": 500, "max_messages": 5});
    let released = plan_on(&mut flight, &cmd).await.expect("plan");

    // Every SQS call now waits 2 s at the proxy: the first read's receive
    // is in flight while its batch is released and planned again.
    proxy.set(Faults::none().latency(Duration::from_secs(2)));
    let mut reader = connect(&server.url).await;
    let cut = reader.do_get(tickets(&released)[0].clone()).await;
    poll(
        STEP,
        async || proxy.count("ReceiveMessage", CALLS) >= 1,
        |&ok| ok,
    )
    .await
    .expect("the receive reached the proxy");
    let body = json!({"table": "t", "consumer": "c"});
    action_on(&mut flight, "release", &body)
        .await
        .expect("release");
    let replanned = plan_on(&mut flight, &cmd).await.expect("plan again");
    assert_ne!(tickets(&replanned), tickets(&released), "a new plan");
    // The old receive comes back with the five messages and, its ticket
    // closed, hands them back (its stream stays open meanwhile, so the
    // receive runs to its end: a chunk, then a seal, of the old plan).
    poll(
        STEP,
        async || {
            proxy.count("ChangeMessageVisibilityBatch", CALLS) >= 1
                && moto::queue_counts(&sqs, &queue_url).await == (5, 0)
        },
        |&ok| ok,
    )
    .await
    .expect("the old receive handed its messages back");
    drop(cut);
    server.kill9();

    proxy.set(Faults::none());
    let server = server_process_via(
        &proxy.endpoint,
        &queue_url,
        &["--state-dir", state.to_str().unwrap()],
    );
    let mut flight = connect(&server.url).await;
    let again = plan_on(&mut flight, &cmd)
        .await
        .expect("plan after restart");
    assert_eq!(
        tickets(&again),
        tickets(&replanned),
        "the new plan came back"
    );
    // Its ticket was never read: it receives now, and what it returns is
    // what is in flight at SQS.
    let got = rows(&read(&mut flight, &tickets(&again)[0]).await);
    assert_eq!(
        (got.len(), moto::queue_counts(&sqs, &queue_url).await),
        (5, (0, 5)),
        "the new ticket received the messages instead of replaying handed-back rows"
    );
    let answer = commit_on(&mut flight, "c", 1).await;
    assert_eq!(answer["deleted"], json!(5), "{answer}");
    drop(server);
}
