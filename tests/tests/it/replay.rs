//! The rules of docs/protocol.md#the-rules: rule 1, a ticket is a repeatable
//! read; rule 4, planning is idempotent.

use futures::StreamExt;
use serde_json::json;

use sqs_flight_tests::prelude::*;

#[tokio::test]
async fn a_replayed_ticket_returns_identical_batches_and_receives_nothing_new() {
    let mut f = Fixture::standard(12).await;
    let info = f
        .plan(json!({"table": "t", "partitions": 1, "max_wait_ms": 500}))
        .await
        .unwrap();
    let ticket = &tickets(&info)[0];
    let first = f.read(ticket).await.unwrap();
    assert_eq!(
        sorted(bodies(&first)),
        sorted((0..12).map(|i| format!("m{i}")).collect())
    );
    // New messages arrive; a replay must not pick them up.
    moto::send_bodies(&f.sqs, &f.queue_url, ["late".to_string()]).await;
    let second = f.read(ticket).await.unwrap();
    // The same rows in the same order; a sealed ticket replays them as one
    // record batch, so batch boundaries may differ.
    assert_eq!(
        concat(&first),
        concat(&second),
        "replay differs from the first read"
    );
    assert_eq!(f.counts().await, (1, 12), "the late message stays visible");
}

#[tokio::test]
async fn concurrent_reads_of_one_ticket_get_the_same_rows() {
    let mut f = Fixture::standard(25).await;
    let info = f
        .plan(json!({"table": "t", "partitions": 1, "max_wait_ms": 500}))
        .await
        .unwrap();
    let ticket = tickets(&info)[0].clone();
    let mut a = f.server.client().await;
    let mut b = f.server.client().await;
    let (ra, rb) = bounded(async {
        let sa = a.do_get(ticket.clone());
        let sb = b.do_get(ticket.clone());
        let (sa, sb) = tokio::join!(sa, sb);
        let collect = |s: arrow_flight::decode::FlightRecordBatchStream| async move {
            s.collect::<Vec<_>>()
                .await
                .into_iter()
                .map(|r| r.unwrap())
                .collect::<Vec<_>>()
        };
        tokio::join!(collect(sa.unwrap()), collect(sb.unwrap()))
    })
    .await;
    assert_eq!(bodies(&ra).len(), 25);
    assert_eq!(
        bodies(&ra),
        bodies(&rb),
        "concurrent readers saw different rows"
    );
    assert_eq!(f.counts().await, (0, 25));
}

#[tokio::test]
async fn a_read_that_dies_half_way_leaves_the_ticket_replayable() {
    let mut f = Fixture::standard(40).await;
    let info = f
        .plan(json!({"table": "t", "partitions": 1, "max_wait_ms": 2000}))
        .await
        .unwrap();
    let ticket = tickets(&info)[0].clone();
    let seen = bounded(async {
        let mut stream = f.flight.do_get(ticket.clone()).await.unwrap();
        let first = stream.next().await.expect("a first batch").unwrap();
        drop(stream); // the client hangs up
        first
    })
    .await;
    let replay = f.read(&ticket).await.unwrap();
    let again = f.read(&ticket).await.unwrap();
    assert_eq!(concat(&replay), concat(&again), "replays differ");
    let replayed = bodies(&replay);
    assert!(
        replayed.len() >= seen.num_rows() && replayed.len() < 40,
        "{}",
        replayed.len()
    );
    assert_eq!(replayed[..seen.num_rows()], bodies(&[seen])[..]);
    // Everything the ticket holds is committed; what the dead read never
    // recorded stays in SQS.
    let out = f.commit("default", 1).await;
    assert_eq!(out["deleted"], replayed.len() as u64);
}

#[tokio::test]
async fn planning_a_batch_twice_returns_the_same_tickets() {
    let mut f = Fixture::standard(0).await;
    let cmd = json!({"table": "t", "consumer": "c", "batch": 7, "partitions": 3});
    let a = f.plan(cmd.clone()).await.unwrap();
    let b = f.plan(cmd).await.unwrap();
    assert_eq!(a.endpoint.len(), 3);
    assert_eq!(tickets(&a), tickets(&b));
    assert_eq!(metadata(&a)["batch"], 7);
    // Planning without a batch takes the next one.
    let next = f
        .plan(json!({"table": "t", "consumer": "c"}))
        .await
        .unwrap();
    assert_eq!(metadata(&next)["batch"], 8);
    assert_eq!(next.endpoint.len(), 2, "the table's default partitions");
}

use sqs_flight_tests::moto;
