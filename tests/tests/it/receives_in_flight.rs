//! `status`'s `receives_in_flight`: a consumer's ReceiveMessage calls are
//! counted from their issue until what they brought is recorded or handed
//! back, so a client that plans only when the queue shows messages can
//! tell "empty" from "taken by a call whose answer is on its way"
//! (docs/protocol.md, `status`). Moto through the fault proxy, which holds
//! the receive and the give-back.

use std::time::Duration;

use serde_json::json;
use sqs_flight_tests::faults::{FaultProxy, Faults, HOLDING};
use sqs_flight_tests::fixture::{connect, read_on};
use sqs_flight_tests::moto;
use sqs_flight_tests::prelude::*;

const RECEIVE: &str = "ReceiveMessage";
const CHANGE: &str = "ChangeMessageVisibilityBatch";

/// A fresh queue holding one message behind a fault proxy, served as
/// table `t`: the fixture (on the proxy), the proxy, a client straight to
/// moto and the queue's URL.
async fn one_message_behind_a_proxy(
    name: &str,
    seed: u64,
) -> (Fixture, FaultProxy, aws_sdk_sqs::Client, String) {
    let (f, proxy, direct) = Fixture::behind_proxy(name, 1, seed, |_| {}).await;
    let url = f.queue_url.clone();
    (f, proxy, direct, url)
}

/// Batch 1 of consumer `q`: one partition, one short poll.
async fn plan_batch_one(f: &mut Fixture) -> arrow_flight::FlightInfo {
    f.plan(json!({"table": "t", "consumer": "q", "batch": 1, "partitions": 1, "max_wait_ms": 0}))
        .await
        .expect("plan")
}

async fn receiving(f: &mut Fixture) -> u64 {
    let c = f.consumer("q").await;
    c["receives_in_flight"]
        .as_u64()
        .unwrap_or_else(|| panic!("status counts the consumer's receives: {c}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receive_counts_until_what_it_brought_is_handed_back() {
    let (mut f, proxy, direct, url) = one_message_behind_a_proxy("receiving", 3).await;
    // The receive waits at the proxy before it reaches moto; the give-back
    // of what it brings (visibility 0) waits too.
    proxy.set(
        Faults::none()
            .hold(RECEIVE, "", Duration::from_secs(2))
            .hold(CHANGE, r#""VisibilityTimeout":0"#, Duration::from_secs(2)),
    );
    let info = plan_batch_one(&mut f).await;
    assert_eq!(receiving(&mut f).await, 0, "nothing issued before a read");

    // A first read whose client hangs up while its receive is held: the
    // loop ends, and the call is left to finish and hand back what it brings.
    let ticket = info.endpoint[0].ticket.clone().expect("a ticket");
    let mut reader = connect(&f.server.url).await;
    let read = tokio::spawn(async move {
        let _stream = reader.do_get(ticket).await;
        std::future::pending::<()>().await
    });
    poll(STEP, async || proxy.count(RECEIVE, HOLDING), |&n| n >= 1)
        .await
        .expect("the receive held at the proxy");
    assert_eq!(receiving(&mut f).await, 1, "a call in flight counts");
    read.abort();

    poll(STEP, async || proxy.count(CHANGE, HOLDING), |&n| n >= 1)
        .await
        .expect("the hand-back held at the proxy");
    assert_eq!(
        moto::queue_counts(&direct, &url).await,
        (0, 1),
        "the message is in flight at moto"
    );
    let c = f.consumer("q").await;
    assert_eq!(
        (c["in_flight"].as_u64(), c["receives_in_flight"].as_u64()),
        (Some(0), Some(1)),
        "the consumer holds nothing, and its call still counts until its hand-back is done: {c}"
    );

    poll(STEP, async || receiving(&mut f).await, |&n| n == 0)
        .await
        .expect("the call no longer counts");
    assert_eq!(
        moto::queue_counts(&direct, &url).await,
        (1, 0),
        "it stopped counting only once the message was visible again"
    );
    f.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receive_counts_while_in_flight_and_no_more_once_recorded() {
    let (mut f, proxy, _, _) = one_message_behind_a_proxy("recorded", 4).await;
    proxy.set(Faults::none().hold(RECEIVE, "", Duration::from_secs(1)));
    let info = plan_batch_one(&mut f).await;
    let mut reader = connect(&f.server.url).await;
    let read = tokio::spawn(async move {
        let ticket = info.endpoint[0].ticket.clone().expect("a ticket");
        read_on(&mut reader, &ticket).await
    });
    poll(STEP, async || proxy.count(RECEIVE, HOLDING), |&n| n >= 1)
        .await
        .expect("the receive held at the proxy");
    assert_eq!(receiving(&mut f).await, 1, "a call in flight counts");
    let rows: usize = read
        .await
        .unwrap()
        .expect("read")
        .iter()
        .map(|b| b.num_rows())
        .sum();
    assert_eq!(rows, 1);
    let c = f.consumer("q").await;
    assert_eq!(
        (c["in_flight"].as_u64(), c["receives_in_flight"].as_u64()),
        (Some(1), Some(0)),
        "recorded, the message counts in in_flight and the call no more: {c}"
    );
    f.server.stop().await;
}
