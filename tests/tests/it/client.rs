//! The Rust client library and its DataFusion provider, against moto.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::RecordBatch;
use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use futures::TryStreamExt;
use serde_json::json;
use sqs_flight_client::datafusion::{SqsFlightTable, session_context};
use sqs_flight_client::{Client, Error, PlanOptions, table_schema};
use sqs_flight_tests::moto;
use tonic::Code;

use sqs_flight_tests::prelude::*;

fn options(consumer: &str) -> PlanOptions {
    PlanOptions::consumer(consumer)
        .partitions(2)
        .max_messages(4)
        .max_wait(Duration::from_millis(300))
}

#[tokio::test]
async fn reads_every_message_across_batches_and_commits() {
    // Two partitions read in parallel: on rustack, since moto can hand one
    // message to two concurrent receives.
    let sqs = sqs_flight_tests::rustack::rustack().client().await;
    let url = sqs_flight_tests::moto::create_queue(&sqs, "client", &[]).await;
    sqs_flight_tests::moto::send_bodies(&sqs, &url, (0..25).map(|i| format!("m{i}"))).await;
    let f = Fixture::serve(sqs, url, |_| {}, |_| {}).await;
    let client = bounded(Client::connect(f.server.url.clone()))
        .await
        .expect("connect the client");
    let mut seen = Vec::new();
    let mut batches = Vec::new();
    loop {
        let plan = bounded(client.plan("t", &options("reader"))).await.unwrap();
        assert_eq!(plan.endpoints.len(), 2);
        let rows = bounded(client.read_batch(&plan)).await.unwrap();
        let got = bodies(&rows);
        assert!(
            got.len() <= 8,
            "batch {} holds {} rows",
            plan.batch,
            got.len()
        );
        let committed = bounded(client.commit("t", "reader", plan.batch))
            .await
            .unwrap();
        assert_eq!(committed.deleted, got.len() as u64);
        assert_eq!(
            (committed.committed_batch, committed.expired),
            (plan.batch, 0)
        );
        if got.is_empty() {
            break;
        }
        batches.push(plan.batch);
        seen.extend(got);
    }
    let expected: Vec<String> = (0..25).map(|i| format!("m{i}")).collect();
    assert_eq!(sorted(seen), sorted(expected), "every message exactly once");
    assert!(
        batches.len() >= 4,
        "25 messages in batches of <= 8: {batches:?}"
    );
    assert_eq!(f.counts().await, (0, 0), "the queue is empty");
}

#[tokio::test]
async fn reads_replay_and_release_gives_messages_back() {
    // Two partitions read in parallel, and the count is exact: on rustack,
    // since moto can hand one message to two concurrent receives (an SQS
    // redelivery, allowed by rule 3 of docs/protocol.md#the-rules, that once made this read 7 rows of 6).
    let sqs = sqs_flight_tests::rustack::rustack().client().await;
    let url = sqs_flight_tests::moto::create_queue(&sqs, "replay", &[]).await;
    sqs_flight_tests::moto::send_bodies(&sqs, &url, (0..6).map(|i| format!("m{i}"))).await;
    let f = Fixture::serve(sqs, url, |_| {}, |_| {}).await;
    let client = bounded(Client::connect(f.server.url.clone()))
        .await
        .expect("connect the client");
    let plan = bounded(client.plan("t", &options("r"))).await.unwrap();
    let first = bounded(client.read_batch(&plan)).await.unwrap();
    assert_eq!(bodies(&first).len(), 6);
    // Each endpoint, read again on its own, replays the same rows in order.
    let mut again = Vec::new();
    for e in &plan.endpoints {
        let rows: Vec<RecordBatch> = bounded(async { client.read(e).await?.try_collect().await })
            .await
            .unwrap();
        again.extend(rows);
    }
    assert_eq!(bodies(&again), bodies(&first));
    // Planning the same batch again returns the same tickets.
    let same = bounded(client.plan("t", &options("r").batch(plan.batch)))
        .await
        .unwrap();
    assert_eq!(same.endpoints, plan.endpoints);

    let status = bounded(client.status(Some("t"))).await.unwrap();
    let consumer = &status.tables["t"].consumers["r"];
    assert_eq!(
        (consumer.open_batches.clone(), consumer.in_flight),
        (vec![plan.batch], 6)
    );

    let released = bounded(client.release("t", "r")).await.unwrap();
    assert_eq!(released.released, 6);
    assert_eq!(f.counts().await, (6, 0), "visible again at once");
}

#[tokio::test]
async fn tables_and_schema() {
    let f = Fixture::standard(0).await;
    let client = bounded(Client::connect(f.server.url.clone()))
        .await
        .expect("connect the client");
    assert_eq!(bounded(client.tables()).await.unwrap(), ["t"]);
    assert_eq!(bounded(client.schema("t")).await.unwrap(), table_schema());
    assert_eq!(client.url(), f.server.url);
}

#[tokio::test]
async fn errors_say_what_to_fix_and_whether_to_retry() {
    let f = Fixture::standard(1).await;
    let client = bounded(Client::connect(f.server.url.clone()))
        .await
        .expect("connect the client");

    let e = bounded(client.schema("nope")).await.unwrap_err();
    assert!(matches!(e, Error::NotFound { .. }), "{e:?}");
    assert!(
        e.to_string().contains("\"nope\"") && e.to_string().contains("known tables: t"),
        "{e}"
    );

    let e = bounded(client.plan("t", &PlanOptions::default().partitions(1000)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::InvalidArgument), "{e:?}");
    assert!(
        e.to_string().contains("partitions") && !e.is_retryable(),
        "{e}"
    );

    let plan = bounded(client.plan("t", &options("c"))).await.unwrap();
    bounded(client.read_batch(&plan)).await.unwrap();
    bounded(client.commit("t", "c", plan.batch)).await.unwrap();
    let e = bounded(client.read_batch(&plan)).await.unwrap_err();
    assert_eq!(e.code(), Some(Code::FailedPrecondition), "{e:?}");
    assert!(e.to_string().contains("committed"), "{e}");

    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("grpc://{}", closed.local_addr().unwrap());
    drop(closed);
    let e = bounded(Client::connect(url.clone())).await.unwrap_err();
    assert!(
        matches!(e, Error::Connect { .. }) && e.is_retryable(),
        "{e:?}"
    );
    assert!(e.to_string().contains(&url), "{e}");
    let e = bounded(Client::connect("ftp://h:1")).await.unwrap_err();
    assert!(matches!(e, Error::InvalidUrl { .. }), "{e:?}");
}

/// `n` order events whose `event` cycles through a, b, c and whose
/// `amount` is the message's index. On rustack: the SQL scans read their
/// two partitions in parallel and the tests count rows exactly, and moto
/// can hand one message to two concurrent receives (an SQS redelivery,
/// allowed by rule 3 of docs/protocol.md#the-rules, that once made the aggregate
/// count 5 a's of 4).
async fn json_queue(n: usize) -> Fixture {
    let sqs = sqs_flight_tests::rustack::rustack().client().await;
    let url = moto::create_queue(&sqs, "json", &[]).await;
    let kinds = ["a", "b", "c"];
    let bodies = (0..n).map(|i| json!({"event": kinds[i % 3], "amount": i}).to_string());
    moto::send_bodies(&sqs, &url, bodies).await;
    Fixture::serve(sqs, url, |_| {}, |_| {}).await
}

/// (event, count, sum) rows of the aggregate query.
fn aggregate_rows(batches: &[RecordBatch]) -> Vec<(String, i64, i64)> {
    let mut out = Vec::new();
    for b in batches {
        let event = b.column(0).as_string::<i32>();
        let count = b.column(1).as_primitive::<Int64Type>();
        let sum = b.column(2).as_primitive::<Int64Type>();
        for i in 0..b.num_rows() {
            out.push((event.value(i).to_string(), count.value(i), sum.value(i)));
        }
    }
    out
}

#[tokio::test]
async fn sql_aggregates_a_json_body_field_then_commits() {
    let f = json_queue(10).await;
    let client = bounded(Client::connect(f.server.url.clone()))
        .await
        .expect("connect the client");
    let table = SqsFlightTable::try_new(client, "t", options("sql").max_messages(100))
        .await
        .unwrap();
    let table = Arc::new(table);
    let ctx = session_context().unwrap();
    ctx.register_table("orders", table.clone()).unwrap();
    let query = "SELECT json_get_str(body, 'event') AS event, count(*) AS n, \
                 sum(json_get_int(body, 'amount')) AS total \
                 FROM orders GROUP BY 1 ORDER BY 1";
    let rows = bounded(async { ctx.sql(query).await?.collect().await })
        .await
        .unwrap();
    let expected = [("a", 4, 18), ("b", 3, 12), ("c", 3, 15)];
    let expected: Vec<_> = expected
        .iter()
        .map(|(e, n, s)| (e.to_string(), *n, *s))
        .collect();
    assert_eq!(aggregate_rows(&rows), expected);

    // A second query through the provider reads the same batch again.
    let batch = table.batch().await.expect("the scan planned a batch");
    let again = bounded(async { ctx.sql(query).await?.collect().await })
        .await
        .unwrap();
    assert_eq!(aggregate_rows(&again), expected);
    assert_eq!(table.batch().await, Some(batch));

    let committed = bounded(table.commit()).await.unwrap().unwrap();
    assert_eq!((committed.committed_batch, committed.deleted), (batch, 10));
    assert_eq!(table.batch().await, None);
    assert_eq!(f.counts().await, (0, 0));
}

#[tokio::test]
async fn sql_scans_push_the_projection_down_and_release() {
    let f = json_queue(4).await;
    let client = bounded(Client::connect(f.server.url.clone()))
        .await
        .expect("connect the client");
    let table = Arc::new(
        SqsFlightTable::try_new(client, "t", options("p"))
            .await
            .unwrap(),
    );
    let ctx = session_context().unwrap();
    ctx.register_table("t", table.clone()).unwrap();

    let plan = bounded(async {
        let frame = ctx.sql("SELECT body FROM t").await?;
        let physical = frame.create_physical_plan().await?;
        Ok::<_, datafusion::error::DataFusionError>(
            datafusion::physical_plan::displayable(physical.as_ref())
                .indent(false)
                .to_string(),
        )
    })
    .await
    .unwrap();
    assert!(plan.contains("partition_sizes=2"), "{plan}");
    assert!(plan.contains("projection=[body]"), "{plan}");

    // A self-join sees one batch on both sides.
    let joined = bounded(async {
        ctx.sql("SELECT count(*) AS n FROM t a JOIN t b ON a.message_id = b.message_id")
            .await?
            .collect()
            .await
    })
    .await
    .unwrap();
    assert_eq!(joined[0].column(0).as_primitive::<Int64Type>().value(0), 4);

    let released = bounded(table.release()).await.unwrap().unwrap();
    assert_eq!(released.released, 4);
    assert_eq!(f.counts().await, (4, 0));
}

#[tokio::test]
async fn status_reports_each_consumer() {
    let f = Fixture::standard(3).await;
    let client = bounded(Client::connect(f.server.url.clone()))
        .await
        .expect("connect the client");
    let plan = bounded(client.plan("t", &options("s"))).await.unwrap();
    bounded(client.read_batch(&plan)).await.unwrap();
    bounded(client.commit("t", "s", plan.batch)).await.unwrap();
    let status = bounded(client.status(None)).await.unwrap();
    let consumers: BTreeMap<_, _> = status.tables["t"].consumers.clone();
    let s = &consumers["s"];
    assert_eq!(s.committed_batch, Some(plan.batch));
    assert!(s.open_batches.is_empty() && s.in_flight == 0, "{s:?}");
}
