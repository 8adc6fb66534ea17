//! Rule 3 (docs/protocol.md#the-rules): uncommitted messages stay invisible
//! while their consumer lives, and come back on release or when the
//! consumer's lease runs out.

use std::time::Duration;

use serde_json::json;
use sqs_flight_server::config::TableConfig;

use sqs_flight_tests::prelude::*;

/// On the memory queue under paused time: the heartbeat is the server's,
/// and seven seconds are a jump of the clock. The heartbeat's calls against
/// SQS itself are checked across a restart in restart.rs.
#[tokio::test(start_paused = true)]
async fn uncommitted_messages_stay_invisible_for_several_visibility_timeouts() {
    let vt = |t: &mut TableConfig| {
        t.visibility_timeout = Some(Duration::from_secs(2));
    };
    let mut f = MemoryFixture::start(5, vt, |_| {}).await;
    let info = f
        .plan(json!({"table": "t", "partitions": 1, "max_wait_ms": 300}))
        .await
        .unwrap();
    assert_eq!(bodies(&f.read_all(&info).await).len(), 5);
    // Three and a half visibility timeouts; the consumer renews its lease
    // (default 300 s) simply by having called.
    tokio::time::sleep(Duration::from_millis(7_000)).await;
    assert_eq!(f.counts().await, (0, 5), "the heartbeat kept them hidden");
    assert_eq!(f.commit("default", 1).await["deleted"], 5);
    assert_eq!(f.counts().await, (0, 0));
}

#[tokio::test]
async fn release_makes_messages_visible_now_and_forgets_the_batch() {
    let mut f = Fixture::standard(5).await; // visibility timeout 30 s
    let info = f
        .plan(json!({"table": "t", "consumer": "c", "partitions": 1, "max_wait_ms": 300}))
        .await
        .unwrap();
    let ticket = tickets(&info)[0].clone();
    assert_eq!(bodies(&f.read(&ticket).await.unwrap()).len(), 5);
    assert_eq!(f.counts().await, (0, 5));
    let out = f
        .action("release", json!({"table": "t", "consumer": "c"}))
        .await
        .unwrap();
    assert_eq!(out, json!({"released": 5}));
    assert_eq!(f.counts().await, (5, 0));
    // The released ticket is gone; the batch can be planned afresh.
    let err = f.read(&ticket).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err}");
    let again = f
        .plan(json!({"table": "t", "consumer": "c"}))
        .await
        .unwrap();
    assert_eq!(metadata(&again)["batch"], 1);
    assert_ne!(tickets(&again)[0], ticket);
    // Nothing was deleted: a commit of the forgotten batch deletes nothing.
    assert_eq!(f.commit("c", 1).await["deleted"], 0);
    assert_eq!(f.counts().await, (5, 0));
}

/// On the memory queue under paused time: the lease and its expiry are
/// the server's.
#[tokio::test(start_paused = true)]
async fn an_expired_lease_releases_the_consumers_messages() {
    let lease = |c: &mut sqs_flight_server::Config| {
        c.consumer_lease = Duration::from_secs(1);
    };
    let mut f = MemoryFixture::start(4, |_| {}, lease).await;
    let info = f
        .plan(json!({"table": "t", "consumer": "c", "partitions": 1, "max_wait_ms": 300}))
        .await
        .unwrap();
    assert_eq!(bodies(&f.read_all(&info).await).len(), 4);
    assert_eq!(f.counts().await.0, 0);
    let counts = poll(
        Duration::from_secs(20),
        async || f.counts().await,
        |c| c.0 == 4,
    )
    .await;
    assert_eq!(counts, Ok((4, 0)), "lease expiry made the messages visible");
    // Like a release: a consumer that never committed is then forgotten.
    let s = f.action("status", json!({"table": "t"})).await.unwrap();
    assert_eq!(s["tables"]["t"]["consumers"], json!({}), "{s}");
}
