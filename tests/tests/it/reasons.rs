//! Every refusal says why in the `sqsf-reason` trailer (docs/protocol.md,
//! "Error reasons"), whatever its message says, and the Rust client reads
//! it as a [`Reason`].

use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch, StringArray};
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::{FlightClient, FlightDescriptor};
use futures::{TryStreamExt, stream};
use serde_json::{Value, json};
use sqs_flight_client::{Client, PlanOptions, Reason};
use sqs_flight_tests::moto::{self, moto};
use sqs_flight_tests::server::TestServer;

use sqs_flight_tests::prelude::*;

async fn refused_plan(flight: &mut FlightClient, cmd: Value) -> tonic::Status {
    plan_on(flight, &cmd).await.expect_err("refused")
}

#[tokio::test]
async fn refusals_of_the_flight_surface_carry_their_reason() {
    let s = TestServer::in_memory("q", 4, |c| c.max_put_rows = 2).await;
    let mut flight = s.client().await;
    use tonic::Code::{FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted};

    let d = FlightDescriptor::new_path(vec!["nope".into()]);
    let e = status(bounded(flight.get_schema(d)).await.unwrap_err());
    assert_eq!((e.code(), reason(&e)), (NotFound, Some("unknown_table")));

    let cases = [
        (
            json!({"table": "q", "max_bytes": 1u64 << 40}),
            "limit:max_bytes",
        ),
        (json!({"table": "q", "partitions": 65}), "limit:partitions"),
        (
            json!({"table": "q", "partitions": 0}),
            "invalid_argument:partitions",
        ),
        (json!({"table": "q", "bogus": 1}), "invalid_argument"),
    ];
    for (cmd, want) in cases {
        let e = refused_plan(&mut flight, cmd.clone()).await;
        assert_eq!(
            (e.code(), reason(&e)),
            (InvalidArgument, Some(want)),
            "{cmd}"
        );
    }

    let first = json!({"table": "q", "consumer": "c", "batch": 1});
    let info = plan_on(&mut flight, &first).await.unwrap();
    let rows = read_on(&mut flight, &tickets(&info)[0]).await.unwrap();
    assert!(rows.iter().map(|b| b.num_rows()).sum::<usize>() > 0);
    let commit = json!({"table": "q", "consumer": "c", "batch": 1});
    action_on(&mut flight, "commit", &commit).await.unwrap();
    let e = refused_plan(&mut flight, first).await;
    assert_eq!(
        (e.code(), reason(&e)),
        (FailedPrecondition, Some("committed"))
    );

    let second = json!({"table": "q", "consumer": "c", "batch": 2});
    let info = plan_on(&mut flight, &second).await.unwrap();
    let release = json!({"table": "q", "consumer": "c"});
    action_on(&mut flight, "release", &release).await.unwrap();
    let e = read_on(&mut flight, &tickets(&info)[0]).await.unwrap_err();
    assert_eq!(
        (e.code(), reason(&e)),
        (FailedPrecondition, Some("not_planned"))
    );

    let e = action_on(&mut flight, "bogus", &json!({}))
        .await
        .unwrap_err();
    assert_eq!(
        (e.code(), reason(&e)),
        (InvalidArgument, Some("invalid_argument"))
    );

    // Refused after the stream started: the reason is in the trailers.
    let body: Vec<String> = (0..3).map(|i| format!("m{i}")).collect();
    let batch =
        RecordBatch::try_from_iter([("body", Arc::new(StringArray::from(body)) as ArrayRef)])
            .unwrap();
    let data = FlightDataEncoderBuilder::new()
        .with_flight_descriptor(Some(FlightDescriptor::new_path(vec!["q".into()])))
        .build(stream::iter([Ok(batch)]));
    let e = bounded(async {
        let results = flight.do_put(data).await.map_err(status)?;
        results.try_collect::<Vec<_>>().await.map_err(status)
    })
    .await
    .unwrap_err();
    assert_eq!(
        (e.code(), reason(&e)),
        (ResourceExhausted, Some("limit:max_put_rows"))
    );
    s.stop().await;
}

#[tokio::test]
async fn a_missing_token_is_unauthenticated() {
    let s = TestServer::in_memory("q", 4, |c| c.auth_token = Some("s3cret".into())).await;
    let mut flight = s.client().await;
    let d = FlightDescriptor::new_path(vec!["q".into()]);
    let e = status(bounded(flight.get_schema(d)).await.unwrap_err());
    assert_eq!(
        (e.code(), reason(&e)),
        (tonic::Code::Unauthenticated, Some("unauthenticated"))
    );
    s.stop().await;
}

#[tokio::test]
async fn the_rust_client_reads_the_reason() {
    let s = TestServer::in_memory("q", 4, |_| {}).await;
    let client = Client::connect(s.url.clone()).await.unwrap();
    let e = client.schema("nope").await.unwrap_err();
    assert_eq!(e.reason(), Some(&Reason::UnknownTable), "{e}");
    let options = PlanOptions {
        max_bytes: Some(1 << 40),
        ..PlanOptions::default()
    };
    let e = client.plan("q", &options).await.unwrap_err();
    assert_eq!(e.reason(), Some(&Reason::Limit("max_bytes".into())), "{e}");
    s.stop().await;
}

#[tokio::test]
async fn a_queue_that_does_not_exist_is_queue_not_found() {
    let sqs = moto().client().await;
    let real = moto::create_queue(&sqs, "sqsf", &[]).await;
    let missing = format!("{real}-missing");
    let mut f = Fixture::serve(sqs, missing, |_| {}, |_| {}).await;
    let e = f.action("status", json!({"table": "t"})).await.unwrap_err();
    assert_eq!(
        (e.code(), reason(&e)),
        (tonic::Code::FailedPrecondition, Some("queue_not_found")),
        "{e}"
    );
    f.server.stop().await;
}
