//! What a ticket's lock guards: its log of rows, the receipts of each
//! receive, and how its first reads went.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::TimestampMillisecondType;
use arrow_array::{Array, RecordBatch};
use sqs_flight_schemas::schema::column;
use tokio::time::Instant;

use super::super::dedup::{self, Key};
use super::super::packed::Packed;
use super::super::receipts::Receipts;
use super::super::row_receipts::RowReceipts;
use super::Phase;
use crate::error::Error;
use crate::large_payload::S3Object;
use crate::sqs::ReceiptHandle;

/// The receipts of one receive and until when they are hidden.
pub(super) struct Chunk {
    /// Row offset of the receive in the log.
    pub(super) start: u32,
    /// The receipts it brought, in row order (renewals are in the log's
    /// [`RowReceipts`]).
    pub(super) receipts: Receipts,
    pub(super) visible_until: Instant,
    /// The receive's rows whose typed payload did not decode (their
    /// `payload_error` is set), by offset in the receive: found once, when
    /// the rows are recorded, so a commit that rejects payload errors need
    /// not unpack held rows. Empty for most receives and every table
    /// without a payload.
    pub(super) payload_errors: Box<[u32]>,
    /// The S3 objects the receive's large payloads were read from, by
    /// offset in the receive, for a commit that deletes them
    /// (`delete_after_commit`). Empty for every table without it.
    pub(super) objects: Box<[(u32, S3Object)]>,
}

/// What one receive brings into a ticket's log (or what a previous
/// process recorded of one, `--state-dir`).
#[derive(Debug)]
pub struct ReceivedRows {
    /// One row per message.
    pub rows: RecordBatch,
    /// Each row's receipt, in row order.
    pub receipts: Vec<ReceiptHandle>,
    /// The S3 objects its large payloads were read from, by offset in the
    /// receive (`delete_after_commit` only).
    pub objects: Vec<(u32, S3Object)>,
    /// What the budget counts for its messages.
    pub bytes: u64,
    /// Until when its messages are hidden.
    pub visible_until: Instant,
}

impl ReceivedRows {
    /// A receive of `rows` without large payloads.
    pub fn new(
        rows: RecordBatch,
        receipts: Vec<ReceiptHandle>,
        bytes: u64,
        visible_until: Instant,
    ) -> Self {
        Self {
            rows,
            receipts,
            objects: Vec::new(),
            bytes,
            visible_until,
        }
    }
}

/// Offsets of the rows of `batch` whose `payload_error` is set (none for a
/// table without a payload).
fn payload_errors(batch: &RecordBatch) -> Box<[u32]> {
    let Some(errors) = batch.column_by_name(sqs_flight_schemas::payload::PAYLOAD_ERROR) else {
        return Box::default();
    };
    if errors.null_count() == errors.len() {
        return Box::default();
    }
    (0..errors.len())
        .filter(|&i| errors.is_valid(i))
        .map(|i| i as u32)
        .collect()
}

/// Rows of the log: as received, or coalesced and packed.
pub(super) enum LogRows {
    Rows(RecordBatch),
    Packed(Arc<Packed>),
}

impl LogRows {
    /// The same rows, shared (no copy of their buffers).
    pub(super) fn share(&self) -> Self {
        match self {
            LogRows::Rows(b) => LogRows::Rows(b.clone()),
            LogRows::Packed(p) => LogRows::Packed(Arc::clone(p)),
        }
    }
}

/// A ticket's log, under the ticket's lock.
pub(super) struct Log {
    pub(super) phase: Phase,
    /// Committed or released: nothing more may be recorded.
    pub(super) closed: bool,
    pub(super) batches: Vec<LogRows>,
    /// Row offset of each batch in the log.
    pub(super) starts: Vec<usize>,
    /// Batches before this index are coalesced already.
    pub(super) coalesced: usize,
    pub(super) rows: usize,
    pub(super) chunks: Vec<Chunk>,
    /// The message id of each row, as [`dedup::key`]s.
    pub(super) keys: Vec<Key>,
    /// Which receipt each row uses now, where it is not its receive's.
    pub(super) row_receipts: RowReceipts,
    pub(super) messages: u64,
    pub(super) bytes: u64,
    /// The oldest `SentTimestamp` (ms since the epoch) of the rows held,
    /// kept as they are recorded so that `status` never unpacks rows.
    pub(super) oldest_sent_ms: Option<i64>,
    /// The first reads that failed with nothing recorded.
    pub(super) failed_first_reads: FailedFirstReads,
    /// Read-ahead began the first read and no reader has joined yet.
    pub(super) ahead_awaits_reader: bool,
}

/// The first reads of a ticket that failed with nothing recorded: how
/// many (a reader's [`Begin`](super::Begin) notes it, so that it ends only with a failure
/// of the read it joined, not an earlier one), and the last one's error,
/// which readers that joined it end with.
#[derive(Default)]
pub(super) struct FailedFirstReads {
    count: u64,
    last: Option<Error>,
}

impl FailedFirstReads {
    /// How many failed so far: the generation a reader that begins now
    /// joins.
    pub(super) fn generation(&self) -> u64 {
        self.count
    }

    /// Counts one more failed first read, with its error.
    pub(super) fn record(&mut self, error: &Error) {
        self.count += 1;
        self.last = Some(copy_error(error));
    }

    /// The error of a first read that failed after a reader began at
    /// `generation`, if one did.
    pub(super) fn since(&self, generation: u64) -> Option<Error> {
        (self.count > generation).then(|| {
            let e = self.last.as_ref().map(copy_error);
            e.unwrap_or_else(|| Error::Internal("read failed".into()))
        })
    }
}

impl Log {
    /// The log of a ticket never read.
    pub(super) fn new() -> Self {
        Log {
            phase: Phase::Fresh,
            closed: false,
            batches: Vec::new(),
            starts: Vec::new(),
            coalesced: 0,
            rows: 0,
            chunks: Vec::new(),
            keys: Vec::new(),
            row_receipts: RowReceipts::default(),
            messages: 0,
            bytes: 0,
            oldest_sent_ms: None,
            failed_first_reads: FailedFirstReads::default(),
            ahead_awaits_reader: false,
        }
    }

    /// Appends one receive's rows and receipts; returns its message count.
    pub(super) fn append(&mut self, received: ReceivedRows) -> u64 {
        let ReceivedRows {
            rows: batch,
            receipts,
            objects,
            bytes,
            visible_until,
        } = received;
        let messages = receipts.len() as u64;
        self.oldest_sent_ms = self
            .oldest_sent_ms
            .into_iter()
            .chain(oldest_sent_ms(&batch))
            .min();
        self.messages += messages;
        self.bytes += bytes;
        let errors = payload_errors(&batch);
        self.keys.extend(message_keys(&batch));
        let start = self.rows;
        self.starts.push(start);
        self.rows += batch.num_rows();
        self.batches.push(LogRows::Rows(batch));
        self.chunks.push(Chunk {
            start: start as u32,
            payload_errors: errors,
            objects: objects.into_boxed_slice(),
            receipts: Receipts::pack(receipts),
            visible_until,
        });
        messages
    }

    /// The receipts of chunk `c`'s rows, the renewed ones in place of
    /// those they replaced.
    pub(super) fn receipts_of(&self, c: &Chunk) -> Vec<ReceiptHandle> {
        let received: Vec<ReceiptHandle> = c.receipts.unpack().collect();
        let start = c.start as usize;
        let rows = start..start + received.len();
        self.row_receipts.in_use(rows, received)
    }
}

/// The [`dedup::key`] of each row's message id (none without the column).
fn message_keys(batch: &RecordBatch) -> Vec<Key> {
    let column = batch.column_by_name(sqs_flight_schemas::column::MESSAGE_ID);
    let Some(ids) = column.and_then(|c| c.as_string_opt::<i32>()) else {
        return Vec::new();
    };
    ids.iter().map(|id| dedup::key(id.unwrap_or(""))).collect()
}

/// The oldest `SentTimestamp` of `batch`'s rows, if any row has one.
fn oldest_sent_ms(batch: &RecordBatch) -> Option<i64> {
    let column = batch.column_by_name(column::SENT_TIMESTAMP)?;
    let sent = column.as_primitive_opt::<TimestampMillisecondType>()?;
    sent.iter().flatten().min()
}

/// A copy of `e` for another reader of the same failed receive.
fn copy_error(e: &Error) -> Error {
    match e {
        Error::Sqs { table, source } => Error::Sqs {
            table: table.clone(),
            source: source.clone(),
        },
        Error::ResourceExhausted(m) => Error::ResourceExhausted(m.clone()),
        other => other.copy_journal_error(),
    }
}
