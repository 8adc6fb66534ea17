//! `Client::send` (DoPut) against moto: counts, progress, read-back, and
//! the row and count of a refusal.

use std::time::Duration;

use arrow_array::RecordBatch;
use arrow_array::cast::AsArray;
use futures::stream;
use sqs_flight_client::send::{MessageRows, OutgoingMessage, batch_from_json_lines};
use sqs_flight_client::{Client, Error, PlanOptions, SendOutcome};
use tonic::Code;

use sqs_flight_tests::prelude::*;

fn batch(bodies: &[&str]) -> RecordBatch {
    let mut rows = MessageRows::new();
    for b in bodies {
        rows.push(&OutgoingMessage::body(*b));
    }
    rows.finish()
}

#[tokio::test]
async fn batches_arrive_as_messages_with_progress_per_batch() {
    let f = Fixture::standard(0).await;
    let client = bounded(Client::connect(f.server.url.clone()))
        .await
        .expect("connect the client");
    let lines: Vec<String> = (0..12)
        .map(|i| {
            format!(
                r#"{{"body": "json-{i}", "delay_seconds": 0, "message_attributes": {{"i": {i}}}}}"#
            )
        })
        .collect();
    let batches = vec![
        batch_from_json_lines(lines.iter().map(String::as_str)).unwrap(),
        batch(&["text-0", "text-1"]),
        batch(&["text-2"]),
    ];
    let mut seen = Vec::new();
    let outcome = bounded(client.send_with_progress("t", stream::iter(batches), |o| seen.push(o)))
        .await
        .unwrap();
    assert_eq!(
        outcome,
        SendOutcome {
            sent: 15,
            batches: 3
        }
    );
    let totals: Vec<u64> = seen.iter().map(|o| o.sent).collect();
    assert_eq!(totals, [12, 14, 15], "one report per acknowledged batch");
    assert_eq!(f.counts().await, (15, 0));

    let options = PlanOptions::consumer("check")
        .partitions(1)
        .max_messages(100)
        .max_wait(Duration::from_millis(300));
    let plan = bounded(client.plan("t", &options)).await.unwrap();
    let rows = bounded(client.read_batch(&plan)).await.unwrap();
    let mut expected: Vec<String> = (0..12).map(|i| format!("json-{i}")).collect();
    expected.extend((0..3).map(|i| format!("text-{i}")));
    assert_eq!(sorted(bodies(&rows)), sorted(expected));
    let attrs: Vec<(String, Vec<String>)> = rows
        .iter()
        .flat_map(|b| {
            let body = b.column_by_name("body").unwrap().as_string::<i32>().clone();
            let map = b
                .column_by_name("message_attributes")
                .unwrap()
                .as_map()
                .clone();
            (0..b.num_rows())
                .map(|i| {
                    let values = map.value(i).column(1).as_string::<i32>().clone();
                    let values = values.iter().flatten().map(str::to_string).collect();
                    (body.value(i).to_string(), values)
                })
                .collect::<Vec<_>>()
        })
        .collect();
    let json_5 = attrs.iter().find(|(b, _)| b == "json-5").unwrap();
    assert_eq!(json_5.1, ["5"], "a number attribute arrives as its text");
    let text_0 = attrs.iter().find(|(b, _)| b == "text-0").unwrap();
    assert!(text_0.1.is_empty());
    bounded(client.commit("t", "check", plan.batch))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_refused_row_stops_the_send_with_its_row_and_the_count_sent() {
    let f = Fixture::standard(0).await;
    let client = bounded(Client::connect(f.server.url.clone()))
        .await
        .expect("connect the client");
    let batches = vec![
        batch(&["a0", "a1", "a2", "a3", "a4"]),
        batch(&["b0", "b1", "b2", "", "b4", "b5"]),
        batch(&["c0"]),
    ];
    let e = bounded(client.send("t", stream::iter(batches)))
        .await
        .unwrap_err();
    assert_eq!(e.error.code(), Some(Code::InvalidArgument), "{e:?}");
    assert_eq!(e.row, Some(8), "rows count from 0 across batches: {e}");
    assert_eq!((e.sent, e.exact), (8, true), "{e}");
    assert!(e.to_string().contains("body is empty"), "{e}");
    assert!(!e.error.is_retryable());
    assert_eq!(f.counts().await, (8, 0), "the rows before it, and no more");
    let plain: Error = e.into();
    assert!(
        plain.to_string().contains("8 rows were sent before it"),
        "{plain}"
    );
}

#[tokio::test]
async fn nothing_to_send_makes_no_call_and_unknown_tables_are_not_found() {
    let f = Fixture::standard(0).await;
    let client = bounded(Client::connect(f.server.url.clone()))
        .await
        .expect("connect the client");
    let outcome = bounded(client.send("nope", stream::empty())).await.unwrap();
    assert_eq!(outcome, SendOutcome::default(), "no DoPut for no data");
    let e = bounded(client.send("nope", stream::iter([batch(&["x"])])))
        .await
        .unwrap_err();
    assert!(matches!(e.error, Error::NotFound { .. }), "{e:?}");
    assert_eq!((e.sent, e.row), (0, None));
    assert_eq!(f.counts().await, (0, 0));
}
