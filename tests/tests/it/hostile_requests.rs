//! Requests built to make the server allocate what it was never sent:
//! each is refused with its status code, and the server answers the next
//! call (an authenticated ListFlights) as before.

use std::sync::Arc;

use arrow_array::{ArrayRef, DictionaryArray, RecordBatch, StringArray, types::Int32Type};
use arrow_flight::encode::{DictionaryHandling, FlightDataEncoderBuilder};
use arrow_flight::{Action, FlightData, FlightDescriptor, Ticket};
use arrow_ipc::CompressionType;
use arrow_ipc::writer::IpcWriteOptions;
use bytes::{Buf, BufMut, Bytes};
use futures::{TryStreamExt, stream};
use tonic::Code::{InvalidArgument, ResourceExhausted};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;

use sqs_flight_tests::prelude::*;

const TOKEN: &str = "s3cret";

/// A fixture whose server has a token, and whose client sends it.
async fn with_token(n: usize) -> Fixture {
    let sqs = sqs_flight_tests::moto::moto().client().await;
    let url = sqs_flight_tests::moto::create_queue(&sqs, "bomb", &[]).await;
    if n > 0 {
        let bodies = (0..n).map(|i| format!("m{i}"));
        sqs_flight_tests::moto::send_bodies(&sqs, &url, bodies).await;
    }
    let mut f = Fixture::serve(
        sqs,
        url,
        |_| {},
        |c| {
            c.auth_token = Some(TOKEN.into());
        },
    )
    .await;
    let bearer = format!("Bearer {TOKEN}");
    f.flight.add_header("authorization", &bearer).unwrap();
    f
}

/// The server still answers: ListFlights names table `t`.
async fn still_answers(f: &mut Fixture, after: &str) {
    let flights: Vec<_> = bounded(async {
        let infos = f.flight.list_flights(Bytes::new()).await?;
        infos.try_collect().await
    })
    .await
    .unwrap_or_else(|e| panic!("ListFlights after {after}: {e}"));
    assert_eq!(flights.len(), 1, "after {after}");
}

fn bodies(n: usize) -> RecordBatch {
    let bodies: ArrayRef = Arc::new(StringArray::from_iter_values(
        (0..n).map(|i| format!("bomb test message {i}")),
    ));
    RecordBatch::try_from_iter([("body", bodies)]).unwrap()
}

/// The DoPut messages of `batch` to table `t`, compressed with `codec`.
async fn put_messages(batch: RecordBatch, codec: Option<CompressionType>) -> Vec<FlightData> {
    let options = IpcWriteOptions::default()
        .try_with_compression(codec)
        .unwrap();
    FlightDataEncoderBuilder::new()
        .with_options(options)
        .with_dictionary_handling(DictionaryHandling::Resend)
        .with_flight_descriptor(Some(FlightDescriptor::new_path(vec!["t".into()])))
        .build(stream::iter([Ok(batch)]))
        .try_collect()
        .await
        .unwrap()
}

/// The record (or dictionary) batch header of an IPC message.
fn batch_header(header: &[u8]) -> arrow_ipc::RecordBatch<'_> {
    let message = arrow_ipc::root_as_message(header).unwrap();
    message
        .header_as_record_batch()
        .or_else(|| message.header_as_dictionary_batch()?.data())
        .expect("a batch message")
}

/// Writes `claim` as the uncompressed length of the last non-empty buffer
/// (the values, which the writer does compress).
fn lie_about_length(data: &mut FlightData, claim: i64) {
    let first = batch_header(&data.data_header)
        .buffers()
        .unwrap()
        .iter()
        .rfind(|b| b.length() > 0)
        .unwrap();
    let at = first.offset() as usize;
    let mut body = data.data_body.to_vec();
    body[at..at + 8].copy_from_slice(&claim.to_le_bytes());
    data.data_body = body.into();
}

/// Moves the second buffer of the batch to `offset` (in the header).
fn move_buffer(data: &mut FlightData, offset: i64) {
    let mut header = data.data_header.to_vec();
    let at = {
        let buffer = batch_header(&header).buffers().unwrap().get(1);
        buffer as *const _ as usize - header.as_ptr() as usize
    };
    header[at..at + 8].copy_from_slice(&offset.to_le_bytes());
    data.data_header = header.into();
}

fn is_dictionary(data: &FlightData) -> bool {
    arrow_ipc::root_as_message(&data.data_header)
        .map(|m| m.header_type() == arrow_ipc::MessageHeader::DictionaryBatch)
        .unwrap_or(false)
}

async fn put_raw(f: &mut Fixture, messages: Vec<FlightData>) -> Result<(), tonic::Status> {
    bounded(async {
        let results = f.flight.do_put(stream::iter(messages.into_iter().map(Ok)));
        let results = results.await.map_err(status)?;
        results.try_collect::<Vec<_>>().await.map_err(status)?;
        Ok(())
    })
    .await
}

#[tokio::test]
async fn doput_ipc_bombs_are_refused_and_honest_compression_still_sends() {
    let mut f = with_token(0).await;
    for codec in [CompressionType::ZSTD, CompressionType::LZ4_FRAME] {
        let honest = put_messages(bodies(50), Some(codec)).await;
        put_raw(&mut f, honest.clone())
            .await
            .unwrap_or_else(|e| panic!("honest {codec:?}: {e}"));

        let mut bomb = honest.clone();
        lie_about_length(&mut bomb[1], 1 << 46);
        let e = put_raw(&mut f, bomb).await.unwrap_err();
        assert_eq!(e.code(), ResourceExhausted, "{codec:?}: {e}");
        assert!(e.message().contains("max_request_bytes"), "{e}");
        still_answers(&mut f, "a lying compressed length").await;
    }
    assert_eq!(f.counts().await, (100, 0), "the honest batches, only them");

    let honest = put_messages(bodies(5), None).await;
    let body = honest[1].data_body.len() as i64;
    for offset in [body, -8, i64::MAX - 4] {
        let mut bomb = honest.clone();
        move_buffer(&mut bomb[1], offset);
        let e = put_raw(&mut f, bomb).await.unwrap_err();
        assert_eq!(e.code(), InvalidArgument, "offset {offset}: {e}");
        assert!(e.message().contains("outside"), "{e}");
        still_answers(&mut f, "a buffer outside the body").await;
    }

    let texts: Vec<String> = (0..100).map(|i| format!("value {i}")).collect();
    let values: DictionaryArray<Int32Type> = texts.iter().map(String::as_str).collect();
    let batch = RecordBatch::try_from_iter([("body", Arc::new(values) as ArrayRef)]).unwrap();
    let mut bomb = put_messages(batch, Some(CompressionType::ZSTD)).await;
    let dictionary = bomb.iter().position(is_dictionary).expect("a dictionary");
    lie_about_length(&mut bomb[dictionary], 1 << 46);
    let e = put_raw(&mut f, bomb).await.unwrap_err();
    assert_eq!(e.code(), ResourceExhausted, "{e}");
    still_answers(&mut f, "a huge dictionary").await;
    assert_eq!(f.counts().await, (100, 0), "nothing of the bombs was sent");
}

/// A commit body of `len` bytes or more: a reject list of short ids, the
/// document that costs most to hold as a `serde_json::Value`.
fn commit_of(len: usize) -> String {
    let ids = vec!["\"a\""; len / 4 + 1].join(",");
    format!(r#"{{"table":"t","batch":1,"reject":[{ids}]}}"#)
}

/// A commit body of exactly `len` bytes, with an unknown field to pad it.
fn padded(len: usize) -> String {
    let head = r#"{"table":"t","batch":1,"pad":""#;
    format!("{head}{}\"}}", "x".repeat(len - head.len() - 2))
}

#[tokio::test]
async fn commands_tickets_and_actions_over_max_command_bytes_are_refused_unparsed() {
    let mut f = with_token(2).await;
    let max = sqs_flight_server::config::DEFAULT_MAX_COMMAND_BYTES as usize;
    // Just above the cap: the handler's check names the size.
    let over = "x".repeat(max + 1);
    let over_cmd = FlightDescriptor::new_cmd(over.clone());
    let mut answers = vec![
        (
            "GetFlightInfo",
            bounded(f.flight.get_flight_info(over_cmd.clone()))
                .await
                .err(),
        ),
        (
            "GetSchema",
            bounded(f.flight.get_schema(over_cmd)).await.err(),
        ),
        (
            "DoGet",
            bounded(f.flight.do_get(Ticket::new(over.clone())))
                .await
                .err(),
        ),
    ];
    assert_eq!(padded(max + 1).len(), max + 1);
    let commit = f.action_raw("commit", &padded(max + 1)).await.err();
    for (rpc, e) in answers.drain(..) {
        let e = status(e.unwrap_or_else(|| panic!("{rpc} accepted it")));
        assert_eq!(e.code(), ResourceExhausted, "{rpc}: {e}");
        assert!(e.message().contains("max_command_bytes"), "{rpc}: {e}");
        still_answers(&mut f, rpc).await;
    }
    let e = commit.expect("refused");
    assert_eq!(e.code(), ResourceExhausted, "{e}");
    assert!(e.message().contains("above the limit"), "{e}");

    // 28 MiB: refused on its bytes as they come, before tonic decodes it.
    let huge = commit_of(28 << 20);
    let e = f.action_raw("commit", &huge).await.unwrap_err();
    assert_eq!(e.code(), ResourceExhausted, "{e}");
    assert!(
        e.message().contains("larger than this call may send"),
        "{e}"
    );
    assert!(e.message().contains("max_command_bytes"), "{e}");
    still_answers(&mut f, "a 28 MiB commit").await;

    // The largest legal commit (10,000 ids of 256 bytes) is parsed.
    let id = "i".repeat(250);
    let ids: Vec<String> = (0..10_000).map(|i| format!("{id}{i:06}")).collect();
    let legal = serde_json::json!({"table": "t", "batch": 1, "reject": ids}).to_string();
    assert!(legal.len() > 2_500_000, "{}", legal.len());
    let e = f.action_raw("commit", &legal).await.unwrap_err();
    assert_ne!(e.code(), ResourceExhausted, "{e}");
    assert!(e.message().contains("batch 1"), "refused as unplanned: {e}");
    assert_eq!(f.counts().await, (2, 0), "the queue is untouched");
}

#[tokio::test]
async fn a_large_handshake_is_refused_before_it_is_read_whole() {
    let mut f = with_token(0).await;
    let mut anonymous = f.server.client().await;
    let e = bounded(anonymous.handshake(vec![b'x'; 1 << 20]))
        .await
        .unwrap_err();
    let e = status(e);
    assert_eq!(e.code(), ResourceExhausted, "{e}");
    assert!(e.message().contains("max_handshake_bytes"), "{e}");
    still_answers(&mut f, "a 1 MiB Handshake").await;
    let token = bounded(anonymous.handshake(TOKEN))
        .await
        .expect("handshake");
    assert_eq!(token, TOKEN.as_bytes());
}

/// A gRPC codec that sends and receives bytes as they are: the message
/// is whatever the test says, protobuf or not.
#[derive(Debug, Clone, Copy, Default)]
struct Raw;

impl Codec for Raw {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = Raw;
    type Decoder = Raw;

    fn encoder(&mut self) -> Raw {
        Raw
    }

    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Bytes;
    type Error = tonic::Status;

    fn encode(&mut self, item: Bytes, buf: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        buf.put_slice(&item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Bytes;
    type Error = tonic::Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, tonic::Status> {
        Ok(Some(buf.copy_to_bytes(buf.remaining())))
    }
}

/// Calls `rpc` of the Flight service with `message` as its request (one
/// message for a streaming call); the status it ends with.
async fn raw_call(url: &str, rpc: &str, message: Bytes, token: bool) -> tonic::Status {
    let channel = tonic::transport::Endpoint::from_shared(url.replace("grpc://", "http://"))
        .unwrap()
        .connect()
        .await
        .expect("connect");
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("ready");
    let path: PathAndQuery = format!("/arrow.flight.protocol.FlightService/{rpc}")
        .parse()
        .unwrap();
    let mut request = tonic::Request::new(stream::iter([message]));
    if token {
        let bearer = format!("Bearer {TOKEN}").parse().unwrap();
        request.metadata_mut().insert("authorization", bearer);
    }
    let response = match grpc.streaming(request, path, Raw).await {
        Ok(r) => r.into_inner(),
        Err(e) => return e,
    };
    match response.map_ok(|_| ()).try_collect::<Vec<_>>().await {
        Ok(_) => tonic::Status::ok("the call succeeded"),
        Err(e) => e,
    }
}

#[tokio::test]
async fn malformed_protobuf_envelopes_are_invalid_argument() {
    let mut f = with_token(1).await;
    let url = f.server.url.clone();
    // Field 1 with wire type 7, which protobuf does not have.
    let garbage = Bytes::from_static(b"\x0f\x0f\x0f\x0f");
    let calls = [
        ("GetFlightInfo", true),
        ("GetSchema", true),
        ("DoGet", true),
        ("DoAction", true),
        ("ListFlights", true),
        ("PollFlightInfo", true),
        ("Handshake", false),
        ("DoPut", true),
    ];
    for (rpc, token) in calls {
        let e = bounded(raw_call(&url, rpc, garbage.clone(), token)).await;
        assert_eq!(e.code(), InvalidArgument, "{rpc}: {e}");
        assert!(!e.message().is_empty(), "{rpc}");
        still_answers(&mut f, rpc).await;
    }
    let action = Action::new("status", "{}");
    let answers: Vec<_> = bounded(async { f.flight.do_action(action).await?.try_collect().await })
        .await
        .expect("a well-formed action still works");
    assert_eq!(answers.len(), 1);
}
