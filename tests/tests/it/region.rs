//! The AWS region of each table, with the real server binary on moto and
//! no region in the server's environment: a table takes the region its
//! Amazon SQS queue URL names, or its own `region`; a table with neither
//! fails with FAILED_PRECONDITION naming the fix (never UNAVAILABLE, which
//! clients retry); a `region` that conflicts with the URL is refused at
//! start.
//!
//! moto keeps one set of queues per region (it routes by the signature's
//! credential scope) and finds a queue by the last segment of its URL, so a
//! table may name a moto queue with an Amazon URL: the read only succeeds
//! if the server signed for the queue's region.

use std::process::{Command, Stdio};
use std::time::Duration;

use aws_sdk_sqs::config::Region;
use serde_json::json;
use sqs_flight_tests::moto::{self, moto};
use sqs_flight_tests::server_process::{ServerProcess, server_binary};

use sqs_flight_tests::prelude::{action_on, connect, plan_on, poll, read_on, tables_toml, tickets};

/// Credentials for moto, and nothing that names a region: no profile file,
/// no instance metadata lookup (which would leave loopback).
const ENV: [(&str, &str); 5] = [
    ("AWS_ACCESS_KEY_ID", "test"),
    ("AWS_SECRET_ACCESS_KEY", "test"),
    ("AWS_CONFIG_FILE", "/nonexistent/sqsf-aws-config"),
    (
        "AWS_SHARED_CREDENTIALS_FILE",
        "/nonexistent/sqsf-aws-credentials",
    ),
    ("AWS_EC2_METADATA_DISABLED", "true"),
];
/// Variables that would give the server a region.
const REGION_VARS: [&str; 3] = ["AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"];

/// A moto client signing for `region`.
async fn moto_in(region: &str) -> aws_sdk_sqs::Client {
    let base = moto().client().await;
    let config = base
        .config()
        .to_builder()
        .region(Region::new(region.to_string()))
        .build();
    aws_sdk_sqs::Client::from_conf(config)
}

/// The queue's name (the last segment of its URL).
fn name(queue_url: &str) -> &str {
    queue_url.rsplit('/').next().expect("a queue URL")
}

/// The server binary on moto with `config` and no region anywhere.
fn start_without_region(config: &str) -> ServerProcess {
    let args = [
        "--listen",
        "127.0.0.1:0",
        "--config",
        config,
        "--sqs-endpoint",
        &moto().endpoint,
    ];
    ServerProcess::start_with_env_unset(&args, &ENV, &REGION_VARS)
}

/// Plans batch 1 of consumer `c` on `table`, reads it and commits it; the
/// bodies read, or the first status refused.
async fn read_and_commit(url: &str, table: &str) -> Result<Vec<String>, tonic::Status> {
    let mut flight = connect(url).await;
    let cmd = json!({"table": table, "consumer": "c", "batch": 1, "partitions": 1,
        "receivers": 1, "max_wait_ms": 500});
    let info = plan_on(&mut flight, &cmd).await?;
    let mut bodies = Vec::new();
    for t in tickets(&info) {
        bodies.extend(sqs_flight_tests::prelude::bodies(
            &read_on(&mut flight, &t).await?,
        ));
    }
    let body = json!({"table": table, "consumer": "c", "batch": 1});
    action_on(&mut flight, "commit", &body).await?;
    bodies.sort();
    Ok(bodies)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_table_signs_for_the_region_of_its_url_or_its_own_setting() {
    let (eu, ap, us) = (
        moto_in("eu-west-1").await,
        moto_in("ap-south-1").await,
        moto().client().await,
    );
    let eu_url = moto::create_queue(&eu, "region-url", &[]).await;
    let ap_url = moto::create_queue(&ap, "region-set", &[]).await;
    moto::send_bodies(&eu, &eu_url, ["eu-1", "eu-2"].map(String::from)).await;
    moto::send_bodies(&ap, &ap_url, ["ap-1"].map(String::from)).await;
    // The queues exist in their own region only: signing for another one
    // (us-east-1, say) cannot find them.
    let elsewhere = us.get_queue_url().queue_name(name(&eu_url)).send().await;
    assert!(elsewhere.is_err(), "moto keeps queues per region");

    let aws_url = format!(
        "https://sqs.eu-west-1.amazonaws.com/{}/{}",
        moto::ACCOUNT,
        name(&eu_url)
    );
    let (_scratch, config) = tables_toml(&[
        ("by_url", format!("queue_url = \"{aws_url}\"\n")),
        (
            "by_setting",
            format!("queue_url = \"{ap_url}\"\nregion = \"ap-south-1\"\n"),
        ),
    ]);
    let server = start_without_region(&config);
    let by_url = read_and_commit(&server.url, "by_url").await;
    assert_eq!(
        by_url.expect("by_url reads"),
        ["eu-1", "eu-2"],
        "{}",
        server.log()
    );
    let by_setting = read_and_commit(&server.url, "by_setting").await;
    assert_eq!(by_setting.expect("by_setting reads"), ["ap-1"]);
    assert_eq!(moto::queue_counts(&eu, &eu_url).await, (0, 0), "committed");
    assert_eq!(moto::queue_counts(&ap, &ap_url).await, (0, 0), "committed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_without_a_region_is_failed_precondition_naming_the_fix() {
    let sqs = moto().client().await;
    let queue_url = moto::create_queue(&sqs, "region-none", &[]).await;
    moto::send_bodies(&sqs, &queue_url, ["m0".to_string()]).await;
    let (_scratch, config) = tables_toml(&[("t", format!("queue_url = \"{queue_url}\"\n"))]);
    let server = start_without_region(&config);
    let err = read_and_commit(&server.url, "t")
        .await
        .expect_err("no region to sign for");
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err}");
    for fix in ["AWS_REGION", "`region`", &queue_url] {
        assert!(err.message().contains(fix), "names {fix}: {err}");
    }
    // Nothing was received: the message is still visible.
    assert_eq!(moto::queue_counts(&sqs, &queue_url).await, (1, 0));
    // The server still serves.
    let mut flight = connect(&server.url).await;
    assert!(
        plan_on(&mut flight, &json!({"table": "nope", "consumer": "c"}))
            .await
            .is_err_and(|s| s.code() == tonic::Code::NotFound)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_that_conflicts_with_the_queue_url_is_refused_at_start() {
    let url = "https://sqs.eu-west-1.amazonaws.com/123456789012/orders";
    let (_scratch, config) = tables_toml(&[(
        "orders",
        format!("queue_url = \"{url}\"\nregion = \"us-east-1\"\n"),
    )]);
    let mut child = Command::new(server_binary())
        .args(["--listen", "127.0.0.1:0", "--config", &config])
        .envs(ENV)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the server");
    let exited = async || child.try_wait().expect("wait");
    let exited = poll(Duration::from_secs(60), exited, Option::is_some).await;
    let Ok(Some(status)) = exited else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("the server did not refuse its configuration within 60 s");
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("piped"), &mut stderr)
        .expect("read stderr");
    assert!(!status.success(), "{status}: {stderr}");
    for named in ["tables.orders.region", "us-east-1", "eu-west-1"] {
        assert!(stderr.contains(named), "names {named}: {stderr}");
    }
}
