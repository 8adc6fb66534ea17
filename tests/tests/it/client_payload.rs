//! Tables with a typed payload through the client: the DataFusion provider
//! exposes the payload struct with its types and SQL groups by its fields;
//! the CLI prints it in every format.

use std::sync::Arc;
use std::time::Duration;

use arrow_array::RecordBatch;
use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int64Type};
use arrow_schema::{DataType, Field, Fields};
use serde_json::{Value, json};
use sqs_flight_client::datafusion::{SqsFlightTable, session_context};
use sqs_flight_client::{Client, PlanOptions};
use sqs_flight_schemas::payload::PayloadSpec;
use sqs_flight_tests::moto;

use sqs_flight_tests::cli::sqs_flight;
use sqs_flight_tests::prelude::*;

/// Orders by user: ann 3 (1.5 + 2.5 + 4), bob 2 (10 + 0.5), cy 1 (7), and
/// one body that does not parse.
async fn orders() -> Fixture {
    let sqs = moto::moto().client().await;
    let url = moto::create_queue(&sqs, "payload-sql", &[]).await;
    let events = [
        ("ann", 1.5),
        ("bob", 10.0),
        ("ann", 2.5),
        ("cy", 7.0),
        ("bob", 0.5),
        ("ann", 4.0),
    ];
    let mut bodies: Vec<String> = events
        .iter()
        .map(|(user, amount)| json!({"user": user, "amount": amount, "note": "x"}).to_string())
        .collect();
    bodies.push("{broken".to_string());
    moto::send_bodies(&sqs, &url, bodies).await;
    let spec: PayloadSpec = serde_json::from_value(json!({"fields": [
        {"name": "user", "type": "utf8"},
        {"name": "amount", "type": "float64"},
    ]}))
    .unwrap();
    Fixture::serve(
        sqs,
        url,
        |t| {
            t.payload = Some(spec);
        },
        |_| {},
    )
    .await
}

fn options(consumer: &str) -> PlanOptions {
    // One partition: moto may hand one message to two concurrent receives.
    PlanOptions::consumer(consumer)
        .partitions(1)
        .max_messages(50)
        .max_wait(Duration::from_millis(300))
}

/// (user, count, total) rows.
fn per_user(batches: &[RecordBatch]) -> Vec<(String, i64, f64)> {
    let mut out = Vec::new();
    for b in batches {
        let user = b.column(0).as_string::<i32>();
        let n = b.column(1).as_primitive::<Int64Type>();
        let total = b.column(2).as_primitive::<Float64Type>();
        for i in 0..b.num_rows() {
            out.push((user.value(i).to_string(), n.value(i), total.value(i)));
        }
    }
    out
}

#[tokio::test]
async fn the_provider_exposes_the_payload_struct_and_sql_groups_by_its_fields() {
    let f = orders().await;
    let client = bounded(Client::connect(f.server.url.clone()))
        .await
        .expect("connect the client");
    let table = Arc::new(
        SqsFlightTable::try_new(client, "t", options("sql-payload"))
            .await
            .unwrap(),
    );
    let schema = datafusion::catalog::TableProvider::schema(table.as_ref());
    assert_eq!(
        schema.field_with_name("payload").unwrap().data_type(),
        &DataType::Struct(Fields::from(vec![
            Field::new("user", DataType::Utf8, true),
            Field::new("amount", DataType::Float64, true),
        ])),
        "the server's per-table schema, not the base one"
    );
    assert_eq!(
        schema.field_with_name("payload_error").unwrap().data_type(),
        &DataType::Utf8
    );

    let ctx = session_context().unwrap();
    ctx.register_table("orders", table.clone()).unwrap();
    let expected = vec![
        ("ann".to_string(), 3, 8.0),
        ("bob".to_string(), 2, 10.5),
        ("cy".to_string(), 1, 7.0),
    ];
    // Bracket access and get_field are both struct field access in
    // DataFusion 55, and so is the dotted column path.
    for query in [
        "SELECT payload['user'] AS user, count(*) AS n, sum(payload['amount']) AS total \
         FROM orders WHERE payload IS NOT NULL GROUP BY 1 ORDER BY 1",
        "SELECT get_field(payload, 'user') AS user, count(*) AS n, \
         sum(get_field(payload, 'amount')) AS total \
         FROM orders WHERE payload_error IS NULL GROUP BY 1 ORDER BY 1",
        "SELECT orders.payload.user AS user, count(*) AS n, sum(orders.payload.amount) AS total \
         FROM orders WHERE payload IS NOT NULL GROUP BY 1 ORDER BY 1",
    ] {
        let rows = bounded(async { ctx.sql(query).await?.collect().await })
            .await
            .unwrap_or_else(|e| panic!("{query}: {e}"));
        assert_eq!(per_user(&rows), expected, "{query}");
    }
    let rows = bounded(async {
        ctx.sql("SELECT body, payload_error FROM orders WHERE payload IS NULL")
            .await?
            .collect()
            .await
    })
    .await
    .unwrap();
    assert_eq!(bodies(&rows), ["{broken"], "the bad body keeps its row");

    let committed = bounded(table.commit()).await.unwrap().unwrap();
    assert_eq!(committed.deleted, 7);
    assert_eq!(f.counts().await, (0, 0));
}

fn args<'a>(f: &'a Fixture, rest: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["--url", f.server.url.as_str()];
    v.extend_from_slice(rest);
    v
}

#[tokio::test]
async fn the_cli_prints_and_queries_payload_columns() {
    let f = orders().await;
    // One partition: moto may hand one message to two concurrent receives.
    let small = [
        "--partitions",
        "1",
        "--max-messages",
        "50",
        "--max-wait-ms",
        "300",
    ];

    let run = sqs_flight(&args(&f, &["schema", "t"])).await;
    let schema = &run.expect_code(0).stdout;
    assert!(
        schema
            .lines()
            .any(|l| l.starts_with("payload ") && l.contains("Struct")),
        "{run:#?}"
    );
    assert!(
        schema.lines().any(|l| l.starts_with("payload_error ")),
        "{run:#?}"
    );

    let mut a = args(
        &f,
        &[
            "tail",
            "t",
            "--format",
            "jsonl",
            "--columns",
            "body,payload,payload_error",
        ],
    );
    a.extend(small);
    let run = sqs_flight(&a).await;
    run.expect_code(0);
    let rows: Vec<Value> = run
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 7, "{run:#?}");
    let cy = rows.iter().find(|r| r["payload"]["user"] == "cy").unwrap();
    assert_eq!(
        cy["payload"],
        json!({"user": "cy", "amount": 7.0}),
        "a nested object"
    );
    assert_eq!(cy["payload_error"], Value::Null);
    let broken = rows.iter().find(|r| r["body"] == "{broken").unwrap();
    assert_eq!(broken["payload"], Value::Null);
    assert!(broken["payload_error"].is_string(), "{broken}");

    let mut a = args(
        &f,
        &["tail", "t", "--format", "csv", "--columns", "payload"],
    );
    a.extend(small);
    let run = sqs_flight(&a).await;
    run.expect_code(0);
    assert!(
        run.stdout.contains("{user: cy, amount: 7.0}"),
        "structs as text in CSV: {run:#?}"
    );

    let mut a = args(
        &f,
        &[
            "sql",
            "SELECT payload['user'] AS user, count(*) AS n FROM t \
             WHERE payload IS NOT NULL GROUP BY 1 ORDER BY 1",
            "--format",
            "csv",
            "--commit",
        ],
    );
    a.extend(small);
    let run = sqs_flight(&a).await;
    run.expect_code(0);
    assert_eq!(run.stdout, "user,n\nann,3\nbob,2\ncy,1\n", "{run:#?}");
    assert_eq!(f.counts().await, (0, 0));
}
