//! The Flight surface: ListFlights, GetSchema, ListActions, PATH plans, and
//! the columns a row carries.

use std::time::Duration;

use arrow_array::Array;
use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type, TimestampMillisecondType};
use arrow_flight::FlightDescriptor;
use aws_sdk_sqs::primitives::Blob;
use aws_sdk_sqs::types::MessageAttributeValue;
use futures::TryStreamExt;
use serde_json::json;
use sqs_flight_schemas::table_schema;
use sqs_flight_server::config::PlanParams;
use sqs_flight_tests::server::TestServer;

use sqs_flight_tests::prelude::*;

#[tokio::test]
async fn list_flights_get_schema_and_list_actions() {
    let mut f = Fixture::standard(0).await;
    let flights: Vec<_> = bounded(async {
        f.flight
            .list_flights(bytes::Bytes::new())
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap()
    })
    .await;
    assert_eq!(flights.len(), 1);
    assert_eq!(
        flights[0].flight_descriptor.as_ref().unwrap().path,
        vec!["t"]
    );
    assert!(flights[0].endpoint.is_empty());

    let schema = bounded(
        f.flight
            .get_schema(FlightDescriptor::new_path(vec!["t".into()])),
    )
    .await
    .unwrap();
    assert_eq!(&schema, table_schema().as_ref());
    let schema = bounded(
        f.flight
            .get_schema(FlightDescriptor::new_cmd(r#"{"table":"t"}"#)),
    )
    .await
    .unwrap();
    assert_eq!(&schema, table_schema().as_ref());

    let actions: Vec<_> = bounded(async {
        f.flight
            .list_actions()
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap()
    })
    .await;
    let names: Vec<_> = actions.iter().map(|a| a.r#type.as_str()).collect();
    assert_eq!(names, ["commit", "release", "status", "server_info"]);
    assert!(actions.iter().all(|a| !a.description.is_empty()));
}

#[tokio::test]
async fn a_path_descriptor_plans_the_next_batch_of_the_default_consumer() {
    let mut f = Fixture::standard(3).await;
    let d = FlightDescriptor::new_path(vec!["t".into()]);
    let info = bounded(f.flight.get_flight_info(d.clone())).await.unwrap();
    assert_eq!(
        serde_json::Value::Object(metadata(&info).into_iter().collect()),
        json!({"table": "t", "consumer": "default", "batch": 1})
    );
    assert_eq!(info.total_records, -1);
    assert_eq!(
        info.endpoint.len(),
        PlanParams::DEFAULTS.partitions as usize
    );
    for e in &info.endpoint {
        assert_eq!(e.location.len(), 1);
        assert_eq!(e.location[0].uri, f.server.url);
    }
    assert_eq!(info.try_decode_schema().unwrap(), *table_schema());
    // Planned but unread batch 1 is open, so the next PATH plan is batch 2.
    let next = bounded(f.flight.get_flight_info(d)).await.unwrap();
    assert_eq!(metadata(&next)["batch"], 2);
}

#[tokio::test]
async fn rows_carry_the_sqs_attributes_and_message_attributes() {
    let mut f = Fixture::standard(0).await;
    let attr = |t: &str, v: &str| {
        MessageAttributeValue::builder()
            .data_type(t)
            .string_value(v)
            .build()
            .unwrap()
    };
    let sent = f
        .sqs
        .send_message()
        .queue_url(&f.queue_url)
        .message_body(r#"{"order":1}"#)
        .message_attributes("kind", attr("String", "order"))
        .message_attributes("qty", attr("Number", "3"))
        .message_attributes(
            "raw",
            MessageAttributeValue::builder()
                .data_type("Binary")
                .binary_value(Blob::new(b"hi".to_vec()))
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    let info = f
        .plan(json!({"table": "t", "batch": 4, "partitions": 1, "max_wait_ms": 300}))
        .await
        .unwrap();
    let rows = f.read_all(&info).await;
    assert_eq!(rows.len(), 1);
    let b = &rows[0];
    assert_eq!(b.schema(), table_schema());
    assert_eq!(b.num_rows(), 1);
    assert_eq!(strings(&rows, "message_id"), vec![sent.message_id]);
    assert_eq!(strings(&rows, "body"), [Some(r#"{"order":1}"#.to_string())]);
    assert_eq!(
        strings(&rows, "md5_of_body"),
        vec![sent.md5_of_message_body]
    );
    assert!(strings(&rows, "sender_id")[0].is_some());
    assert_eq!(strings(&rows, "message_group_id"), [None]);
    let col = |n: &str| b.column_by_name(n).unwrap().clone();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let sent_ts = col("sent_timestamp")
        .as_primitive::<TimestampMillisecondType>()
        .value(0);
    assert!(
        (now_ms - sent_ts).abs() < 60_000,
        "sent {sent_ts} vs now {now_ms}"
    );
    assert!(col("first_receive_timestamp").is_valid(0));
    assert_eq!(col("receive_count").as_primitive::<Int32Type>().value(0), 1);
    assert_eq!(col("batch").as_primitive::<Int64Type>().value(0), 4);
    assert_eq!(col("partition").as_primitive::<Int32Type>().value(0), 0);
    let attrs = col("message_attributes");
    let entries = attrs.as_map().value(0);
    let keys: Vec<_> = entries
        .column(0)
        .as_string::<i32>()
        .iter()
        .flatten()
        .collect();
    let values: Vec<_> = entries
        .column(1)
        .as_string::<i32>()
        .iter()
        .flatten()
        .collect();
    assert_eq!(keys, ["kind", "qty", "raw"]);
    assert_eq!(values, ["order", "3", "aGk="]);
}

#[tokio::test]
async fn the_embedded_demo_table_reads_and_commits() {
    let s = TestServer::in_memory("demo", 7, |_| {}).await;
    let mut flight = s.client().await;
    let cmd = json!({"table": "demo", "partitions": 1, "max_wait_ms": 100});
    let info = plan_on(&mut flight, &cmd).await.unwrap();
    let rows = read_on(&mut flight, &tickets(&info)[0]).await.unwrap();
    assert_eq!(bodies(&rows).len(), 7);
    let commit = json!({"table": "demo", "batch": 1});
    let out = action_on(&mut flight, "commit", &commit).await.unwrap();
    assert_eq!(out["deleted"], 7);
    tokio::time::timeout(Duration::from_secs(10), s.stop())
        .await
        .unwrap();
}
