//! FIFO queues: each message group stays in order across batches.

use serde_json::json;
use sqs_flight_tests::moto;

use crate::support::*;

#[tokio::test]
async fn each_message_group_keeps_its_order_across_batches() {
    let sqs = moto::moto().client().await;
    let url = moto::create_fifo_queue(&sqs, "fifo", &[]).await;
    let messages: Vec<(String, String)> = (0..18)
        .map(|i| (format!("g{}", i % 3), format!("g{}-{:02}", i % 3, i / 3)))
        .collect();
    moto::send_fifo_bodies(&sqs, &url, messages).await;
    let mut f = Fixture::serve(sqs, url, |t| t, |c| c).await;

    let mut rows = Vec::new();
    for batch in 1..=20 {
        let info = f
            .plan(json!({"table": "t", "batch": batch, "partitions": 2,
                         "max_messages": 2, "max_wait_ms": 300}))
            .await
            .unwrap();
        let got = f.read_all(&info).await;
        rows.extend(
            strings(&got, "message_group_id")
                .into_iter()
                .zip(bodies(&got)),
        );
        f.commit("default", batch).await;
        if rows.len() == 18 {
            break;
        }
    }
    assert_eq!(rows.len(), 18, "every message read once");
    assert_each_group_in_order(rows, 6);
    assert_eq!(f.counts().await, (0, 0));
}
