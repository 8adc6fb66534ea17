//! A DoPut stream's IPC messages decoded one at a time, synchronously, so
//! that DoPut can run each decode on the blocking pool: decoding a record
//! batch validates every offset and every byte of its strings, which takes
//! time in proportion to what the client sent.
//!
//! It does what arrow-flight's `FlightRecordBatchStream` does with each
//! message: a schema starts the stream's state, a dictionary batch adds to
//! it, a record batch is decoded against it.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch};
use arrow_buffer::Buffer;
use arrow_flight::FlightData;
use arrow_flight::error::FlightError;
use arrow_ipc::MessageHeader;
use arrow_schema::{Schema, SchemaRef};

/// Alignment arrow-ipc wants of a body to use it without copying.
const ALIGNMENT: usize = 64;

/// The schema and dictionaries of one DoPut stream so far.
#[derive(Debug, Default)]
pub(super) struct Decoder {
    schema: Option<SchemaRef>,
    dictionaries: HashMap<i64, ArrayRef>,
}

impl Decoder {
    /// Decodes `data`: the record batch it holds, or none (a schema, a
    /// dictionary, a message with only metadata).
    pub(super) fn decode(&mut self, data: FlightData) -> Result<Option<RecordBatch>, FlightError> {
        if data.data_header.is_empty() {
            return Ok(None);
        }
        let message = arrow_ipc::root_as_message(&data.data_header)
            .map_err(|e| FlightError::DecodeError(format!("Error decoding root message: {e}")))?;
        match message.header_type() {
            MessageHeader::NONE => Ok(None),
            MessageHeader::Schema => {
                let schema = Schema::try_from(&data)
                    .map_err(|e| FlightError::DecodeError(format!("Error decoding schema: {e}")))?;
                self.schema = Some(Arc::new(schema));
                self.dictionaries.clear();
                Ok(None)
            }
            MessageHeader::DictionaryBatch => {
                let schema = self.schema("DictionaryBatch")?;
                let dictionary = message.header_as_dictionary_batch().ok_or_else(|| {
                    FlightError::protocol("a DictionaryBatch message without its batch")
                })?;
                arrow_ipc::reader::read_dictionary(
                    &Buffer::from(data.data_body),
                    dictionary,
                    &schema,
                    &mut self.dictionaries,
                    &message.version(),
                )
                .map_err(|e| FlightError::DecodeError(format!("Error decoding dictionary: {e}")))?;
                Ok(None)
            }
            MessageHeader::RecordBatch => {
                let schema = self.schema("RecordBatch")?;
                let batch = message.header_as_record_batch().ok_or_else(|| {
                    FlightError::protocol("a RecordBatch message without its batch")
                })?;
                // Used as it is when aligned, else copied into an aligned buffer.
                let body = if (data.data_body.as_ptr() as usize).is_multiple_of(ALIGNMENT) {
                    Buffer::from(data.data_body.clone())
                } else {
                    Buffer::from(data.data_body.as_ref())
                };
                arrow_ipc::reader::read_record_batch(
                    &body,
                    batch,
                    schema,
                    &self.dictionaries,
                    None,
                    &message.version(),
                )
                .map(Some)
                .map_err(|e| FlightError::DecodeError(format!("Error decoding record batch: {e}")))
            }
            other => Err(FlightError::protocol(format!(
                "unexpected message type {other:?}"
            ))),
        }
    }

    fn schema(&self, what: &str) -> Result<SchemaRef, FlightError> {
        self.schema
            .clone()
            .ok_or_else(|| FlightError::protocol(format!("a {what} before the schema")))
    }
}
