//! One consumer of a table: its watermark, its open batches, what its
//! commits still have to delete or give back, and its lease.
//!
//! The fields are private: the methods here are the only code that changes
//! a consumer (the registry holds the consumers behind one lock and calls
//! them, as mini-redis keeps its `State` behind `Db`'s methods). A commit
//! is computed once, as a [`Commit`]: the journal's record
//! ([`Commit::state_after`]) and the change of the live consumer
//! ([`Consumer::commit_through`]) are both made from it.

use std::collections::BTreeMap;
use std::ops::RangeBounds;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::ahead::Ahead;
use super::dedup::Key;
use super::reject::Rejects;
use super::status::{ConsumerStatus, age_ms};
use super::store::{StoredConsumer, StoredReject};
use super::ticket::Ticket;
use super::usage::Usage;
use super::{PlannedBatch, caps};
use crate::large_payload::S3Object;
use crate::sqs::ReceiptHandle;

pub(super) struct Consumer {
    committed: Option<u64>,
    last_planned: Option<u64>,
    batches: BTreeMap<u64, Arc<PlannedBatch>>,
    /// The batch after the last planned one, received ahead with the
    /// same plan command (see [`super::ahead`]); not an open batch of
    /// the consumer's until a plan of it takes it.
    ahead: Option<Ahead>,
    /// Receipts of committed batches whose delete has not succeeded yet.
    pending_delete: Vec<ReceiptHandle>,
    /// Receipts whose delete runs behind its commit's answer
    /// (`--deletes-behind`), until SQS answers: written among the pending
    /// deletes by any write of the consumer's state meanwhile (a plan), so
    /// that a crash before they are done retries them at the restart.
    deleting: Vec<ReceiptHandle>,
    /// Rejects written to the journal and not given back yet: those of a
    /// previous process (the heartbeat gives them back once), and those of
    /// the commit under way, kept here so that any other write of the
    /// consumer's state (a plan) keeps them too until the give-back is
    /// done (see [`super::reject`]).
    pending_reject: Vec<PendingReject>,
    /// Messages given back by its commits since this process started.
    rejected: u64,
    last_seen: Instant,
    commit_lock: Arc<tokio::sync::Mutex<()>>,
}

/// The messages one commit rejected, to give back hidden for `delay_seconds`.
pub(super) struct PendingReject {
    delay_seconds: u32,
    receipts: Vec<ReceiptHandle>,
    /// Found in the store at the start (else: the commit under way's).
    restored: bool,
    /// The batch a previous process received ahead, given back at the
    /// start: no reject (not counted in `rejected`).
    read_ahead: bool,
}

impl PendingReject {
    fn stored(&self) -> StoredReject {
        StoredReject {
            delay_seconds: self.delay_seconds,
            receipts: self
                .receipts
                .iter()
                .map(|r| r.expose().to_string())
                .collect(),
            read_ahead: self.read_ahead,
        }
    }

    /// The receipts to give back and how long they stay hidden (seconds).
    pub(super) fn into_parts(self) -> (Vec<ReceiptHandle>, u32) {
        (self.receipts, self.delay_seconds)
    }

    /// Whether it gives back a batch received ahead, not rejects.
    pub(super) fn is_read_ahead(&self) -> bool {
        self.read_ahead
    }
}

/// A commit through a batch, computed once from the consumer: the journal
/// writes [`Commit::state_after`] before the consumer takes it
/// ([`Consumer::commit_through`]).
pub(super) struct Commit {
    /// The committed batch.
    batch: u64,
    /// The consumer's watermark after the commit.
    committed: u64,
    /// The open batches up to `batch`, which the commit forgets.
    done: Vec<Arc<PlannedBatch>>,
    /// The rows the commit gives back instead of deleting.
    rejects: Rejects,
}

/// What a commit took from its consumer ([`Consumer::commit_through`]):
/// the tickets of the batches up to the committed one, still open, and the
/// pending deletes of earlier commits.
pub(super) struct Taking {
    tickets: Vec<Arc<Ticket>>,
    pending_delete: Vec<ReceiptHandle>,
    committed: u64,
}

/// What a commit acts on: receipts to delete, receipts to give back, and
/// the consumer's watermark.
pub(super) struct Taken {
    /// One receipt per message (and the pending deletes of earlier commits).
    pub(super) delete: Vec<ReceiptHandle>,
    /// Second receipts of rows in `delete`, each with the row's own: a
    /// message that two overlapping calls brought is deleted with both
    /// (see `dedup::offer`), and counted once.
    pub(super) second: Vec<(ReceiptHandle, ReceiptHandle)>,
    pub(super) reject: Vec<ReceiptHandle>,
    pub(super) committed: u64,
}

impl Commit {
    /// The batches the commit forgets.
    pub(super) fn forgotten(&self) -> impl Iterator<Item = u64> + '_ {
        self.done.iter().map(|b| b.batch)
    }

    /// How long the commit's rejects stay hidden, in seconds.
    pub(super) fn delay_seconds(&self) -> u32 {
        self.rejects.delay_seconds()
    }

    /// The consumer's state (`before`, as the store keeps it) once the
    /// commit is done, as the journal writes it before anything changes:
    /// the new watermark, the receipts of the batches up to it added to its
    /// pending deletes, and those of the rejected messages to its pending
    /// rejects. It reads the tickets' logs: call it outside the consumers'
    /// lock.
    pub(super) fn state_after(&self, mut state: StoredConsumer) -> StoredConsumer {
        state.committed = Some(self.committed);
        let tickets = self.done.iter().flat_map(|b| b.tickets.iter());
        let (delete, reject) = self.split(tickets, Ticket::receipts);
        state.pending_delete.extend(delete);
        if !reject.is_empty() {
            state.pending_reject.push(StoredReject {
                delay_seconds: self.delay_seconds(),
                receipts: reject,
                read_ahead: false,
            });
        }
        state
    }

    /// Closes the tickets the commit took and splits their receipts into
    /// those to delete (after the pending deletes) and those to give back.
    /// Call it outside the consumers' lock.
    ///
    /// The ids it deletes enter the table's committed window first, so
    /// that a copy SQS delivers again meanwhile is never new to the table
    /// (see [`super::dedup`]); the ids it rejects do not.
    pub(super) fn close(&self, taking: Taking) -> Taken {
        let (mut delete, mut reject, mut second) = (taking.pending_delete, Vec::new(), Vec::new());
        for t in &taking.tickets {
            if let Some(dedup) = t.dedup() {
                dedup.committed(self.rejects.split(t, t.keys()).0);
            }
            let (receipts, seconds) = t.close_with_second_receipts();
            second.extend(self.rejects.not_rejected(t, seconds));
            let (d, r) = self.rejects.split(t, receipts);
            delete.extend(d);
            reject.extend(r);
        }
        Taken {
            delete,
            second,
            reject,
            committed: taking.committed,
        }
    }

    /// The objects its batches' large payloads were read from, each with
    /// the receipt its row is deleted with (a rejected row's receipt is
    /// not deleted, so its object stays). Read before the tickets close.
    pub(super) fn objects(&self) -> Vec<(ReceiptHandle, S3Object)> {
        let tickets = self.done.iter().flat_map(|b| b.tickets.iter());
        tickets.flat_map(|t| t.objects()).collect()
    }

    /// The message ids (as keys) the commit deletes: those of its batches'
    /// rows, without the rows it rejects.
    pub(super) fn deleted_keys(&self) -> Vec<Key> {
        let tickets = self.done.iter().flat_map(|b| b.tickets.iter());
        self.split(tickets, Ticket::keys).0
    }

    /// The receipts of `tickets` (read with `receipts_of`), split into
    /// those to delete and those to give back.
    fn split<'a, T>(
        &self,
        tickets: impl IntoIterator<Item = &'a Arc<Ticket>>,
        receipts_of: impl Fn(&Ticket) -> Vec<T>,
    ) -> (Vec<T>, Vec<T>) {
        let (mut delete, mut reject) = (Vec::new(), Vec::new());
        for t in tickets {
            let (d, r) = self.rejects.split(t, receipts_of(t));
            delete.extend(d);
            reject.extend(r);
        }
        (delete, reject)
    }
}

impl Consumer {
    pub(super) fn new() -> Self {
        Self {
            committed: None,
            last_planned: None,
            batches: BTreeMap::new(),
            ahead: None,
            pending_delete: Vec::new(),
            deleting: Vec::new(),
            pending_reject: Vec::new(),
            rejected: 0,
            last_seen: Instant::now(),
            commit_lock: Arc::default(),
        }
    }

    /// A consumer as the store kept it; its pending rejects are marked
    /// restored, for the heartbeat to give back once.
    pub(super) fn restored(state: StoredConsumer) -> Self {
        let mut c = Self::new();
        c.committed = state.committed;
        c.last_planned = state.last_planned;
        c.pending_delete = state
            .pending_delete
            .into_iter()
            .map(ReceiptHandle::new)
            .collect();
        c.pending_reject = state
            .pending_reject
            .into_iter()
            .map(|r| PendingReject {
                delay_seconds: r.delay_seconds,
                receipts: r.receipts.into_iter().map(ReceiptHandle::new).collect(),
                restored: true,
                read_ahead: r.read_ahead,
            })
            .collect();
        c
    }

    /// What the store keeps of this consumer.
    pub(super) fn stored(&self) -> StoredConsumer {
        StoredConsumer {
            committed: self.committed,
            last_planned: self.last_planned,
            pending_delete: self
                .pending_delete
                .iter()
                .chain(&self.deleting)
                .map(|r| r.expose().to_string())
                .collect(),
            pending_reject: self
                .pending_reject
                .iter()
                .map(PendingReject::stored)
                .collect(),
        }
    }

    /// Renews the lease (any RPC that names the consumer).
    pub(super) fn touch(&mut self) {
        self.last_seen = Instant::now();
    }

    /// The batch a plan that names none gets.
    pub(super) fn next_batch(&self) -> u64 {
        self.last_planned.max(self.committed).map_or(1, |b| b + 1)
    }

    /// The watermark, if `batch` is at or below it (committed already).
    pub(super) fn committed_through(&self, batch: u64) -> Option<u64> {
        self.committed.filter(|&w| batch <= w)
    }

    /// The open batch `batch`, if planned.
    pub(super) fn planned(&self, batch: u64) -> Option<&Arc<PlannedBatch>> {
        self.batches.get(&batch)
    }

    /// How many batches are open.
    pub(super) fn open_batch_count(&self) -> usize {
        self.batches.len()
    }

    /// Every open batch, and the batch received ahead (the heartbeat
    /// keeps them all hidden).
    pub(super) fn open_batches(&self) -> impl Iterator<Item = &Arc<PlannedBatch>> {
        self.batches
            .values()
            .chain(self.ahead.as_ref().map(Ahead::planned))
    }

    /// The batch received ahead, if any.
    pub(super) fn ahead(&self) -> Option<&Ahead> {
        self.ahead.as_ref()
    }

    /// Keeps `ahead` as the batch received ahead; its tickets are counted
    /// in `usage`.
    pub(super) fn set_ahead(&mut self, ahead: Ahead, usage: &Usage) {
        usage.add_tickets(ahead.planned().tickets.len() as u64);
        self.ahead = Some(ahead);
    }

    /// Takes the batch received ahead, to give back; its tickets are no
    /// longer counted in `usage`.
    pub(super) fn take_ahead(&mut self, usage: &Usage) -> Option<Arc<PlannedBatch>> {
        let ahead = self.ahead.take()?;
        usage.remove_tickets(ahead.planned().tickets.len() as u64);
        Some(Arc::clone(ahead.planned()))
    }

    /// Makes the batch received ahead an open batch of the consumer's (a
    /// plan of it with the same command): its tickets stay counted.
    pub(super) fn adopt_ahead(&mut self) -> Option<Arc<PlannedBatch>> {
        let planned = Arc::clone(self.ahead.take()?.planned());
        self.last_planned = self.last_planned.max(Some(planned.batch));
        self.batches.insert(planned.batch, Arc::clone(&planned));
        Some(planned)
    }

    /// The tickets of the open batches in `range`.
    pub(super) fn tickets(&self, range: impl RangeBounds<u64>) -> Vec<Arc<Ticket>> {
        self.batches
            .range(range)
            .flat_map(|(_, b)| b.tickets.iter().cloned())
            .collect()
    }

    /// Adds a planned batch (a new plan, or one restored from the store);
    /// its tickets are counted in `usage`.
    pub(super) fn add_batch(&mut self, planned: Arc<PlannedBatch>, usage: &Usage) {
        usage.add_tickets(planned.tickets.len() as u64);
        self.last_planned = self.last_planned.max(Some(planned.batch));
        self.batches.insert(planned.batch, planned);
    }

    /// Whether nothing of this consumer is worth keeping: no watermark, no
    /// open batch, no delete to retry. A released consumer that never
    /// committed is forgotten, so that `status` lists only consumers that
    /// hold or committed something (a peek leaves no trace).
    pub(super) fn is_empty(&self) -> bool {
        self.committed.is_none()
            && self.batches.is_empty()
            && self.ahead.is_none()
            && self.pending_delete.is_empty()
            && self.deleting.is_empty()
            && self.pending_reject.is_empty()
    }

    /// Whether it holds open batches, deletes to retry or rejects to give
    /// back (a server told to exit when idle waits for them). A batch
    /// received ahead is not work: the shutdown gives it back.
    pub(super) fn holds_work(&self) -> bool {
        !self.pending_delete.is_empty()
            || !self.deleting.is_empty()
            || !self.pending_reject.is_empty()
            || !self.batches.is_empty()
    }

    /// Whether the consumer holds nothing but its watermark and has not
    /// called for `lease`: it may give its place to a new consumer.
    pub(super) fn is_idle(&self, now: Instant, lease: Duration) -> bool {
        self.batches.is_empty()
            && self.ahead.is_none()
            && self.pending_delete.is_empty()
            && self.pending_reject.is_empty()
            && now.saturating_duration_since(self.last_seen) > lease
            // No commit under way (it holds the lock's other handle).
            && Arc::strong_count(&self.commit_lock) == 1
    }

    /// Whether it holds open batches and has not called for `lease`.
    pub(super) fn lease_expired(&self, now: Instant, lease: Duration) -> bool {
        (!self.batches.is_empty() || self.ahead.is_some())
            && now.duration_since(self.last_seen) > lease
    }

    /// Takes every open batch, and the batch received ahead (release,
    /// lease expiry); their tickets are no longer counted in `usage`.
    pub(super) fn take_open(&mut self, usage: &Usage) -> Vec<Arc<PlannedBatch>> {
        self.last_planned = self.committed;
        let mut open: Vec<_> = std::mem::take(&mut self.batches).into_values().collect();
        usage.remove_tickets(caps::tickets_of(&open));
        open.extend(self.take_ahead(usage));
        open
    }

    /// Renews the lease for a commit and hands over the lock that
    /// serializes the consumer's commits.
    pub(super) fn commit_lock(&mut self) -> Arc<tokio::sync::Mutex<()>> {
        self.touch();
        Arc::clone(&self.commit_lock)
    }

    /// A commit through `batch` that gives back `rejects`: computed once,
    /// here, from the consumer as it is now.
    pub(super) fn commit(&self, batch: u64, rejects: Rejects) -> Commit {
        Commit {
            batch,
            committed: self.committed.map_or(batch, |w| w.max(batch)),
            done: self
                .batches
                .range(..=batch)
                .map(|(_, b)| Arc::clone(b))
                .collect(),
            rejects,
        }
    }

    /// Takes `commit` (after the journal wrote it): raises the watermark,
    /// forgets the batches up to it (their tickets no longer counted in
    /// `usage`) and takes their tickets, with the pending deletes of
    /// earlier commits, for [`Commit::close`].
    pub(super) fn commit_through(&mut self, commit: &Commit, usage: &Usage) -> Taking {
        let keep = self.batches.split_off(&(commit.batch + 1));
        let done = std::mem::replace(&mut self.batches, keep);
        usage.remove_tickets(caps::tickets_of(done.values()));
        self.committed = self.committed.max(Some(commit.batch));
        Taking {
            tickets: done
                .values()
                .flat_map(|b| b.tickets.iter().cloned())
                .collect(),
            pending_delete: std::mem::take(&mut self.pending_delete),
            committed: self.committed.unwrap_or(commit.batch),
        }
    }

    /// Keeps the commit's rejects (`receipts`) on the list while they are
    /// given back, so that any write of the consumer's state keeps them.
    pub(super) fn hold_rejects(&mut self, commit: &Commit, receipts: Vec<ReceiptHandle>) {
        self.pending_reject.push(PendingReject {
            delay_seconds: commit.delay_seconds(),
            receipts,
            restored: false,
            read_ahead: false,
        });
    }

    /// Keeps `receipts`, whose delete runs behind the commit's answer, as
    /// in flight and pending until [`Consumer::commit_done`].
    pub(super) fn delete_behind(&mut self, receipts: &[ReceiptHandle]) {
        self.deleting = receipts.to_vec();
    }

    /// After a commit's calls: the deletes SQS neither did nor refused are
    /// kept for the next commit to retry, and the commit's own rejects are
    /// off the list (given back, or given up on).
    pub(super) fn commit_done(&mut self, unresolved: Vec<ReceiptHandle>) {
        self.deleting.clear();
        self.pending_delete.extend(unresolved);
        self.pending_reject.retain(|r| r.restored);
    }

    /// Whether it holds rejects of a previous process to give back.
    pub(super) fn has_restored_rejects(&self) -> bool {
        self.pending_reject.iter().any(|r| r.restored)
    }

    /// Takes the rejects of a previous process, to give back once.
    pub(super) fn take_restored_rejects(&mut self) -> Vec<PendingReject> {
        let (restored, own) = std::mem::take(&mut self.pending_reject)
            .into_iter()
            .partition(|r| r.restored);
        self.pending_reject = own;
        restored
    }

    /// Counts messages its commits gave back.
    pub(super) fn count_rejected(&mut self, n: u64) {
        self.rejected += n;
    }

    /// The consumer in `status`, at `now_ms`, with `receives_in_flight` of
    /// its table's count.
    pub(super) fn status(&self, now_ms: i64, receives_in_flight: u64) -> ConsumerStatus {
        let in_flight = self
            .batches
            .values()
            .flat_map(|b| b.tickets.iter())
            .map(|t| t.in_flight())
            .sum::<u64>()
            + self.pending_delete.len() as u64
            + self.deleting.len() as u64;
        ConsumerStatus {
            committed_batch: self.committed,
            last_planned_batch: self.last_planned,
            open_batches: self.batches.keys().copied().collect(),
            in_flight,
            read_ahead_batch: self.ahead.as_ref().map(|a| a.planned().batch),
            read_ahead: self.ahead.as_ref().map(Ahead::messages),
            oldest_age_ms: self
                .newest_batch_oldest_sent_ms()
                .map(|sent| age_ms(now_ms, sent)),
            rejected: self.rejected,
            receives_in_flight,
        }
    }

    /// The oldest `SentTimestamp` held by the last planned batch, if it
    /// is open and holds a message that has one.
    fn newest_batch_oldest_sent_ms(&self) -> Option<i64> {
        let batch = self.batches.get(&self.last_planned?)?;
        batch
            .tickets
            .iter()
            .filter_map(|t| t.oldest_sent_ms())
            .min()
    }

    /// Makes the consumer's last call `at` (a test's way to pass its lease).
    #[cfg(test)]
    pub(super) fn seen_at(&mut self, at: Instant) {
        self.last_seen = at;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deletes_running_behind_are_pending_in_every_write_until_done() {
        let mut c = Consumer::new();
        let receipts = vec![
            ReceiptHandle::new("r1".into()),
            ReceiptHandle::new("r2".into()),
        ];
        c.delete_behind(&receipts);
        assert_eq!(
            c.stored().pending_delete,
            ["r1", "r2"],
            "a plan's write keeps them"
        );
        assert!(c.holds_work(), "an idle exit waits for them");
        assert_eq!(c.status(0, 0).in_flight, 2);
        c.commit_done(vec![ReceiptHandle::new("r2".into())]);
        assert_eq!(c.stored().pending_delete, ["r2"], "only the unresolved one");
        assert_eq!(c.status(0, 0).in_flight, 1);
    }
}
