//! DoPut: rows become SQS messages; unsendable rows are refused by name.

use std::sync::Arc;

use arrow_array::builder::{MapBuilder, StringBuilder};
use arrow_array::{ArrayRef, Int32Array, RecordBatch, StringArray};
use arrow_flight::FlightDescriptor;
use arrow_flight::encode::FlightDataEncoderBuilder;
use futures::{TryStreamExt, stream};
use serde_json::json;
use sqs_flight_tests::moto;

use sqs_flight_tests::prelude::*;

fn bodies_batch(bodies: Vec<String>) -> RecordBatch {
    RecordBatch::try_from_iter([("body", Arc::new(StringArray::from(bodies)) as ArrayRef)]).unwrap()
}

#[tokio::test]
async fn ten_thousand_rows_arrive_as_ten_thousand_messages() {
    // moto's send walks the whole queue; rustack holds volume.
    let sqs = sqs_flight_tests::rustack::rustack().client().await;
    let url = moto::create_queue(&sqs, "volume", &[]).await;
    let mut f = Fixture::serve(sqs, url, |_| {}, |_| {}).await;
    let batches: Vec<_> = (0..10)
        .map(|b| bodies_batch((0..1000).map(|i| format!("row-{}", b * 1000 + i)).collect()))
        .collect();
    let sent = f.put(batches).await.unwrap();
    assert_eq!(sent, vec![1000; 10], "one PutResult per batch");
    assert_eq!(f.counts().await, (10_000, 0));
    // Read back through the server: every body exactly once.
    let mut read = Vec::new();
    for batch in 1..=20 {
        let info = f
            .plan(json!({"table": "t", "batch": batch, "partitions": 4,
                         "max_messages": 2500, "max_wait_ms": 500}))
            .await
            .unwrap();
        read.extend(bodies(&f.read_all(&info).await));
        f.commit("default", batch).await;
        if read.len() >= 10_000 {
            break;
        }
    }
    let expected: Vec<String> = (0..10_000).map(|i| format!("row-{i}")).collect();
    assert_eq!(sorted(read), sorted(expected));
    assert_eq!(f.counts().await, (0, 0));
}

#[tokio::test]
async fn bodies_and_attributes_arrive_as_sent() {
    let mut f = Fixture::standard(0).await;
    let n = 120;
    let mut attrs = MapBuilder::new(None, StringBuilder::new(), StringBuilder::new());
    for i in 0..n {
        attrs.keys().append_value("source");
        attrs.values().append_value("test");
        attrs.keys().append_value("n");
        attrs.values().append_value(i.to_string());
        attrs.append(true).unwrap();
    }
    let bodies: Vec<String> = (0..n)
        .map(|i| format!("{{\"i\":{i},\"text\":\"héllo ✓\"}}"))
        .collect();
    let batch = RecordBatch::try_from_iter([
        (
            "body",
            Arc::new(StringArray::from(bodies.clone())) as ArrayRef,
        ),
        ("delay_seconds", Arc::new(Int32Array::from(vec![0; n]))),
        ("message_attributes", Arc::new(attrs.finish())),
    ])
    .unwrap();
    assert_eq!(f.put(vec![batch]).await.unwrap(), vec![n as u64]);
    let info = f
        .plan(json!({"table": "t", "partitions": 1, "max_messages": 1000, "max_wait_ms": 500}))
        .await
        .unwrap();
    let rows = f.read_all(&info).await;
    assert_eq!(
        sorted(sqs_flight_tests::prelude::bodies(&rows)),
        sorted(bodies)
    );
    let attrs: Vec<_> = rows
        .iter()
        .flat_map(|b| {
            use arrow_array::Array;
            use arrow_array::cast::AsArray;
            let m = b
                .column_by_name("message_attributes")
                .unwrap()
                .as_map()
                .clone();
            (0..m.len())
                .map(|i| {
                    let e = m.value(i);
                    let k: Vec<_> = e
                        .column(0)
                        .as_string::<i32>()
                        .iter()
                        .flatten()
                        .map(String::from)
                        .collect();
                    let v: Vec<_> = e
                        .column(1)
                        .as_string::<i32>()
                        .iter()
                        .flatten()
                        .map(String::from)
                        .collect();
                    (k, v)
                })
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(attrs.len(), n);
    assert!(
        attrs
            .iter()
            .all(|(k, v)| k == &["n", "source"] && v[1] == "test")
    );
    assert_eq!(f.commit("default", 1).await["deleted"], n as u64);
}

#[tokio::test]
async fn unsendable_rows_are_refused_by_name_with_the_count_sent_before() {
    let mut f = Fixture::standard(0).await;
    let big = "x".repeat((1 << 20) + 1);
    let cases: Vec<(&str, String, &str)> = vec![
        ("oversized", big, "above the SQS limit"),
        ("nul", "bad\u{0}body".to_string(), "U+0000"),
        ("empty", String::new(), "body is empty"),
    ];
    let mut total = 0;
    for (name, bad, needle) in cases {
        let mut rows: Vec<String> = (0..25).map(|i| format!("{name}-{i}")).collect();
        rows[17] = bad;
        let err = f.put(vec![bodies_batch(rows)]).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{name}: {err}");
        assert!(err.message().contains("row 17"), "{name}: {err}");
        assert!(err.message().contains(needle), "{name}: {err}");
        assert!(
            err.message().contains("17 rows were sent before it"),
            "{name}: {err}"
        );
        total += 17;
        assert_eq!(f.counts().await, (total, 0), "{name}");
    }
}

#[tokio::test]
async fn bad_input_is_refused_before_anything_is_sent() {
    let mut f = Fixture::standard(0).await;
    let no_body =
        RecordBatch::try_from_iter([("text", Arc::new(StringArray::from(vec!["a"])) as ArrayRef)])
            .unwrap();
    let wrong_type =
        RecordBatch::try_from_iter([("body", Arc::new(Int32Array::from(vec![1])) as ArrayRef)])
            .unwrap();
    let extra = RecordBatch::try_from_iter([
        ("body", Arc::new(StringArray::from(vec!["a"])) as ArrayRef),
        (
            "colour",
            Arc::new(StringArray::from(vec!["red"])) as ArrayRef,
        ),
    ])
    .unwrap();
    for (batch, needle) in [
        (no_body, "`body`"),
        (wrong_type, "expected Utf8"),
        (extra, "`colour`"),
    ] {
        let err = f.put(vec![batch]).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");
        assert!(err.message().contains(needle), "{err}");
    }
    // Unknown table, and a CMD descriptor.
    let data = FlightDataEncoderBuilder::new()
        .with_flight_descriptor(Some(FlightDescriptor::new_path(vec!["nope".into()])))
        .build(stream::iter([Ok(bodies_batch(vec!["a".into()]))]));
    let err = status(
        bounded(async { f.flight.do_put(data).await?.try_collect::<Vec<_>>().await })
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code(), tonic::Code::NotFound, "{err}");
    let data = FlightDataEncoderBuilder::new()
        .with_flight_descriptor(Some(FlightDescriptor::new_cmd("{}")))
        .build(stream::iter([Ok(bodies_batch(vec!["a".into()]))]));
    let err = status(
        bounded(async { f.flight.do_put(data).await?.try_collect::<Vec<_>>().await })
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");
    assert_eq!(f.counts().await, (0, 0));
}

#[tokio::test]
async fn fifo_sends_keep_group_order_and_need_a_group_id() {
    let sqs = moto::moto().client().await;
    let url = moto::create_fifo_queue(&sqs, "putfifo", &[]).await;
    let mut f = Fixture::serve(sqs, url, |_| {}, |_| {}).await;
    let n = 30;
    let batch = RecordBatch::try_from_iter([
        (
            "body",
            Arc::new(StringArray::from(
                (0..n)
                    .map(|i| format!("g{}-{:02}", i % 3, i / 3))
                    .collect::<Vec<_>>(),
            )) as ArrayRef,
        ),
        (
            "message_group_id",
            Arc::new(StringArray::from(
                (0..n).map(|i| format!("g{}", i % 3)).collect::<Vec<_>>(),
            )),
        ),
        (
            "message_deduplication_id",
            Arc::new(StringArray::from(
                (0..n).map(|i| format!("d{i}")).collect::<Vec<_>>(),
            )),
        ),
    ])
    .unwrap();
    assert_eq!(f.put(vec![batch]).await.unwrap(), vec![n as u64]);
    let mut read = Vec::new();
    for batch in 1..=30 {
        let info = f
            .plan(json!({"table": "t", "batch": batch, "partitions": 1, "max_messages": 4, "max_wait_ms": 300}))
            .await
            .unwrap();
        read.extend(bodies(&f.read_all(&info).await));
        f.commit("default", batch).await;
        if read.len() == n {
            break;
        }
    }
    assert_eq!(read.len(), n);
    for g in 0..3 {
        let group: Vec<_> = read
            .iter()
            .filter(|b| b.starts_with(&format!("g{g}-")))
            .cloned()
            .collect();
        assert_eq!(group, sorted(group.clone()), "group g{g} out of order");
    }
    let no_group = bodies_batch(vec!["x".into()]);
    let err = f.put(vec![no_group]).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");
    assert!(
        err.message().contains("message_group_id is missing"),
        "{err}"
    );
}
