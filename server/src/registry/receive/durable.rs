//! Writing a loop's receives to the journal without holding the loop up.
//!
//! A receive's rows enter the ticket's log (and so reach its readers) only
//! once the journal has written them. The loop does not wait for that: it
//! keeps what it received as pending ([`Durable::keep`]) and goes on
//! receiving while one write of this ticket is in flight, which carries
//! every receive pending when it was handed over, each as a chunk of its
//! own ([`ReceiveLoop::flush`]). When it lands, its receives enter the log
//! in order ([`ReceiveLoop::landed`]); when it fails, they and everything
//! pending go back to SQS and the loop ends with the error. Until the
//! ticket holds them, the registry's budget counts them all the same. One write in
//! flight at a time keeps the journal free of gaps: a chunk is never
//! written after one before it failed.
//!
//! With the state in object storage, where every write is a billed request,
//! pending receives also wait up to the journal's linger (see
//! [`crate::registry::journal::STATE_LOG_LINGER`]) or until
//! [`FLUSH_MESSAGES`] of them are pending, so that one write carries
//! hundreds of messages; a local store writes them as soon as the previous
//! write landed; in memory they enter the log at once.

use std::time::Duration;

use tokio::time::Instant;

use super::super::dedup::Key;
use super::super::journal::Written;
use super::super::store;
use super::super::ticket::{Closed, ReceivedRows};
use super::super::usage::Held;
use super::{ReceiveLoop, Recorded, hand_back, unix_ms};
use crate::error::Result;
use crate::sqs::ReceiptHandle;

/// Pending receives are written without waiting out the linger once they
/// hold this many messages.
pub(super) const FLUSH_MESSAGES: u64 = 1000;

/// One receive kept for the ticket's log, with what its record needs once
/// written.
pub(super) struct Piece {
    pub(super) received: ReceivedRows,
    /// Its messages' keys, held by the ticket in the dedup map.
    pub(super) keys: Vec<Key>,
    /// Its messages' send times, for the age metrics.
    pub(super) sent_ms: Vec<i64>,
    /// Its messages and bytes, counted in the registry's budget until the
    /// ticket counts them (or they go back).
    pub(super) held: Held,
}

impl Piece {
    fn messages(&self) -> u64 {
        self.received.receipts.len() as u64
    }
}

/// The receives of one loop not yet in the ticket's log: pending, and in
/// the write in flight.
pub(super) struct Durable {
    pending: Vec<Piece>,
    /// When the oldest pending receive was kept.
    since: Option<Instant>,
    writing: Option<(Written, Vec<Piece>)>,
    linger: Duration,
}

impl Durable {
    pub(super) fn new(linger: Duration) -> Self {
        Self {
            pending: Vec::new(),
            since: None,
            writing: None,
            linger,
        }
    }

    /// Keeps one receive until it is written.
    pub(super) fn keep(&mut self, piece: Piece) {
        self.since.get_or_insert_with(Instant::now);
        self.pending.push(piece);
    }

    /// Rows kept and not yet in the ticket's log: where the next receive's
    /// rows start, past the log's.
    pub(super) fn rows(&self) -> usize {
        let in_flight = self.writing.iter().flat_map(|(_, p)| p);
        self.pending
            .iter()
            .chain(in_flight)
            .map(|p| p.received.receipts.len())
            .sum()
    }

    pub(super) fn is_writing(&self) -> bool {
        self.writing.is_some()
    }

    /// Whether nothing is pending or in flight.
    pub(super) fn is_empty(&self) -> bool {
        self.pending.is_empty() && self.writing.is_none()
    }

    /// When the pending receives are due to be written, if any are and no
    /// write is in flight: now, once enough are pending.
    pub(super) fn due_at(&self) -> Option<Instant> {
        if self.writing.is_some() {
            return None;
        }
        let since = self.since?;
        let messages: u64 = self.pending.iter().map(Piece::messages).sum();
        if messages >= FLUSH_MESSAGES {
            return Some(since);
        }
        Some(since + self.linger)
    }

    /// The outcome of the write in flight, once it lands (cancel-safe);
    /// never answers when none is in flight.
    pub(super) async fn landing(&mut self) -> Result<()> {
        match &mut self.writing {
            Some((written, _)) => written.outcome().await,
            None => std::future::pending().await,
        }
    }

    /// The outcome of the write in flight, if it has landed already.
    pub(super) fn landed_now(&mut self) -> Option<Result<()>> {
        self.writing.as_mut()?.0.landed()
    }

    /// Everything not yet in the log, pending and in flight, in receive
    /// order; nothing is left.
    pub(super) fn take_all(&mut self) -> Vec<Piece> {
        let mut all = self.writing.take().map(|(_, p)| p).unwrap_or_default();
        all.append(&mut self.pending);
        self.since = None;
        all
    }
}

impl ReceiveLoop {
    /// Hands every pending receive to the journal as one write, a chunk
    /// each, numbered after the ticket's log (no write is in flight, so
    /// every earlier chunk is in it), and the ticket's seal after them when
    /// `seal`. A write that cannot be handed over leaves them pending and
    /// fails.
    pub(super) fn flush(&self, d: &mut Durable, seal: bool) -> Result<()> {
        debug_assert!(d.writing.is_none(), "one write in flight at a time");
        if d.pending.is_empty() {
            return Ok(());
        }
        let pieces = std::mem::take(&mut d.pending);
        d.since = None;
        let first = self.ticket.recorded_chunks();
        let id = self.ticket.id();
        let ops = || {
            pieces
                .iter()
                .zip(first..)
                .map(|(p, seq)| {
                    let r = &p.received;
                    Ok(store::Op::Chunk {
                        id: id.clone(),
                        seq,
                        meta: store::ChunkMeta {
                            receipts: r.receipts.iter().map(|h| h.expose().to_string()).collect(),
                            visible_until_ms: unix_ms(r.visible_until),
                            bytes: r.bytes,
                            plan: id.plan,
                            objects: r.objects.clone(),
                        },
                        rows: store::encode_rows(&r.rows)?,
                    })
                })
                .chain(seal.then(|| Ok(store::Op::Seal { id: id.clone() })))
                .collect()
        };
        match self.registry.journal.submit(ops) {
            Ok(written) => {
                d.writing = Some((written, pieces));
                Ok(())
            }
            Err(e) => {
                d.pending = pieces;
                Err(e)
            }
        }
    }

    /// Puts the receives of the write that landed with `outcome` into the
    /// ticket's log, in order, and counts them. A failed write, or a
    /// ticket closed meanwhile, gives back everything not yet in the log
    /// (pending too) and ends the loop.
    pub(super) async fn landed(&self, d: &mut Durable, outcome: Result<()>) -> Result<Recorded> {
        if let Err(e) = outcome {
            self.give_back(d.take_all()).await;
            return Err(e);
        }
        let (_, pieces) = d.writing.take().expect("a write was in flight");
        let mut pieces = pieces.into_iter();
        while let Some(piece) = pieces.next() {
            let seq = self.ticket.recorded_chunks();
            let Piece {
                received,
                keys,
                sent_ms,
                held,
            } = piece;
            let n = received.receipts.len() as u64;
            let appended = self.ticket.append(received);
            // Counted by the ticket now, or going back.
            drop(held);
            match appended {
                Ok(renewed) => {
                    self.journal_renewed_in(seq, renewed).await;
                    self.count(n, sent_ms);
                }
                Err(Closed(back)) => {
                    self.table.dedup().release(&self.ticket, &keys);
                    let mut rest: Vec<Piece> = pieces.collect();
                    rest.append(&mut d.take_all());
                    hand_back(&self.table, back).await;
                    self.give_back(rest).await;
                    return Ok(Recorded::Closed);
                }
            }
        }
        Ok(Recorded::Yes)
    }

    /// Writes what is left at the loop's end and waits for it, with the
    /// ticket's seal in the last write when `seal` (saving a write of its
    /// own): whether the seal was written, or the write's error.
    pub(super) async fn drain(&self, d: &mut Durable, seal: bool) -> Result<bool> {
        let mut sealed = false;
        while !d.is_empty() {
            if !d.is_writing() {
                if let Err(e) = self.flush(d, seal) {
                    self.give_back(d.take_all()).await;
                    return Err(e);
                }
                sealed = seal;
                continue;
            }
            let outcome = d.landing().await;
            if let Recorded::Closed = self.landed(d, outcome).await? {
                return Ok(false);
            }
        }
        Ok(sealed)
    }

    /// Releases the keys of `pieces` and hands their messages back to SQS:
    /// they never entered the ticket's log.
    pub(super) async fn give_back(&self, pieces: Vec<Piece>) {
        let dedup = self.table.dedup();
        let mut back: Vec<ReceiptHandle> = Vec::new();
        for p in pieces {
            dedup.release(&self.ticket, &p.keys);
            back.extend(p.received.receipts);
        }
        hand_back(&self.table, back).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::Ordering::SeqCst;

    use futures::StreamExt;
    use sqs_flight_schemas::{CommitCommand, PlanCommand};
    use tokio_util::sync::CancellationToken;

    use super::super::super::test_support::{counts, read_partition, registry, until};
    use super::super::super::{PlannedBatch, Registry, store};

    /// A registry on 100 messages with its store in a scratch directory,
    /// and its batch 1 planned.
    async fn planned(
        name: &str,
    ) -> (
        tempfile::TempDir,
        Arc<Registry>,
        Arc<store::Store>,
        Arc<PlannedBatch>,
    ) {
        let scratch = crate::scratch::dir(name);
        let r = registry(100, Some(&scratch.path().join("state"))).await;
        let store = Arc::clone(r.journal.store().unwrap());
        let batch = plan(&r).await;
        (scratch, r, store, batch)
    }

    /// Batch 1 of consumer `c`: one partition of up to 100 messages,
    /// nothing received before its read.
    async fn plan(r: &Arc<Registry>) -> Arc<PlannedBatch> {
        let mut cmd = PlanCommand::new("t", "c");
        cmd.batch = Some(1);
        cmd.partitions = Some(1);
        cmd.max_messages = Some(100);
        cmd.max_wait_ms = Some(1000);
        cmd.read_ahead = Some(0);
        r.plan(&cmd).await.unwrap()
    }

    /// Waits until all 100 messages are received (in flight).
    async fn all_in_flight(r: &Registry) {
        until("every message received", || {
            let now = futures::executor::block_on(counts(r));
            (now == (0, 100)).then_some(())
        })
        .await;
    }

    // The gate holds the store's writer thread, not a task, on purpose.
    #[allow(clippy::await_holding_lock)]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn receives_go_on_while_a_write_is_in_flight_and_their_rows_wait_for_it() {
        let (_scratch, r, store, batch) = planned("durable-pipelined").await;
        let gate = store.write_gate.lock().unwrap();
        let before = store.writes.load(SeqCst);
        let reader = {
            let (r, batch) = (Arc::clone(&r), Arc::clone(&batch));
            tokio::spawn(async move { read_partition(&r, &batch, 0).await })
        };
        // Ten receives of ten, all made while the first write is held.
        all_in_flight(&r).await;
        assert_eq!(batch.tickets[0].rows(), 0, "no row is in the log unwritten");
        assert_eq!(
            r.usage.snapshot().0,
            100,
            "the budget counts them all the same"
        );
        drop(gate);
        let ids = reader.await.unwrap();
        assert_eq!(ids.len(), 100);
        assert_eq!(r.usage.snapshot().0, 100, "counted once, by the ticket now");
        let writes = store.writes.load(SeqCst) - before;
        assert_eq!(
            writes, 2,
            "the first receive, then the nine pending behind it with the seal"
        );
        assert_eq!(read_partition(&r, &batch, 0).await, ids, "a replay");
        let done = r.commit(&CommitCommand::new("t", "c", 1)).await.unwrap();
        assert_eq!((done.deleted, counts(&r).await), (100, (0, 0)));
        assert_eq!(r.usage.snapshot(), (0, 0));
    }

    // The gate holds the store's writer thread, not a task, on purpose.
    #[allow(clippy::await_holding_lock)]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_write_gives_back_its_receives_and_those_pending() {
        let (_scratch, r, store, batch) = planned("durable-failed").await;
        let gate = store.write_gate.lock().unwrap();
        // The first write of the read lands; every later one fails.
        store
            .fail_from_write
            .store(store.writes.load(SeqCst) + 1, SeqCst);
        let reader = {
            let id = batch.tickets[0].id().clone();
            let stream = r.read(&id, &CancellationToken::new()).unwrap();
            tokio::spawn(stream.collect::<Vec<_>>())
        };
        all_in_flight(&r).await;
        drop(gate);
        let streamed = reader.await.unwrap();
        let error = streamed.last().unwrap().as_ref().unwrap_err().to_string();
        assert!(error.contains("failure injected"), "{error}");
        let kept: usize = streamed.iter().flatten().map(|b| b.num_rows()).sum();
        let ids = read_partition(&r, &batch, 0).await;
        assert_eq!(ids.len(), kept, "a replay streams what was written");
        let kept = kept as u64;
        assert!(kept > 0 && kept < 100, "the first write's rows: {kept}");
        until("the rest given back", || {
            let now = futures::executor::block_on(counts(&r));
            (now == (100 - kept, kept)).then_some(())
        })
        .await;
        store.fail_from_write.store(u64::MAX, SeqCst);
        assert_eq!(
            r.usage.snapshot().0,
            kept,
            "what went back is no longer counted"
        );
        let done = r.commit(&CommitCommand::new("t", "c", 1)).await.unwrap();
        assert_eq!((done.deleted, counts(&r).await), (kept, (100 - kept, 0)));
    }
}
