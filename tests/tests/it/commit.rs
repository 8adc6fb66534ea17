//! Rule 2 (docs/protocol.md#the-rules): commit deletes everything up to the acknowledged
//! batch, once.

use serde_json::{Value, json};

use sqs_flight_tests::prelude::*;

#[tokio::test]
async fn commit_deletes_exactly_the_batches_up_to_n() {
    let mut f = Fixture::standard(30).await;
    let mut per_batch = Vec::new();
    for batch in 1..=3 {
        let info = f
            .plan(json!({"table": "t", "consumer": "q", "batch": batch,
                         "partitions": 2, "max_messages": 5, "max_wait_ms": 500}))
            .await
            .unwrap();
        let rows = f.read_all(&info).await;
        assert_eq!(bodies(&rows).len(), 10, "batch {batch}");
        per_batch.push(sorted(bodies(&rows)));
    }
    assert_eq!(f.counts().await, (0, 30));

    let out = f.commit("q", 2).await;
    assert_eq!(
        out,
        json!({"committed_batch": 2, "deleted": 20, "expired": 0, "rejected": 0})
    );
    assert_eq!(f.counts().await, (0, 10), "batch 3 is still held");

    // Idempotent: committing 2 again, or anything below, deletes nothing.
    assert_eq!(f.commit("q", 2).await["deleted"], 0);
    assert_eq!(
        f.commit("q", 1).await,
        json!({"committed_batch": 2, "deleted": 0, "expired": 0, "rejected": 0})
    );

    // What is left in SQS is exactly batch 3: release it and look.
    f.action("release", json!({"table": "t", "consumer": "q"}))
        .await
        .unwrap();
    let left = moto::drain_visible(&f.sqs, &f.queue_url).await;
    let left = sorted(left.into_iter().map(|m| m.body.unwrap()).collect());
    assert_eq!(left, per_batch[2]);
}

#[tokio::test]
async fn committed_batches_are_refused_with_the_watermark() {
    let mut f = Fixture::standard(4).await;
    let info = f
        .plan(json!({"table": "t", "consumer": "q", "partitions": 1, "max_wait_ms": 300}))
        .await
        .unwrap();
    assert_eq!(metadata(&info)["batch"], 1);
    let ticket = tickets(&info)[0].clone();
    assert_eq!(bodies(&f.read(&ticket).await.unwrap()).len(), 4);
    assert_eq!(f.commit("q", 1).await["deleted"], 4);
    assert_eq!(f.counts().await, (0, 0));

    let err = f.read(&ticket).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err}");
    assert!(err.message().contains("watermark: 1"), "{err}");
    let err = f
        .plan(json!({"table": "t", "consumer": "q", "batch": 1}))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err}");
    assert!(err.message().contains("watermark: 1"), "{err}");
    // The next batch is planned above the watermark.
    let next = f
        .plan(json!({"table": "t", "consumer": "q"}))
        .await
        .unwrap();
    assert_eq!(metadata(&next)["batch"], 2);
    // Other consumers are independent.
    let other = f
        .plan(json!({"table": "t", "consumer": "other"}))
        .await
        .unwrap();
    assert_eq!(metadata(&other)["batch"], 1);
}

#[tokio::test]
async fn status_reports_watermarks_open_batches_and_in_flight() {
    let mut f = Fixture::standard(6).await;
    let info = f
        .plan(json!({"table": "t", "consumer": "q", "partitions": 1, "max_wait_ms": 300}))
        .await
        .unwrap();
    f.read_all(&info).await;
    let s = f.action("status", json!({})).await.unwrap();
    let t = &s["tables"]["t"];
    assert_eq!(t["approximate_depth"], 0);
    assert_eq!(t["approximate_in_flight"], 6);
    // The lag is an age now: a number while the newest batch holds rows.
    let mut q = t["consumers"]["q"].clone();
    let age = q.as_object_mut().unwrap().remove("oldest_age_ms");
    assert!(age.as_ref().is_some_and(Value::is_u64), "{s}");
    assert_eq!(
        q,
        json!({"committed_batch": null, "last_planned_batch": 1, "open_batches": [1], "in_flight": 6,
            "rejected": 0, "receives_in_flight": 0})
    );
    f.commit("q", 1).await;
    let s = f.action("status", json!({"table": "t"})).await.unwrap();
    assert_eq!(
        s["tables"]["t"]["consumers"]["q"],
        json!({"committed_batch": 1, "last_planned_batch": 1, "open_batches": [], "in_flight": 0,
            "oldest_age_ms": null, "rejected": 0, "receives_in_flight": 0})
    );
}

use sqs_flight_tests::moto;

/// A commit or a release for a consumer that never read leaves no consumer
/// behind, and a consumer released before it committed anything (a peek, a
/// Spark batch read) is forgotten: `status` lists only consumers that hold
/// or committed something.
#[tokio::test]
async fn consumers_that_never_committed_leave_no_trace_in_status() {
    let mut f = Fixture::standard(3).await;
    let consumers = |s: &serde_json::Value| s["tables"]["t"]["consumers"].clone();

    assert_eq!(
        f.commit("typo", 1).await,
        json!({"committed_batch": 1, "deleted": 0, "expired": 0, "rejected": 0})
    );
    let status = f.action("status", json!({"table": "t"})).await.unwrap();
    assert_eq!(consumers(&status), json!({}), "{status}");

    let info = f
        .plan(json!({"table": "t", "consumer": "peek", "partitions": 1, "max_wait_ms": 300}))
        .await
        .unwrap();
    assert_eq!(bodies(&f.read_all(&info).await).len(), 3);
    let status = f.action("status", json!({"table": "t"})).await.unwrap();
    assert_eq!(consumers(&status)["peek"]["in_flight"], 3, "{status}");
    let released = f
        .action("release", json!({"table": "t", "consumer": "peek"}))
        .await
        .unwrap();
    assert_eq!(released, json!({"released": 3}));
    let status = f.action("status", json!({"table": "t"})).await.unwrap();
    assert_eq!(consumers(&status), json!({}), "{status}");
    assert_eq!(f.counts().await, (3, 0), "every message visible again");
}
