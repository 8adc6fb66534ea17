//! Who may use the server: without AWS credentials every call that needs
//! SQS fails with FAILED_PRECONDITION naming the problem, and with an auth
//! token every RPC needs it.

use arrow_flight::FlightDescriptor;
use serde_json::json;
use sqs_flight_tests::moto;

use sqs_flight_tests::prelude::*;

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
    let mut f = Fixture::serve(no_creds, url, |_| {}, |_| {}).await;
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
        |_| {},
        |c| {
            c.auth_token = Some("s3cret".into());
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
