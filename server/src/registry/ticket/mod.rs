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
//!
//! The log, its receives and their receipts are in `log`, under the
//! ticket's lock; a reader follows it in `follow` ([`Ticket::follow`]).

use std::collections::{BTreeSet, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use arrow_array::RecordBatch;
use arrow_array::cast::AsArray;
use sqs_flight_schemas::TicketId;
use tokio::sync::watch;
use tokio::time::Instant;

mod follow;
mod log;

#[cfg(test)]
mod tests;

pub(crate) use self::log::ReceivedRows;
use self::log::{Log, LogRows};
use super::dedup::{Dedup, Key};
use super::packed::Packed;
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

/// The rows a commit picked in one ticket: their indexes in the log (the
/// same as their receipts' in [`Ticket::close`] and [`Ticket::receipts`]),
/// and the message ids it found among them.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Picked {
    pub(super) rows: BTreeSet<usize>,
    pub(super) ids: HashSet<String>,
}

/// Receives recorded between two coalesces of a ticket's log.
pub(crate) const COALESCE_EVERY: usize = 64;

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
    /// ([`FailedFirstReads::generation`](log::FailedFirstReads::generation)).
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
            log: Mutex::new(Log::new()),
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
