//! What a DoPut IPC message may make the server allocate, checked on its
//! header before arrow-ipc decodes its body.
//!
//! arrow-ipc trusts the sender: a compressed buffer starts with the length
//! it decompresses to (8 bytes, little-endian), and the decoder allocates
//! that much before it reads a byte of the compressed data; a buffer's
//! offset and length are sliced out of the body with an assertion. So one
//! record batch claiming 2^46 bytes would end the process. [`IpcBounds`]
//! walks the header of each message (a flatbuffer, verified) and refuses,
//! before any decoding:
//!
//! - a buffer outside the message body, a negative length or row count, a
//!   compressed buffer shorter than its length prefix, an LZ4 frame that
//!   decompresses to more than it claims (LZ4's decoder does not stop at
//!   the claim; zstd's does): INVALID_ARGUMENT;
//! - a record or dictionary batch whose buffers claim more than
//!   `max_request_bytes` once decompressed (compression saves bandwidth, it
//!   does not raise the message limit), dictionaries that add up to more
//!   than that over the stream, or a batch of more than `max_put_rows`
//!   rows: RESOURCE_EXHAUSTED naming the setting;
//! - a schema message above `max_put_schema_bytes` (its metadata included):
//!   RESOURCE_EXHAUSTED naming it.
//!
//! What a stream keeps decoded from one batch to the next, its schema and
//! dictionaries, counts against `max_request_bytes` for the stream and
//! against `max_put_held_bytes` for all DoPut streams together
//! ([`HeldBudget`]), until the stream ends: a client cannot hold memory by
//! opening streams that send a schema and wait.
//!
//! Honest compressed input (ZSTD or LZ4 frames, as pyarrow and arrow-rs
//! write them) is decoded as before.

use std::sync::Arc;

use arrow_flight::FlightData;
use arrow_ipc::{CompressionType, MessageHeader};

/// Bytes before each compressed buffer: the length it decompresses to.
const PREFIX: usize = 8;

/// The prefix of a buffer sent uncompressed within a compressed body.
const NOT_COMPRESSED: i64 = -1;

/// Why a DoPut message was refused before decoding.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IpcError {
    /// The header contradicts itself or its body.
    #[error("DoPut: not a valid Arrow IPC message: {0}")]
    Malformed(String),
    /// Decoding it would take more than a limit allows.
    #[error("{message}")]
    TooLarge {
        /// The limit's name.
        limit: &'static str,
        message: String,
    },
}

/// Bytes that all DoPut streams together keep decoded between batches:
/// their schemas and dictionaries (`max_put_held_bytes`).
pub(crate) type HeldBudget = crate::request_budget::ByteBudget;

/// The limits of one DoPut stream, and what it holds decoded: its schema
/// and dictionaries, counted in a [`HeldBudget`] until it is dropped.
#[derive(Debug)]
pub struct IpcBounds {
    /// Bytes one message may decode to (`max_request_bytes`), and the
    /// schema and dictionaries of a stream in all.
    max_decoded_bytes: u64,
    /// Rows one record batch may claim (`max_put_rows`).
    max_rows: u64,
    /// Bytes of one schema message (`max_put_schema_bytes`).
    max_schema_bytes: u64,
    /// Bytes this stream holds decoded (schema and dictionaries), taken
    /// from `budget`.
    held: u64,
    budget: Arc<HeldBudget>,
}

impl Drop for IpcBounds {
    fn drop(&mut self) {
        self.budget.give(self.held);
    }
}

impl IpcBounds {
    /// Bounds with no schema limit of their own and a budget of their own.
    pub fn new(max_decoded_bytes: u64, max_rows: u64) -> Self {
        Self {
            max_decoded_bytes,
            max_rows,
            max_schema_bytes: u64::MAX,
            held: 0,
            budget: HeldBudget::new(u64::MAX),
        }
    }

    /// Counts what the stream holds in `budget`, shared with the other
    /// streams, and refuses a schema message above `max_schema_bytes`.
    pub(crate) fn with_held(mut self, budget: Arc<HeldBudget>, max_schema_bytes: u64) -> Self {
        self.budget = budget;
        self.max_schema_bytes = max_schema_bytes;
        self
    }

    /// Checks one FlightData of a DoPut stream before it is decoded.
    pub fn check(&mut self, data: &FlightData) -> Result<(), IpcError> {
        if data.data_header.is_empty() {
            // Nothing to decode (arrow-flight refuses it by itself).
            return Ok(());
        }
        let message = arrow_ipc::root_as_message(&data.data_header)
            .map_err(|e| IpcError::Malformed(format!("its header does not parse: {e}")))?;
        match message.header_type() {
            MessageHeader::RecordBatch => {
                let batch = message.header_as_record_batch().ok_or_else(no_header)?;
                self.check_batch(batch, &data.data_body, "record batch")
                    .map(|_| ())
            }
            MessageHeader::DictionaryBatch => {
                let dictionary = message.header_as_dictionary_batch().ok_or_else(no_header)?;
                let batch = dictionary.data().ok_or_else(no_header)?;
                let decoded = self.check_batch(batch, &data.data_body, "dictionary batch")?;
                self.hold(decoded, "schema and dictionaries")
            }
            MessageHeader::Schema => {
                let bytes = data.data_header.len() as u64;
                if bytes > self.max_schema_bytes {
                    return Err(IpcError::TooLarge {
                        limit: "max_put_schema_bytes",
                        message: format!(
                            "a schema message of {bytes} bytes (fields and metadata), above the \
                             limit of {} bytes (max_put_schema_bytes); send a schema with less \
                             metadata",
                            self.max_schema_bytes
                        ),
                    });
                }
                self.hold(bytes, "schema and dictionaries")
            }
            _ => Ok(()),
        }
    }

    /// Checks a record batch (or a dictionary's) against `body`; returns
    /// the bytes its buffers decode to.
    fn check_batch(
        &self,
        batch: arrow_ipc::RecordBatch,
        body: &[u8],
        what: &str,
    ) -> Result<u64, IpcError> {
        let rows = non_negative(batch.length(), "the row count")?;
        if rows > self.max_rows {
            return Err(IpcError::TooLarge {
                limit: "max_put_rows",
                message: format!(
                    "a {what} of {rows} rows, above the limit of {} rows per DoPut call \
                     (max_put_rows); send smaller batches",
                    self.max_rows
                ),
            });
        }
        self.check_nodes(&batch)?;
        let codec = batch.compression().map(|c| c.codec());
        let mut decoded = 0u64;
        for buffer in batch.buffers().into_iter().flatten() {
            let bytes = slice(body, buffer.offset(), buffer.length())?;
            let (claim, compressed) = claimed_len(bytes, codec)?;
            decoded = decoded.saturating_add(claim);
            if decoded > self.max_decoded_bytes {
                return Err(self.too_large(what, decoded));
            }
            if codec == Some(CompressionType::LZ4_FRAME)
                && let Some(frame) = compressed
            {
                check_lz4(frame, claim)?;
            }
        }
        Ok(decoded)
    }

    /// Each node's length and null count: not negative, and no more
    /// elements than the message may decode to bytes (every column type
    /// DoPut accepts takes at least a byte per element).
    fn check_nodes(&self, batch: &arrow_ipc::RecordBatch) -> Result<(), IpcError> {
        for node in batch.nodes().into_iter().flatten() {
            let length = non_negative(node.length(), "a column length")?;
            let nulls = non_negative(node.null_count(), "a null count")?;
            if nulls > length {
                return Err(IpcError::Malformed(format!(
                    "a column of {length} values claims {nulls} nulls"
                )));
            }
            if length > self.max_decoded_bytes {
                return Err(self.too_large("column", length));
            }
        }
        Ok(())
    }

    /// Counts `decoded` more bytes held by the stream until it ends: within
    /// `max_request_bytes` for the stream, and the shared budget.
    fn hold(&mut self, decoded: u64, what: &str) -> Result<(), IpcError> {
        let held = self.held.saturating_add(decoded);
        if held > self.max_decoded_bytes {
            return Err(self.too_large(&format!("stream's {what}"), held));
        }
        if !self.budget.take(decoded) {
            return Err(IpcError::TooLarge {
                limit: "max_put_held_bytes",
                message: format!(
                    "DoPut streams already hold {} bytes of schemas and dictionaries; this \
                     stream's {decoded} more would pass the server's limit of {} bytes \
                     (max_put_held_bytes): send again later",
                    self.budget.used(),
                    self.budget.limit()
                ),
            });
        }
        self.held = held;
        Ok(())
    }

    fn too_large(&self, what: &str, bytes: u64) -> IpcError {
        IpcError::TooLarge {
            limit: "max_request_bytes",
            message: format!(
                "a {what} that decodes to at least {bytes} bytes, above the limit of {} bytes \
                 (max_request_bytes: compressed or not, one message decodes to no more); \
                 send smaller record batches",
                self.max_decoded_bytes
            ),
        }
    }
}

fn no_header() -> IpcError {
    IpcError::Malformed("its header names a batch it does not hold".into())
}

fn non_negative(value: i64, what: &str) -> Result<u64, IpcError> {
    u64::try_from(value).map_err(|_| IpcError::Malformed(format!("{what} is {value}")))
}

/// The bytes `offset..offset + length` of `body`, or why they are not in it.
fn slice(body: &[u8], offset: i64, length: i64) -> Result<&[u8], IpcError> {
    let range = usize::try_from(offset)
        .ok()
        .zip(usize::try_from(length).ok())
        .and_then(|(start, len)| Some(start..start.checked_add(len)?))
        .filter(|r| r.end <= body.len());
    range.map(|r| &body[r]).ok_or_else(|| {
        IpcError::Malformed(format!(
            "a buffer at offset {offset} of length {length} is outside the {}-byte body",
            body.len()
        ))
    })
}

/// The bytes `buffer` claims to decode to under `codec` (none: as sent),
/// and its compressed data when it is compressed.
fn claimed_len(
    buffer: &[u8],
    codec: Option<CompressionType>,
) -> Result<(u64, Option<&[u8]>), IpcError> {
    if codec.is_none() || buffer.is_empty() {
        return Ok((buffer.len() as u64, None));
    }
    let Some((prefix, data)) = buffer.split_first_chunk::<PREFIX>() else {
        return Err(IpcError::Malformed(format!(
            "a compressed buffer of {} bytes, shorter than its {PREFIX}-byte length prefix",
            buffer.len()
        )));
    };
    match i64::from_le_bytes(*prefix) {
        NOT_COMPRESSED => Ok((data.len() as u64, None)),
        claim => Ok((
            non_negative(claim, "a compressed buffer's length")?,
            Some(data),
        )),
    }
}

/// An LZ4 frame decodes to no more than `claim` bytes: arrow-ipc reads a
/// frame to its end whatever it claims, so the frame is run through once
/// here, into nothing, stopping one byte past the claim.
fn check_lz4(frame: &[u8], claim: u64) -> Result<(), IpcError> {
    use std::io::Read;
    let decoder = lz4_flex::frame::FrameDecoder::new(frame);
    let mut bounded = decoder.take(claim.saturating_add(1));
    let n = std::io::copy(&mut bounded, &mut std::io::sink())
        .map_err(|e| IpcError::Malformed(format!("an LZ4 buffer does not decode: {e}")))?;
    if n > claim {
        return Err(IpcError::Malformed(format!(
            "an LZ4 buffer decodes to more than the {claim} bytes it claims"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
