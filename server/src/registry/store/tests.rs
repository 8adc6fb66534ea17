use std::sync::Arc;
use std::sync::atomic::Ordering;

use redb::{ReadableDatabase, ReadableTableMetadata};

use super::keys::{key, parse_key};
use super::*;

fn id(batch: u64, partition: u32) -> TicketId {
    id_of(batch, partition, 7)
}

fn id_of(batch: u64, partition: u32, plan: u64) -> TicketId {
    TicketId {
        table: "t".into(),
        consumer: "c".into(),
        batch,
        partition,
        plan,
    }
}

fn rows(n: usize) -> RecordBatch {
    let msgs: Vec<_> = (0..n)
        .map(|i| sqs_flight_schemas::SqsMessage {
            message_id: format!("m{i}"),
            body: format!("body {i}"),
            ..Default::default()
        })
        .collect();
    sqs_flight_schemas::message::messages_to_batch(&msgs, 1, 0).unwrap()
}

fn chunk(batch: u64, partition: u32, seq: u64, n: usize) -> Op {
    chunk_of(id(batch, partition), seq, n)
}

fn chunk_of(id: TicketId, seq: u64, n: usize) -> Op {
    let (batch, partition) = (id.batch, id.partition);
    Op::Chunk {
        id,
        seq,
        meta: ChunkMeta {
            receipts: (0..n)
                .map(|i| format!("r{batch}-{partition}-{seq}-{i}"))
                .collect(),
            visible_until_ms: 42,
            objects: Vec::new(),
            bytes: n as u64,
            plan: 0,
        },
        rows: encode_rows(&rows(n)).unwrap(),
    }
}

fn batch(batch: u64) -> Op {
    Op::Batch {
        table: "t".into(),
        consumer: "c".into(),
        batch,
        stored: StoredBatch::new(7, PlanParams::DEFAULTS),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewed_receipts_and_committed_ids_load_back_and_expired_ids_go() {
    let scratch = crate::scratch::dir("dedup");
    let dir = scratch.path().join("state");
    let store = Arc::new(Store::open(&dir).unwrap());
    let renew = |offset, receipt: &str| Op::Renew {
        id: id(1, 0),
        seq: 0,
        offset,
        receipt: receipt.into(),
    };
    apply(&store, vec![batch(1), chunk(1, 0, 0, 3), renew(1, "newer")])
        .await
        .unwrap();
    // A renewal of another plan, or of a chunk never written, changes nothing.
    let other_plan = Op::Renew {
        id: id_of(1, 0, 8),
        seq: 0,
        offset: 0,
        receipt: "other plan".into(),
    };
    let no_chunk = Op::Renew {
        id: id(1, 0),
        seq: 5,
        offset: 0,
        receipt: "no chunk".into(),
    };
    apply(&store, vec![other_plan, no_chunk]).await.unwrap();
    let loaded = store.load().unwrap();
    let receipts = &loaded[0].batches[0].tickets[0].chunks[0].1.receipts;
    assert_eq!(receipts, &["r1-0-0-0", "newer", "r1-0-0-2"]);

    let now = crate::registry::status::unix_now_ms() as u64;
    let committed = |table: &str, until_ms, keys: Vec<u128>| Op::Committed {
        table: table.into(),
        until_ms,
        keys,
    };
    apply(
        &store,
        vec![committed("t", now + 2_000, vec![1, u128::MAX])],
    )
    .await
    .unwrap();
    assert_eq!(
        store.load_committed(now).unwrap(),
        [
            ("t".to_string(), now + 2_000, 1),
            ("t".into(), now + 2_000, u128::MAX)
        ]
    );
    assert_eq!(store.load_committed(now + 2_000).unwrap(), [], "expired");
    // A later write drops the table's expired ids from the file.
    let raw = |store: &Store| {
        let txn = store.db.begin_read().unwrap();
        txn.open_table(COMMITTED).unwrap().len().unwrap()
    };
    apply(&store, vec![committed("u", now + 60_000, vec![3])])
        .await
        .unwrap();
    assert_eq!(raw(&store), 3, "another table's write keeps t's ids");
    apply(&store, vec![committed("t", 1, vec![4])])
        .await
        .unwrap();
    assert_eq!(
        raw(&store),
        3,
        "4 went at once, 1 and MAX stay until their time"
    );
    drop(store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_is_written_loads_back_and_forgotten_batches_are_gone() {
    let scratch = crate::scratch::dir("store");
    let dir = scratch.path().join("state");
    {
        let store = Arc::new(Store::open(&dir).unwrap());
        let state = StoredConsumer {
            committed: Some(0),
            last_planned: Some(2),
            pending_delete: vec!["p1".into()],
            pending_reject: vec![StoredReject {
                delay_seconds: 30,
                receipts: vec!["j1".into()],
                read_ahead: false,
            }],
        };
        apply(&store, vec![batch(1), batch(2)]).await.unwrap();
        // Concurrent writers share transactions and all succeed.
        let writes = (0..8u64).map(|seq| {
            let store = Arc::clone(&store);
            tokio::spawn(async move { apply(&store, vec![chunk(1, 0, seq, 3)]).await })
        });
        for w in futures::future::join_all(writes).await {
            w.unwrap().unwrap();
        }
        apply(&store, vec![chunk(2, 1, 0, 2), Op::Seal { id: id(2, 1) }])
            .await
            .unwrap();
        let consumer = Op::Consumer {
            table: "t".into(),
            consumer: "c".into(),
            state,
        };
        apply(&store, vec![consumer, chunk(9, 0, 0, 1)])
            .await
            .unwrap();
        apply(
            &store,
            vec![Op::Forget {
                table: "t".into(),
                consumer: "c".into(),
                batch: 2,
            }],
        )
        .await
        .unwrap();
    }
    let store = Store::open(&dir).unwrap();
    let loaded = store.load().unwrap();
    assert_eq!(loaded.len(), 1);
    let c = &loaded[0];
    assert_eq!((c.table.as_str(), c.consumer.as_str()), ("t", "c"));
    assert_eq!(c.state.last_planned, Some(2));
    assert_eq!(c.state.pending_delete, vec!["p1".to_string()]);
    assert_eq!(c.state.pending_reject[0].receipts, ["j1"]);
    assert_eq!(c.state.pending_reject[0].delay_seconds, 30);
    assert_eq!(c.batches.len(), 1, "batch 2 was forgotten");
    let b = &c.batches[0];
    assert_eq!((b.batch, b.stored.plan), (1, 7));
    assert_eq!(b.tickets.len(), PlanParams::DEFAULTS.partitions as usize);
    let t0 = &b.tickets[0];
    assert!(!t0.sealed);
    assert_eq!(t0.chunks.len(), 8);
    assert_eq!(t0.chunks[0].0, rows(3), "rows come back as written");
    assert_eq!(t0.chunks[5].1.receipts[2], "r1-0-5-2", "in sequence order");
    // The chunk of batch 9, never planned, was dropped on load.
    let again = store.load().unwrap();
    assert_eq!(again[0].batches.len(), 1);
    drop(store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_at_open_gives_forgotten_rows_back_and_keeps_the_rest() {
    let scratch = crate::scratch::dir("compact");
    let dir = scratch.path().join("state");
    let size = |store: &Store| std::fs::metadata(store.path()).unwrap().len();
    let full = {
        let store = Arc::new(Store::open(&dir).unwrap());
        apply(&store, vec![batch(1), batch(2)]).await.unwrap();
        for seq in 0..40 {
            apply(&store, vec![chunk(1, 0, seq, 500)]).await.unwrap();
        }
        apply(&store, vec![chunk(2, 0, 0, 3)]).await.unwrap();
        let forget = Op::Forget {
            table: "t".into(),
            consumer: "c".into(),
            batch: 1,
        };
        apply(&store, vec![forget]).await.unwrap();
        size(&store)
    };
    let mut store = Store::open(&dir).unwrap();
    let opened = size(&store);
    store.compact();
    let compacted = size(&store);
    assert!(
        compacted < opened / 2,
        "{compacted} B after compaction, {opened} B before ({full} B when written)"
    );
    let loaded = store.load().unwrap();
    assert_eq!(loaded[0].batches.len(), 1);
    assert_eq!(loaded[0].batches[0].tickets[0].chunks[0].0, rows(3));
    drop(store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunks_and_seals_of_another_plan_are_neither_written_nor_adopted() {
    let scratch = crate::scratch::dir("plans");
    let dir = scratch.path().join("state");
    let store = Arc::new(Store::open(&dir).unwrap());
    // Batch 1 is planned (plan 7), released, and planned again (plan 8);
    // the receive of plan 7 ends after that.
    let forget = Op::Forget {
        table: "t".into(),
        consumer: "c".into(),
        batch: 1,
    };
    apply(&store, vec![batch(1), chunk(1, 0, 0, 2), forget])
        .await
        .unwrap();
    let replanned = Op::Batch {
        table: "t".into(),
        consumer: "c".into(),
        batch: 1,
        stored: StoredBatch::new(
            8,
            PlanParams {
                partitions: 3,
                ..PlanParams::DEFAULTS
            },
        ),
    };
    apply(&store, vec![replanned]).await.unwrap();
    apply(&store, vec![chunk(1, 0, 1, 3), Op::Seal { id: id(1, 0) }])
        .await
        .unwrap();
    let loaded = store.load().unwrap();
    let b = &loaded[0].batches[0];
    assert_eq!(b.stored.plan, 8);
    assert!(
        b.tickets[0].chunks.is_empty() && !b.tickets[0].sealed,
        "plan 8's ticket adopted nothing of plan 7"
    );
    // Its own receives are written.
    let own = id_of(1, 0, 8);
    apply(
        &store,
        vec![chunk_of(own.clone(), 0, 4), Op::Seal { id: own }],
    )
    .await
    .unwrap();
    // Stale entries of plan 7 (written before the plan check).
    let rows = encode_rows(&rows(1)).unwrap();
    let stale_meta = br#"{"receipts":["s1"],"visible_until_ms":42,"bytes":1,"plan":7}"#;
    {
        let txn = store.db.begin_write().unwrap();
        {
            let mut meta = txn.open_table(CHUNK_META).unwrap();
            let mut chunk_rows = txn.open_table(CHUNK_ROWS).unwrap();
            let mut sealed = txn.open_table(SEALED).unwrap();
            let k = key("t", "c", &[1, 2, 0]);
            meta.insert(k.as_slice(), &stale_meta[..]).unwrap();
            chunk_rows.insert(k.as_slice(), rows.as_slice()).unwrap();
            let stale_seal = br#"{"plan":7}"#;
            sealed
                .insert(key("t", "c", &[1, 2]).as_slice(), &stale_seal[..])
                .unwrap();
        }
        txn.commit().unwrap();
    }
    let loaded = store.load().unwrap();
    let t = &loaded[0].batches[0].tickets;
    assert_eq!(t[0].chunks.len(), 1);
    assert_eq!(t[0].chunks[0].1.plan, 8);
    assert!(t[0].sealed);
    assert!(t[2].chunks.is_empty() && !t[2].sealed, "plan 7: dropped");
    let txn = store.db.begin_read().unwrap();
    let meta = txn.open_table(CHUNK_META).unwrap();
    assert_eq!(
        meta.len().unwrap(),
        1,
        "the stale chunk is gone from the file"
    );
    drop((meta, txn, loaded, store));
}

#[test]
fn keys_round_trip_and_sort_by_batch() {
    let k = key("orders", "spark", &[7, 1, 3]);
    assert_eq!(
        parse_key(&k),
        Some(("orders".into(), "spark".into(), vec![7, 1, 3]))
    );
    assert!(key("t", "c", &[2]) < key("t", "c", &[10]));
    assert!(parse_key(&[0, 0, 0, 9, b'x']).is_none());
    // A consumer that is a prefix of another never shares its keys.
    assert!(!key("t", "ab", &[1]).starts_with(&key("t", "a", &[])));
}

#[test]
fn a_stored_batch_round_trips_and_requires_every_parameter() {
    let new = StoredBatch::new(3, PlanParams::DEFAULTS);
    let json = serde_json::to_value(new).unwrap();
    assert_eq!(
        serde_json::from_value::<StoredBatch>(json.clone()).unwrap(),
        new
    );
    for name in ["receivers", "max_bytes"] {
        let mut broken = json.clone();
        broken.as_object_mut().unwrap().remove(name);
        assert!(
            serde_json::from_value::<StoredBatch>(broken).is_err(),
            "{name}"
        );
    }
}

#[test]
fn a_store_records_its_format_version_and_refuses_one_it_does_not_know() {
    let scratch = crate::scratch::dir("format");
    let dir = scratch.path().join("state");
    let version = |store: &Store| {
        let txn = store.db.begin_read().unwrap();
        let format = txn.open_table(FORMAT).unwrap();
        format.get(FORMAT_KEY).unwrap().map(|v| v.value())
    };
    let store = Store::open(&dir).unwrap();
    assert_eq!(version(&store), Some(FORMAT_VERSION), "a new store");
    drop(store);
    let store = Store::open(&dir).unwrap();
    assert_eq!(version(&store), Some(FORMAT_VERSION), "opened again");
    let txn = store.db.begin_write().unwrap();
    txn.open_table(FORMAT)
        .unwrap()
        .insert(FORMAT_KEY, FORMAT_VERSION + 1)
        .unwrap();
    txn.commit().unwrap();
    drop(store);
    let Err(e) = Store::open(&dir) else {
        panic!("a store of format version {} opened", FORMAT_VERSION + 1);
    };
    let e = e.to_string();
    assert!(e.contains("format version 2"), "{e}");
    assert!(e.contains("reads version 1 only"), "{e}");
    assert!(e.contains("--state-dir"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_write_that_fails_after_the_state_log_took_it_stops_the_server() {
    use crate::state_log::objects::Files;
    use crate::state_log::replica::{self, Fence};
    let scratch = crate::scratch::dir("diverged");
    let store = Store::open(&scratch.path().join("state")).unwrap();
    let objects = Arc::new(Files::new(scratch.path().join("log")));
    let fence = Arc::new(Fence::default());
    let taken = replica::take_over(objects.clone(), &store, Arc::clone(&fence)).await;
    store.attach(taken.unwrap());

    store.fail_writes.store(true, Ordering::SeqCst);
    let failed = store.write(&[batch(1)]).unwrap_err().to_string();
    assert!(failed.contains("failure injected"), "{failed}");
    store.fail_writes.store(false, Ordering::SeqCst);
    let why = fence.fenced().expect("stopped").to_string();
    assert!(why.contains("local store failed"), "{why}");
    let refused = store.write(&[batch(2)]).unwrap_err();
    assert!(matches!(refused, Error::Fenced(_)), "{refused}");

    // The log holds the write the local store failed: a server started
    // again acts on it.
    let mut log = crate::state_log::Log::new(objects);
    let segments = log.read().await.unwrap();
    let written = segments.last().unwrap();
    assert_eq!(written.frames.len(), 1);
    let op = crate::state_log::ops::op(written.frames[0].clone()).unwrap();
    assert!(matches!(op, Op::Batch { batch: 1, .. }), "{op:?}");
}
