//! What an operator observes: metrics that move by the right amounts,
//! health and readiness, logs that never carry a receipt handle, and a
//! status that shows message age and survives a deleted queue.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use serde_json::{Value, json};
use sqs_flight_server::sqs::{Received, SqsError};
use sqs_flight_tests::moto;
use sqs_flight_tests::server::{self, TestServer};

use sqs_flight_tests::http::{get, metric};
use sqs_flight_tests::prelude::*;

#[tokio::test]
async fn metrics_move_by_the_right_amounts_after_a_read_and_a_commit() {
    let sqs = moto::moto().client().await;
    let url = moto::queue_holding(&sqs, "metrics", 6).await;
    let (mut f, ops) = Fixture::serve_with_metrics(sqs, url).await;
    let info = f
        .plan(json!({"table": "t", "consumer": "q", "partitions": 1, "max_wait_ms": 300}))
        .await
        .unwrap();
    let ticket = tickets(&info)[0].clone();
    assert_eq!(bodies(&f.read(&ticket).await.unwrap()).len(), 6);
    let (_, before) = get(ops, "/metrics").await;
    let tc = r#"{table="t",consumer="q"}"#;
    assert_eq!(
        metric(&before, &format!("sqsf_messages_received_total{tc}")),
        Some(6.0),
        "{before}"
    );
    assert_eq!(
        metric(&before, "sqsf_registry_messages"),
        Some(6.0),
        "{before}"
    );
    assert_eq!(
        metric(&before, &format!("sqsf_open_batches{tc}")),
        Some(1.0),
        "{before}"
    );
    f.read(&ticket).await.unwrap();
    assert_eq!(f.commit("q", 1).await["deleted"], 6);
    let (status, after) = get(ops, "/metrics").await;
    assert_eq!(status, 200);
    assert_eq!(
        metric(&after, &format!("sqsf_messages_replayed_total{tc}")),
        Some(6.0),
        "{after}"
    );
    assert_eq!(
        metric(&after, &format!("sqsf_messages_deleted_total{tc}")),
        Some(6.0),
        "{after}"
    );
    assert_eq!(
        metric(&after, &format!("sqsf_messages_expired_total{tc}")),
        None,
        "{after}"
    );
    assert_eq!(
        metric(&after, &format!("sqsf_committed_batch{tc}")),
        Some(1.0),
        "{after}"
    );
    assert_eq!(
        metric(&after, "sqsf_registry_messages"),
        Some(0.0),
        "{after}"
    );
    let deletes = r#"sqsf_sqs_call_seconds_count{table="t",operation="DeleteMessageBatch"}"#;
    assert_eq!(metric(&after, deletes), Some(1.0), "{after}");
}

#[tokio::test]
async fn readyz_and_grpc_health_follow_the_sqs_endpoint() {
    // Up: moto answers.
    let sqs = moto::moto().client().await;
    let url = moto::create_queue(&sqs, "ready", &[]).await;
    let (f, ops) = Fixture::serve_with_metrics(sqs, url.clone()).await;
    assert_eq!(get(ops, "/healthz").await.0, 200);
    assert_eq!(get(ops, "/readyz").await, (200, "ready\n".to_string()));
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", f.server.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    for service in ["", "arrow.flight.protocol.FlightService"] {
        let req = tonic_health::pb::HealthCheckRequest {
            service: service.into(),
        };
        let status = bounded(health.check(req))
            .await
            .unwrap()
            .into_inner()
            .status;
        assert_eq!(
            status,
            tonic_health::pb::health_check_response::ServingStatus::Serving as i32
        );
    }
    // Down: nothing listens at the SQS endpoint.
    let dead = moto::sqs_client(&format!("http://{}", free_addr())).await;
    let ops_down = free_addr();
    let mut config = server::config(vec![server::sqs_table("t", &url)]);
    config.metrics_listen = Some(ops_down);
    let down = TestServer::start(config, dead).await;
    let (status, body) = get(ops_down, "/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("table t"), "{body}");
    assert_eq!(
        get(ops_down, "/healthz").await.0,
        200,
        "alive while not ready"
    );
    // gRPC health: the Flight service turns NOT_SERVING (its first check
    // runs at start and gives up after the readiness timeout); the process
    // itself stays SERVING.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", down.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let check = |service: &str| tonic_health::pb::HealthCheckRequest {
        service: service.into(),
    };
    use tonic_health::pb::health_check_response::ServingStatus;
    let flight = async || {
        let req = check("arrow.flight.protocol.FlightService");
        let answer = bounded(health.check(req)).await.unwrap();
        answer.into_inner().status
    };
    let not_serving = ServingStatus::NotServing as i32;
    let status = poll(Duration::from_secs(30), flight, |s| *s == not_serving).await;
    assert_eq!(
        status,
        Ok(not_serving),
        "the Flight service turns NOT_SERVING"
    );
    let overall = bounded(health.check(check("")))
        .await
        .unwrap()
        .into_inner()
        .status;
    assert_eq!(
        overall,
        ServingStatus::Serving as i32,
        "the process is alive"
    );
}

/// Remembers every receipt handle a queue received.
#[derive(Default)]
struct Recording {
    seen: Mutex<Vec<String>>,
}

impl ReceiveWatch for Recording {
    fn after(&self, got: &Result<Vec<Received>, SqsError>) {
        if let Ok(got) = got {
            let mut seen = self.seen.lock().unwrap();
            seen.extend(got.iter().map(|r| r.receipt.expose().to_string()));
        }
    }
}

/// Everything logged in this test process, at DEBUG and above.
fn captured_logs() -> &'static LogBuffer {
    static LOGS: OnceLock<LogBuffer> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buf = LogBuffer::default();
        let writer = {
            let buf = buf.clone();
            move || buf.clone()
        };
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(writer)
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("no other global subscriber");
        buf
    })
}

#[tokio::test]
async fn no_log_line_up_to_debug_carries_a_receipt_handle() {
    let logs = captured_logs();
    let sqs = moto::moto().client().await;
    let url = moto::queue_holding(&sqs, "logs", 8).await;
    let recording = Arc::new(Recording::default());
    let server = watched(&sqs, &url, Arc::clone(&recording)).await;
    let mut flight = server.client().await;
    let plan = |batch: u64| {
        let cmd = json!({"table": "t", "batch": batch, "partitions": 1, "max_messages": 4, "max_wait_ms": 300});
        arrow_flight::FlightDescriptor::new_cmd(cmd.to_string())
    };
    // Read, replay, release, read again, commit: every path that touches handles.
    for (batch, commit) in [(1, false), (2, true)] {
        let info = bounded(flight.get_flight_info(plan(batch))).await.unwrap();
        let ticket = info.endpoint[0].ticket.clone().unwrap();
        for _ in 0..2 {
            let s = bounded(flight.do_get(ticket.clone())).await.unwrap();
            let _: Vec<_> = futures::TryStreamExt::try_collect(s).await.unwrap();
        }
        let (kind, body) = match commit {
            true => ("commit", json!({"table": "t", "batch": batch})),
            false => ("release", json!({"table": "t"})),
        };
        let action = arrow_flight::Action::new(kind, body.to_string());
        let s = bounded(flight.do_action(action)).await.unwrap();
        let _: Vec<_> = futures::TryStreamExt::try_collect(s).await.unwrap();
    }
    server.stop().await;
    let handles = recording.seen.lock().unwrap().clone();
    assert!(
        handles.len() >= 8,
        "the test saw the handles it checks ({})",
        handles.len()
    );
    let text = logs.text();
    assert!(
        text.contains("DoGet stream ended"),
        "logs were captured at DEBUG"
    );
    for h in &handles {
        assert!(
            !text.contains(h.as_str()),
            "a receipt handle appears in the logs"
        );
    }
}

#[tokio::test]
async fn message_age_is_observed_at_the_first_receive_and_shown_in_status() {
    let sqs = moto::moto().client().await;
    let url = moto::queue_holding(&sqs, "ages", 4).await;
    let (mut f, ops) = Fixture::serve_with_metrics(sqs, url).await;
    let status = |answer: &Value| answer["tables"]["t"]["consumers"]["q"]["oldest_age_ms"].clone();
    let info = f
        .plan(json!({"table": "t", "consumer": "q", "partitions": 1, "max_wait_ms": 300}))
        .await
        .unwrap();
    let before = f.action("status", json!({"table": "t"})).await.unwrap();
    assert_eq!(status(&before), Value::Null, "nothing received: {before}");
    let ticket = tickets(&info)[0].clone();
    assert_eq!(bodies(&f.read(&ticket).await.unwrap()).len(), 4);
    let held = f.action("status", json!({"table": "t"})).await.unwrap();
    assert!(
        status(&held).is_u64(),
        "an age while the batch holds rows: {held}"
    );
    // A replay streams the rows again but receives nothing: no new ages.
    f.read(&ticket).await.unwrap();
    let (_, text) = get(ops, "/metrics").await;
    let count = r#"sqsf_message_age_seconds_count{table="t"}"#;
    assert_eq!(metric(&text, count), Some(4.0), "{text}");
    let inf = r#"sqsf_message_age_seconds_bucket{le="+Inf",table="t"}"#;
    assert_eq!(metric(&text, inf), Some(4.0), "{text}");
    assert_eq!(f.commit("q", 1).await["deleted"], 4);
    let after = f.action("status", json!({"table": "t"})).await.unwrap();
    assert_eq!(
        status(&after),
        Value::Null,
        "the batch is committed: {after}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_queue_does_not_hide_the_other_tables_from_status() {
    let sqs = moto::moto().client().await;
    let gone = moto::create_queue(&sqs, "status-gone", &[]).await;
    let kept = moto::create_queue(&sqs, "status-kept", &[]).await;
    moto::send_bodies(&sqs, &kept, ["m0".to_string(), "m1".to_string()]).await;
    let tables = vec![
        server::sqs_table("gone", &gone),
        server::sqs_table("kept", &kept),
    ];
    let srv = TestServer::start(server::config(tables), sqs.clone()).await;
    let mut flight = srv.client().await;
    sqs.delete_queue()
        .queue_url(&gone)
        .send()
        .await
        .expect("delete the queue");

    let all = action_on(&mut flight, "status", &json!({}))
        .await
        .expect("status of every table");
    let t = &all["tables"];
    assert_eq!(
        (&t["kept"]["approximate_depth"], &t["kept"]["error"]),
        (&json!(2), &Value::Null),
        "{all}"
    );
    assert_eq!(t["gone"]["approximate_depth"], Value::Null, "{all}");
    let error = t["gone"]["error"]
        .as_str()
        .unwrap_or_else(|| panic!("says why: {all}"));
    assert!(error.contains("queue does not exist"), "{error}");
    // Asked for by name, the table's error is the answer.
    let one = action_on(&mut flight, "status", &json!({"table": "gone"})).await;
    let e = one.expect_err("the queue is gone");
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e}");
    srv.stop().await;
}
