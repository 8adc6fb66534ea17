//! A Flight SQL result as the FlightData messages of its DoGet, made in
//! the SQL worker ([`super::worker`]) and relayed by the server as they
//! are ([`super::child`]): the server never decodes, expands or re-encodes
//! a result, so what it holds for a statement is the message or two in
//! flight, whatever the query makes.
//!
//! The messages are those of an Arrow IPC stream: first the schema
//! (exactly the planned one), then for each batch the dictionaries it uses
//! that were not sent yet (a dictionary goes out once, and again only when
//! a batch brings a different one: arrow-ipc's `DictionaryTracker`, as its
//! stream writer does), then the batch, sliced by rows into messages of
//! about [`TARGET_MESSAGE`] bytes. arrow-flight's encoder would instead
//! expand a dictionary column to rows x value bytes (its default,
//! `Hydrate`), or send the dictionary again with every slice (`Resend`). A
//! slice of a view column (`Utf8View`, `BinaryView`, also inside a struct
//! or a list) is compacted first when its data buffers hold more than its
//! rows use: as it is, it would carry every data buffer of the whole
//! column, once per slice.
//!
//! One message may not pass [`MAX_MESSAGE`] (a gRPC message, less the
//! FlightData's own fields): a row or a dictionary larger than that is
//! [`FrameError::RowTooLarge`] or [`FrameError::DictionaryTooLarge`],
//! which the worker answers as RESOURCE_EXHAUSTED.
//!
//! Between worker and server a message is one [`super::frame::Kind::Flight`]
//! frame: `[header length u32 LE][IPC message header][IPC body]`.

use std::collections::VecDeque;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::ByteViewType;
use arrow_array::{
    Array, ArrayRef, GenericByteViewArray, GenericListArray, OffsetSizeTrait, RecordBatch,
    RecordBatchOptions, StructArray,
};
use arrow_flight::FlightData;
use arrow_ipc::MetadataVersion;
use arrow_ipc::writer::{
    DictionaryTracker, EncodedData, IpcDataGenerator, IpcWriteContext, IpcWriteOptions,
};
use arrow_schema::{ArrowError, DataType, SchemaRef};
use bytes::{Buf, Bytes};
use datafusion::arrow::buffer::{OffsetBuffer, ScalarBuffer};

use super::frame::{FrameError, Kind};

/// Bytes a result message aims at: arrow-flight's target (2 MiB, half
/// the 4 MiB that gRPC clients accept by default), so that clients which
/// read its encoder's messages read these.
pub(crate) const TARGET_MESSAGE: usize = arrow_flight::encode::GRPC_TARGET_MAX_FLIGHT_SIZE_BYTES;
/// Most bytes of one result message (IPC header and body): the server's
/// gRPC message size, less [`FLIGHT_DATA_FIELDS`].
pub(crate) const MAX_MESSAGE: usize = crate::server::MAX_MESSAGE_SIZE - FLIGHT_DATA_FIELDS;
/// Room for a FlightData's protobuf field tags and lengths around its
/// header and body (a few bytes are used).
const FLIGHT_DATA_FIELDS: usize = 1024;
/// Bytes of the header length in front of a message's frame.
const LENGTH: usize = 4;

/// The IPC options of result messages: buffers aligned to 8 bytes, as the
/// plain DoGet's (`flight::do_get::encoder`) and Arrow C++ write them.
fn options() -> IpcWriteOptions {
    IpcWriteOptions::try_new(8, false, MetadataVersion::V5).unwrap_or_default()
}

/// Encodes the batches of one result, in order, into frame payloads.
pub(crate) struct ResultEncoder {
    /// Bytes a message aims at ([`TARGET_MESSAGE`]).
    target: usize,
    /// Most bytes of a message ([`MAX_MESSAGE`]).
    max: usize,
    schema: SchemaRef,
    tracker: DictionaryTracker,
    options: IpcWriteOptions,
    generator: IpcDataGenerator,
    context: IpcWriteContext,
}

impl ResultEncoder {
    /// An encoder of batches of `schema`, and the result's first message:
    /// the schema.
    pub(crate) fn new(schema: SchemaRef) -> (Self, Vec<u8>) {
        Self::with_sizes(schema, TARGET_MESSAGE, MAX_MESSAGE)
    }

    /// [`Self::new`] with other message sizes (the tests' small ones).
    fn with_sizes(schema: SchemaRef, target: usize, max: usize) -> (Self, Vec<u8>) {
        let mut encoder = Self {
            target,
            max,
            schema,
            tracker: DictionaryTracker::new(false),
            options: options(),
            generator: IpcDataGenerator::default(),
            context: IpcWriteContext::default(),
        };
        let message = encoder.generator.schema_to_bytes_with_dictionary_tracker(
            &encoder.schema,
            &mut encoder.tracker,
            &encoder.options,
        );
        (encoder, payload(message))
    }

    /// The messages of `batch` (which has the encoder's schema), made one
    /// slice at a time as they are taken.
    pub(crate) fn messages(&mut self, batch: &RecordBatch) -> Messages<'_> {
        let slices = slices(batch, self.target);
        Messages {
            encoder: self,
            slices,
            ready: VecDeque::new(),
        }
    }

    /// Encodes `slice`: its new dictionaries and its rows into `ready`, or
    /// its two halves back into `slices` when it is over the target size
    /// and has more than a row.
    fn encode(
        &mut self,
        slice: RecordBatch,
        slices: &mut VecDeque<RecordBatch>,
        ready: &mut VecDeque<Vec<u8>>,
    ) -> Result<(), FrameError> {
        let slice = compact(&slice)?;
        let (dictionaries, rows) =
            self.generator
                .encode(&slice, &mut self.tracker, &self.options, &mut self.context)?;
        // Sent whatever happens to the rows: the tracker counts them sent.
        for dictionary in dictionaries {
            let bytes = size(&dictionary);
            if bytes > self.max {
                return Err(FrameError::DictionaryTooLarge {
                    bytes,
                    cap: self.max,
                });
            }
            ready.push_back(payload(dictionary));
        }
        let (bytes, n) = (size(&rows), slice.num_rows());
        if bytes <= self.target || (n == 1 && bytes <= self.max) {
            ready.push_back(payload(rows));
            return Ok(());
        }
        if n <= 1 {
            return Err(FrameError::RowTooLarge {
                bytes,
                cap: self.max,
            });
        }
        let half = n / 2;
        slices.push_front(slice.slice(half, n - half));
        slices.push_front(slice.slice(0, half));
        Ok(())
    }
}

/// The messages of one batch, as frame payloads ([`ResultEncoder::messages`]).
pub(crate) struct Messages<'a> {
    encoder: &'a mut ResultEncoder,
    slices: VecDeque<RecordBatch>,
    ready: VecDeque<Vec<u8>>,
}

impl Iterator for Messages<'_> {
    type Item = Result<Vec<u8>, FrameError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(message) = self.ready.pop_front() {
                return Some(Ok(message));
            }
            let slice = self.slices.pop_front()?;
            if let Err(e) = self
                .encoder
                .encode(slice, &mut self.slices, &mut self.ready)
            {
                self.slices.clear();
                return Some(Err(e));
            }
        }
    }
}

/// Bytes of an encoded message: its header and body.
fn size(message: &EncodedData) -> usize {
    message.ipc_message.len() + message.arrow_data.len()
}

/// A message as the payload of a [`Kind::Flight`] frame.
fn payload(message: EncodedData) -> Vec<u8> {
    let header = message.ipc_message.len();
    let mut out = Vec::with_capacity(LENGTH + header + message.arrow_data.len());
    // A header is a flatbuffer of the schema or of a batch's buffers: far
    // below 4 GiB (the frame itself is at most 64 MiB).
    out.extend_from_slice(&(header as u32).to_le_bytes());
    out.extend_from_slice(&message.ipc_message);
    drop(message.ipc_message);
    out.extend_from_slice(&message.arrow_data);
    out
}

/// The FlightData of a [`Kind::Flight`] frame's payload, sharing its
/// bytes (nothing is copied).
pub(crate) fn flight_data(payload: Vec<u8>) -> Result<FlightData, FrameError> {
    let mut bytes = Bytes::from(payload);
    if bytes.len() < LENGTH {
        return Err(malformed("shorter than its header length"));
    }
    let header = bytes.get_u32_le() as usize;
    if header > bytes.len() {
        return Err(malformed("its header length is past its end"));
    }
    let data_header = bytes.split_to(header);
    Ok(FlightData {
        data_header,
        data_body: bytes,
        ..Default::default()
    })
}

fn malformed(what: &str) -> FrameError {
    FrameError::Malformed(Kind::Flight, what.into())
}

/// `batch` cut by rows into slices of about `target` bytes each, by an
/// estimate of each column's bytes (a dictionary counts its keys only, a
/// view column the bytes its rows use). A slice found larger once encoded
/// is halved then ([`ResultEncoder::encode`]).
fn slices(batch: &RecordBatch, target: usize) -> VecDeque<RecordBatch> {
    let rows = batch.num_rows();
    if rows == 0 {
        return VecDeque::new();
    }
    let bytes: usize = batch.columns().iter().map(|c| estimate(c.as_ref())).sum();
    let pieces = bytes.div_ceil(target.max(1)).clamp(1, rows);
    let per = rows.div_ceil(pieces);
    (0..rows)
        .step_by(per)
        .map(|at| batch.slice(at, per.min(rows - at)))
        .collect()
}

/// About the bytes `array` takes as Arrow IPC (its dictionary's values
/// aside: they go in a message of their own).
fn estimate(array: &dyn Array) -> usize {
    match array.data_type() {
        DataType::Dictionary(_, _) => estimate(array.as_any_dictionary().keys()),
        DataType::Utf8View => view_bytes(array.as_string_view()),
        DataType::BinaryView => view_bytes(array.as_binary_view()),
        _ => {
            let data = array.to_data();
            data.get_slice_memory_size()
                .unwrap_or_else(|_| array.get_buffer_memory_size())
        }
    }
}

/// About the bytes of a view array as IPC: 16 a view, and the bytes of
/// the values longer than the 12 a view holds inline, or of its data
/// buffers when they hold less (rows that share values).
fn view_bytes<T: ByteViewType + ?Sized>(array: &GenericByteViewArray<T>) -> usize {
    let held: usize = array.data_buffers().iter().map(|b| b.len()).sum();
    16 * array.len() + outside(array.views()).min(held)
}

/// Bytes of the values of `views` that are not inline (longer than 12).
fn outside(views: &[u128]) -> usize {
    views
        .iter()
        .map(|v| *v as u32 as usize)
        .filter(|&n| n > 12)
        .sum()
}

/// `slice` with its view columns compacted (see [`compact_array`]).
fn compact(slice: &RecordBatch) -> Result<RecordBatch, ArrowError> {
    if !slice.columns().iter().any(|c| has_view(c.data_type())) {
        return Ok(slice.clone());
    }
    let columns = slice.columns().iter().map(compact_array).collect();
    let options = RecordBatchOptions::new().with_row_count(Some(slice.num_rows()));
    RecordBatch::try_new_with_options(slice.schema(), columns, &options)
}

/// Whether `data_type` has a view type where [`compact_array`] looks:
/// itself, or inside structs and lists.
fn has_view(data_type: &DataType) -> bool {
    match data_type {
        DataType::Utf8View | DataType::BinaryView => true,
        DataType::Struct(fields) => fields.iter().any(|f| has_view(f.data_type())),
        DataType::List(field) | DataType::LargeList(field) => has_view(field.data_type()),
        _ => false,
    }
}

/// `array` with every view array in it (itself, or a struct's or a
/// list's child) holding only the bytes of its own rows: a sliced view
/// array keeps every data buffer of the whole, and IPC writes them all.
/// Other types are left as they are (a message's size is checked all the
/// same).
fn compact_array(array: &ArrayRef) -> ArrayRef {
    match array.data_type() {
        DataType::Utf8View if wasteful(array.as_string_view()) => {
            Arc::new(array.as_string_view().gc())
        }
        DataType::BinaryView if wasteful(array.as_binary_view()) => {
            Arc::new(array.as_binary_view().gc())
        }
        DataType::Struct(_) if has_view(array.data_type()) => {
            let s = array.as_struct();
            let columns = s.columns().iter().map(compact_array).collect();
            match StructArray::try_new(s.fields().clone(), columns, s.nulls().cloned()) {
                Ok(compacted) => Arc::new(compacted),
                Err(_) => Arc::clone(array),
            }
        }
        DataType::List(_) if has_view(array.data_type()) => {
            compact_list(array.as_list::<i32>()).unwrap_or_else(|| Arc::clone(array))
        }
        DataType::LargeList(_) if has_view(array.data_type()) => {
            compact_list(array.as_list::<i64>()).unwrap_or_else(|| Arc::clone(array))
        }
        _ => Arc::clone(array),
    }
}

/// Whether `array`'s data buffers hold more bytes than its rows use: then
/// compacting it sends less. (Rows that share one value, as a constant
/// column's do, use more than the buffers hold: compacting would copy the
/// value once per row.)
fn wasteful<T: ByteViewType + ?Sized>(array: &GenericByteViewArray<T>) -> bool {
    let held: usize = array.data_buffers().iter().map(|b| b.len()).sum();
    held > outside(array.views())
}

/// `list` over only the values its rows use, compacted, its offsets from 0.
fn compact_list<O: OffsetSizeTrait>(list: &GenericListArray<O>) -> Option<ArrayRef> {
    let offsets = list.value_offsets();
    let (first, last) = (*offsets.first()?, *offsets.last()?);
    let values = list
        .values()
        .slice(first.as_usize(), (last - first).as_usize());
    let values = compact_array(&values);
    let rebased: Vec<O> = offsets.iter().map(|o| *o - first).collect();
    let offsets = OffsetBuffer::new(ScalarBuffer::from(rebased));
    let field = match list.data_type() {
        DataType::List(f) | DataType::LargeList(f) => Arc::clone(f),
        _ => return None,
    };
    GenericListArray::try_new(field, offsets, values, list.nulls().cloned())
        .ok()
        .map(|l| Arc::new(l) as ArrayRef)
}

#[cfg(test)]
mod tests {
    use arrow_array::types::Int32Type;
    use arrow_array::{DictionaryArray, Int32Array, LargeStringArray, StringViewArray};
    use arrow_flight::decode::FlightRecordBatchStream;
    use arrow_schema::{Field, Schema};
    use futures::TryStreamExt;

    use super::*;

    /// Every message of `batches`, in order, as frame payloads.
    fn encode_all(
        schema: &SchemaRef,
        batches: &[RecordBatch],
        target: usize,
        max: usize,
    ) -> Result<Vec<Vec<u8>>, FrameError> {
        let (mut encoder, first) = ResultEncoder::with_sizes(Arc::clone(schema), target, max);
        let mut out = vec![first];
        for batch in batches {
            for message in encoder.messages(batch) {
                out.push(message?);
            }
        }
        Ok(out)
    }

    /// What a Flight client reads from `messages`: the schema and batches.
    async fn decode(messages: Vec<Vec<u8>>) -> (SchemaRef, Vec<RecordBatch>) {
        let data: Vec<_> = messages
            .into_iter()
            .map(|m| {
                flight_data(m)
                    .map_err(|e| arrow_flight::error::FlightError::ProtocolError(e.to_string()))
            })
            .collect();
        let mut stream = FlightRecordBatchStream::new_from_flight_data(futures::stream::iter(data));
        let mut batches = Vec::new();
        while let Some(b) = stream.try_next().await.unwrap() {
            batches.push(b);
        }
        (Arc::clone(stream.schema().unwrap()), batches)
    }

    /// A batch of `rows` rows of one dictionary column whose one value is
    /// `width` bytes.
    fn dictionary(rows: usize, width: usize) -> RecordBatch {
        let values = LargeStringArray::from(vec!["x".repeat(width)]);
        let keys = Int32Array::from(vec![0; rows]);
        let column = DictionaryArray::<Int32Type>::try_new(keys, Arc::new(values)).unwrap();
        RecordBatch::try_from_iter([("d", Arc::new(column) as ArrayRef)]).unwrap()
    }

    fn is_dictionary(message: &[u8]) -> bool {
        let data = flight_data(message.to_vec()).unwrap();
        let header = arrow_ipc::root_as_message(&data.data_header).unwrap();
        header.header_type() == arrow_ipc::MessageHeader::DictionaryBatch
    }

    #[tokio::test]
    async fn a_dictionary_goes_out_once_as_a_dictionary_and_again_only_when_it_changes() {
        let width = 256 << 10;
        let first = dictionary(4000, width);
        // The same dictionary (the same buffers), and a different one.
        let same = first.slice(0, 1000);
        let other = dictionary(10, 1000);
        let schema = first.schema();
        let batches = [first, same, other];
        let messages = encode_all(&schema, &batches, TARGET_MESSAGE, MAX_MESSAGE).unwrap();
        let total: usize = messages.iter().map(Vec::len).sum();
        let dictionaries: Vec<usize> = messages
            .iter()
            .filter(|m| is_dictionary(m))
            .map(Vec::len)
            .collect();
        assert_eq!(dictionaries.len(), 2, "{dictionaries:?}");
        assert!(
            dictionaries[0] > width && dictionaries[1] < width,
            "{dictionaries:?}"
        );
        // Hydrated, the 5,010 rows would take 1.2 GiB.
        assert!(total < width + (1 << 20), "{total} bytes sent");
        let (got, batches) = decode(messages).await;
        assert_eq!(got, schema, "the schema as it is, dictionary included");
        let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
        assert_eq!(rows, 5010);
        let last = batches.last().unwrap().column(0).as_any_dictionary();
        let values = last.values().as_string::<i64>();
        assert_eq!(values.value(0).len(), 1000);
    }

    #[tokio::test]
    async fn a_view_column_is_sent_compacted_per_slice_and_a_shared_value_is_not_copied() {
        // 400 distinct values of 20 KiB in one data buffer (as a cast from
        // Utf8 makes them): each slice would carry the whole 8 MiB.
        let values: Vec<String> = (0..400).map(|i| format!("{i:020480}")).collect();
        let strings = arrow_array::StringArray::from(values.clone());
        let views = arrow_cast::cast(&strings, &DataType::Utf8View).unwrap();
        let batch = RecordBatch::try_from_iter([("v", views)]).unwrap();
        let schema = batch.schema();
        let data = 400 * 20480;
        let messages = encode_all(&schema, &[batch], TARGET_MESSAGE, MAX_MESSAGE).unwrap();
        let total: usize = messages.iter().map(Vec::len).sum();
        assert!(messages.len() > 4, "{} messages", messages.len());
        assert!(messages.iter().all(|m| m.len() <= TARGET_MESSAGE + 4096));
        assert!(total < data + data / 4, "{total} bytes sent for {data}");
        let (_, batches) = decode(messages).await;
        let got: Vec<String> = batches
            .iter()
            .flat_map(|b| {
                let v = b.column(0).as_string_view();
                v.iter().map(|s| s.unwrap().to_string()).collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(got, values);

        // One 256 KiB value shared by 4,000 rows: sent once or a few times,
        // never once per row.
        let shared =
            StringViewArray::from_iter_values(std::iter::repeat_n("y".repeat(256 << 10), 1));
        let keys: Vec<u32> = vec![0; 4000];
        let shared =
            arrow_select::take::take(&shared, &arrow_array::UInt32Array::from(keys), None).unwrap();
        let batch = RecordBatch::try_from_iter([("v", shared)]).unwrap();
        let messages = encode_all(&batch.schema(), &[batch], TARGET_MESSAGE, MAX_MESSAGE).unwrap();
        let total: usize = messages.iter().map(Vec::len).sum();
        assert!(
            total < 8 << 20,
            "{total} bytes sent for a shared 256 KiB value"
        );
    }

    #[test]
    fn a_row_or_a_dictionary_over_the_cap_is_refused_naming_it() {
        let batch = dictionary(3, 2000);
        let schema = batch.schema();
        let err = encode_all(&schema, &[batch], 100, 1000).unwrap_err();
        assert!(
            matches!(err, FrameError::DictionaryTooLarge { cap: 1000, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("over the 1000 B"), "{err}");

        let rows = arrow_array::StringArray::from(vec!["z".repeat(2000); 3]);
        let batch = RecordBatch::try_from_iter([("s", Arc::new(rows) as ArrayRef)]).unwrap();
        let err = encode_all(&batch.schema(), &[batch], 100, 1000).unwrap_err();
        assert!(
            matches!(err, FrameError::RowTooLarge { cap: 1000, .. }),
            "{err}"
        );
    }

    #[tokio::test]
    async fn an_empty_result_is_its_schema_and_a_wide_batch_is_sliced() {
        let schema = Arc::new(Schema::new(vec![Field::new("s", DataType::Utf8, false)]));
        let messages = encode_all(&schema, &[], TARGET_MESSAGE, MAX_MESSAGE).unwrap();
        assert_eq!(messages.len(), 1);
        let (got, batches) = decode(messages).await;
        assert_eq!(got, schema, "nullability included");
        assert!(batches.is_empty());

        let rows = arrow_array::StringArray::from(vec!["w".repeat(1000); 10_000]);
        let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(rows)]).unwrap();
        let messages = encode_all(&schema, &[batch], 100_000, MAX_MESSAGE).unwrap();
        assert!(messages.len() > 100, "{}", messages.len());
        assert!(messages.iter().all(|m| m.len() <= 100_000 + 4));
        let (_, batches) = decode(messages).await;
        assert_eq!(
            batches.iter().map(RecordBatch::num_rows).sum::<usize>(),
            10_000
        );
    }
}
