//! Batches sized to the backlog (docs/protocol.md, "Plan parameters:
//! defaults and limits"): a plan that leaves `max_messages` to the built-in
//! default takes the queue's depth as `status` last read it, shared among
//! its partitions, between the default (1000) and `backlog_max_messages`;
//! a plan or table that sets another `max_messages` keeps it, and a table whose
//! depth the server has not read gets the default.
//!
//! A backlog must pass 1000 messages per partition to show, so these run
//! on rustack: moto takes minutes to fill and read such a queue.

use serde_json::{Value, json};
use sqs_flight_server::Config;
use sqs_flight_server::config::TableConfig;
use sqs_flight_tests::moto;
use sqs_flight_tests::rustack::rustack;

use sqs_flight_tests::prelude::*;

/// More than the default 1000 per partition, and odd, so that the share of
/// each of 2 partitions is rounded.
const BACKLOG: usize = 2501;

/// A rustack queue holding [`BACKLOG`] messages, served as table `t` with the
/// tweaks given.
async fn backlog(
    table: impl FnOnce(&mut TableConfig),
    config: impl FnOnce(&mut Config),
) -> Fixture {
    let sqs = rustack().client().await;
    let url = moto::queue_holding(&sqs, "backlog", BACKLOG).await;
    Fixture::serve(sqs, url, table, config).await
}

/// Has the server read the queue's depth (the `status` action, as the
/// Spark source does before each plan); checks it saw the whole backlog.
async fn status(f: &mut Fixture) {
    let answer = f.action("status", json!({"table": "t"})).await.unwrap();
    assert_eq!(answer["tables"]["t"]["approximate_depth"], BACKLOG);
}

/// The rows of batch 1 planned with `fields` (besides table, consumer and
/// batch), all partitions read.
async fn batch_rows(f: &mut Fixture, fields: Value) -> usize {
    let mut cmd = json!({"table": "t", "consumer": "q", "batch": 1, "max_wait_ms": 500,
                         "backlog_max_messages": 10_000});
    cmd.as_object_mut()
        .unwrap()
        .extend(fields.as_object().unwrap().clone());
    let info = f.plan(cmd).await.unwrap();
    let rows = f.read_all(&info).await;
    rows.iter().map(|b| b.num_rows()).sum()
}

#[tokio::test]
async fn a_batch_takes_the_backlog_once_status_saw_it() {
    let mut f = backlog(|_| {}, |_| {}).await;
    status(&mut f).await;
    // 2501 over 2 partitions: 1251 each, so the whole backlog in one batch
    // (1000 each, the default, would leave 501; 1250 would leave 1).
    assert_eq!(batch_rows(&mut f, json!({"partitions": 2})).await, BACKLOG);
    assert_eq!(f.counts().await, (0, BACKLOG as i64));
}

#[tokio::test]
async fn an_explicit_max_messages_wins() {
    let mut f = backlog(|_| {}, |_| {}).await;
    status(&mut f).await;
    let rows = batch_rows(&mut f, json!({"partitions": 1, "max_messages": 1200})).await;
    assert_eq!(rows, 1200);
}

#[tokio::test]
async fn a_table_that_sets_max_messages_keeps_it() {
    let mut f = backlog(
        |t| {
            t.defaults.max_messages = 1200;
        },
        |_| {},
    )
    .await;
    status(&mut f).await;
    assert_eq!(batch_rows(&mut f, json!({"partitions": 1})).await, 1200);
}

#[tokio::test]
async fn the_cap_holds() {
    let mut f = backlog(|_| {}, |_| {}).await;
    status(&mut f).await;
    let cmd = json!({"partitions": 1, "backlog_max_messages": 1500});
    assert_eq!(batch_rows(&mut f, cmd).await, 1500);
}

#[tokio::test]
async fn a_plan_that_does_not_ask_takes_the_default() {
    let mut f = backlog(|_| {}, |_| {}).await;
    status(&mut f).await;
    let cmd = json!({"partitions": 1, "backlog_max_messages": 0});
    assert_eq!(batch_rows(&mut f, cmd).await, 1000);
}

#[tokio::test]
async fn with_no_depth_seen_a_batch_takes_the_default() {
    let mut f = backlog(|_| {}, |_| {}).await;
    assert_eq!(batch_rows(&mut f, json!({"partitions": 1})).await, 1000);
}
