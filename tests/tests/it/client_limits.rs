//! Per-client limits against a running server (embedded queue backend):
//! concurrent streams per client address, request size, rows and bytes per
//! DoPut call, plan parameter limits set by flag, and name checks. Each
//! refusal names its limit, and the server goes on serving.

use std::sync::Arc;
use std::time::Duration;

use arrow_array::{ArrayRef, RecordBatch, StringArray};
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::{FlightClient, FlightDescriptor, Ticket};
use clap::Parser;
use futures::{TryStreamExt, stream};
use serde_json::{Value, json};
use sqs_flight_server::config::{Cli, Config};
use sqs_flight_tests::server::TestServer;

use sqs_flight_tests::prelude::{action_on, bounded, plan_on, poll, status, tickets};

async fn plan(flight: &mut FlightClient, cmd: Value) -> Result<Vec<Ticket>, tonic::Status> {
    Ok(tickets(&plan_on(flight, &cmd).await?))
}

async fn action(flight: &mut FlightClient, kind: &str, body: Value) -> Value {
    action_on(flight, kind, &body).await.expect("action")
}

async fn depth(flight: &mut FlightClient) -> u64 {
    let s = action(flight, "status", json!({"table": "q"})).await;
    s["tables"]["q"]["approximate_depth"].as_u64().unwrap()
}

fn bodies(rows: std::ops::Range<usize>, width: usize) -> RecordBatch {
    let b: Vec<String> = rows.map(|i| format!("{i:0width$}")).collect();
    RecordBatch::try_from_iter([("body", Arc::new(StringArray::from(b)) as ArrayRef)]).unwrap()
}

/// DoPut of `batches` to `q`: the `sent` of each PutResult, or the status
/// that ended the call.
async fn put(
    flight: &mut FlightClient,
    batches: Vec<RecordBatch>,
) -> (Vec<u64>, Option<tonic::Status>) {
    let data = FlightDataEncoderBuilder::new()
        .with_flight_descriptor(Some(FlightDescriptor::new_path(vec!["q".into()])))
        .build(stream::iter(batches.into_iter().map(Ok)));
    bounded(async {
        let mut results = match flight.do_put(data).await {
            Ok(r) => r,
            Err(e) => return (Vec::new(), Some(status(e))),
        };
        let mut sent = Vec::new();
        loop {
            match results.try_next().await {
                Ok(Some(r)) => {
                    let v: Value = serde_json::from_slice(&r.app_metadata).unwrap();
                    sent.push(v["sent"].as_u64().unwrap());
                }
                Ok(None) => return (sent, None),
                Err(e) => return (sent, Some(status(e))),
            }
        }
    })
    .await
}

#[tokio::test]
async fn streams_per_client_are_limited_and_freed_when_a_stream_ends() {
    let s = TestServer::in_memory("q", 0, |c| c.max_streams_per_client = 2).await;
    let mut flight = s.client().await;
    // An empty queue: each partition's stream stays open waiting for messages.
    let tickets = plan(
        &mut flight,
        json!({"table": "q", "partitions": 3, "max_wait_ms": 20000}),
    )
    .await
    .unwrap();
    let first = bounded(flight.do_get(tickets[0].clone())).await.unwrap();
    let mut other = s.client().await; // another connection, same address
    let second = bounded(other.do_get(tickets[1].clone())).await.unwrap();

    let err = match bounded(flight.do_get(tickets[2].clone())).await {
        Ok(_) => panic!("a third stream is refused"),
        Err(e) => status(e),
    };
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err}");
    assert!(
        err.message().contains("max_streams_per_client")
            && err.message().contains("limit per client is 2"),
        "{err}"
    );
    let (_, put_err) = put(&mut flight, vec![bodies(0..1, 1)]).await;
    let put_err = put_err.expect("a DoPut is a stream too");
    assert_eq!(put_err.code(), tonic::Code::ResourceExhausted, "{put_err}");
    assert_eq!(
        depth(&mut flight).await,
        0,
        "the refused DoPut sent nothing"
    );
    // Calls that are not streams still go through.
    plan(&mut flight, json!({"table": "q", "consumer": "other"}))
        .await
        .expect("GetFlightInfo at the stream limit");

    // The client hangs up on one stream: its slot frees up.
    drop(first);
    let third = poll(
        Duration::from_secs(5),
        async || {
            let got = bounded(flight.do_get(tickets[2].clone())).await;
            let got = got.map_err(status);
            if let Err(e) = &got {
                assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e}");
            }
            got.ok()
        },
        Option::is_some,
    )
    .await;
    assert!(
        third.is_ok(),
        "the slot of the dropped stream was not freed"
    );
    drop((second, third));
    tokio::time::timeout(Duration::from_secs(15), s.stop())
        .await
        .unwrap();
}

#[tokio::test]
async fn requests_above_max_request_bytes_are_refused_naming_the_limit() {
    let s = TestServer::in_memory("q", 0, |c| c.max_request_bytes = 16 << 10).await;
    let mut flight = s.client().await;
    // A unary request: refused by the gRPC layer, which names the size.
    let big = json!({"table": "q", "consumer": "c".repeat(20 << 10)}).to_string();
    let err = status(
        bounded(flight.get_flight_info(FlightDescriptor::new_cmd(big)))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code(), tonic::Code::OutOfRange, "{err}");
    assert!(err.message().contains("16384"), "{err}");
    // A DoPut record batch above the limit: nothing sent, the limit named.
    let (sent, err) = put(&mut flight, vec![bodies(0..2, 10), bodies(2..100, 1000)]).await;
    let err = err.expect("the large batch is refused");
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err}");
    assert!(err.message().contains("max_request_bytes"), "{err}");
    assert_eq!(sent, vec![2], "the batch before it went through");
    assert_eq!(depth(&mut flight).await, 2);
    // Requests within the limit still work, on the same connection.
    let (sent, err) = put(&mut flight, vec![bodies(0..5, 10)]).await;
    assert!(err.is_none(), "{err:?}");
    assert_eq!(sent, vec![5]);
    s.stop().await;
}

#[tokio::test]
async fn rows_and_bytes_per_doput_call_are_limited() {
    let s = TestServer::in_memory("q", 0, |c| {
        c.max_put_rows = 5;
        c.max_put_bytes = 100;
    })
    .await;
    let mut flight = s.client().await;
    let (sent, err) = put(&mut flight, vec![bodies(0..3, 4), bodies(3..6, 4)]).await;
    let err = err.expect("the second batch crosses max_put_rows");
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err}");
    assert!(
        err.message().contains("max_put_rows") && err.message().contains("3 rows were sent"),
        "{err}"
    );
    assert_eq!(sent, vec![3]);
    assert_eq!(
        depth(&mut flight).await,
        3,
        "nothing of the refused batch was sent"
    );

    // 2 rows of 30 bytes, then 2 more: 120 bytes > 100 (and 4 rows <= 5).
    let (sent, err) = put(&mut flight, vec![bodies(0..2, 30), bodies(2..4, 30)]).await;
    let err = err.expect("the second batch crosses max_put_bytes");
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err}");
    assert!(err.message().contains("max_put_bytes"), "{err}");
    assert_eq!(sent, vec![2]);
    assert_eq!(depth(&mut flight).await, 5);
    // A new call starts counting again.
    let (sent, err) = put(&mut flight, vec![bodies(0..5, 4)]).await;
    assert!(err.is_none(), "{err:?}");
    assert_eq!(sent, vec![5]);
    s.stop().await;
}

#[tokio::test]
async fn plan_limits_set_by_flag_are_enforced() {
    let cli = Cli::try_parse_from([
        "sqs-flight-server",
        "--limit-partitions",
        "3",
        "--limit-max-messages",
        "2000",
        "--table",
        "q=http://unused",
    ])
    .unwrap();
    let from_flags = Config::try_from(cli).unwrap();
    let s = TestServer::in_memory("q", 0, |c| c.limits = from_flags.limits).await;
    let mut flight = s.client().await;
    for (cmd, needle) in [
        (json!({"table": "q", "partitions": 4}), "`partitions`"),
        (
            json!({"table": "q", "max_messages": 2001}),
            "`max_messages`",
        ),
    ] {
        let err = plan(&mut flight, cmd.clone()).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{cmd}: {err}");
        assert!(err.message().contains(needle), "{cmd}: {err}");
    }
    let tickets = plan(
        &mut flight,
        json!({"table": "q", "partitions": 3, "max_messages": 2000}),
    )
    .await
    .unwrap();
    assert_eq!(tickets.len(), 3);
    s.stop().await;
}

#[tokio::test]
async fn names_are_bounded_and_free_of_control_characters() {
    let s = TestServer::in_memory("q", 0, |_| {}).await;
    let mut flight = s.client().await;
    for (cmd, needle) in [
        (
            json!({"table": "q", "consumer": "c".repeat(257)}),
            "`consumer`",
        ),
        (json!({"table": "q", "consumer": "a\u{7}b"}), "`consumer`"),
        (json!({"table": "q\n"}), "`table`"),
    ] {
        let err = plan(&mut flight, cmd.clone()).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{cmd}: {err}");
        assert!(err.message().contains(needle), "{cmd}: {err}");
    }
    // The longest name is fine, and so is any printable character.
    for consumer in ["c".repeat(256), "spark-q: run/1 é".to_string()] {
        plan(&mut flight, json!({"table": "q", "consumer": consumer}))
            .await
            .unwrap();
    }
    let status = action(&mut flight, "status", json!({})).await;
    assert_eq!(
        status["tables"]["q"]["consumers"]
            .as_object()
            .unwrap()
            .len(),
        2,
        "only the accepted consumers were planned: {status}"
    );
    s.stop().await;
}
