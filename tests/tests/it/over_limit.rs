//! `over_limit`: SQS refuses ReceiveMessage with `OverLimit` while a queue
//! holds as many messages in flight as it allows (docs/protocol.md, rule 7,
//! "SQS's in-flight cap"). A first read backs off instead of failing, fails
//! UNAVAILABLE only once its `max_wait_ms` passed with nothing but
//! refusals, read-ahead stops and leaves its ticket fresh, and a consumer's
//! refused read gives back the batches received ahead of the table; a
//! plan's own receive (`receive_at_plan`) stops as read-ahead does. Moto
//! through the fault proxy, which answers the refusals.

use std::time::Duration;

use arrow_flight::{FlightClient, FlightInfo, Ticket};
use serde_json::{Value, json};
use sqs_flight_tests::faults::{CALLS, FaultProxy, Faults, REFUSED};
use sqs_flight_tests::moto;
use sqs_flight_tests::prelude::*;

const RECEIVE: &str = "ReceiveMessage";
const OVER_LIMIT: &str = "OverLimit";

/// Every ReceiveMessage refused for the queue's in-flight cap.
fn at_the_cap() -> Faults {
    Faults::none().refuse(RECEIVE, "", OVER_LIMIT)
}

/// A fresh queue of `n` messages behind a fault proxy, served as table
/// `t` with a metrics endpoint: the fixture (on the proxy), the proxy, a
/// client straight to moto, and the metrics address.
async fn behind_a_proxy(
    name: &str,
    n: usize,
) -> (
    Fixture,
    FaultProxy,
    aws_sdk_sqs::Client,
    std::net::SocketAddr,
) {
    let ops = free_addr();
    let metered = |c: &mut sqs_flight_server::Config| {
        c.metrics_listen = Some(ops);
    };
    let (f, proxy, direct) = Fixture::behind_proxy(name, n, 11, metered).await;
    (f, proxy, direct, ops)
}

/// Batch `batch` of `consumer`: one partition of at most `max` messages.
fn cmd(consumer: &str, batch: u64, max: u64, max_wait_ms: u64, read_ahead: u64) -> Value {
    json!({"table": "t", "consumer": consumer, "batch": batch, "partitions": 1,
           "max_messages": max, "max_wait_ms": max_wait_ms, "read_ahead": read_ahead})
}

/// The one ticket of a one-partition plan.
fn ticket(info: &FlightInfo) -> Ticket {
    info.endpoint[0].ticket.clone().expect("a ticket")
}

fn rows(batches: &[arrow_array::RecordBatch]) -> usize {
    batches.iter().map(|b| b.num_rows()).sum()
}

/// Waits until the proxy refused `n` receives.
async fn refused(proxy: &FaultProxy, n: u64) {
    poll(STEP, async || proxy.count(RECEIVE, REFUSED), |&r| r >= n)
        .await
        .expect("receives refused at the proxy");
}

/// Waits until consumer `c` has no ReceiveMessage call in flight (`what`
/// names the call waited for).
async fn receives_over(flight: &mut FlightClient, what: &str) {
    poll(
        STEP,
        async || consumer_on(flight, "c").await,
        |c| c["receives_in_flight"] == 0,
    )
    .await
    .unwrap_or_else(|e| panic!("{what} is over: {e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_read_at_the_cap_backs_off_and_reads_everything_once_it_clears() {
    let (mut f, proxy, direct, ops) = behind_a_proxy("over-limit-clears", 10).await;
    let info = f.plan(cmd("q", 1, 10, 20_000, 0)).await.expect("plan");
    proxy.set(at_the_cap());
    let clear = async {
        refused(&proxy, 1).await;
        proxy.set(Faults::none());
    };
    let t = ticket(&info);
    let (read, ()) = tokio::join!(f.read(&t), clear);
    let read = read.expect("no error: the read waited for the cap to clear");
    assert_eq!(rows(&read), 10);
    let url = f.queue_url.clone();
    assert_eq!(moto::queue_counts(&direct, &url).await, (0, 10));
    let (_, text) = sqs_flight_tests::http::get(ops, "/metrics").await;
    let counted = text.lines().any(|l| {
        l.starts_with("sqsf_sqs_errors_total{")
            && l.contains(r#"operation="ReceiveMessage""#)
            && l.contains(r#"code="OverLimit""#)
    });
    assert!(counted, "{text}");
    f.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_read_only_refused_until_max_wait_fails_unavailable_and_stays_fresh() {
    let (mut f, proxy, direct, _) = behind_a_proxy("over-limit-fails", 10).await;
    let info = f.plan(cmd("q", 1, 10, 2_500, 0)).await.expect("plan");
    proxy.set(at_the_cap());
    let e = f.read(&ticket(&info)).await.expect_err("only refusals");
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e}");
    for named in ["OverLimit", "120,000"] {
        assert!(e.message().contains(named), "names {named}: {e}");
    }
    assert!(
        proxy.count(RECEIVE, REFUSED) >= 2,
        "it tried again before it failed: {}",
        proxy.report()
    );
    proxy.set(Faults::none());
    let read = f.read(&ticket(&info)).await.expect("the ticket receives");
    assert_eq!(rows(&read), 10, "the ticket was still fresh");
    let url = f.queue_url.clone();
    assert_eq!(moto::queue_counts(&direct, &url).await, (0, 10));
    f.server.stop().await;
}

/// Batch 1 gets 5 messages, then waits on an empty queue: while that
/// second receive is on its way, every later one is refused, so the
/// first receive of the batch read ahead (made once batch 1 ends) is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_ahead_at_the_cap_stops_and_the_next_batch_receives_everything() {
    let (mut f, proxy, direct, _) = behind_a_proxy("over-limit-ahead", 5).await;
    let mut other = f.server.client().await;
    let one = f.plan(cmd("c", 1, 10, 2_000, 1)).await.expect("plan 1");
    let refuse_later = async {
        poll(STEP, async || proxy.count(RECEIVE, CALLS), |&n| n >= 2)
            .await
            .expect("batch 1's second receive");
        proxy.set(at_the_cap());
    };
    let t = ticket(&one);
    let (read, ()) = tokio::join!(f.read(&t), refuse_later);
    assert_eq!(rows(&read.expect("batch 1")), 5);
    refused(&proxy, 1).await;
    receives_over(&mut other, "the refused receive").await;
    let c = consumer_on(&mut other, "c").await;
    assert_eq!(c["read_ahead_batch"], 2, "{c}");
    assert_eq!(c["read_ahead"], 0, "nothing read ahead: {c}");

    let url = f.queue_url.clone();
    moto::send_bodies(&direct, &url, (5..12).map(|i| format!("m{i}"))).await;
    proxy.set(Faults::none());
    let two = f.plan(cmd("c", 2, 10, 2_000, 1)).await.expect("plan 2");
    let read = f.read(&ticket(&two)).await.expect("batch 2");
    assert_eq!(rows(&read), 7, "every message sent since batch 1");
    assert_eq!(moto::queue_counts(&direct, &url).await, (0, 12));
    assert_eq!(f.commit("c", 2).await["deleted"], 12);
    f.action("release", json!({"table": "t", "consumer": "c"}))
        .await
        .expect("release");
    assert_eq!(
        moto::queue_counts(&direct, &url).await,
        (0, 0),
        "nothing lost"
    );
    f.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_at_the_cap_gives_back_another_consumers_batch_read_ahead() {
    let (mut f, proxy, direct, _) = behind_a_proxy("over-limit-evicts", 20).await;
    let mut other = f.server.client().await;
    let one = f.plan(cmd("o", 1, 10, 1_000, 1)).await.expect("plan o");
    assert_eq!(rows(&f.read(&ticket(&one)).await.expect("o's batch 1")), 10);
    poll(
        STEP,
        async || consumer_on(&mut other, "o").await["read_ahead"].as_u64(),
        |n| *n == Some(10),
    )
    .await
    .expect("o's batch 2 received ahead");
    let url = f.queue_url.clone();
    assert_eq!(moto::queue_counts(&direct, &url).await, (0, 20));

    let q = f.plan(cmd("q", 1, 10, 20_000, 0)).await.expect("plan q");
    proxy.set(at_the_cap());
    let given_back = async {
        poll(
            STEP,
            async || moto::queue_counts(&direct, &url).await,
            |c| *c == (10, 10),
        )
        .await
        .expect("o's batch read ahead visible at SQS again");
        let o = consumer_on(&mut other, "o").await;
        assert_eq!(o["read_ahead_batch"], Value::Null, "{o}");
        proxy.set(Faults::none());
    };
    let t = ticket(&q);
    let (read, ()) = tokio::join!(f.read(&t), given_back);
    assert_eq!(rows(&read.expect("q's batch 1")), 10, "what o gave back");
    assert!(proxy.count(RECEIVE, REFUSED) >= 1);
    assert_eq!(moto::queue_counts(&direct, &url).await, (0, 20));
    f.server.stop().await;
}

/// A plan with `receive_at_plan` made while the queue is at its cap: the
/// plan's own receive stops at the refusal and leaves its ticket fresh,
/// and the partition's first read receives everything once the cap clears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receive_at_plan_at_the_cap_stops_and_the_first_read_receives_everything() {
    let (mut f, proxy, direct, _) = behind_a_proxy("over-limit-at-plan", 10).await;
    let mut other = f.server.client().await;
    proxy.set(at_the_cap());
    let mut plan = cmd("c", 1, 10, 2_000, 0);
    plan["receive_at_plan"] = json!(1);
    let info = f.plan(plan).await.expect("plan");
    refused(&proxy, 1).await;
    receives_over(&mut other, "the plan's refused receive").await;
    let url = f.queue_url.clone();
    assert_eq!(moto::queue_counts(&direct, &url).await, (10, 0));

    proxy.set(Faults::none());
    let read = f.read(&ticket(&info)).await.expect("the first read");
    assert_eq!(rows(&read), 10, "the ticket was still fresh");
    assert_eq!(f.commit("c", 1).await["deleted"], 10);
    assert_eq!(moto::queue_counts(&direct, &url).await, (0, 0));
    f.server.stop().await;
}

/// A consumer's read that joins the plan's own receive (`receive_at_plan`)
/// while SQS refuses that receive for the cap takes the first read over
/// when the refusal comes back: it backs off as its own first read would
/// and reads everything once the cap clears, instead of failing with the
/// plan's refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_joining_a_refused_receive_at_plan_backs_off_as_a_first_read() {
    let (mut f, proxy, direct, _) = behind_a_proxy("over-limit-joined", 10).await;
    // Each refusal takes two seconds: the read starts while the plan's
    // receive waits for its answer.
    proxy.set(at_the_cap().latency(Duration::from_secs(2)));
    let mut plan = cmd("c", 1, 10, 20_000, 0);
    plan["receive_at_plan"] = json!(1);
    let info = f.plan(plan).await.expect("plan");
    refused(&proxy, 1).await;
    let clear = async {
        // The read's own receive is the second refused call.
        refused(&proxy, 2).await;
        proxy.set(Faults::none());
    };
    let t = ticket(&info);
    let read = {
        let read = f.read(&t);
        tokio::pin!(read);
        tokio::select! {
            // Answered before a receive of its own was refused.
            early = &mut read => early,
            () = clear => read.await,
        }
    };
    let read = read.expect("no error: the read waited for the cap to clear");
    assert_eq!(rows(&read), 10);
    assert_eq!(f.commit("c", 1).await["deleted"], 10);
    let url = f.queue_url.clone();
    assert_eq!(moto::queue_counts(&direct, &url).await, (0, 0));
    f.server.stop().await;
}
