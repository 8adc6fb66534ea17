use std::time::Duration;

use futures::StreamExt;
use sqs_flight_schemas::SqsMessage;
use sqs_flight_schemas::message::messages_to_batch;

use super::*;

fn ticket() -> Arc<Ticket> {
    let id = TicketId {
        table: "t".into(),
        consumer: "c".into(),
        batch: 1,
        partition: 0,
        plan: 1,
    };
    Arc::new(Ticket::new(id, Arc::new(Usage::default())))
}

fn rows(n: usize) -> (RecordBatch, Vec<ReceiptHandle>) {
    let msgs: Vec<_> = (0..n)
        .map(|i| SqsMessage {
            message_id: format!("m{i}"),
            body: "b".into(),
            ..Default::default()
        })
        .collect();
    let receipts = (0..n)
        .map(|i| ReceiptHandle::new(format!("r{i}")))
        .collect();
    (messages_to_batch(&msgs, 1, 0).unwrap(), receipts)
}

fn concat(batches: &[RecordBatch]) -> RecordBatch {
    arrow_select::concat::concat_batches(&batches[0].schema(), batches).unwrap()
}

async fn read(t: &Arc<Ticket>, begin: Begin) -> Result<Vec<RecordBatch>, Error> {
    Arc::clone(t)
        .follow(begin)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect()
}

#[tokio::test]
async fn only_the_first_reader_receives_and_all_see_the_same_rows() {
    let t = ticket();
    let first = t.begin();
    assert!(first.first);
    let second = t.begin();
    assert!(!second.first);
    let live = tokio::spawn(Arc::clone(&t).follow(first).collect::<Vec<_>>());
    let concurrent = tokio::spawn(Arc::clone(&t).follow(second).collect::<Vec<_>>());
    let (b, r) = rows(3);
    t.append(ReceivedRows::new(b, r, 3, Instant::now()))
        .unwrap();
    let (b, r) = rows(2);
    t.append(ReceivedRows::new(b, r, 2, Instant::now()))
        .unwrap();
    t.seal();
    let wait = |h| tokio::time::timeout(Duration::from_secs(5), h);
    let live: Vec<_> = wait(live).await.unwrap().unwrap();
    let live: Vec<RecordBatch> = live.into_iter().map(Result::unwrap).collect();
    let concurrent: Vec<RecordBatch> = wait(concurrent)
        .await
        .unwrap()
        .unwrap()
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let replay = read(&t, t.begin()).await.unwrap();
    assert_eq!(concat(&live), concat(&replay));
    assert_eq!(concat(&live), concat(&concurrent));
    assert_eq!(concat(&replay).num_rows(), 5);
    assert_eq!(t.usage.snapshot(), (5, 5));
}

#[tokio::test]
async fn a_sealed_log_is_one_record_batch_and_replays_from_any_point() {
    let t = ticket();
    let begin = t.begin();
    let follower = Arc::clone(&t).follow(begin);
    futures::pin_mut!(follower);
    for n in [3, 0, 4] {
        let (b, r) = rows(n);
        t.append(ReceivedRows::new(b, r, n as u64, Instant::now()))
            .unwrap();
    }
    // The first reader has taken the first receive before the seal.
    let first = follower.next().await.unwrap().unwrap();
    assert_eq!(first.num_rows(), 3);
    t.seal();
    assert_eq!(t.log().batches.len(), 1, "coalesced on seal");
    assert!(
        matches!(t.log().batches[0], LogRows::Packed(_)),
        "packed on seal"
    );
    let rest: Vec<RecordBatch> = follower.map(Result::unwrap).collect().await;
    assert_eq!(rest.iter().map(|b| b.num_rows()).sum::<usize>(), 4);
    let replay = read(&t, t.begin()).await.unwrap();
    assert_eq!(replay.len(), 1);
    assert_eq!(
        concat(&[first].into_iter().chain(rest).collect::<Vec<_>>()),
        replay[0]
    );
}

#[tokio::test]
async fn long_receives_are_coalesced_as_they_go_and_readers_lose_no_row() {
    let t = ticket();
    let begin = t.begin();
    let follower = Arc::clone(&t).follow(begin);
    futures::pin_mut!(follower);
    let mut read = 0;
    let receives = 2 * COALESCE_EVERY + 5;
    for i in 0..receives {
        let (b, r) = rows(2);
        t.append(ReceivedRows::new(b, r, 2, Instant::now()))
            .unwrap();
        // A reader that keeps up, one that lags: both stay on their row.
        if i % 3 == 0 {
            read += follower.next().await.unwrap().unwrap().num_rows();
        }
    }
    assert_eq!(t.log().batches.len(), 2 + 5, "two coalesced, five recent");
    t.seal();
    assert_eq!(t.log().batches.len(), 3, "the tail coalesced at the seal");
    let packed = t
        .log()
        .batches
        .iter()
        .filter(|h| matches!(h, LogRows::Packed(_)))
        .count();
    assert_eq!(packed, 3, "every coalesced batch is packed");
    let rest: Vec<RecordBatch> = follower.map(Result::unwrap).collect().await;
    read += rest.iter().map(|b| b.num_rows()).sum::<usize>();
    assert_eq!(read, 2 * receives);
    let replay = concat(&read_all(&t).await);
    assert_eq!(replay.num_rows(), 2 * receives);
}

async fn read_all(t: &Arc<Ticket>) -> Vec<RecordBatch> {
    read(t, t.begin()).await.unwrap()
}

#[tokio::test]
async fn a_first_read_that_fails_empty_leaves_the_ticket_fresh() {
    let t = ticket();
    let first = t.begin();
    let joined = t.begin();
    let waiting = {
        let t = Arc::clone(&t);
        tokio::spawn(async move { read(&t, joined).await })
    };
    let err = Error::ResourceExhausted("budget".into());
    assert!(t.fail(&err));
    let joined = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(joined, Err(Error::ResourceExhausted(_))),
        "{joined:?}"
    );
    assert!(matches!(
        read(&t, first).await,
        Err(Error::ResourceExhausted(_))
    ));
    // The next reader receives.
    let again = t.begin();
    assert!(again.first);
    let (b, r) = rows(2);
    t.append(ReceivedRows::new(b, r, 2, Instant::now()))
        .unwrap();
    t.seal();
    assert_eq!(concat(&read(&t, again).await.unwrap()).num_rows(), 2);
}

#[tokio::test]
async fn a_first_read_that_fails_after_recording_is_sealed() {
    let t = ticket();
    let first = t.begin();
    let (b, r) = rows(2);
    t.append(ReceivedRows::new(b, r, 2, Instant::now()))
        .unwrap();
    assert!(!t.fail(&Error::Internal("boom".into())));
    assert_eq!(t.log().phase, Phase::Sealed);
    assert!(!t.begin().first);
    assert_eq!(concat(&read(&t, first).await.unwrap()).num_rows(), 2);
}

#[tokio::test]
async fn close_hands_over_receipts_and_refuses_more() {
    let t = ticket();
    let begin = t.begin();
    let (b, r) = rows(2);
    t.append(ReceivedRows::new(b, r, 2, Instant::now()))
        .unwrap();
    let receipts = t.close();
    assert_eq!(receipts.len(), 2);
    assert_eq!(t.usage.snapshot(), (0, 0));
    let (b, r) = rows(1);
    assert_eq!(
        t.append(ReceivedRows::new(b, r.clone(), 1, Instant::now())),
        Err(Closed(r))
    );
    assert!(!t.begin().first);
    assert_eq!(read(&t, begin).await.unwrap().len(), 0);
}

#[test]
fn the_oldest_sent_timestamp_is_kept_as_rows_are_recorded_and_dropped_at_close() {
    let t = ticket();
    t.begin();
    let sent = |ms: &[Option<i64>]| {
        let msgs: Vec<_> = ms
            .iter()
            .map(|&sent_timestamp| SqsMessage {
                message_id: "m".into(),
                body: "b".into(),
                sent_timestamp,
                ..Default::default()
            })
            .collect();
        let receipts = vec![ReceiptHandle::new("r".into()); msgs.len()];
        (messages_to_batch(&msgs, 1, 0).unwrap(), receipts)
    };
    assert_eq!(t.oldest_sent_ms(), None);
    let (b, r) = sent(&[None]);
    t.append(ReceivedRows::new(b, r, 1, Instant::now()))
        .unwrap();
    assert_eq!(t.oldest_sent_ms(), None, "no timestamp, no age");
    let (b, r) = sent(&[Some(500), Some(300), None]);
    t.append(ReceivedRows::new(b, r, 3, Instant::now()))
        .unwrap();
    let (b, r) = sent(&[Some(400)]);
    t.append(ReceivedRows::new(b, r, 1, Instant::now()))
        .unwrap();
    assert_eq!(t.oldest_sent_ms(), Some(300));
    t.seal();
    assert_eq!(t.oldest_sent_ms(), Some(300), "packing keeps it");
    t.close();
    assert_eq!(t.oldest_sent_ms(), None, "nothing held after close");
}

/// `b` with a `payload_error` column holding `errors`.
fn with_errors(b: RecordBatch, errors: Vec<Option<&str>>) -> RecordBatch {
    let mut fields = b.schema().fields().to_vec();
    fields.push(Arc::new(arrow_schema::Field::new(
        sqs_flight_schemas::payload::PAYLOAD_ERROR,
        arrow_schema::DataType::Utf8,
        true,
    )));
    let mut columns = b.columns().to_vec();
    columns.push(Arc::new(arrow_array::StringArray::from(errors)));
    let schema = Arc::new(arrow_schema::Schema::new(fields));
    RecordBatch::try_new(schema, columns).unwrap()
}

#[test]
fn pick_finds_ids_in_received_and_packed_rows_and_payload_errors_by_receive() {
    let t = ticket();
    let none = HashSet::new();
    let m1 = HashSet::from(["m1", "nope"]);
    assert_eq!(t.pick(&m1, true).unwrap(), Picked::default(), "never read");
    t.begin();
    let (b, r) = rows(3);
    t.append(ReceivedRows::new(
        with_errors(b, vec![None; 3]),
        r,
        3,
        Instant::now(),
    ))
    .unwrap();
    let (b, r) = rows(2);
    let b = with_errors(b, vec![None, Some("not JSON")]);
    t.append(ReceivedRows::new(b, r, 2, Instant::now()))
        .unwrap();
    for state in ["as received", "packed"] {
        let picked = t.pick(&m1, true).unwrap();
        // m1 is row 1 of each receive; row 1 of the second is row 4.
        assert_eq!(picked.rows, BTreeSet::from([1, 4]), "{state}");
        assert_eq!(picked.ids, HashSet::from(["m1".to_string()]), "{state}");
        assert_eq!(t.pick(&none, false).unwrap(), Picked::default());
        assert_eq!(t.pick(&none, true).unwrap().rows, BTreeSet::from([4]));
        t.seal();
        assert!(matches!(t.log().batches[0], LogRows::Packed(_)));
    }
}

#[tokio::test]
async fn due_chunks_and_extension() {
    let t = ticket();
    t.begin();
    let now = Instant::now();
    let (b, r) = rows(2);
    t.append(ReceivedRows::new(b, r, 2, now + Duration::from_secs(1)))
        .unwrap();
    assert_eq!(t.due(now).len(), 0);
    let due = t.due(now + Duration::from_secs(2));
    assert_eq!(due.len(), 1);
    assert_eq!(due[0].receipts.len(), 2);
    t.extended(0, now + Duration::from_secs(10));
    assert_eq!(t.due(now + Duration::from_secs(2)).len(), 0);
}
