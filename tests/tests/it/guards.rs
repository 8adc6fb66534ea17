//! The server's guards: registry budget, hang-ups, credentials, auth token.

use std::time::Duration;

use arrow_flight::FlightDescriptor;
use futures::StreamExt;
use serde_json::json;
use sqs_flight_tests::http::{get, metric};
use sqs_flight_tests::moto;

use sqs_flight_tests::prelude::*;

#[tokio::test]
async fn past_the_registry_budget_a_read_is_refused_with_resource_exhausted() {
    let sqs = moto::moto().client().await;
    let url = moto::create_queue(&sqs, "budget", &[]).await;
    moto::send_bodies(&sqs, &url, (0..12).map(|i| format!("m{i}"))).await;
    let mut f = Fixture::serve(
        sqs,
        url,
        |t| t,
        |mut c| {
            c.registry_max_messages = 5;
            c
        },
    )
    .await;
    let cmd = |batch: u64| json!({"table": "t", "batch": batch, "partitions": 1, "max_messages": 5, "max_wait_ms": 300});
    let first = f.plan(cmd(1)).await.unwrap();
    assert_eq!(bodies(&f.read_all(&first).await).len(), 5);
    let second = f.plan(cmd(2)).await.unwrap();
    let ticket = tickets(&second)[0].clone();
    let err = f.read(&ticket).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err}");
    assert!(err.message().contains("commit or release"), "{err}");
    assert_eq!(f.counts().await, (7, 5), "nothing more was received");
    // Committing frees the budget; a fresh plan reads again.
    f.commit("default", 1).await;
    let third = f.plan(cmd(3)).await.unwrap();
    assert_eq!(bodies(&f.read_all(&third).await).len(), 5);
}

#[tokio::test]
async fn a_client_that_hangs_up_stops_the_receive_loop() {
    let (mut f, ops) = Fixture::metered(0, "hang-up", |_| {}).await;
    let info = f
        .plan(json!({"table": "t", "partitions": 1, "max_wait_ms": 5000}))
        .await
        .unwrap();
    let ticket = tickets(&info)[0].clone();
    let mut reader = f.server.client().await;
    bounded(async {
        let mut stream = reader.do_get(ticket.clone()).await.unwrap();
        // The schema arrives first; the receive loop is now long-polling.
        let wait = tokio::time::timeout(Duration::from_millis(500), stream.next()).await;
        assert!(wait.is_err(), "no rows from an empty queue");
        drop(stream);
    })
    .await;
    // The server sees the reset when it drops the stream (and with it the
    // receive loop): only then may a message arrive.
    let open = poll(
        STEP,
        async || metric(&get(ops, "/metrics").await.1, "sqsf_doget_streams_open"),
        |&open| open == Some(0.0),
    )
    .await;
    assert_eq!(open, Ok(Some(0.0)), "the server dropped the stream");
    moto::send_bodies(&f.sqs, &f.queue_url, ["late".to_string()]).await;
    // The receive call in flight at the hang-up is left to finish (its long
    // poll runs 5 s), and hands back what it brings. Had the loop kept
    // polling it would have recorded "late": once no call is in flight,
    // the registry holds nothing for the consumer.
    let consumer = poll(
        STEP,
        async || consumer_status(&mut f).await,
        |c| c["receives_in_flight"] == json!(0),
    )
    .await
    .expect("the receive in flight at the hang-up ended");
    assert_eq!(
        consumer["in_flight"],
        json!(0),
        "nothing recorded after the hang-up: {consumer}"
    );
    // The read recorded nothing, so the ticket is still fresh: the next
    // read receives. ("late" itself may be held by moto's abandoned long
    // poll until its visibility timeout, so a new message is sent.)
    moto::send_bodies(&f.sqs, &f.queue_url, ["later".to_string()]).await;
    let next = f.read(&ticket).await.unwrap();
    assert!(
        bodies(&next).contains(&"later".to_string()),
        "{:?}",
        bodies(&next)
    );
}

#[tokio::test]
async fn missing_aws_credentials_fail_with_failed_precondition_naming_the_problem() {
    let m = moto::moto();
    let admin = m.client().await;
    let url = moto::create_queue(&admin, "creds", &[]).await;
    moto::send_bodies(&admin, &url, ["kept".to_string()]).await;
    let no_creds = aws_sdk_sqs::Client::from_conf(
        aws_sdk_sqs::Config::builder()
            .behavior_version(aws_sdk_sqs::config::BehaviorVersion::latest())
            .region(aws_sdk_sqs::config::Region::new("us-east-1"))
            .endpoint_url(&m.endpoint)
            .build(),
    );
    let mut f = Fixture::serve(no_creds, url, |t| t, |c| c).await;
    let info = f
        .plan(json!({"table": "t", "partitions": 1, "max_wait_ms": 300}))
        .await
        .unwrap();
    let err = f.read(&tickets(&info)[0]).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err}");
    assert!(
        err.message().to_lowercase().contains("credentials"),
        "{err}"
    );
    let err = f.action("status", json!({"table": "t"})).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err}");
    // Every table's status answers, and says why the counts are missing.
    let all = f.action("status", json!({})).await.unwrap();
    let why = all["tables"]["t"]["error"].as_str().unwrap_or_default();
    assert!(why.contains("credentials"), "{all}");
    assert_eq!(moto::queue_counts(&admin, &f.queue_url).await, (1, 0));
}

#[tokio::test]
async fn with_an_auth_token_every_rpc_needs_it() {
    let sqs = moto::moto().client().await;
    let url = moto::create_queue(&sqs, "auth", &[]).await;
    let mut f = Fixture::serve(
        sqs,
        url,
        |t| t,
        |mut c| {
            c.auth_token = Some("s3cret".into());
            c
        },
    )
    .await;
    let path = FlightDescriptor::new_path(vec!["t".into()]);
    let err = status(
        bounded(f.flight.get_flight_info(path.clone()))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err}");
    f.flight
        .add_header("authorization", "Bearer wrong")
        .unwrap();
    let err = status(
        bounded(f.flight.get_schema(path.clone()))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err}");
    f.flight
        .add_header("authorization", "Bearer s3cret")
        .unwrap();
    let info = bounded(f.flight.get_flight_info(path)).await.unwrap();
    assert_eq!(metadata(&info)["batch"], 1);
}

/// The default consumer of table `t` in `status`.
async fn consumer_status(f: &mut Fixture) -> serde_json::Value {
    let status = f.action("status", json!({"table": "t"})).await.unwrap();
    status["tables"]["t"]["consumers"]["default"].clone()
}
