//! Honest messages pass and decode; each kind of lie is refused before
//! decoding. The lies are made by patching messages arrow's own writer made.

use std::sync::Arc;

use arrow_array::{ArrayRef, DictionaryArray, RecordBatch, StringArray, types::Int32Type};
use arrow_flight::encode::{DictionaryHandling, FlightDataEncoderBuilder};
use arrow_flight::{FlightData, decode::FlightRecordBatchStream};
use arrow_ipc::writer::IpcWriteOptions;
use futures::{TryStreamExt, stream};

use super::*;

/// A bound well above the test batches.
const MAX: u64 = 1 << 20;

fn bodies(n: usize) -> RecordBatch {
    let bodies: ArrayRef =
        Arc::new(StringArray::from_iter_values((0..n).map(|i| {
            format!("message number {i}, the same text again and again")
        })));
    RecordBatch::try_from_iter([("body", bodies)]).unwrap()
}

/// The FlightData arrow-flight's encoder makes of `batch` (schema first).
fn encode(batch: &RecordBatch, codec: Option<CompressionType>) -> Vec<FlightData> {
    let options = IpcWriteOptions::default()
        .try_with_compression(codec)
        .unwrap();
    let encoded = FlightDataEncoderBuilder::new()
        .with_options(options)
        .with_dictionary_handling(DictionaryHandling::Resend)
        .build(stream::iter([Ok(batch.clone())]));
    futures::executor::block_on(encoded.try_collect()).unwrap()
}

fn check_all(messages: &[FlightData]) -> Result<(), IpcError> {
    let mut bounds = IpcBounds::new(MAX, 1000);
    messages.iter().try_for_each(|m| bounds.check(m))
}

fn decode(messages: Vec<FlightData>) -> Vec<RecordBatch> {
    let input = stream::iter(messages.into_iter().map(Ok));
    let batches = FlightRecordBatchStream::new_from_flight_data(input);
    futures::executor::block_on(batches.try_collect()).unwrap()
}

/// Where the struct `inner` (found in `header` by the flatbuffer reader)
/// starts in `header`.
fn position_of<T>(header: &[u8], inner: &T) -> usize {
    inner as *const T as usize - header.as_ptr() as usize
}

/// Rewrites two i64s of the header struct `pick` finds (a Buffer's
/// offset and length, a FieldNode's length and null count).
fn patch_header<T>(
    data: &mut FlightData,
    pick: impl Fn(arrow_ipc::RecordBatch<'_>) -> &T,
    values: [i64; 2],
) {
    let mut header = data.data_header.to_vec();
    let at = {
        let message = arrow_ipc::root_as_message(&header).unwrap();
        let batch = message
            .header_as_record_batch()
            .or_else(|| message.header_as_dictionary_batch()?.data())
            .unwrap();
        position_of(&header, pick(batch))
    };
    header[at..at + 8].copy_from_slice(&values[0].to_le_bytes());
    header[at + 8..at + 16].copy_from_slice(&values[1].to_le_bytes());
    data.data_header = header.into();
}

/// Sets the claimed uncompressed length of the last non-empty buffer (the
/// values, which the writer does compress).
fn lie_about_length(data: &mut FlightData, claim: i64) {
    let message = arrow_ipc::root_as_message(&data.data_header).unwrap();
    let batch = message
        .header_as_record_batch()
        .or_else(|| message.header_as_dictionary_batch()?.data())
        .unwrap();
    let last = batch.buffers().unwrap().iter().rfind(|b| b.length() > 0);
    let at = last.unwrap().offset() as usize;
    let mut body = data.data_body.to_vec();
    body[at..at + 8].copy_from_slice(&claim.to_le_bytes());
    data.data_body = body.into();
}

#[test]
fn honest_compressed_batches_pass_and_decode() {
    for codec in [
        None,
        Some(CompressionType::ZSTD),
        Some(CompressionType::LZ4_FRAME),
    ] {
        let batch = bodies(100);
        let messages = encode(&batch, codec);
        assert_eq!(check_all(&messages), Ok(()), "{codec:?}");
        assert_eq!(decode(messages), [batch], "{codec:?}");
    }
}

#[test]
fn a_lying_uncompressed_length_is_refused_before_decoding() {
    for codec in [CompressionType::ZSTD, CompressionType::LZ4_FRAME] {
        let mut messages = encode(&bodies(100), Some(codec));
        lie_about_length(&mut messages[1], 1 << 46);
        match check_all(&messages) {
            Err(IpcError::TooLarge { message: m, .. }) => {
                assert!(m.contains("max_request_bytes"), "{m}")
            }
            other => panic!("{codec:?}: {other:?}"),
        }
        lie_about_length(&mut messages[1], -2);
        assert!(matches!(check_all(&messages), Err(IpcError::Malformed(_))));
    }
}

#[test]
fn claims_add_up_over_the_buffers_of_a_batch() {
    let messages = encode(&bodies(1000), Some(CompressionType::ZSTD));
    let mut bounds = IpcBounds::new(1000, 1000);
    bounds.check(&messages[0]).unwrap();
    match bounds.check(&messages[1]) {
        Err(IpcError::TooLarge { message: m, .. }) => {
            assert!(m.contains("above the limit of 1000"), "{m}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_lz4_frame_longer_than_its_claim_is_refused() {
    let mut messages = encode(&bodies(100), Some(CompressionType::LZ4_FRAME));
    lie_about_length(&mut messages[1], 10);
    match check_all(&messages) {
        Err(IpcError::Malformed(m)) => assert!(m.contains("more than the 10 bytes"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn buffers_outside_the_body_are_refused() {
    let honest = encode(&bodies(10), None);
    let body = honest[1].data_body.len() as i64;
    for (offset, length) in [(body, 1), (0, body + 1), (-8, 8), (0, -1), (i64::MAX, 1)] {
        let mut messages = honest.clone();
        patch_header(
            &mut messages[1],
            |b| b.buffers().unwrap().get(1),
            [offset, length],
        );
        match check_all(&messages) {
            Err(IpcError::Malformed(m)) => assert!(m.contains("outside"), "{m}"),
            other => panic!("({offset}, {length}): {other:?}"),
        }
    }
}

#[test]
fn node_claims_are_bounded() {
    let honest = encode(&bodies(10), None);
    for (length, nulls, too_large) in [(-1, 0, false), (5, 6, false), (1 << 40, 0, true)] {
        let mut messages = honest.clone();
        patch_header(
            &mut messages[1],
            |b| b.nodes().unwrap().get(0),
            [length, nulls],
        );
        let e = check_all(&messages).unwrap_err();
        assert_eq!(matches!(e, IpcError::TooLarge { .. }), too_large, "{e:?}");
    }
}

#[test]
fn batches_of_more_rows_than_a_put_may_send_are_refused() {
    let messages = encode(&bodies(10), None);
    let mut bounds = IpcBounds::new(MAX, 9);
    bounds.check(&messages[0]).unwrap();
    match bounds.check(&messages[1]) {
        Err(IpcError::TooLarge { message: m, .. }) => assert!(m.contains("max_put_rows"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn dictionaries_are_bounded_one_by_one_and_in_all() {
    let texts: Vec<String> = (0..100).map(|i| format!("value {i}")).collect();
    let values: DictionaryArray<Int32Type> = texts.iter().map(String::as_str).collect();
    let batch = RecordBatch::try_from_iter([("d", Arc::new(values) as ArrayRef)]).unwrap();
    let messages = encode(&batch, Some(CompressionType::ZSTD));
    let dictionary = messages
        .iter()
        .position(|m| {
            arrow_ipc::root_as_message(&m.data_header)
                .unwrap()
                .header_type()
                == MessageHeader::DictionaryBatch
        })
        .expect("the encoder sends the dictionary");
    assert_eq!(check_all(&messages), Ok(()));

    let mut lying = messages.clone();
    lie_about_length(&mut lying[dictionary], 1 << 46);
    assert!(matches!(check_all(&lying), Err(IpcError::TooLarge { .. })));

    // The same honest dictionary again and again: in all, over the bound.
    let mut bounds = IpcBounds::new(4096, 1000);
    let refused = std::iter::repeat_n(&messages[dictionary], 1000)
        .map(|m| bounds.check(m))
        .find_map(Result::err);
    match refused {
        Some(IpcError::TooLarge { message: m, .. }) => assert!(m.contains("dictionaries"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn garbage_headers_are_refused_and_empty_ones_left_to_arrow() {
    let mut bounds = IpcBounds::new(MAX, 1000);
    let garbage = FlightData {
        data_header: vec![0xff; 40].into(),
        ..FlightData::default()
    };
    assert!(matches!(
        bounds.check(&garbage),
        Err(IpcError::Malformed(_))
    ));
    assert_eq!(bounds.check(&FlightData::default()), Ok(()));
}

/// A schema message of `body` whose metadata holds `pad` bytes.
fn schema_message(pad: usize) -> FlightData {
    let metadata = [("pad".to_string(), "x".repeat(pad))].into();
    let schema = arrow_schema::Schema::new(vec![arrow_schema::Field::new(
        "body",
        arrow_schema::DataType::Utf8,
        true,
    )])
    .with_metadata(metadata);
    arrow_flight::SchemaAsIpc::new(&schema, &IpcWriteOptions::default()).into()
}

fn refused_for(result: Result<(), IpcError>) -> &'static str {
    match result {
        Err(IpcError::TooLarge { limit, .. }) => limit,
        other => panic!("not refused for a limit: {other:?}"),
    }
}

#[test]
fn a_schema_above_its_limit_is_refused_before_decoding() {
    let schema = schema_message(5000);
    let size = schema.data_header.len() as u64;
    let budget = HeldBudget::new(u64::MAX);
    let mut bounds = IpcBounds::new(MAX, 1000).with_held(Arc::clone(&budget), size - 1);
    assert_eq!(refused_for(bounds.check(&schema)), "max_put_schema_bytes");
    assert_eq!(budget.used(), 0, "nothing held for a refused schema");
    let mut bounds = IpcBounds::new(MAX, 1000).with_held(Arc::clone(&budget), size);
    assert_eq!(bounds.check(&schema), Ok(()));
}

#[test]
fn schemas_held_by_open_streams_share_one_budget() {
    let schema = schema_message(5000);
    let size = schema.data_header.len() as u64;
    let budget = HeldBudget::new(2 * size + size / 2);
    let open = || IpcBounds::new(MAX, 1000).with_held(Arc::clone(&budget), MAX);
    let (mut one, mut two, mut three) = (open(), open(), open());
    assert_eq!(one.check(&schema), Ok(()));
    assert_eq!(two.check(&schema), Ok(()));
    assert_eq!(budget.used(), 2 * size);
    assert_eq!(refused_for(three.check(&schema)), "max_put_held_bytes");
    drop(one);
    assert_eq!(
        budget.used(),
        size,
        "a stream that ends gives back what it held"
    );
    assert_eq!(three.check(&schema), Ok(()));
    drop((two, three));
    assert_eq!(budget.used(), 0);
}

#[test]
fn one_stream_holds_at_most_max_request_bytes_of_schemas() {
    let schema = schema_message(5000);
    let size = schema.data_header.len() as u64;
    let mut bounds = IpcBounds::new(2 * size - 1, 1000);
    assert_eq!(bounds.check(&schema), Ok(()));
    // A second schema on the same stream: held with the first.
    assert_eq!(refused_for(bounds.check(&schema)), "max_request_bytes");
}
