//! One ticket's log: the rows it received, in order, and their receipts.
//!
//! The first DoGet of a ticket starts the receive task, which appends to the
//! log; every DoGet (the first included) streams by following the log until
//! it is sealed. That one mechanism gives repeatable reads: a replay, a
//! concurrent reader and the first reader all see the same rows in the same
//! order, and a receive that dies half way seals the log with what it had.
//! A first read that fails before it recorded anything leaves the ticket
//! fresh, so the next read receives instead of replaying an empty log.
//!
//! Readers follow by row offset, not by record batch, so the log can be
//! coalesced: one receive of ten messages makes a small batch whose
//! per-array overhead would otherwise dwarf the rows it holds. Every
//! [`COALESCE_EVERY`] receives, and at the seal, the batches recorded since
//! the last coalesce are concatenated into one and packed (compressed,
//! [`Packed`]), outside the log's lock, so the copy in flight stays small
//! and readers never wait for it. A reader that reaches a packed batch
//! (a replay, or a reader that fell behind) unpacks it.

use std::collections::{BTreeSet, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use arrow_array::cast::AsArray;
use arrow_array::types::TimestampMillisecondType;
use arrow_array::{Array, RecordBatch};
use futures::Stream;
use sqs_flight_schemas::TicketId;
use sqs_flight_schemas::schema::column;
use tokio::sync::watch;
use tokio::time::Instant;

use super::dedup::{self, Dedup, Key};
use super::packed::Packed;
use super::receipts::Receipts;
use super::row_receipts::RowReceipts;
use super::usage::Usage;
use crate::error::Error;
use crate::large_payload::S3Object;
use crate::sqs::ReceiptHandle;

/// Where a ticket's receive stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Never read, or its first read failed before recording anything.
    Fresh,
    /// The first DoGet's receive task is appending.
    Receiving,
    /// Complete: later reads replay.
    Sealed,
}

/// The receipts of one receive and until when they are hidden.
struct Chunk {
    /// Row offset of the receive in the log.
    start: u32,
    /// The receipts it brought, in row order (renewals are in the log's
    /// [`RowReceipts`]).
    receipts: Receipts,
    visible_until: Instant,
    /// The receive's rows whose typed payload did not decode (their
    /// `payload_error` is set), by offset in the receive: found once, when
    /// the rows are recorded, so a commit that rejects payload errors need
    /// not unpack held rows. Empty for most receives and every table
    /// without a payload.
    payload_errors: Box<[u32]>,
    /// The S3 objects the receive's large payloads were read from, by
    /// offset in the receive, for a commit that deletes them
    /// (`delete_after_commit`). Empty for every table without it.
    objects: Box<[(u32, S3Object)]>,
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
enum LogRows {
    Rows(RecordBatch),
    Packed(Arc<Packed>),
}

impl LogRows {
    /// The same rows, shared (no copy of their buffers).
    fn share(&self) -> Self {
        match self {
            LogRows::Rows(b) => LogRows::Rows(b.clone()),
            LogRows::Packed(p) => LogRows::Packed(Arc::clone(p)),
        }
    }
}

/// The rows a commit picked in one ticket: their indexes in the log (the
/// same as their receipts' in [`Ticket::close`] and [`Ticket::receipts`]),
/// and the message ids it found among them.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Picked {
    pub(super) rows: BTreeSet<usize>,
    pub(super) ids: HashSet<String>,
}

struct Log {
    phase: Phase,
    /// Committed or released: nothing more may be recorded.
    closed: bool,
    batches: Vec<LogRows>,
    /// Row offset of each batch in the log.
    starts: Vec<usize>,
    /// Batches before this index are coalesced already.
    coalesced: usize,
    rows: usize,
    chunks: Vec<Chunk>,
    /// The message id of each row, as [`dedup::key`]s.
    keys: Vec<Key>,
    /// Which receipt each row uses now, where it is not its receive's.
    row_receipts: RowReceipts,
    messages: u64,
    bytes: u64,
    /// The oldest `SentTimestamp` (ms since the epoch) of the rows held,
    /// kept as they are recorded so that `status` never unpacks rows.
    oldest_sent_ms: Option<i64>,
    /// The first reads that failed with nothing recorded.
    failed_first_reads: FailedFirstReads,
    /// Read-ahead began the first read and no reader has joined yet.
    ahead_awaits_reader: bool,
}

/// The first reads of a ticket that failed with nothing recorded: how
/// many (a reader's [`Begin`] notes it, so that it ends only with a failure
/// of the read it joined, not an earlier one), and the last one's error,
/// which readers that joined it end with.
#[derive(Default)]
struct FailedFirstReads {
    count: u64,
    last: Option<Error>,
}

impl FailedFirstReads {
    /// How many failed so far: the generation a reader that begins now
    /// joins.
    fn generation(&self) -> u64 {
        self.count
    }

    /// Counts one more failed first read, with its error.
    fn record(&mut self, error: &Error) {
        self.count += 1;
        self.last = Some(copy_error(error));
    }

    /// The error of a first read that failed after a reader began at
    /// `generation`, if one did.
    fn since(&self, generation: u64) -> Option<Error> {
        (self.count > generation).then(|| {
            let e = self.last.as_ref().map(copy_error);
            e.unwrap_or_else(|| Error::Internal("read failed".into()))
        })
    }
}

impl Log {
    /// Appends one receive's rows and receipts; returns its message count.
    fn append(&mut self, received: ReceivedRows) -> u64 {
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
    fn receipts_of(&self, c: &Chunk) -> Vec<ReceiptHandle> {
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

/// Receives recorded between two coalesces of a ticket's log.
pub const COALESCE_EVERY: usize = 64;

/// A copy of `e` for another reader of the same failed receive.
fn copy_error(e: &Error) -> Error {
    match e {
        Error::Sqs { table, source } => Error::Sqs {
            table: table.clone(),
            source: source.clone(),
        },
        Error::ResourceExhausted(m) => Error::ResourceExhausted(m.clone()),
        other => Error::Internal(other.to_string()),
    }
}

/// A receipt chunk due for a visibility extension.
pub struct DueChunk {
    pub(super) ticket: Arc<Ticket>,
    pub(super) index: usize,
    pub(super) receipts: Vec<ReceiptHandle>,
}

/// One repeatable read.
pub struct Ticket {
    id: TicketId,
    log: Mutex<Log>,
    changed: watch::Sender<u64>,
    usage: Arc<Usage>,
    /// The table's held ids, which this ticket's rows are in.
    dedup: Option<Arc<Dedup>>,
}

/// A record refused because the ticket is closed; the receipts come back.
#[derive(Debug, PartialEq, Eq)]
pub struct Closed(pub(super) Vec<ReceiptHandle>);

/// What [`Ticket::begin`] tells a reader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Begin {
    /// This reader must receive.
    pub(super) first: bool,
    /// This reader is the first of a ticket read-ahead received.
    pub(super) joins_ahead: bool,
    /// How many first reads of the ticket had failed when it began
    /// ([`FailedFirstReads::generation`]).
    generation: u64,
}

impl Ticket {
    /// The ticket's id: table, consumer, batch, partition and plan.
    pub fn id(&self) -> &TicketId {
        &self.id
    }

    pub fn new(id: TicketId, usage: Arc<Usage>) -> Self {
        Self {
            id,
            log: Mutex::new(Log {
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
            }),
            changed: watch::Sender::new(0),
            usage,
            dedup: None,
        }
    }

    /// The same ticket, its rows in the table's held ids (`dedup`).
    pub fn with_dedup(mut self, dedup: Arc<Dedup>) -> Self {
        self.dedup = Some(dedup);
        self
    }

    /// The table's held ids, if this ticket's rows are in them.
    pub(super) fn dedup(&self) -> Option<&Arc<Dedup>> {
        self.dedup.as_ref()
    }

    /// Keeps `receipt` for row `row`'s delete besides the row's own: a
    /// delivery of the same message whose call overlapped the row's, so
    /// that which receipt SQS acts on is unknown (see `dedup::offer`). At
    /// most one per row (the latest), so the list is bounded by the rows.
    /// The receipt comes back if the ticket was closed.
    pub fn add_second_receipt(
        &self,
        row: usize,
        receipt: ReceiptHandle,
    ) -> Result<(), ReceiptHandle> {
        let mut log = self.log();
        if log.closed {
            return Err(receipt);
        }
        log.row_receipts.add_second(row, receipt);
        Ok(())
    }

    /// Takes the receipts kept with [`Ticket::add_second_receipt`], by row (the code
    /// takes them at close, [`Ticket::close_with_second_receipts`]).
    #[cfg(test)]
    pub fn take_second_receipts(&self) -> Vec<(usize, ReceiptHandle)> {
        self.log().row_receipts.take_second()
    }

    /// Whether the ticket was closed (committed or released).
    pub fn is_closed(&self) -> bool {
        self.log().closed
    }

    /// Rows recorded so far: the row index of the next.
    pub fn rows(&self) -> usize {
        self.log().rows
    }

    /// The message ids of the rows held now, as keys, in row order.
    pub fn keys(&self) -> Vec<Key> {
        self.log().keys.clone()
    }

    /// Gives row `row` the receipt of a later receive of the same message:
    /// the old receipt is never used again. The receipt comes back if the
    /// ticket was closed (its rows committed or released) or has no such
    /// row. Answers the receive (chunk) and the offset in it that changed,
    /// or `None` for a row still being recorded: [`Ticket::append`] takes
    /// the receipt in and answers it then.
    pub fn renew(
        &self,
        row: usize,
        receipt: ReceiptHandle,
    ) -> Result<Option<(u64, u32)>, ReceiptHandle> {
        let mut log = self.log();
        if log.closed {
            return Err(receipt);
        }
        if row >= log.rows {
            log.row_receipts.renew_pending(row, receipt);
            return Ok(None);
        }
        let i = log.chunks.partition_point(|c| c.start as usize <= row) - 1;
        let offset = (row - log.chunks[i].start as usize) as u32;
        log.row_receipts.renew(row, receipt);
        Ok(Some((i as u64, offset)))
    }

    /// A ticket as a previous server process left it (`--state-dir`): a
    /// ticket that recorded anything, or was sealed, replays; one that never
    /// recorded anything and was not sealed is fresh.
    pub fn restored(
        id: TicketId,
        usage: Arc<Usage>,
        chunks: Vec<ReceivedRows>,
        sealed: bool,
    ) -> Self {
        let t = Self::new(id, usage);
        {
            let mut log = t.log();
            for chunk in chunks {
                let bytes = chunk.bytes;
                let messages = log.append(chunk);
                t.usage.add(messages, bytes);
            }
            if sealed || !log.chunks.is_empty() {
                log.phase = Phase::Sealed;
            }
        }
        t.coalesce(1);
        t
    }

    /// Concatenates the batches recorded since the last coalesce into one
    /// and packs it, if there are at least `min` of them (one is packed as
    /// it is). Only the receive task appends, so the range copied is the
    /// range replaced, unless the ticket was closed meanwhile.
    fn coalesce(&self, min: usize) {
        let (from, tail) = {
            let log = self.log();
            let from = log.coalesced;
            if log.closed || log.batches.len().saturating_sub(from) < min.max(1) {
                return;
            }
            // Batches after the coalesced ones are as received.
            let tail: Option<Vec<RecordBatch>> = log.batches[from..]
                .iter()
                .map(|h| match h {
                    LogRows::Rows(b) => Some(b.clone()),
                    LogRows::Packed(_) => None,
                })
                .collect();
            match tail {
                Some(tail) => (from, tail),
                None => return,
            }
        };
        let packed = arrow_select::concat::concat_batches(&tail[0].schema(), &tail)
            .and_then(|one| Packed::pack(&one));
        let one = match packed {
            Ok(one) => LogRows::Packed(Arc::new(one)),
            Err(e) => {
                tracing::warn!(error = %e, "could not pack a ticket's rows; keeping them as received");
                return;
            }
        };
        let mut log = self.log();
        let to = from + tail.len();
        if log.closed || log.coalesced != from || log.batches.len() < to {
            return;
        }
        let start = log.starts[from];
        log.batches.splice(from..to, [one]);
        log.starts.splice(from..to, [start]);
        log.coalesced = from + 1;
    }

    fn log(&self) -> MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn notify(&self) {
        self.changed.send_modify(|v| *v += 1);
    }

    /// Joins the ticket's read; exactly one caller, the first reader of a
    /// fresh ticket, gets `first` and must receive. `joins_ahead` tells
    /// the first reader of a ticket that read-ahead received: it is no
    /// replay.
    pub fn begin(&self) -> Begin {
        let mut log = self.log();
        let first = log.phase == Phase::Fresh && !log.closed;
        if first {
            log.phase = Phase::Receiving;
        }
        Begin {
            first,
            joins_ahead: std::mem::take(&mut log.ahead_awaits_reader) && !first,
            generation: log.failed_first_reads.generation(),
        }
    }

    /// Begins the first read of a fresh ticket for read-ahead (see
    /// `registry::ahead`): true if the caller must receive. The next
    /// [`Ticket::begin`] is then the consumer's first read, not a replay.
    pub fn begin_ahead(&self) -> bool {
        let mut log = self.log();
        let first = log.phase == Phase::Fresh && !log.closed;
        if first {
            log.phase = Phase::Receiving;
            log.ahead_awaits_reader = true;
        }
        first
    }

    /// Whether the first read ended and no later one receives (sealed, and
    /// not closed).
    pub fn is_sealed(&self) -> bool {
        let log = self.log();
        log.phase == Phase::Sealed && !log.closed
    }

    /// How many receives the log holds: the sequence number of the next.
    pub fn recorded_chunks(&self) -> u64 {
        self.log().chunks.len() as u64
    }

    /// Appends one receive's rows and receipts, before they are streamed.
    /// A newer receipt a later receive brought for one of these rows
    /// meanwhile ([`Ticket::renew`]) takes its place; those are answered,
    /// as (offset in this receive, receipt), for the journal.
    pub fn append(&self, mut received: ReceivedRows) -> Result<Vec<(u32, ReceiptHandle)>, Closed> {
        let mut log = self.log();
        let start = log.rows;
        let renewed = log.row_receipts.take_pending(start, &mut received.receipts);
        if log.closed {
            return Err(Closed(received.receipts));
        }
        let bytes = received.bytes;
        let messages = log.append(received);
        let due = log.batches.len() - log.coalesced >= COALESCE_EVERY;
        drop(log);
        self.usage.add(messages, bytes);
        self.notify();
        if due {
            self.coalesce(COALESCE_EVERY);
        }
        Ok(renewed)
    }

    /// Ends the receive: every later read replays.
    pub fn seal(&self) {
        let mut log = self.log();
        if log.phase != Phase::Sealed {
            log.phase = Phase::Sealed;
            drop(log);
            self.notify();
            self.coalesce(1);
        }
    }

    /// Ends a first read that failed with `error`. If it recorded nothing,
    /// the ticket becomes fresh again (the next read receives) and readers
    /// that joined it end with the error; otherwise it is sealed with what it
    /// holds. Returns true if the ticket is fresh again.
    pub fn fail(&self, error: &Error) -> bool {
        let mut log = self.log();
        if log.phase != Phase::Receiving || !log.chunks.is_empty() || log.closed {
            drop(log);
            self.seal();
            return false;
        }
        log.phase = Phase::Fresh;
        // Its rows were never recorded: the next read numbers rows afresh.
        log.row_receipts.clear();
        log.failed_first_reads.record(error);
        drop(log);
        self.notify();
        true
    }

    /// Closes the ticket for good (commit or release) and hands over its
    /// receipts; its rows are dropped.
    pub fn close(&self) -> Vec<ReceiptHandle> {
        self.close_with_second_receipts().0
    }

    /// [`Ticket::close`], and the second receipts kept with
    /// [`Ticket::add_second_receipt`], each as (row, second receipt, the row's own): a
    /// delete or give-back of such a row uses both.
    pub fn close_with_second_receipts(
        &self,
    ) -> (
        Vec<ReceiptHandle>,
        Vec<(usize, ReceiptHandle, ReceiptHandle)>,
    ) {
        let mut log = self.log();
        log.closed = true;
        log.phase = Phase::Sealed;
        let (messages, bytes) = (log.messages, log.bytes);
        log.messages = 0;
        log.bytes = 0;
        log.oldest_sent_ms = None;
        log.batches.clear();
        log.starts.clear();
        log.coalesced = 0;
        log.rows = 0;
        // In row order: a row's own receipt is at its index.
        let receipts: Vec<ReceiptHandle> =
            log.chunks.iter().flat_map(|c| log.receipts_of(c)).collect();
        log.chunks.clear();
        let keys = std::mem::take(&mut log.keys);
        let second = log
            .row_receipts
            .take_second()
            .into_iter()
            .filter_map(|(row, r)| Some((row, r, receipts.get(row)?.clone())))
            .collect();
        log.row_receipts.clear();
        drop(log);
        if let Some(d) = &self.dedup {
            d.release(self, &keys);
        }
        self.usage.remove(messages, bytes);
        self.notify();
        (receipts, second)
    }

    /// The objects the held rows' large payloads were read from, each
    /// with the receipt its row is deleted with.
    pub fn objects(&self) -> Vec<(ReceiptHandle, S3Object)> {
        let log = self.log();
        let mut out = Vec::new();
        for c in log.chunks.iter().filter(|c| !c.objects.is_empty()) {
            let receipts = log.receipts_of(c);
            out.extend(c.objects.iter().filter_map(|(offset, o)| {
                Some((receipts.get(*offset as usize)?.clone(), o.clone()))
            }));
        }
        out
    }

    /// The receipt handles held now, in order, as the state store keeps
    /// them; the ticket is unchanged.
    pub fn receipts(&self) -> Vec<String> {
        let log = self.log();
        log.chunks
            .iter()
            .flat_map(|c| {
                log.receipts_of(c)
                    .into_iter()
                    .map(|r| r.expose().to_string())
            })
            .collect()
    }

    /// The rows held now whose message id is in `ids`, and with
    /// `payload_errors` those whose payload did not decode, as
    /// [`Picked`]. A ticket never read holds no row, so it picks none.
    ///
    /// Payload errors are known per receive already; ids are read from the
    /// held rows (a coalesced batch is unpacked for it, outside the log's
    /// lock), so only a commit that names ids pays for it.
    pub fn pick(&self, ids: &HashSet<&str>, payload_errors: bool) -> Result<Picked, Error> {
        let (held, mut picked) = {
            let log = self.log();
            let held: Vec<(usize, LogRows)> = if ids.is_empty() {
                Vec::new()
            } else {
                let shared = log.batches.iter().map(LogRows::share);
                log.starts.iter().copied().zip(shared).collect()
            };
            let mut picked = Picked::default();
            if payload_errors {
                let mut start = 0usize;
                for c in &log.chunks {
                    picked
                        .rows
                        .extend(c.payload_errors.iter().map(|&i| start + i as usize));
                    start += c.receipts.len();
                }
            }
            (held, picked)
        };
        for (start, h) in held {
            let rows = match h {
                LogRows::Rows(b) => b,
                LogRows::Packed(p) => p
                    .unpack()
                    .map_err(|e| Error::Internal(format!("unpacking held rows: {e}")))?,
            };
            let column = rows.column_by_name(sqs_flight_schemas::column::MESSAGE_ID);
            let Some(column) = column.and_then(|c| c.as_string_opt::<i32>()) else {
                return Err(Error::Internal("held rows without message ids".into()));
            };
            for (i, id) in column.iter().enumerate() {
                if let Some(id) = id.filter(|id| ids.contains(id)) {
                    picked.rows.insert(start + i);
                    picked.ids.insert(id.to_string());
                }
            }
        }
        Ok(picked)
    }

    /// Messages held (not yet committed or released).
    pub fn in_flight(&self) -> u64 {
        self.log().messages
    }

    /// The oldest `SentTimestamp` (ms since the epoch) of the messages
    /// held; `None` when none is held (or none has one).
    pub fn oldest_sent_ms(&self) -> Option<i64> {
        self.log().oldest_sent_ms
    }

    /// Chunks whose visibility ends before `horizon`.
    pub fn due(self: &Arc<Self>, horizon: Instant) -> Vec<DueChunk> {
        let log = self.log();
        log.chunks
            .iter()
            .enumerate()
            .filter(|(_, c)| c.visible_until < horizon)
            .map(|(index, c)| DueChunk {
                ticket: Arc::clone(self),
                index,
                receipts: log.receipts_of(c),
            })
            .collect()
    }

    /// Records that chunk `index` is hidden until `until`.
    pub fn extended(&self, index: usize, until: Instant) {
        if let Some(c) = self.log().chunks.get_mut(index) {
            c.visible_until = c.visible_until.max(until);
        }
    }

    /// The rows of this ticket: what is recorded, then what is recorded
    /// later, until the log is sealed. `begin` is what the reader's
    /// [`Ticket::begin`] answered: if that read fails before recording
    /// anything, the stream ends with its error.
    pub fn follow(
        self: Arc<Self>,
        begin: Begin,
    ) -> impl Stream<Item = Result<RecordBatch, Error>> + Send + 'static {
        let follower = Follower {
            changed: self.changed.subscribe(),
            ticket: self,
            generation: begin.generation,
            next: 0,
            done: false,
        };
        futures::stream::unfold(follower, |mut follower| async move {
            let item = follower.next_batch().await?;
            Some((item, follower))
        })
    }
}

/// What a reader following a log finds at its next row.
enum Found {
    /// Rows as received, from the next on.
    Rows(RecordBatch),
    /// A packed batch, and the next row's offset in it.
    Unpack(Arc<Packed>, usize),
    /// The first read the reader joined failed with nothing recorded.
    Failed(Error),
    /// Sealed, and every row read.
    End,
    /// Every row recorded so far read: wait for more.
    Wait,
}

/// One reader following a ticket's log (see [`Ticket::follow`]).
struct Follower {
    ticket: Arc<Ticket>,
    /// Told when the log changes.
    changed: watch::Receiver<u64>,
    /// The failed first reads when the reader began
    /// ([`FailedFirstReads::generation`]).
    generation: u64,
    /// The row the reader reads next.
    next: usize,
    /// The stream ended with an error.
    done: bool,
}

impl Follower {
    /// The next rows, waiting for the log to change as needed; `None` at
    /// the end of the stream.
    async fn next_batch(&mut self) -> Option<Result<RecordBatch, Error>> {
        if self.done {
            return None;
        }
        loop {
            match self.look() {
                Found::Rows(b) => return Some(Ok(self.advance(b))),
                Found::Unpack(packed, offset) => return Some(self.unpack(&packed, offset)),
                Found::Failed(e) => return Some(self.fail(e)),
                Found::End => return None,
                Found::Wait => self.changed.changed().await.ok()?,
            }
        }
    }

    /// What the log holds at the reader's next row now.
    fn look(&mut self) -> Found {
        self.changed.borrow_and_update();
        let log = self.ticket.log();
        if let Some(e) = log.failed_first_reads.since(self.generation) {
            Found::Failed(e)
        } else if self.next < log.rows {
            let i = log.starts.partition_point(|&s| s <= self.next) - 1;
            let offset = self.next - log.starts[i];
            match &log.batches[i] {
                LogRows::Rows(b) => Found::Rows(b.slice(offset, b.num_rows() - offset)),
                LogRows::Packed(p) => Found::Unpack(Arc::clone(p), offset),
            }
        } else if log.phase == Phase::Sealed {
            Found::End
        } else {
            Found::Wait
        }
    }

    /// The rows of `packed` from `offset` on; an error ends the stream.
    fn unpack(&mut self, packed: &Packed, offset: usize) -> Result<RecordBatch, Error> {
        match packed.unpack() {
            Ok(b) => Ok(self.advance(b.slice(offset, b.num_rows() - offset))),
            Err(e) => self.fail(Error::Internal(format!("unpacking held rows: {e}"))),
        }
    }

    /// Moves the reader past `rows`, which it streams next.
    fn advance(&mut self, rows: RecordBatch) -> RecordBatch {
        self.next += rows.num_rows();
        rows
    }

    /// Ends the stream with `error`.
    fn fail(&mut self, error: Error) -> Result<RecordBatch, Error> {
        self.done = true;
        Err(error)
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let (messages, bytes, keys) = {
            let mut log = self.log();
            (log.messages, log.bytes, std::mem::take(&mut log.keys))
        };
        self.usage.remove(messages, bytes);
        if let Some(d) = &self.dedup {
            d.release(self, &keys);
        }
    }
}

#[cfg(test)]
mod tests {
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
}
