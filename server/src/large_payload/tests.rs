use std::sync::Arc;

use sqs_flight_schemas::SqsMessage;

use super::memory::MemoryStore;
use super::*;

fn object(key: &str) -> S3Object {
    S3Object {
        bucket: "payloads".into(),
        key: key.into(),
    }
}

fn pointer_message(id: &str, o: &S3Object, size: usize) -> SqsMessage {
    SqsMessage {
        message_id: id.into(),
        body: pointer_body(o),
        message_attributes: vec![
            (RESERVED_ATTRIBUTE.into(), size.to_string()),
            ("kind".into(), "order".into()),
        ],
        ..SqsMessage::default()
    }
}

fn large(store: &Arc<MemoryStore>, config: LargePayloadConfig) -> LargePayloads {
    LargePayloads::new(config, Arc::clone(store) as Arc<dyn ObjectStore>)
}

fn reading() -> LargePayloadConfig {
    LargePayloadConfig {
        read: true,
        ..LargePayloadConfig::default()
    }
}

/// Bodies above `threshold_bytes` (0: every body) go to bucket `payloads`.
fn writing(threshold_bytes: u64) -> LargePayloadConfig {
    LargePayloadConfig {
        bucket: Some("payloads".into()),
        threshold_bytes,
        ..LargePayloadConfig::default()
    }
}

#[test]
fn pointers_of_both_libraries_and_versions_parse_and_others_do_not() {
    let o = object("k/1");
    assert_eq!(parse_pointer(&pointer_body(&o)).unwrap(), o);
    // The Python port writes spaces, the Java library none; the old class.
    let python = r#"["software.amazon.payloadoffloading.PayloadS3Pointer", {"s3BucketName": "payloads", "s3Key": "k/1"}]"#;
    let legacy = r#"["com.amazon.sqs.javamessaging.MessageS3Pointer",{"s3BucketName":"payloads","s3Key":"k/1"}]"#;
    assert_eq!(parse_pointer(python).unwrap(), o);
    assert_eq!(parse_pointer(legacy).unwrap(), o);
    for bad in [
        "hello",
        r#"["other.Class", {"s3BucketName": "b", "s3Key": "k"}]"#,
        r#"["software.amazon.payloadoffloading.PayloadS3Pointer", {"s3BucketName": "b"}]"#,
        r#"["software.amazon.payloadoffloading.PayloadS3Pointer", {"s3BucketName": "", "s3Key": "k"}]"#,
        r#"{"s3BucketName": "b", "s3Key": "k"}"#,
    ] {
        let e = parse_pointer(bad).unwrap_err();
        assert!(e.contains("not a large-payload pointer"), "{bad}: {e}");
    }
}

#[tokio::test]
async fn resolve_reads_pointers_and_leaves_plain_messages_and_failures_as_they_are() {
    let store = Arc::new(MemoryStore::default());
    let here = object("here");
    store.insert(&here, "the payload".as_bytes());
    let gone = object("gone");
    let mut plain = SqsMessage {
        message_id: "p".into(),
        body: "plain".into(),
        ..SqsMessage::default()
    };
    let mut read = pointer_message("r", &here, 11);
    let mut missing = pointer_message("m", &gone, 11);
    let mut garbled = pointer_message("g", &here, 11);
    garbled.body = "not a pointer".into();
    let lp = large(&store, reading());
    let got = lp
        .resolve(&mut [&mut plain, &mut read, &mut missing, &mut garbled])
        .await;
    assert_eq!(got[0], Resolved::Plain);
    assert_eq!(got[1], Resolved::Read(here.clone()));
    assert!(
        matches!(&got[2], Resolved::Failed(e) if e.contains("does not exist") && e.contains("s3://payloads/gone")),
        "{:?}",
        got[2]
    );
    assert!(
        matches!(&got[3], Resolved::Failed(e) if e.contains("not a large-payload pointer")),
        "{:?}",
        got[3]
    );
    assert_eq!(plain.body, "plain");
    assert_eq!(read.body, "the payload");
    // The reserved attribute goes with the pointer; the others stay.
    assert_eq!(
        read.message_attributes,
        vec![("kind".to_string(), "order".to_string())]
    );
    assert_eq!(missing.body, pointer_body(&gone));
    assert_eq!(missing.message_attributes.len(), 2);
    assert_eq!(garbled.body, "not a pointer");
    assert_eq!(store.gets(), 2, "the garbled pointer is not fetched");
}

#[tokio::test]
async fn an_object_over_max_object_bytes_is_not_fetched_when_declared_and_not_read_when_not() {
    let store = Arc::new(MemoryStore::default());
    let big = object("big");
    store.insert(&big, vec![b'x'; 100]);
    let lp = large(
        &store,
        LargePayloadConfig {
            max_object_bytes: 99,
            ..reading()
        },
    );
    let mut declared = pointer_message("d", &big, 100);
    let mut understated = pointer_message("u", &big, 10);
    let got = lp.resolve(&mut [&mut declared, &mut understated]).await;
    for g in &got {
        assert!(
            matches!(g, Resolved::Failed(e) if e.contains("100 bytes") && e.contains("max_object_bytes (99)")),
            "{g:?}"
        );
    }
    assert_eq!(
        store.gets(),
        1,
        "a declared size over the bound is refused before the fetch"
    );
}

#[tokio::test]
async fn an_object_that_is_not_text_is_a_failure() {
    let store = Arc::new(MemoryStore::default());
    let bin = object("bin");
    store.insert(&bin, vec![0xff, 0xfe]);
    let mut m = pointer_message("b", &bin, 2);
    let got = large(&store, reading()).resolve(&mut [&mut m]).await;
    assert!(
        matches!(&got[0], Resolved::Failed(e) if e.contains("not UTF-8")),
        "{got:?}"
    );
}

#[tokio::test]
async fn offload_puts_bodies_over_the_threshold_and_sends_pointers() {
    let store = Arc::new(MemoryStore::default());
    let lp = large(
        &store,
        LargePayloadConfig {
            prefix: "in/".into(),
            ..writing(10)
        },
    );
    let small = OutgoingMessage {
        body: "0123456789".into(),
        ..OutgoingMessage::default()
    };
    let big = OutgoingMessage {
        body: "0123456789a".into(),
        ..OutgoingMessage::default()
    };
    let (out, err) = lp.offload(vec![small.clone(), big]).await;
    assert!(err.is_none());
    assert_eq!(out[0], small, "at the threshold a body goes as it is");
    assert_eq!(out[1].payload_size, Some(11));
    let o = parse_pointer(&out[1].body).unwrap();
    assert_eq!(o.bucket, "payloads");
    assert!(
        o.key.starts_with("in/") && o.key.len() == 3 + 36,
        "{}",
        o.key
    );
    assert_eq!(store.object(&o).unwrap(), b"0123456789a");
    // Threshold 0: every body.
    let always = large(&store, writing(0));
    let (out, _) = always.offload(vec![small]).await;
    assert!(out[0].payload_size.is_some());
    assert_eq!(store.count(), 2);
}

#[tokio::test]
async fn a_failed_put_deletes_the_objects_put_for_the_rows_after_it() {
    let store = Arc::new(MemoryStore::default());
    let lp = large(&store, writing(0));
    store.refuse_puts_of("refused");
    let bodies = ["a", "refused", "b", "c"];
    let messages = bodies
        .iter()
        .map(|b| OutgoingMessage {
            body: (*b).into(),
            ..OutgoingMessage::default()
        })
        .collect();
    let (out, err) = lp.offload(messages).await;
    assert_eq!(err.map(|(i, _)| i), Some(1), "the write stops at row 1");
    assert_eq!(out.len(), 1);
    let sent = parse_pointer(&out[0].body).unwrap();
    assert_eq!(store.object(&sent).unwrap(), b"a");
    assert_eq!(
        store.count(),
        1,
        "only the object of the row before the failed put is left"
    );
}

#[tokio::test]
async fn delete_removes_objects_and_counts_them() {
    let store = Arc::new(MemoryStore::default());
    let a = object("a");
    store.insert(&a, "x".as_bytes());
    let lp = large(&store, reading());
    let outcome = lp.delete(vec![a.clone()], "a test's").await;
    assert_eq!(outcome.deleted, 1);
    assert!(store.object(&a).is_none());
}
