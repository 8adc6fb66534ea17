//! Recording one receive into the ticket's log, in named steps: drop the
//! messages the table holds or committed already ([`ReceiveLoop::deduplicate`]),
//! read the large payloads ([`ReceiveLoop::resolve_payloads`]), keep what
//! fits the partition's `max_bytes` ([`within_budget`]), build the rows
//! ([`ReceiveLoop::build_rows`]) and keep them until the journal has
//! written them ([`ReceiveLoop::keep`], then [`super::durable`]).

use sqs_flight_schemas::{MessageBatchBuilder, SqsMessage, payload};
use tokio::time::Instant;

use super::super::dedup::{self, Key, Seen, Span};
use super::super::ticket::ReceivedRows;
use super::durable::{Durable, Piece};
use super::{Progress, ReceiveLoop, Recorded, delete_again, hand_back, journal_renewed};
use crate::error::{Error, Result};
use crate::large_payload::{Resolved, S3Object};
use crate::metrics::Metrics;
use crate::sqs::{ReceiptHandle, Received};

/// A message new to the table, with its receipt and its key.
type Fresh = (SqsMessage, ReceiptHandle, Key);

/// What a receive's large payloads resolved to, by message, when the
/// table reads them.
struct Payloads {
    resolved: Vec<Resolved>,
    /// Whether the objects are kept for the commit (it deletes them).
    keeps_objects: bool,
}

/// The messages of one receive that fit the partition's `max_bytes`, with
/// what their rows need, and the receipts and keys of those past it.
#[derive(Default)]
struct Within {
    messages: Vec<SqsMessage>,
    receipts: Vec<ReceiptHandle>,
    keys: Vec<Key>,
    sent_ms: Vec<i64>,
    /// The S3 objects kept for the commit, by row.
    objects: Vec<(u32, S3Object)>,
    /// Each row's payload error, up to the last row that has one.
    errors: Vec<Option<String>>,
    bytes: u64,
    overflow: Vec<ReceiptHandle>,
    overflow_keys: Vec<Key>,
}

impl Within {
    fn recorded(&self) -> Recorded {
        if self.overflow.is_empty() {
            Recorded::Yes
        } else {
            Recorded::Full
        }
    }
}

/// Splits `fresh` at the partition's `max_bytes`, `done` counting what the
/// loop recorded before: the first message of a stream is always kept, so
/// one large message cannot stall a partition, and everything after the
/// first message past the budget overflows.
fn within_budget(
    fresh: Vec<Fresh>,
    done: &Progress,
    max_bytes: u64,
    payloads: Option<&Payloads>,
) -> Within {
    let mut w = Within::default();
    for (i, (message, receipt, key)) in fresh.into_iter().enumerate() {
        let size = message.size() as u64;
        let first = done.messages == 0 && w.receipts.is_empty();
        if !w.overflow.is_empty() || (!first && done.bytes + w.bytes + size > max_bytes) {
            w.overflow.push(receipt);
            w.overflow_keys.push(key);
            continue;
        }
        if let Some(p) = payloads {
            let row = w.receipts.len() as u32;
            match p.resolved.get(i) {
                Some(Resolved::Read(o)) if p.keeps_objects => w.objects.push((row, o.clone())),
                Some(Resolved::Failed(why)) => {
                    w.errors.resize(w.receipts.len(), None);
                    w.errors.push(Some(why.clone()));
                }
                _ => {}
            }
        }
        w.sent_ms.extend(message.sent_timestamp);
        w.messages.push(message);
        w.receipts.push(receipt);
        w.keys.push(key);
        w.bytes += size;
    }
    w
}

impl ReceiveLoop {
    /// Records one receive. A message whose id the table holds already
    /// or committed lately adds no row (see [`super::super::dedup`]): a
    /// held one gives its holder the newer receipt, a committed one is
    /// deleted again. Messages past `max_bytes` are handed back to SQS
    /// unrecorded (see [`within_budget`]); so is everything when the
    /// ticket was closed meanwhile (its batch committed or released).
    pub(super) async fn record(
        &self,
        received: Vec<Received>,
        done: &mut Progress,
        durable: &mut Durable,
        call: Span,
        visible_until: Instant,
    ) -> Result<Recorded> {
        let first_row = self.ticket.rows() + durable.rows();
        let mut fresh = self.deduplicate(received, first_row, call).await;
        let payloads = self.resolve_payloads(&mut fresh).await;
        let max_bytes = self.batch.params.max_bytes;
        let mut within = within_budget(fresh, done, max_bytes, payloads.as_ref());
        let dedup = self.table.dedup();
        dedup.release(&self.ticket, &within.overflow_keys);
        let rows = match self.build_rows(&mut within, payloads.is_some()) {
            Ok(rows) => rows,
            Err(e) => {
                dedup.release(&self.ticket, &within.keys);
                return Err(e);
            }
        };
        if within.receipts.is_empty() {
            // Every message was a duplicate, or past `max_bytes`.
            let recorded = within.recorded();
            hand_back(&self.table, within.overflow).await;
            return Ok(recorded);
        }
        Ok(self.keep(rows, within, done, durable, visible_until).await)
    }

    /// The messages of one receive that are new to the table, in receive
    /// order, with their receipts and keys, now held by this ticket at the
    /// rows they will take (see [`super::super::dedup::Dedup::classify`]).
    /// A message received twice in this receive keeps the later receipt;
    /// one committed lately is deleted again here. Its rows start at
    /// `first_row` (past those of the receives not yet in the log).
    async fn deduplicate(
        &self,
        received: Vec<Received>,
        first_row: usize,
        call: Span,
    ) -> Vec<Fresh> {
        let keys: Vec<Key> = received
            .iter()
            .map(|r| dedup::key(&r.message.message_id))
            .collect();
        let (messages, mut receipts): (Vec<_>, Vec<_>) = received
            .into_iter()
            .map(|r| (r.message, Some(r.receipt)))
            .unzip();
        let first_row = u32::try_from(first_row).unwrap_or(u32::MAX);
        let dedup = self.table.dedup();
        let mut renewed = Vec::new();
        let seen = dedup.classify(
            &self.ticket,
            first_row,
            &keys,
            &mut receipts,
            call,
            &mut renewed,
        );
        journal_renewed(&self.registry, &self.table, renewed).await;
        let mut fresh: Vec<usize> = Vec::with_capacity(seen.len());
        let mut again = Vec::new();
        for (i, s) in seen.iter().enumerate() {
            match s {
                Seen::New => fresh.push(i),
                Seen::Again(n) => receipts[fresh[*n]] = receipts[i].take(),
                Seen::Held => {}
                Seen::Committed => again.extend(receipts[i].take()),
            }
        }
        let held = seen.len() - fresh.len() - again.len();
        let m = &self.registry.metrics;
        m.duplicates(self.table.name(), "held", held as u64);
        m.duplicates(self.table.name(), "committed", again.len() as u64);
        delete_again(&self.table, again).await;
        let mut messages: Vec<Option<_>> = messages.into_iter().map(Some).collect();
        fresh
            .into_iter()
            .filter_map(|i| Some((messages[i].take()?, receipts[i].take()?, keys[i])))
            .collect()
    }

    /// Reads the large payloads of `fresh` in place, when the table reads
    /// them: before the rows exist, so that a replay serves the same bytes
    /// and `max_bytes` counts them. Counts the reads in the metrics.
    async fn resolve_payloads(&self, fresh: &mut [Fresh]) -> Option<Payloads> {
        let large = self.table.large_payloads().filter(|l| l.reads())?;
        let mut messages: Vec<_> = fresh.iter_mut().map(|(m, _, _)| m).collect();
        let resolved = large.resolve(&mut messages).await;
        let count = |read: bool| {
            resolved
                .iter()
                .filter(|r| match r {
                    Resolved::Read(_) => read,
                    Resolved::Failed(_) => !read,
                    Resolved::Plain => false,
                })
                .count() as u64
        };
        let m = &self.registry.metrics;
        m.large_payloads(self.table.name(), "read", count(true));
        m.large_payloads(self.table.name(), "read_failed", count(false));
        Some(Payloads {
            resolved,
            // Kept for the commit only when it deletes them.
            keeps_objects: large.deletes_after_commit(),
        })
    }

    /// The rows of `within`'s messages: the table's payload columns added,
    /// and, when the table reads large payloads, each row's payload error.
    fn build_rows(
        &self,
        within: &mut Within,
        reads_large: bool,
    ) -> Result<arrow_array::RecordBatch> {
        let mut builder = MessageBatchBuilder::with_capacity(within.messages.len());
        for message in &within.messages {
            builder.append(message);
        }
        let id = self.ticket.id();
        let errors = &mut within.errors;
        builder
            .finish(id.batch as i64, id.partition as i32)
            .and_then(|b| match self.table.payload() {
                Some(decoder) => decoder.extend(b),
                None => Ok(b),
            })
            .and_then(|b| {
                if !reads_large {
                    return Ok(b);
                }
                errors.resize(b.num_rows(), None);
                payload::with_errors(b, errors)
            })
            .map_err(|e| Error::Internal(format!("building a record batch: {e}")))
    }

    /// Keeps the rows until the journal has written them (see
    /// [`super::durable`]), counts them as received and gives back what
    /// overflowed.
    async fn keep(
        &self,
        rows: arrow_array::RecordBatch,
        within: Within,
        done: &mut Progress,
        durable: &mut Durable,
        visible_until: Instant,
    ) -> Recorded {
        let recorded = within.recorded();
        let Within {
            receipts,
            keys,
            sent_ms,
            objects,
            bytes,
            overflow,
            ..
        } = within;
        let n = receipts.len() as u64;
        done.messages += n;
        done.bytes += bytes;
        durable.keep(Piece {
            held: self.registry.usage.hold(n, bytes),
            received: ReceivedRows {
                rows,
                receipts,
                objects,
                bytes,
                visible_until,
            },
            keys,
            sent_ms,
        });
        hand_back(&self.table, overflow).await;
        recorded
    }

    /// Journals the renewals the record of receive `seq` put in place (by
    /// offset in it).
    pub(super) async fn journal_renewed_in(&self, seq: u64, renewed: Vec<(u32, ReceiptHandle)>) {
        let id = self.ticket.id();
        let renewed = renewed.into_iter().map(|(offset, r)| dedup::Renewed {
            id: id.clone(),
            seq,
            offset,
            receipt: r.expose().to_string(),
        });
        journal_renewed(&self.registry, &self.table, renewed.collect()).await;
    }

    /// Counts `n` messages recorded, and their ages, in the metrics.
    pub(super) fn count(&self, n: u64, sent_ms: Vec<i64>) {
        let id = self.ticket.id();
        let m = &self.registry.metrics;
        Metrics::count(&m.received, &id.table, &id.consumer, n);
        m.message_ages(&id.table, super::super::status::unix_now_ms(), sent_ms);
    }
}
