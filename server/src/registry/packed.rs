//! Held rows, packed: a coalesced batch of a ticket whose columns other than
//! the body are kept as one Arrow IPC message with zstd-compressed buffers
//! until a reader needs them again.
//!
//! A held message's columns beyond its body (message id, MD5, sender id,
//! timestamps, the constant batch and partition) cost about 150 B as plain
//! Arrow arrays; compressed they cost a fraction of that. The body stays as
//! it is: compressing it would cost CPU in proportion to the bytes received
//! (with 4 KiB bodies, nearly all of them) for a gain that depends on the
//! content. Readers that keep up with a receive read its rows before they
//! are packed; a replay, or a reader that fell behind, unpacks one coalesced
//! batch at a time.

use std::io::Cursor;

use arrow_array::{ArrayRef, RecordBatch, RecordBatchOptions};
use arrow_ipc::CompressionType;
use arrow_ipc::reader::StreamReader;
use arrow_ipc::writer::{IpcWriteOptions, StreamWriter};
use arrow_schema::{ArrowError, SchemaRef};
use bytes::Bytes;
use sqs_flight_schemas::column::BODY;

/// zstd's fastest level: packing runs on the receive path.
const ZSTD_LEVEL: i32 = 1;

/// One batch: its body column as it is, the others as a compressed Arrow
/// IPC stream.
#[derive(Debug)]
pub(super) struct Packed {
    schema: SchemaRef,
    /// The body column and its index, when the batch has one.
    body: Option<(usize, ArrayRef)>,
    /// The other columns.
    ipc: Bytes,
    rows: usize,
}

impl Packed {
    /// Packs `batch`.
    pub(super) fn pack(batch: &RecordBatch) -> Result<Self, ArrowError> {
        let schema = batch.schema();
        let body = schema.index_of(BODY).ok();
        let others: Vec<usize> = (0..batch.num_columns())
            .filter(|&i| Some(i) != body)
            .collect();
        let rest = batch.project(&others)?;
        let options = IpcWriteOptions::default()
            .try_with_compression(Some(CompressionType::ZSTD))?
            .try_with_compression_level(Some(ZSTD_LEVEL))?;
        let mut ipc = write_ipc(&rest, options)?;
        ipc.shrink_to_fit();
        Ok(Self {
            body: body.map(|i| (i, batch.column(i).clone())),
            schema,
            ipc: Bytes::from(ipc),
            rows: batch.num_rows(),
        })
    }

    /// The batch again, identical to the one packed.
    pub(super) fn unpack(&self) -> Result<RecordBatch, ArrowError> {
        let rest = read_ipc(&self.ipc)?;
        let mut columns = rest.columns().to_vec();
        if let Some((i, body)) = &self.body {
            columns.insert(*i, body.clone());
        }
        let options = RecordBatchOptions::new().with_row_count(Some(self.rows));
        RecordBatch::try_new_with_options(self.schema.clone(), columns, &options)
    }
}

/// `batch` as an Arrow IPC stream; the state store keeps rows so too.
pub(super) fn write_ipc(
    batch: &RecordBatch,
    options: IpcWriteOptions,
) -> Result<Vec<u8>, ArrowError> {
    let mut writer = StreamWriter::try_new_with_options(Vec::new(), &batch.schema(), options)?;
    writer.write(batch)?;
    writer.into_inner()
}

/// The rows of an Arrow IPC stream, as one batch.
pub(super) fn read_ipc(bytes: &[u8]) -> Result<RecordBatch, ArrowError> {
    let reader = StreamReader::try_new(Cursor::new(bytes), None)?;
    let schema = reader.schema();
    let batches = reader.collect::<Result<Vec<_>, _>>()?;
    // One batch (what `write_ipc` writes) comes back without a copy.
    arrow_select::concat::concat_batches(&schema, &batches)
}

#[cfg(test)]
mod tests {
    use arrow_array::Array;
    use sqs_flight_schemas::SqsMessage;
    use sqs_flight_schemas::message::messages_to_batch;

    use super::*;

    fn rows(n: usize, body: impl Fn(usize) -> String) -> RecordBatch {
        let messages: Vec<SqsMessage> = (0..n)
            .map(|i| SqsMessage {
                message_id: format!("{:08x}-0000-4000-8000-{:012x}", i, i * 7919),
                body: body(i),
                md5_of_body: Some(format!("{:032x}", i as u128 * 0x9e37_79b9_7f4a_7c15)),
                sender_id: Some("AIDAIENQZJOLO23YVJ4VO".into()),
                sent_timestamp: Some(1_700_000_000_000 + i as i64),
                first_receive_timestamp: Some(1_700_000_000_100 + i as i64),
                receive_count: Some(1),
                message_attributes: vec![("kind".into(), format!("k{}", i % 3))],
                ..Default::default()
            })
            .collect();
        messages_to_batch(&messages, 7, 1).unwrap()
    }

    #[test]
    fn unpack_gives_back_the_batch_packed() {
        let batch = rows(640, |i| format!("{{\"order\": {i}, \"note\": \"é\"}}"));
        let packed = Packed::pack(&batch).unwrap();
        let back = packed.unpack().unwrap();
        assert_eq!(back, batch);
        assert_eq!(back.schema(), batch.schema());
        // A slice too: its offsets do not start at zero.
        let slice = batch.slice(100, 7);
        assert_eq!(Packed::pack(&slice).unwrap().unpack().unwrap(), slice);
    }

    #[test]
    fn the_columns_beyond_the_body_take_far_less_packed() {
        let batch = rows(640, |i| {
            format!("{{\"order\": {i}, \"status\": \"shipped\"}}")
        });
        let body = batch.schema().index_of(BODY).unwrap();
        let arrays: usize = (0..batch.num_columns())
            .filter(|&i| i != body)
            .map(|i| batch.column(i).get_array_memory_size())
            .sum();
        let packed = Packed::pack(&batch).unwrap();
        assert!(
            packed.ipc.len() * 3 < arrays,
            "packed {} B against {arrays} B of arrays",
            packed.ipc.len()
        );
        // The body is kept as it is, not copied.
        let (_, kept) = packed.body.as_ref().unwrap();
        assert!(std::sync::Arc::ptr_eq(kept, batch.column(body)));
    }
}
