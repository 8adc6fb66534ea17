//! `sqs-flight infer-schema` against moto: the printed block is accepted by
//! the server's own config parser with the inferred types, and the sampled
//! messages go back to the queue.

use arrow_schema::{DataType, Field, Fields};
use clap::Parser;
use serde_json::json;
use sqs_flight_server::config::{Cli, Config};
use sqs_flight_tests::moto;

use sqs_flight_tests::cli::sqs_flight;
use sqs_flight_tests::prelude::*;

fn args<'a>(f: &'a Fixture, rest: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["--url", f.server.url.as_str()];
    v.extend_from_slice(rest);
    v
}

/// The payload fields the server's config parser makes of `block` under a
/// `[tables.t]` section.
fn parsed_payload(block: &str) -> Fields {
    let (_scratch, file) = temp_file(
        "payload.toml",
        &format!("[tables.t]\nqueue_url = \"http://127.0.0.1:1/q\"\n\n{block}"),
    );
    let cli = Cli::try_parse_from(["sqs-flight-server", "--config", file.to_str().unwrap()])
        .expect("server flags");
    let config = Config::try_from(cli).unwrap_or_else(|e| panic!("{e}\n{block}"));
    let _ = std::fs::remove_file(file);
    let spec = config
        .table("t")
        .unwrap()
        .payload
        .clone()
        .expect("a payload");
    spec.arrow_fields().expect("payload fields")
}

fn field(fields: &Fields, name: &str) -> DataType {
    fields
        .find(name)
        .unwrap_or_else(|| panic!("no field {name} in {fields:?}"))
        .1
        .data_type()
        .clone()
}

#[tokio::test]
async fn the_printed_block_is_accepted_by_the_server_with_the_inferred_types() {
    let f = Fixture::standard(0).await;
    let bodies = vec![
        json!({"user": "ann", "amount": 12, "paid": true, "tags": ["a", "b"],
               "customer": {"id": "c1", "visits": 3}, "coupon": null})
        .to_string(),
        json!({"user": "bob", "amount": 7.5, "items": [{"sku": "x", "qty": 2}]}).to_string(),
        "not json".to_string(),
        "[1, 2, 3]".to_string(),
    ];
    moto::send_bodies(&f.sqs, &f.queue_url, bodies).await;

    let run = sqs_flight(&args(&f, &["infer-schema", "t", "--max-wait-ms", "300"])).await;
    run.expect_code(0);
    assert!(
        run.stderr
            .contains("skipped 2 of 4 bodies: not a JSON object"),
        "says how many were skipped: {run:#?}"
    );
    assert!(run.stdout.contains("[tables.t.payload]"), "{run:#?}");
    assert_eq!(
        f.counts().await,
        (4, 0),
        "the peeked messages are back in the queue: {run:#?}"
    );

    let fields = parsed_payload(&run.stdout);
    let names: Vec<&str> = fields.iter().map(|f| f.name().as_str()).collect();
    assert_eq!(
        names,
        [
            "amount", "coupon", "customer", "items", "paid", "tags", "user"
        ]
    );
    assert_eq!(field(&fields, "amount"), DataType::Float64, "12 and 7.5");
    assert_eq!(field(&fields, "user"), DataType::Utf8);
    assert_eq!(field(&fields, "paid"), DataType::Boolean);
    assert_eq!(
        field(&fields, "coupon"),
        DataType::Utf8,
        "seen only as null"
    );
    let utf8_item = Field::new("item", DataType::Utf8, true);
    assert_eq!(field(&fields, "tags"), DataType::List(utf8_item.into()));
    assert_eq!(
        field(&fields, "customer"),
        DataType::Struct(Fields::from(vec![
            Field::new("id", DataType::Utf8, true),
            Field::new("visits", DataType::Int64, true),
        ]))
    );
    let DataType::List(item) = field(&fields, "items") else {
        panic!("items is a list: {fields:?}")
    };
    assert_eq!(
        item.data_type(),
        &DataType::Struct(Fields::from(vec![
            Field::new("qty", DataType::Int64, true),
            Field::new("sku", DataType::Utf8, true),
        ]))
    );
}

#[tokio::test]
async fn sns_envelopes_print_unwrap_and_an_empty_table_fails() {
    let f = Fixture::standard(0).await;
    let run = sqs_flight(&args(&f, &["infer-schema", "t", "--max-wait-ms", "300"])).await;
    assert!(
        run.expect_code(1)
            .stderr
            .contains("no body to infer from: table t gave 0 messages"),
        "{run:#?}"
    );

    let envelope = json!({"Type": "Notification", "TopicArn": "arn:aws:sns:us-east-1:1:t",
                          "Message": json!({"order": 7, "state": "paid"}).to_string()});
    moto::send_bodies(&f.sqs, &f.queue_url, [envelope.to_string()]).await;
    let run = sqs_flight(&args(
        &f,
        &[
            "infer-schema",
            "t",
            "--max-wait-ms",
            "300",
            "--unwrap",
            "sns",
        ],
    ))
    .await;
    run.expect_code(0);
    assert!(run.stdout.contains("unwrap = \"sns\""), "{run:#?}");
    let fields = parsed_payload(&run.stdout);
    assert_eq!(field(&fields, "order"), DataType::Int64);
    assert_eq!(field(&fields, "state"), DataType::Utf8);
    assert_eq!(f.counts().await, (1, 0), "released: {run:#?}");
}

#[tokio::test]
async fn an_unknown_table_exits_5_and_holds_nothing() {
    let f = Fixture::standard(2).await;
    let run = sqs_flight(&args(&f, &["infer-schema", "nope"])).await;
    assert!(
        run.expect_code(5).stderr.contains("known tables: t"),
        "{run:#?}"
    );
    assert_eq!(f.counts().await, (2, 0));
}
