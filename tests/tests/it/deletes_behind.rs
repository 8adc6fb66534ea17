//! `deletes_behind`: a commit answers once it is decided and its
//! DeleteMessageBatch calls run after the answer (docs/protocol.md,
//! `commit`). Moto through the fault proxy, which holds or refuses the
//! deletes.

use std::time::Duration;

use serde_json::{Value, json};
use sqs_flight_tests::faults::{FaultProxy, Faults, HELD, HOLDING, REFUSED};
use sqs_flight_tests::moto;
use sqs_flight_tests::prelude::*;

const DELETE: &str = "DeleteMessageBatch";

/// A fresh queue of `n` messages behind a fault proxy, served as table
/// `t` with `deletes_behind` on: the fixture (on the proxy), the proxy,
/// and a client straight to moto.
async fn behind_a_proxy(name: &str, n: usize) -> (Fixture, FaultProxy, aws_sdk_sqs::Client) {
    let behind = |c: &mut sqs_flight_server::Config| {
        c.deletes_behind = true;
    };
    Fixture::behind_proxy(name, n, 7, behind).await
}

/// Plans batch 1 of consumer `q` (one partition) and reads it whole.
async fn read_batch_one(f: &mut Fixture, n: usize) {
    let info = f
        .plan(
            json!({"table": "t", "consumer": "q", "batch": 1, "partitions": 1,
                     "max_messages": n, "max_wait_ms": 500}),
        )
        .await
        .expect("plan");
    let got = f.read_all(&info).await;
    assert_eq!(got.iter().map(|b| b.num_rows()).sum::<usize>(), n);
}

/// What consumer `q` holds in flight, from `status`.
async fn in_flight(f: &mut Fixture) -> i64 {
    let s = f.action("status", json!({"table": "t"})).await.unwrap();
    s["tables"]["t"]["consumers"]["q"]["in_flight"]
        .as_i64()
        .unwrap_or_else(|| panic!("status names the consumer: {s}"))
}

fn behind(deleted: u64) -> Value {
    json!({"committed_batch": 1, "deleted": deleted, "expired": 0, "rejected": 0,
           "deletes": "behind"})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_answers_before_its_deletes_reach_sqs_and_they_land_after() {
    let (mut f, proxy, direct) = behind_a_proxy("behind-held", 10).await;
    read_batch_one(&mut f, 10).await;
    proxy.set(Faults::none().hold(DELETE, "", Duration::from_secs(3)));
    assert_eq!(f.commit("q", 1).await, behind(10));
    assert_eq!(proxy.count(DELETE, HELD), 0, "no delete reached moto yet");
    let url = f.queue_url.clone();
    assert_eq!(moto::queue_counts(&direct, &url).await, (0, 10));
    assert_eq!(
        in_flight(&mut f).await,
        10,
        "status shows the deletes pending"
    );

    poll(STEP, async || proxy.count(DELETE, HELD), |&n| n >= 1)
        .await
        .expect("the held delete forwarded to moto");
    poll(
        STEP,
        async || moto::queue_counts(&direct, &url).await,
        |c| *c == (0, 0),
    )
    .await
    .expect("the queue emptied once the hold ended");
    poll(STEP, async || in_flight(&mut f).await, |&n| n == 0)
        .await
        .expect("status no longer counts them");
    f.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_that_failed_behind_the_answer_is_retried_by_the_next_commit() {
    let (mut f, proxy, direct) = behind_a_proxy("behind-refused", 10).await;
    read_batch_one(&mut f, 10).await;
    proxy.set(Faults::none().refuse(DELETE, "", "AccessDenied"));
    assert_eq!(
        f.commit("q", 1).await,
        behind(10),
        "the failure comes after the answer"
    );
    poll(STEP, async || proxy.count(DELETE, REFUSED), |&n| n >= 1)
        .await
        .expect("the delete refused at the proxy");
    proxy.set(Faults::none());
    // This commit runs after the first one's deletes: it finds them owed.
    assert_eq!(f.commit("q", 1).await, behind(10));
    let url = f.queue_url.clone();
    poll(
        STEP,
        async || moto::queue_counts(&direct, &url).await,
        |c| *c == (0, 0),
    )
    .await
    .expect("the second commit deleted what the first could not");
    f.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_server_waits_for_the_deletes_behind_its_commits() {
    let (mut f, proxy, direct) = behind_a_proxy("behind-stop", 10).await;
    read_batch_one(&mut f, 10).await;
    proxy.set(Faults::none().hold(DELETE, "", Duration::from_secs(2)));
    assert_eq!(f.commit("q", 1).await, behind(10));
    poll(STEP, async || proxy.count(DELETE, HOLDING), |&n| n >= 1)
        .await
        .expect("the delete held at the proxy");
    let url = f.queue_url.clone();
    // What SIGTERM does: the shutdown token is cancelled.
    f.server.stop().await;
    assert_eq!(proxy.count(DELETE, HELD), 1, "the held delete went through");
    assert_eq!(moto::queue_counts(&direct, &url).await, (0, 0));
}

/// The same through the real binary and SIGTERM: the process exits only
/// once the delete held behind its commit's answer went through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_waits_for_the_deletes_behind_its_commits() {
    let direct = moto::moto().client().await;
    let url = moto::queue_holding(&direct, "behind-sigterm", 10).await;
    let proxy = FaultProxy::start(&moto::moto().endpoint, 7).await;
    let server = server_process_via(&proxy.endpoint, &url, &["--deletes-behind"]);
    let mut flight = connect(&server.url).await;
    let plan = json!({"table": "t", "consumer": "q", "batch": 1, "partitions": 1,
                      "max_messages": 10, "max_wait_ms": 500});
    let info = plan_on(&mut flight, &plan).await.expect("plan");
    let ticket = info.endpoint[0].ticket.clone().expect("a ticket");
    let rows: usize = read_on(&mut flight, &ticket)
        .await
        .expect("read")
        .iter()
        .map(|b| b.num_rows())
        .sum();
    assert_eq!(rows, 10);
    proxy.set(Faults::none().hold(DELETE, "", Duration::from_secs(2)));
    let body = json!({"table": "t", "consumer": "q", "batch": 1});
    let answer = action_on(&mut flight, "commit", &body)
        .await
        .expect("commit");
    assert_eq!(answer, behind(10));
    poll(STEP, async || proxy.count(DELETE, HOLDING), |&n| n >= 1)
        .await
        .expect("the delete held at the proxy");
    drop(flight);
    server.signal(libc::SIGTERM);
    let status = server
        .wait_exit(Duration::from_secs(15))
        .expect("the server exits after SIGTERM");
    assert!(status.success(), "{status:?}");
    assert_eq!(proxy.count(DELETE, HELD), 1, "the held delete went through");
    assert_eq!(moto::queue_counts(&direct, &url).await, (0, 0));
}
