//! What a DoPut makes the server hold, and for how long: a batch of
//! millions of tiny rows is converted a slice at a time, off the runtime,
//! as it is sent; a stream's schema is bounded and counted with every other
//! stream's; a stream that sends nothing ends. Other clients are answered
//! meanwhile, and the rows sent arrive once each.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::{ArrayRef, RecordBatch, StringArray};
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::{FlightClient, FlightData, FlightDescriptor, PutResult};
use arrow_schema::{DataType, Field, Schema};
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt, stream};
use sqs_flight_tests::moto;
use sqs_flight_tests::server_process::ServerProcess;
use sqs_flight_tests::server_process::status_kib;

use sqs_flight_tests::prelude::*;

/// How long another client's call may take while hostile calls run.
const PROMPT: Duration = Duration::from_secs(2);

/// The server of the demo table, with `extra` flags.
fn demo(extra: &[&str]) -> ServerProcess {
    let mut args = vec!["--listen", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    ServerProcess::start(&args)
}

/// One batch of `n` one-byte bodies.
fn tiny_rows(n: usize) -> RecordBatch {
    let bodies = StringArray::from_iter_values(std::iter::repeat_n("x", n));
    RecordBatch::try_from_iter([("body", Arc::new(bodies) as ArrayRef)]).unwrap()
}

/// The DoPut messages of `batches` to `table`, one message per batch (the
/// encoder would split them into messages of 2 MiB).
async fn put_messages(table: &str, batches: Vec<RecordBatch>) -> Vec<FlightData> {
    FlightDataEncoderBuilder::new()
        .with_max_flight_data_size(usize::MAX)
        .with_flight_descriptor(Some(FlightDescriptor::new_path(vec![table.into()])))
        .build(stream::iter(batches.into_iter().map(Ok)))
        .try_collect()
        .await
        .unwrap()
}

/// Sends `messages` on a DoPut of its own, then `then` (more messages, or
/// nothing and never an end); the PutResults as they come.
async fn open_put(
    url: &str,
    messages: Vec<FlightData>,
    then: BoxStream<'static, FlightData>,
) -> BoxStream<'static, Result<PutResult, tonic::Status>> {
    let mut flight = connect(url).await;
    let input = stream::iter(messages).chain(then).map(Ok);
    let results = bounded(flight.do_put(input)).await.map_err(status);
    match results {
        Ok(results) => {
            // The client's channel lives as long as the stream is read.
            let results = results.map_err(status);
            stream::unfold((results, flight), |(mut results, flight)| async move {
                let next = results.next().await?;
                Some((next, (results, flight)))
            })
            .boxed()
        }
        Err(e) => stream::iter([Err(e)]).boxed(),
    }
}

/// ListFlights on `flight`, answered within [`PROMPT`].
async fn answered_promptly(flight: &mut FlightClient, during: &str) {
    let started = Instant::now();
    let listed = tokio::time::timeout(PROMPT, async {
        let infos = flight.list_flights(bytes::Bytes::new()).await?;
        infos.try_collect::<Vec<_>>().await
    })
    .await;
    let waited = started.elapsed();
    match listed {
        Ok(Ok(infos)) => assert_eq!(infos.len(), 1, "the demo table, {during}"),
        Ok(Err(e)) => panic!("ListFlights failed {during}: {e}"),
        Err(_) => panic!("ListFlights waited more than {waited:?} {during}"),
    }
}

/// The error a DoPut's results end with.
async fn error_of(
    results: &mut BoxStream<'static, Result<PutResult, tonic::Status>>,
) -> tonic::Status {
    loop {
        match bounded(results.next()).await {
            Some(Ok(_)) => continue,
            Some(Err(e)) => return e,
            None => panic!("the DoPut ended without an error"),
        }
    }
}

/// A batch of a million and a half one-byte bodies (7 MiB on the wire) to a
/// queue that no longer exists: the first SendMessageBatch fails, and the
/// server stops converting. Converting the whole batch to messages first,
/// as the server once did, costs about 300 MiB.
#[tokio::test]
async fn a_put_of_many_tiny_rows_converts_as_it_sends() {
    let sqs = moto::moto().client().await;
    let url = moto::create_queue(&sqs, "tiny", &[]).await;
    let server = server_process_on_moto(&url, &["--sqs-max-attempts", "1"]);
    sqs.delete_queue().queue_url(&url).send().await.unwrap();
    let messages = put_messages("t", vec![tiny_rows(1_500_000)]).await;
    let before = status_kib(server.pid(), "VmHWM:");
    let mut results = open_put(&server.url, messages, stream::empty().boxed()).await;
    let e = error_of(&mut results).await;
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e}");
    assert!(e.message().contains("0 rows were sent"), "{e}");
    let grown = status_kib(server.pid(), "VmHWM:").saturating_sub(before) / 1024;
    assert!(
        grown < 100,
        "the server's peak memory grew by {grown} MiB for a batch it could not send"
    );
}

/// Four calls each converting two million one-byte rows at once (each
/// refused whole by `max_put_bytes` once measured) leave the runtime free:
/// another client's ListFlights is answered promptly throughout, and the
/// server's peak memory stays far below what the messages would take.
#[tokio::test]
async fn other_clients_are_answered_while_puts_convert_millions_of_rows() {
    let server = demo(&["--max-put-bytes", "1000000"]);
    let mut other = connect(&server.url).await;
    answered_promptly(&mut other, "before the puts").await;
    let messages = put_messages("demo", vec![tiny_rows(2_000_000)]).await;
    let before = status_kib(server.pid(), "VmHWM:");
    let mut puts = Vec::new();
    for _ in 0..4 {
        let messages = messages.clone();
        let url = server.url.clone();
        puts.push(tokio::spawn(async move {
            let mut results = open_put(&url, messages, stream::empty().boxed()).await;
            error_of(&mut results).await
        }));
    }
    while !puts.iter().all(|p| p.is_finished()) {
        answered_promptly(&mut other, "while the puts convert").await;
        // Pacing, not a wait: another client's call every 100 ms.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for put in puts {
        let e = put.await.unwrap();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e}");
        assert_eq!(reason(&e), Some("limit:max_put_bytes"), "{e}");
    }
    let grown = status_kib(server.pid(), "VmHWM:").saturating_sub(before) / 1024;
    assert!(grown < 200, "the server's peak memory grew by {grown} MiB");
    answered_promptly(&mut other, "after the puts").await;
}

/// A batch whose schema carries `pad` bytes of metadata.
fn padded(pad: usize) -> RecordBatch {
    let metadata = [("pad".to_string(), "p".repeat(pad))].into();
    let schema =
        Schema::new(vec![Field::new("body", DataType::Utf8, false)]).with_metadata(metadata);
    let bodies = StringArray::from(vec!["held"]);
    RecordBatch::try_new(Arc::new(schema), vec![Arc::new(bodies)]).unwrap()
}

/// A schema above `max_put_schema_bytes` is refused; streams that hold
/// schemas (sent with a row, then waiting) count against
/// `max_put_held_bytes` until they end, here by `put_idle_timeout`.
#[tokio::test]
async fn schemas_are_bounded_and_counted_until_their_stream_ends() {
    let kib = |n: u64| (n << 10).to_string();
    let server = demo(&[
        "--max-put-schema-bytes",
        &kib(1024),
        "--max-put-held-bytes",
        &kib(2048),
        "--put-idle-timeout",
        "3",
    ]);
    let mut other = connect(&server.url).await;
    let too_big = put_messages("demo", vec![padded(1100 << 10)]).await;
    let e = error_of(&mut open_put(&server.url, too_big, stream::empty().boxed()).await).await;
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e}");
    assert_eq!(reason(&e), Some("limit:max_put_schema_bytes"), "{e}");

    // Two streams hold a schema of 900 KiB each, and wait.
    let held = put_messages("demo", vec![padded(900 << 10)]).await;
    let mut waiting = Vec::new();
    for _ in 0..2 {
        let mut results = open_put(&server.url, held.clone(), stream::pending().boxed()).await;
        let first = bounded(results.next()).await.expect("a PutResult");
        first.expect("the row is sent");
        waiting.push(results);
    }
    let e =
        error_of(&mut open_put(&server.url, held.clone(), stream::pending().boxed()).await).await;
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e}");
    assert_eq!(reason(&e), Some("limit:max_put_held_bytes"), "{e}");
    answered_promptly(&mut other, "while schemas are held").await;

    // Idle past put_idle_timeout, they end, and give back what they held.
    for mut results in waiting {
        let e = error_of(&mut results).await;
        assert_eq!(e.code(), tonic::Code::DeadlineExceeded, "{e}");
        assert_eq!(reason(&e), Some("limit:put_idle_timeout"), "{e}");
    }
    let sent = open_put(&server.url, held, stream::empty().boxed()).await;
    let sent: Vec<_> = bounded(sent.collect()).await;
    assert!(matches!(sent.as_slice(), [Ok(_)]), "{sent:?}");
}

/// A DoPut that sends nothing, or stops sending, ends with
/// DEADLINE_EXCEEDED naming `put_idle_timeout`, after the rows it sent.
#[tokio::test]
async fn an_idle_put_stream_ends_with_put_idle_timeout() {
    let server = demo(&["--put-idle-timeout", "1"]);
    let mut silent = open_put(&server.url, Vec::new(), stream::pending().boxed()).await;
    let e = error_of(&mut silent).await;
    assert_eq!(e.code(), tonic::Code::DeadlineExceeded, "{e}");
    assert_eq!(reason(&e), Some("limit:put_idle_timeout"), "{e}");
    assert!(e.message().contains("put_idle_timeout"), "{e}");

    let one_row = put_messages("demo", vec![tiny_rows(1)]).await;
    let mut stalled = open_put(&server.url, one_row, stream::pending().boxed()).await;
    let first = bounded(stalled.next()).await.expect("a PutResult");
    first.expect("the row is sent");
    let e = error_of(&mut stalled).await;
    assert_eq!(e.code(), tonic::Code::DeadlineExceeded, "{e}");
    assert_eq!(reason(&e), Some("limit:put_idle_timeout"), "{e}");
    assert!(e.message().contains("1 rows were sent before"), "{e}");
}

/// A client that sends batches and reads none of the PutResults (its
/// window for them is a few bytes) stops its stream's writer: past
/// `put_idle_timeout` the writer ends and gives back the schema it held,
/// so another stream's schema fits in `max_put_held_bytes` again.
#[tokio::test]
async fn a_put_whose_answers_are_not_read_gives_back_what_it_held() {
    let kib = |n: u64| (n << 10).to_string();
    let server = demo(&[
        "--max-put-schema-bytes",
        &kib(1024),
        "--max-put-held-bytes",
        &kib(1100),
        "--put-idle-timeout",
        "2",
    ]);
    let channel = tonic::transport::Endpoint::from_shared(server.url.replace("grpc://", "http://"))
        .unwrap()
        .initial_stream_window_size(Some(32))
        .connect()
        .await
        .expect("connect");
    let mut deaf = FlightClient::new(channel);
    let mut batches = vec![padded(900 << 10)];
    batches.extend(std::iter::repeat_with(|| tiny_rows(1)).take(64));
    let messages = put_messages("demo", batches).await;
    let input = stream::iter(messages).chain(stream::pending()).map(Ok);
    let unread = bounded(deaf.do_put(input)).await.expect("the DoPut starts");
    // The held schema leaves no room for another stream's...
    let held = put_messages("demo", vec![padded(900 << 10)]).await;
    let try_put = async || {
        let results = open_put(&server.url, held.clone(), stream::empty().boxed()).await;
        bounded(results.collect::<Vec<_>>()).await
    };
    let first = try_put().await;
    let refused = first.first().and_then(|r| r.as_ref().err());
    assert!(
        refused.is_some_and(|e| reason(e) == Some("limit:max_put_held_bytes")),
        "{first:?}"
    );
    // ...until the writer that cannot answer gives up.
    let fits = poll(Duration::from_secs(15), try_put, |r: &Vec<_>| {
        matches!(r.as_slice(), [Ok(_)])
    });
    let answer = fits.await;
    assert!(
        answer.is_ok(),
        "the unread stream still holds its schema: {answer:?}"
    );
    drop(unread);
}

/// Rows of 30 KiB fill more than one slice of 8 MiB: every row before the
/// bad one arrives once, none after it.
#[tokio::test]
async fn rows_over_several_slices_arrive_once_each() {
    let mut f = Fixture::standard(0).await;
    let body = |i: usize| format!("{i:05}-{}", "b".repeat(30 << 10));
    let mut bodies: Vec<String> = (0..300).map(body).collect();
    bodies[290] = String::new();
    let first = RecordBatch::try_from_iter([(
        "body",
        Arc::new(StringArray::from_iter_values(
            (0..50).map(|i| format!("small-{i}")),
        )) as ArrayRef,
    )])
    .unwrap();
    let second =
        RecordBatch::try_from_iter([("body", Arc::new(StringArray::from(bodies)) as ArrayRef)])
            .unwrap();
    let e = f.put(vec![first, second]).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    assert!(e.message().contains("row 340: body is empty"), "{e}");
    assert!(e.message().contains("340 rows were sent"), "{e}");
    let received = sqs_flight_tests::sqs::drain_visible(&f.sqs, &f.queue_url).await;
    let mut got: Vec<String> = received.into_iter().filter_map(|m| m.body).collect();
    got.sort();
    let mut expected: Vec<String> = (0..50).map(|i| format!("small-{i}")).collect();
    expected.extend((0..290).map(body));
    expected.sort();
    assert_eq!(got.len(), expected.len(), "each row once");
    assert!(got == expected, "the rows before the bad one, each once");
}

/// The embedded demo table lives in the server's memory: a DoPut of more
/// one-byte rows than it holds (inside every DoPut limit) fills it to its
/// cap and then fails UNAVAILABLE saying it is full and how many rows were
/// sent, instead of growing the server by about 580 B a message.
#[tokio::test]
async fn the_demo_queue_refuses_messages_past_its_cap() {
    let server = demo(&[]);
    let mut other = connect(&server.url).await;
    let messages = put_messages("demo", vec![tiny_rows(400_000)]).await;
    let before = status_kib(server.pid(), "VmHWM:");
    let mut results = open_put(&server.url, messages, stream::empty().boxed()).await;
    let e = error_of(&mut results).await;
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e}");
    assert!(e.message().contains("is full"), "{e}");
    // The demo table starts with 20 sample messages.
    let sent = 250_000 - 20;
    assert!(e.message().contains(&format!("{sent} rows")), "{e}");
    let grown = status_kib(server.pid(), "VmHWM:").saturating_sub(before) / 1024;
    assert!(grown < 300, "the server's peak memory grew by {grown} MiB");
    answered_promptly(&mut other, "after the put").await;
}
