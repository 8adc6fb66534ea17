//! Typed payloads: JSON bodies decoded into `payload` on the server; bad
//! bodies keep their row with a `payload_error`.

use arrow_array::Array;
use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int64Type};
use arrow_flight::FlightDescriptor;
use serde_json::json;
use sqs_flight_schemas::payload::{PayloadSpec, Unwrap};
use sqs_flight_tests::moto;

use sqs_flight_tests::prelude::*;

fn spec(unwrap: Unwrap) -> PayloadSpec {
    serde_json::from_value(json!({
        "unwrap": unwrap,
        "fields": [
            {"name": "user", "type": "utf8"},
            {"name": "amount", "type": "float64"},
            {"name": "items", "type": "list", "item": {"type": "struct", "fields": [
                {"name": "sku", "type": "utf8"}, {"name": "qty", "type": "int64"}]}}
        ]
    }))
    .unwrap()
}

async fn fixture(bodies: Vec<String>, unwrap: Unwrap) -> Fixture {
    let sqs = moto::moto().client().await;
    let url = moto::create_queue(&sqs, "payload", &[]).await;
    moto::send_bodies(&sqs, &url, bodies).await;
    Fixture::serve(
        sqs,
        url,
        |t| {
            t.payload = Some(spec(unwrap));
        },
        |_| {},
    )
    .await
}

#[tokio::test]
async fn json_bodies_become_typed_columns_and_bad_ones_keep_their_row() {
    let bodies = vec![
        r#"{"user":"ann","amount":12.5,"items":[{"sku":"a","qty":2}],"ignored":1}"#.to_string(),
        "this is not json".to_string(),
        r#"{"user":"bob","amount":"lots"}"#.to_string(),
        r#"{"user":"cy"}"#.to_string(),
    ];
    let mut f = fixture(bodies.clone(), Unwrap::None).await;
    let schema = bounded(
        f.flight
            .get_schema(FlightDescriptor::new_path(vec!["t".into()])),
    )
    .await
    .unwrap();
    assert!(schema.field_with_name("payload").is_ok());
    assert!(schema.field_with_name("payload_error").is_ok());

    let info = f
        .plan(json!({"table": "t", "partitions": 1, "max_wait_ms": 300}))
        .await
        .unwrap();
    let rows = f.read_all(&info).await;
    let mut seen = Vec::new();
    for b in &rows {
        let payload = b.column_by_name("payload").unwrap().as_struct();
        let users = payload.column_by_name("user").unwrap().as_string::<i32>();
        let amounts = payload
            .column_by_name("amount")
            .unwrap()
            .as_primitive::<Float64Type>();
        let items = payload.column_by_name("items").unwrap().as_list::<i32>();
        let errors = b
            .column_by_name("payload_error")
            .unwrap()
            .as_string::<i32>();
        let body = b.column_by_name("body").unwrap().as_string::<i32>();
        for i in 0..b.num_rows() {
            let row = match body.value(i) {
                b if b.starts_with(r#"{"user":"ann""#) => {
                    assert!(errors.is_null(i));
                    assert_eq!(users.value(i), "ann");
                    assert_eq!(amounts.value(i), 12.5);
                    let item = items.value(i);
                    let qty = item.as_struct().column_by_name("qty").unwrap();
                    assert_eq!(qty.as_primitive::<Int64Type>().value(0), 2);
                    "ann"
                }
                "this is not json" => {
                    assert!(payload.is_null(i));
                    assert!(
                        errors.value(i).contains("not a JSON object"),
                        "{}",
                        errors.value(i)
                    );
                    "malformed"
                }
                b if b.contains("lots") => {
                    assert!(payload.is_null(i));
                    assert!(errors.value(i).contains("amount"), "{}", errors.value(i));
                    "wrong type"
                }
                _ => {
                    assert!(errors.is_null(i));
                    assert_eq!(users.value(i), "cy");
                    assert!(amounts.is_null(i), "a missing field is null");
                    "missing"
                }
            };
            seen.push(row);
        }
    }
    seen.sort();
    assert_eq!(seen, ["ann", "malformed", "missing", "wrong type"]);
    let out = f.commit("default", 1).await;
    assert_eq!(
        out["deleted"], 4,
        "bad rows are deleted at commit like the others"
    );
    assert_eq!(f.counts().await, (0, 0));
}

#[tokio::test]
async fn sns_envelopes_are_unwrapped_before_decoding() {
    let envelope = |msg: &str| {
        json!({"Type": "Notification", "MessageId": "x", "TopicArn": "arn:aws:sns:us-east-1:1:t",
               "Message": msg})
        .to_string()
    };
    let bodies = vec![
        envelope(r#"{"user":"sns-user","amount":1.0}"#),
        r#"{"user":"raw"}"#.to_string(),
    ];
    let mut f = fixture(bodies, Unwrap::Sns).await;
    let info = f
        .plan(json!({"table": "t", "partitions": 1, "max_wait_ms": 300}))
        .await
        .unwrap();
    let rows = f.read_all(&info).await;
    let users: Vec<_> = rows
        .iter()
        .flat_map(|b| {
            let p = b.column_by_name("payload").unwrap().as_struct();
            let u = p.column_by_name("user").unwrap().as_string::<i32>().clone();
            let e = b
                .column_by_name("payload_error")
                .unwrap()
                .as_string::<i32>()
                .clone();
            (0..b.num_rows())
                .map(|i| {
                    (
                        u.is_valid(i).then(|| u.value(i).to_string()),
                        e.is_valid(i).then(|| e.value(i).to_string()),
                    )
                })
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        users.contains(&(Some("sns-user".into()), None)),
        "{users:?}"
    );
    assert!(
        users
            .iter()
            .any(|(u, e)| u.is_none() && e.as_deref().is_some_and(|e| e.contains("SNS envelope"))),
        "{users:?}"
    );
}
