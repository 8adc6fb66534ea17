//! Large payloads (docs/protocol.md, "Large payloads"): messages of the SQS
//! Extended Client format read as their S3 objects, written through S3
//! over the threshold, and their objects deleted after the commit when the
//! table says so; against moto's SQS and S3 on one port.

use arrow_array::cast::AsArray;
use arrow_array::{ArrayRef, RecordBatch, StringArray};
use aws_sdk_sqs::types::MessageAttributeValue;
use serde_json::json;
use sqs_flight_server::config::LargePayloadConfig;
use sqs_flight_tests::faults::{CALLS, Fault, FaultProxy, Faults};
use sqs_flight_tests::moto;
use sqs_flight_tests::s3;
use sqs_flight_tests::server_process::{ServerProcess, server_process_with};

use sqs_flight_tests::prelude::*;

const POINTER_CLASS: &str = "software.amazon.payloadoffloading.PayloadS3Pointer";

/// The pointer body the Python extended client writes (with its spaces).
fn pointer(bucket: &str, key: &str) -> String {
    format!(r#"["{POINTER_CLASS}", {{"s3BucketName": "{bucket}", "s3Key": "{key}"}}]"#)
}

/// Sends `body` with the reserved attribute, as the extended client does.
async fn send_pointer(f: &Fixture, body: String, size: usize) {
    let size = MessageAttributeValue::builder()
        .data_type("Number")
        .string_value(size.to_string())
        .build()
        .unwrap();
    f.sqs
        .send_message()
        .queue_url(&f.queue_url)
        .message_body(body)
        .message_attributes("ExtendedPayloadSize", size)
        .send()
        .await
        .unwrap();
}

/// A moto queue served as `t` with `large_payloads` as `config` makes it,
/// the server's S3 at moto's endpoint; the S3 client and a fresh bucket.
async fn fixture(
    config: impl FnOnce(&str) -> LargePayloadConfig,
) -> (Fixture, aws_sdk_s3::Client, String) {
    let (f, client, bucket, _) = fixture_via(&moto::moto().endpoint.clone(), config).await;
    (f, client, bucket)
}

/// `sqsf_large_payloads_total` of table `t` with `outcome`, from the
/// metrics endpoint at `ops`.
async fn large_metric(ops: std::net::SocketAddr, outcome: &str) -> Option<f64> {
    let text = sqs_flight_tests::http::get(ops, "/metrics").await.1;
    let labels = format!(r#"table="t",outcome="{outcome}""#);
    sqs_flight_tests::http::metric(&text, &format!("sqsf_large_payloads_total{{{labels}}}"))
}

/// [`fixture`] whose server reaches S3 at `s3_endpoint` (a fault proxy),
/// with its metrics endpoint, whose address comes last.
async fn fixture_via(
    s3_endpoint: &str,
    config: impl FnOnce(&str) -> LargePayloadConfig,
) -> (Fixture, aws_sdk_s3::Client, String, std::net::SocketAddr) {
    let ops = free_addr();
    let endpoint = s3_endpoint.to_string();
    let client = s3::s3_client(&moto::moto().endpoint);
    let bucket = s3::create_bucket(&client, "lp").await;
    let sqs = moto::moto().client().await;
    let url = moto::create_queue(&sqs, "lp", &[]).await;
    let large = config(&bucket);
    let f = Fixture::serve(
        sqs,
        url,
        |t| {
            t.large_payloads = Some(large);
        },
        |c| {
            c.s3_endpoint = Some(endpoint);
            c.metrics_listen = Some(ops);
        },
    )
    .await;
    (f, client, bucket, ops)
}

fn reading(_: &str) -> LargePayloadConfig {
    LargePayloadConfig {
        read: true,
        ..LargePayloadConfig::default()
    }
}

/// (body, payload_error) of each row.
fn rows_of(batches: &[RecordBatch]) -> Vec<(String, Option<String>)> {
    let bodies = strings(batches, "body");
    let errors = strings(batches, "payload_error");
    bodies.into_iter().map(Option::unwrap).zip(errors).collect()
}

/// The names of each row's message attributes.
fn attribute_names(batches: &[RecordBatch]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for b in batches {
        let map = b.column_by_name("message_attributes").unwrap().as_map();
        for i in 0..b.num_rows() {
            let entry = map.value(i);
            let keys = entry.column(0).as_string::<i32>();
            out.push(keys.iter().map(|k| k.unwrap().to_string()).collect());
        }
    }
    out
}

#[tokio::test]
async fn pointers_read_as_their_objects_once_and_a_missing_object_keeps_its_row_with_an_error() {
    let (mut f, client, bucket) = fixture(reading).await;
    // Above SQS's own limit of 1 MiB: only S3 can carry it.
    let big: String = (0..(2 << 20))
        .map(|i| (b'a' + (i % 26) as u8) as char)
        .collect();
    s3::put(&client, &bucket, "big", big.as_bytes()).await;
    send_pointer(&f, pointer(&bucket, "big"), big.len()).await;
    send_pointer(&f, pointer(&bucket, "gone"), 10).await;
    moto::send_bodies(&f.sqs, &f.queue_url, ["plain".to_string()]).await;

    let info = f
        .plan(json!({"table": "t", "consumer": "q", "partitions": 1, "max_wait_ms": 500}))
        .await
        .unwrap();
    let ticket = tickets(&info)[0].clone();
    let first = f.read(&ticket).await.unwrap();
    let mut rows = rows_of(&first);
    rows.sort_by_key(|(b, _)| b.len());
    assert_eq!(rows.len(), 3, "no row dropped");
    assert_eq!(rows[0], ("plain".to_string(), None));
    assert_eq!(rows[1].0, pointer(&bucket, "gone"), "the pointer stays");
    let why = rows[1].1.as_deref().unwrap();
    assert!(
        why.contains("does not exist") && why.contains("/gone"),
        "{why}"
    );
    assert_eq!(rows[2].0.len(), big.len());
    assert!(rows[2].0 == big, "the object's bytes, not the pointer");
    assert_eq!(rows[2].1, None);
    // The reserved attribute goes with the pointer it described.
    for (names, (body, _)) in attribute_names(&first).iter().zip(rows_of(&first)) {
        let reserved = names.iter().any(|n| n == "ExtendedPayloadSize");
        assert_eq!(reserved, body.starts_with('['), "{names:?}");
    }

    // A replay serves the bytes recorded, without a second fetch: the
    // object is gone from S3 now.
    client
        .delete_object()
        .bucket(&bucket)
        .key("big")
        .send()
        .await
        .unwrap();
    let again = f.read(&ticket).await.unwrap();
    assert_eq!(rows_of(&again), rows_of(&first));
    assert_eq!(f.commit("q", 1).await["deleted"], 3);
    assert_eq!(f.counts().await, (0, 0));
}

#[tokio::test]
async fn a_commit_deletes_the_objects_it_read_with_delete_after_commit_and_not_a_rejected_ones() {
    let endpoint = moto::moto().endpoint.clone();
    let (mut f, client, bucket, ops) = fixture_via(&endpoint, |_| LargePayloadConfig {
        read: true,
        delete_after_commit: true,
        ..LargePayloadConfig::default()
    })
    .await;
    for key in ["kept", "deleted"] {
        s3::put(&client, &bucket, key, key.as_bytes()).await;
        send_pointer(&f, pointer(&bucket, key), key.len()).await;
    }
    let info = f
        .plan(json!({"table": "t", "consumer": "q", "partitions": 1, "max_wait_ms": 500}))
        .await
        .unwrap();
    let rows = f.read_all(&info).await;
    assert_eq!(sorted(bodies(&rows)), ["deleted", "kept"]);
    assert_eq!(
        s3::keys(&client, &bucket).await,
        ["deleted", "kept"],
        "reading deletes nothing"
    );
    let ids = strings(&rows, "message_id");
    let kept = bodies(&rows).iter().position(|b| b == "kept").unwrap();
    let out = f
        .action(
            "commit",
            json!({"table": "t", "consumer": "q", "batch": 1,
                   "reject": [ids[kept].clone().unwrap()]}),
        )
        .await
        .unwrap();
    assert_eq!(
        (out["deleted"].as_u64(), out["rejected"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(
        s3::keys(&client, &bucket).await,
        ["kept"],
        "the committed message's object is gone, the rejected one's stays"
    );
    assert_eq!(large_metric(ops, "deleted").await, Some(1.0));
}

#[tokio::test]
async fn without_delete_after_commit_a_commit_leaves_the_objects() {
    let (mut f, client, bucket) = fixture(reading).await;
    s3::put(&client, &bucket, "k", b"payload").await;
    send_pointer(&f, pointer(&bucket, "k"), 7).await;
    let info = f
        .plan(json!({"table": "t", "consumer": "q", "partitions": 1, "max_wait_ms": 500}))
        .await
        .unwrap();
    assert_eq!(bodies(&f.read_all(&info).await), ["payload"]);
    assert_eq!(f.commit("q", 1).await["deleted"], 1);
    assert_eq!(s3::keys(&client, &bucket).await, ["k"]);
}

fn body_batch(bodies: &[String]) -> RecordBatch {
    let column: ArrayRef = std::sync::Arc::new(StringArray::from_iter_values(bodies));
    RecordBatch::try_from_iter([("body", column)]).unwrap()
}

#[tokio::test]
async fn doput_offloads_bodies_over_the_threshold_as_the_extended_client_reads_them() {
    let (mut f, client, bucket) = fixture(|bucket| LargePayloadConfig {
        read: true,
        bucket: Some(bucket.to_string()),
        prefix: "in/".into(),
        ..LargePayloadConfig::default()
    })
    .await;
    let small = "s".repeat(1000);
    let over = "o".repeat(300 * 1024);
    let huge = "h".repeat(3 << 20);
    let sent = f
        .put(vec![body_batch(&[
            small.clone(),
            over.clone(),
            huge.clone(),
        ])])
        .await
        .unwrap();
    assert_eq!(sent.iter().sum::<u64>(), 3);
    let keys = s3::keys(&client, &bucket).await;
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert!(keys.iter().all(|k| k.starts_with("in/")), "{keys:?}");

    // In SQS: the small body as it is, the others as pointers with the
    // reserved Number attribute, as the extended client expects them.
    let raw = f
        .sqs
        .receive_message()
        .queue_url(&f.queue_url)
        .max_number_of_messages(10)
        .message_attribute_names("All")
        .visibility_timeout(0)
        .send()
        .await
        .unwrap();
    let mut pointers = 0;
    for m in raw.messages() {
        let body = m.body().unwrap();
        let attribute = m
            .message_attributes()
            .and_then(|a| a.get("ExtendedPayloadSize"));
        if body == small {
            assert!(attribute.is_none());
            continue;
        }
        pointers += 1;
        assert!(
            body.starts_with(&format!(r#"["{POINTER_CLASS}""#)),
            "{body}"
        );
        let a = attribute.expect("the reserved attribute");
        assert_eq!(a.data_type(), "Number");
        let size: usize = a.string_value().unwrap().parse().unwrap();
        assert!(size == over.len() || size == huge.len(), "{size}");
    }
    assert_eq!(pointers, 2);

    // And read back through the server: the bodies as written.
    let info = f
        .plan(json!({"table": "t", "consumer": "q", "partitions": 1, "max_wait_ms": 500}))
        .await
        .unwrap();
    let mut got = bodies(&f.read_all(&info).await);
    got.sort_by_key(String::len);
    assert!(got == [small, over, huge], "bodies differ");
}

#[tokio::test]
async fn a_body_over_max_object_bytes_is_refused_by_row_and_one_over_sqs_limit_without_a_bucket() {
    let (mut f, _client, bucket) = fixture(|bucket| LargePayloadConfig {
        bucket: Some(bucket.to_string()),
        max_object_bytes: 2 << 20,
        ..LargePayloadConfig::default()
    })
    .await;
    let err = f
        .put(vec![body_batch(&["ok".into(), "x".repeat((2 << 20) + 1)])])
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().contains("row 1") && err.message().contains("max_object_bytes"),
        "{}",
        err.message()
    );
    let _ = bucket;

    // A bucket that is not there: the server's configuration, not the row.
    let (mut f, _client, _bucket) = fixture(|bucket| LargePayloadConfig {
        bucket: Some(format!("{bucket}-missing")),
        ..LargePayloadConfig::default()
    })
    .await;
    let err = f
        .put(vec![body_batch(&["x".repeat(300 * 1024)])])
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert_eq!(reason(&err), Some("s3_refused"), "{}", err.message());
    assert!(err.message().contains("row 0"), "{}", err.message());

    // Without large payloads, SQS's own limit stands.
    let mut plain = Fixture::standard(0).await;
    let err = plain
        .put(vec![body_batch(&["x".repeat((1 << 20) + 1)])])
        .await
        .unwrap_err();
    assert!(err.message().contains("SQS limit"), "{}", err.message());
}

#[tokio::test]
async fn s3_failing_now_and_then_is_retried_and_s3_down_leaves_rows_with_errors_that_go_back() {
    let proxy = FaultProxy::start(&moto::moto().endpoint, 11).await;
    let (mut f, client, bucket, ops) = fixture_via(&proxy.endpoint, reading).await;
    for i in 0..6 {
        let key = format!("k{i}");
        s3::put(&client, &bucket, &key, key.as_bytes()).await;
        send_pointer(&f, pointer(&bucket, &key), key.len()).await;
    }
    proxy.set(Faults::of(&[Fault::InternalError]).on("S3.GET", 0.5));
    let info = f
        .plan(json!({"table": "t", "consumer": "q", "partitions": 1, "max_wait_ms": 500}))
        .await
        .unwrap();
    let rows = f.read_all(&info).await;
    assert_eq!(sorted(bodies(&rows)), ["k0", "k1", "k2", "k3", "k4", "k5"]);
    assert!(strings(&rows, "payload_error").iter().all(Option::is_none));
    assert!(
        proxy.count("S3.GET", "InternalError") > 0,
        "{}",
        proxy.report()
    );
    assert_eq!(large_metric(ops, "read").await, Some(6.0));
    assert_eq!(f.commit("q", 1).await["deleted"], 6);

    // S3 down: each fetch gives up after its attempts, and its row comes
    // with the pointer and why; a commit can give those rows back.
    for key in ["a", "b"] {
        s3::put(&client, &bucket, key, key.as_bytes()).await;
        send_pointer(&f, pointer(&bucket, key), 1).await;
    }
    proxy.clear_counts();
    proxy.set(Faults::of(&[Fault::InternalError]).on("S3.GET", 1.0));
    let info = f
        .plan(
            json!({"table": "t", "consumer": "q", "batch": 2, "partitions": 1,
                     "max_wait_ms": 500}),
        )
        .await
        .unwrap();
    let rows = f.read_all(&info).await;
    assert_eq!(rows_of(&rows).len(), 2, "no row dropped");
    for (body, error) in rows_of(&rows) {
        assert!(body.starts_with('['), "{body}");
        let why = error.unwrap();
        assert!(why.contains("GetObject") && why.contains("failed"), "{why}");
    }
    assert_eq!(large_metric(ops, "read_failed").await, Some(2.0));
    let attempts = u64::from(sqs_flight_server::config::DEFAULT_SQS_MAX_ATTEMPTS);
    assert_eq!(
        proxy.count("S3.GET", CALLS),
        2 * attempts,
        "bounded retries"
    );
    let out = f
        .action(
            "commit",
            json!({"table": "t", "consumer": "q", "batch": 2,
                   "reject_payload_errors": true, "reject_delay_seconds": 0}),
        )
        .await
        .unwrap();
    assert_eq!(
        (out["deleted"].as_u64(), out["rejected"].as_u64()),
        (Some(0), Some(2))
    );
    let back = moto::drain_visible(&f.sqs, &f.queue_url).await;
    assert_eq!(back.len(), 2, "both messages are back in the queue");
}

/// A queue holding one pointer message to the object `k` ("from S3") of a
/// fresh bucket: the S3 client, the bucket and the queue's URL.
async fn one_pointer(prefix: &str) -> (aws_sdk_s3::Client, String, String) {
    let endpoint = moto::moto().endpoint.clone();
    let client = s3::s3_client(&endpoint);
    let bucket = s3::create_bucket(&client, prefix).await;
    let sqs = moto::moto().client().await;
    let url = moto::create_queue(&sqs, prefix, &[]).await;
    s3::put(&client, &bucket, "k", b"from S3").await;
    let size = MessageAttributeValue::builder()
        .data_type("Number")
        .string_value("7")
        .build()
        .unwrap();
    sqs.send_message()
        .queue_url(&url)
        .message_body(pointer(&bucket, "k"))
        .message_attributes("ExtendedPayloadSize", size)
        .send()
        .await
        .unwrap();
    (client, bucket, url)
}

/// The server binary serving `url` as `t` with `large_payloads` set by the
/// TOML lines `large`, its S3 calls at moto through `AWS_ENDPOINT_URL_S3`,
/// with `extra` flags.
fn server_process(url: &str, large: &str, extra: &[&str]) -> ServerProcess {
    let endpoint = moto::moto().endpoint.clone();
    let toml = format!("[tables.t.large_payloads]\n{large}\n");
    let env = [("AWS_ENDPOINT_URL_S3", endpoint.as_str())];
    server_process_with(&endpoint, url, &toml, extra, &env)
}

#[tokio::test]
async fn a_server_process_reads_large_payloads_at_the_sdks_s3_endpoint_variable() {
    let (_client, _bucket, url) = one_pointer("lpenv").await;
    let server = server_process(&url, "read = true", &[]);
    let mut flight = connect(&server.url).await;
    let info = plan_on(
        &mut flight,
        &json!({"table": "t", "consumer": "q", "partitions": 1, "max_wait_ms": 500}),
    )
    .await
    .unwrap();
    let rows = read_on(&mut flight, &tickets(&info)[0]).await.unwrap();
    assert_eq!(bodies(&rows), ["from S3"], "{}", server.log());
}

#[tokio::test]
async fn after_kill_9_a_replay_serves_the_payload_read_and_the_commit_still_deletes_its_object() {
    let (client, bucket, url) = one_pointer("lprestart").await;
    let dir = temp_dir("lprestart");
    let state = dir.path().join("state");
    let state = state.to_str().unwrap();
    let large = "read = true\ndelete_after_commit = true";
    let server = server_process(&url, large, &["--state-dir", state]);
    let mut flight = connect(&server.url).await;
    let cmd = json!({"table": "t", "consumer": "q", "partitions": 1, "max_wait_ms": 500});
    let info = plan_on(&mut flight, &cmd).await.unwrap();
    let ticket = tickets(&info)[0].clone();
    assert_eq!(
        bodies(&read_on(&mut flight, &ticket).await.unwrap()),
        ["from S3"]
    );
    server.kill9();

    let server = server_process(&url, large, &["--state-dir", state]);
    let mut flight = connect(&server.url).await;
    let rows = read_on(&mut flight, &ticket).await.unwrap();
    assert_eq!(
        bodies(&rows),
        ["from S3"],
        "the replay, from the state store"
    );
    assert_eq!(s3::keys(&client, &bucket).await, ["k"]);
    let out = action_on(
        &mut flight,
        "commit",
        &json!({"table": "t", "consumer": "q", "batch": 1}),
    )
    .await
    .unwrap();
    assert_eq!(out["deleted"], 1, "{out}");
    assert!(
        s3::keys(&client, &bucket).await.is_empty(),
        "the restored receive still knows its object: {}",
        server.log()
    );
}

#[tokio::test]
async fn s3_failing_past_its_retries_stops_doput_at_the_row_with_s3_unavailable() {
    let proxy = FaultProxy::start(&moto::moto().endpoint, 5).await;
    let (mut f, client, bucket, _ops) = fixture_via(&proxy.endpoint, |bucket| LargePayloadConfig {
        bucket: Some(bucket.to_string()),
        ..LargePayloadConfig::default()
    })
    .await;
    proxy.set(Faults::of(&[Fault::InternalError]).on("S3.PUT", 1.0));
    let err = f
        .put(vec![body_batch(&["small".into(), "x".repeat(300 * 1024)])])
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    assert_eq!(reason(&err), Some("s3_unavailable"), "{}", err.message());
    assert!(err.message().contains("row 1"), "{}", err.message());
    let attempts = u64::from(sqs_flight_server::config::DEFAULT_SQS_MAX_ATTEMPTS);
    assert_eq!(proxy.count("S3.PUT", CALLS), attempts, "bounded retries");
    assert!(s3::keys(&client, &bucket).await.is_empty());
    // The row before it went; the large one did not.
    let raw = moto::drain_visible(&f.sqs, &f.queue_url).await;
    let raw: Vec<String> = raw.into_iter().map(|m| m.body.unwrap()).collect();
    assert_eq!(raw, ["small"]);
}
