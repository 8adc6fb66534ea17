//! FIFO queues: each message group stays in order across batches.

use serde_json::json;
use sqs_flight_tests::moto;

use sqs_flight_tests::prelude::*;

#[tokio::test]
async fn each_message_group_keeps_its_order_across_batches() {
    let sqs = moto::moto().client().await;
    let mut f = fifo_groups(sqs, 3, 6).await;
    let plan = json!({"table": "t", "partitions": 2, "max_messages": 2, "max_wait_ms": 300});
    let rows = read_groups(&mut f, plan, 18).await;
    assert_eq!(rows.len(), 18, "every message read once");
    assert_each_group_in_order(rows, 6);
    assert_eq!(f.counts().await, (0, 0));
}
