//! Read-ahead: a consumer's next batch received before the consumer plans
//! it (docs/protocol.md, "Read-ahead").
//!
//! When a plan makes batch N of a consumer with `read_ahead` 1, the
//! registry also plans batch N+1 with the same plan command, as the
//! consumer's *batch received ahead* ([`Ahead`]). It is an ordinary plan
//! in every way that keeps messages safe: its tickets are in the journal,
//! their receives are recorded before anything sees them, the heartbeat
//! keeps them hidden, they count in the registry's budget and caps, and
//! the table's held ids cover them. What differs is who starts the
//! receive: once every partition of batch N has received (each first
//! read's loop ended), the registry starts the first reads of batch N+1
//! itself. So batch N+1 never takes messages that a partition of batch N
//! still to be read would have got (an engine with fewer cores than
//! partitions reads them one after another), and an idle queue costs one
//! long poll per partition at a time, as without read-ahead.
//!
//! A plan of batch N+1 with the same command *takes* it: the batch
//! becomes an open batch of the consumer's, its tickets are the ones the
//! plan hands out, their reads follow the receive under way or replay what
//! it recorded (rule 1 holds: a ticket's rows are fixed at its first
//! read, which read-ahead made), and the plan makes batch N+2 ahead in
//! turn. Any other plan gives it back (visibility 0) first: a plan of
//! another batch, or with another command, or when every partition of it
//! came back empty (so a queue that was idle when it was read ahead does
//! not make the consumer's next batch empty). Release, lease expiry and
//! shutdown give it back as they do open batches, and a restart with
//! `--state-dir` gives back the batch a previous process read ahead.
//!
//! A plan with `receive_at_plan` 1 starts the first reads of the batch it
//! plans in the same way, at once, when every earlier open batch of the
//! consumer has received (docs/protocol.md, "Planning"): the engine's
//! planning and task launch then overlap SQS's round trip.

use std::sync::Arc;

use sqs_flight_schemas::PlanCommand;

use super::receive::ReceiveLoop;
use super::release::release_batches;
use super::store::{Op, StoredBatch};
use super::ticket::Ticket;
use super::{Consumer, ConsumerKey, PlannedBatch, Registry, Table};
use crate::config::plan::PlanOverrides;

/// A consumer's batch received ahead, and the plan command's fields it was
/// planned with (a plan with the same fields takes it).
pub(super) struct Ahead {
    planned: Arc<PlannedBatch>,
    overrides: PlanOverrides,
}

impl Ahead {
    /// The planned batch.
    pub(super) fn planned(&self) -> &Arc<PlannedBatch> {
        &self.planned
    }

    /// Messages it holds.
    pub(super) fn messages(&self) -> u64 {
        self.planned.tickets.iter().map(|t| t.in_flight()).sum()
    }

    /// Whether a plan of `batch` with `overrides` takes it: the same batch
    /// and command, and some partition is still receiving or holds rows.
    fn taken_by(&self, batch: u64, overrides: &PlanOverrides) -> bool {
        self.planned.batch == batch
            && self.overrides == *overrides
            && !self
                .planned
                .tickets
                .iter()
                .all(|t| t.is_sealed() && t.rows() == 0)
    }
}

/// What a plan did with the consumer's batch received ahead.
#[derive(Default)]
pub(super) struct AheadChange {
    /// The batch it gave back (planned with another command, or empty).
    pub(super) dropped: Option<Arc<PlannedBatch>>,
    /// The batch it planned ahead of its own.
    pub(super) made: Option<Arc<PlannedBatch>>,
}

impl AheadChange {
    /// The journal's ops: the batch given back forgotten (before the plan
    /// that may reuse its number), then the new one.
    pub(super) fn ops(&self, key: &ConsumerKey) -> (Vec<Op>, Vec<Op>) {
        let (table, consumer) = key;
        let forget = self.dropped.iter().map(|b| Op::Forget {
            table: table.clone(),
            consumer: consumer.clone(),
            batch: b.batch,
        });
        let batch = self.made.iter().map(|b| Op::Batch {
            table: table.clone(),
            consumer: consumer.clone(),
            batch: b.batch,
            stored: StoredBatch::new(b.plan, b.params).with_ahead(true),
        });
        (forget.collect(), batch.collect())
    }
}

impl Registry {
    /// The consumer's batch received ahead, taken by a plan of `batch`
    /// with `cmd`'s fields if it fits (see [`Ahead`]), or else taken off
    /// the consumer to give back (in `change.dropped`).
    pub(super) fn adopt_or_drop_ahead(
        &self,
        c: &mut Consumer,
        batch: u64,
        cmd: &PlanCommand,
        change: &mut AheadChange,
    ) -> Option<Arc<PlannedBatch>> {
        let ahead = c.ahead()?;
        let room = (c.open_batch_count() as u64) < self.caps.open_batches;
        if room && ahead.taken_by(batch, &PlanOverrides::from(cmd)) {
            return c.adopt_ahead();
        }
        change.dropped = c.take_ahead(&self.usage);
        None
    }

    /// Plans the batch after `planned` ahead of the consumer, with `cmd`'s
    /// fields, if its `read_ahead` asks for it, the consumer has no batch
    /// ahead and has not planned that batch itself, and the caps and the
    /// budget leave room for it (read-ahead never makes a plan fail).
    pub(super) fn plan_ahead(
        &self,
        table: &Table,
        c: &mut Consumer,
        cmd: &PlanCommand,
        planned: &PlannedBatch,
        consumers: u64,
    ) -> Option<Arc<PlannedBatch>> {
        if planned.params.read_ahead == 0 || c.ahead().is_some() {
            return None;
        }
        let batch = planned.batch + 1;
        if c.planned(batch).is_some() {
            return None;
        }
        let mut next = cmd.clone();
        next.batch = Some(batch);
        let params = self.params(table, &next).ok()?;
        let tickets = self.usage.tickets() + params.partitions;
        if tickets > self.caps.tickets || self.check_plan_budget(tickets, consumers).is_err() {
            return None;
        }
        let made = self.new_plan(table, &cmd.consumer, batch, params);
        c.set_ahead(
            Ahead {
                planned: Arc::clone(&made),
                overrides: PlanOverrides::from(cmd),
            },
            &self.usage,
        );
        tracing::debug!(table = %cmd.table, consumer = %cmd.consumer, batch, "planned a batch ahead");
        Some(made)
    }

    /// Called when the first read of `ticket` has received: starts its
    /// consumer's batch ahead once every partition of the ticket's batch
    /// has, if that is the next batch of the same plan.
    pub(super) fn read_ahead_after(self: &Arc<Self>, table: &Arc<Table>, ticket: &Ticket) {
        let id = ticket.id();
        let key = (id.table.clone(), id.consumer.clone());
        let next = self.consumers.with(&key, |c| {
            let current = c.planned(id.batch).filter(|b| b.plan == id.plan)?;
            match c.ahead().map(Ahead::planned) {
                Some(ahead) if ahead.batch == id.batch + 1 && current.received() => {
                    Some(Arc::clone(ahead))
                }
                _ => None,
            }
        });
        if let Some(next) = next.flatten() {
            self.start_first_reads(table, &next);
        }
    }

    /// Starts the first reads of `planned` (a batch received ahead, or one
    /// whose plan asks to receive at once), of each ticket no read began
    /// already. They stop when the server does.
    pub(super) fn start_first_reads(
        self: &Arc<Self>,
        table: &Arc<Table>,
        planned: &Arc<PlannedBatch>,
    ) {
        for ticket in &planned.tickets {
            self.start_first_read(table, planned, ticket);
        }
    }

    fn start_first_read(
        self: &Arc<Self>,
        table: &Arc<Table>,
        planned: &Arc<PlannedBatch>,
        ticket: &Arc<Ticket>,
    ) {
        if !ticket.begin_ahead() {
            return;
        }
        let receive = ReceiveLoop {
            registry: Arc::clone(self),
            table: Arc::clone(table),
            batch: Arc::clone(planned),
            ticket: Arc::clone(ticket),
            cancel: self.background.stop_token(),
            background: true,
        };
        let id = ticket.id().clone();
        tokio::spawn(async move {
            match receive.run().await {
                Ok(s) => {
                    tracing::debug!(table = %id.table, consumer = %id.consumer, batch = id.batch,
                    partition = id.partition, messages = s.messages, "received before the first read")
                }
                Err(e) if e.is_over_limit() => {
                    tracing::info!(table = %id.table, consumer = %id.consumer, batch = id.batch,
                    partition = id.partition,
                    "the queue is at its in-flight cap (OverLimit): stopped receiving before the first read; the partition's first read receives")
                }
                Err(e) => {
                    tracing::warn!(table = %id.table, consumer = %id.consumer, batch = id.batch,
                    partition = id.partition, error = %e,
                    "receiving before the first read failed; the partition's first read receives again")
                }
            }
        });
    }

    /// Gives back, in the background, the batch received ahead of every
    /// consumer `which` names, `why` saying why in the log; true if there
    /// was any. A plan the caps or the budget refuse evicts every one
    /// (read-ahead never makes a plan fail); a read SQS refused for the
    /// queue's in-flight cap (`OverLimit`) evicts those of its table, which
    /// hold messages in flight that nobody asked for yet.
    pub(super) fn evict_ahead(
        self: &Arc<Self>,
        which: impl Fn(&ConsumerKey) -> bool,
        why: &str,
    ) -> bool {
        let taken = self.consumers.take_ahead(&self.usage, which);
        self.give_back_evicted(taken, why)
    }

    /// Gives back `taken` batches received ahead in the background, `why`
    /// saying why in the log; true if there was any.
    pub(super) fn give_back_evicted(
        self: &Arc<Self>,
        taken: Vec<(ConsumerKey, Arc<PlannedBatch>)>,
        why: &str,
    ) -> bool {
        if taken.is_empty() {
            return false;
        }
        tracing::info!(
            batches = taken.len(),
            "giving back batches received ahead: {why}"
        );
        let registry = Arc::clone(self);
        tokio::spawn(async move { registry.give_back_taken_ahead(taken).await });
        true
    }

    /// At shutdown, after the receive loops: gives back every batch
    /// received ahead (nobody planned them), and forgets it in the journal.
    pub(super) async fn give_back_every_ahead(&self) {
        let taken = self.consumers.take_ahead(&self.usage, |_| true);
        self.give_back_taken_ahead(taken).await;
    }

    /// Forgets `taken` batches received ahead in the journal and gives
    /// their messages back.
    async fn give_back_taken_ahead(&self, taken: Vec<(ConsumerKey, Arc<PlannedBatch>)>) {
        for ((table, consumer), batch) in taken {
            let ops = || {
                Ok(vec![Op::Forget {
                    table: table.clone(),
                    consumer: consumer.clone(),
                    batch: batch.batch,
                }])
            };
            if let Err(e) = self.journal.write(ops).await {
                tracing::warn!(error = %e, %table, %consumer, "could not forget a batch received ahead in the state store; the next start gives it back");
            }
            if let Some(t) = self.tables.get(&table)
                && let Err(e) = release_batches(t, vec![batch]).await
            {
                tracing::warn!(%table, %consumer, error = %e, "could not give back a batch received ahead at shutdown; its messages reappear after their visibility timeout");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use sqs_flight_schemas::{CommitCommand, ReleaseCommand};

    use super::super::test_support::{counts, read_partition, registry, reopened, until};
    use super::*;

    /// Batch `batch` of consumer `c`: one partition of `max` messages, one
    /// short poll of waiting, read ahead.
    fn cmd(batch: u64, max: u64) -> PlanCommand {
        let mut cmd = PlanCommand::new("t", "c");
        cmd.batch = Some(batch);
        cmd.partitions = Some(1);
        cmd.max_messages = Some(max);
        cmd.max_wait_ms = Some(0);
        cmd.read_ahead = Some(1);
        cmd
    }

    /// The message ids a read of partition 0 of `batch` streams.
    async fn read(r: &Arc<Registry>, batch: &PlannedBatch) -> Vec<String> {
        read_partition(r, batch, 0).await
    }

    fn ahead_of(r: &Registry) -> Option<Arc<PlannedBatch>> {
        let key = ("t".to_string(), "c".to_string());
        r.consumers
            .with(&key, |c| c.ahead().map(|a| Arc::clone(a.planned())))
            .flatten()
    }

    /// Waits until the batch received ahead has received.
    async fn ahead_received(r: &Registry) -> Arc<PlannedBatch> {
        until("the batch ahead receiving", || {
            ahead_of(r).filter(|a| a.received())
        })
        .await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_next_plan_with_the_same_command_takes_the_batch_received_ahead() {
        let r = registry(30, None).await;
        let one = r.plan(&cmd(1, 10)).await.unwrap();
        assert!(ahead_of(&r).is_some(), "batch 2 is planned ahead");
        let first = read(&r, &one).await;
        assert_eq!(first.len(), 10);
        let ahead = ahead_received(&r).await;
        assert_eq!(r.consumer_status("t")["c"].read_ahead, Some(10));
        assert_eq!(
            counts(&r).await,
            (10, 20),
            "20 held: batch 1 and batch 2 ahead"
        );

        let two = r.plan(&cmd(2, 10)).await.unwrap();
        assert_eq!(
            two.plan, ahead.plan,
            "the plan took the batch received ahead"
        );
        let second = read(&r, &two).await;
        assert_eq!(second.len(), 10);
        assert!(second.iter().all(|id| !first.contains(id)), "new messages");
        assert_eq!(
            read(&r, &two).await,
            second,
            "a replay streams the same rows"
        );
        let status = &r.consumer_status("t")["c"];
        assert_eq!(status.open_batches, [1, 2]);
        assert_eq!(status.last_planned_batch, Some(2));
        assert_eq!(status.read_ahead_batch, Some(3), "batch 3 is planned ahead");
        // Batch 3 receives once batch 2's partition has: now.
        ahead_received(&r).await;
        assert_eq!(counts(&r).await, (0, 30));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_batch_ahead_waits_until_every_partition_of_the_current_one_has_received() {
        let r = registry(20, None).await;
        let mut two = cmd(1, 10);
        two.partitions = Some(2);
        let one = r.plan(&two).await.unwrap();
        assert_eq!(read_partition(&r, &one, 0).await.len(), 10);
        // An engine with one core reads the partitions one after another:
        // the batch ahead must not take partition 1's messages meanwhile.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(counts(&r).await, (10, 10), "nothing read ahead yet");
        assert_eq!(read_partition(&r, &one, 1).await.len(), 10);
        let ahead = ahead_received(&r).await;
        assert!(
            ahead.tickets.iter().all(|t| t.rows() == 0),
            "the queue was empty"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_plan_with_another_command_gives_the_batch_received_ahead_back() {
        let r = registry(30, None).await;
        let one = r.plan(&cmd(1, 10)).await.unwrap();
        read(&r, &one).await;
        let ahead = ahead_received(&r).await;
        assert_eq!(counts(&r).await, (10, 20));
        let two = r.plan(&cmd(2, 5)).await.unwrap();
        assert_ne!(two.plan, ahead.plan, "a new plan");
        assert!(
            ahead.tickets[0].is_closed(),
            "the batch ahead was given back"
        );
        assert_eq!(counts(&r).await, (20, 10), "its messages are visible again");
        assert_eq!(read(&r, &two).await.len(), 5);
    }

    /// Waits until every partition of `batch` has received.
    async fn received(batch: &PlannedBatch) {
        until("the batch receiving", || batch.received().then_some(())).await
    }

    /// `cmd(batch, max)` over two partitions, not read ahead, receiving at
    /// its plan if `at_plan`.
    fn two_partitions(batch: u64, max: u64, at_plan: bool) -> PlanCommand {
        let mut c = cmd(batch, max);
        c.partitions = Some(2);
        c.read_ahead = Some(0);
        c.receive_at_plan = at_plan.then_some(1);
        c
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_plan_with_receive_at_plan_receives_before_any_read_and_its_reads_stream_that() {
        let r = registry(30, None).await;
        // Without it, a plan receives nothing: its first reads do.
        let off = r.plan(&two_partitions(1, 10, false)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(counts(&r).await, (30, 0), "nothing received at the plan");
        r.release(&ReleaseCommand::new("t", "c")).await.unwrap();
        assert!(off.tickets.iter().all(|t| !t.is_sealed()));

        let one = r.plan(&two_partitions(1, 10, true)).await.unwrap();
        received(&one).await;
        assert_eq!(
            counts(&r).await,
            (10, 20),
            "both partitions received, no read yet"
        );
        assert_eq!(
            one.tickets.iter().map(|t| t.rows()).collect::<Vec<_>>(),
            [10, 10]
        );
        let first = read_partition(&r, &one, 0).await;
        let second = read_partition(&r, &one, 1).await;
        assert_eq!((first.len(), second.len()), (10, 10));
        assert!(second.iter().all(|id| !first.contains(id)));
        assert_eq!(
            read_partition(&r, &one, 0).await,
            first,
            "a replay streams the same rows"
        );
        let done = r.commit(&CommitCommand::new("t", "c", 1)).await.unwrap();
        assert_eq!(done.deleted, 20);
        assert_eq!(counts(&r).await, (10, 0));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_plan_the_journal_refuses_starts_no_receive() {
        let scratch = crate::scratch::dir("at-plan-journal");
        let r = registry(30, Some(&scratch.path().join("state"))).await;
        let store = Arc::clone(r.journal.store().unwrap());
        store
            .fail_writes
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let mut refused = two_partitions(1, 10, true);
        refused.read_ahead = Some(1);
        assert!(r.plan(&refused).await.is_err(), "the plan fails");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(counts(&r).await, (30, 0), "nothing held for it");
        assert!(
            !r.render_metrics().contains(r#"operation="ReceiveMessage""#),
            "and no receive made"
        );
        store
            .fail_writes
            .store(false, std::sync::atomic::Ordering::SeqCst);
        drop((r, store));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_plan_with_receive_at_plan_waits_while_an_earlier_batch_is_still_to_be_read() {
        let r = registry(30, None).await;
        let one = r.plan(&two_partitions(1, 10, false)).await.unwrap();
        // Batch 2 must not take what batch 1's partitions, read later, get.
        let two = r.plan(&two_partitions(2, 5, true)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(counts(&r).await, (30, 0), "batch 2 did not receive");
        assert_eq!(read_partition(&r, &one, 0).await.len(), 10);
        assert_eq!(read_partition(&r, &one, 1).await.len(), 10);
        // Its first reads receive, as without receive_at_plan.
        assert_eq!(read_partition(&r, &two, 0).await.len(), 5);
        assert_eq!(read_partition(&r, &two, 1).await.len(), 5);
        assert_eq!(counts(&r).await, (0, 30));
        // Once batch 2 has received, a plan of batch 3 receives at once.
        let three = r.plan(&two_partitions(3, 5, true)).await.unwrap();
        received(&three).await;
        assert!(
            three.tickets.iter().all(|t| t.rows() == 0),
            "the queue is empty"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batch_received_ahead_empty_is_not_taken() {
        let r = registry(10, None).await;
        let one = r.plan(&cmd(1, 10)).await.unwrap();
        assert_eq!(read(&r, &one).await.len(), 10);
        let ahead = ahead_received(&r).await;
        assert_eq!(ahead.tickets[0].rows(), 0);
        let two = r.plan(&cmd(2, 10)).await.unwrap();
        assert_ne!(two.plan, ahead.plan, "a fresh plan receives afresh");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn commit_leaves_the_batch_received_ahead_and_release_gives_it_back() {
        let r = registry(30, None).await;
        let one = r.plan(&cmd(1, 10)).await.unwrap();
        read(&r, &one).await;
        ahead_received(&r).await;
        r.commit(&CommitCommand::new("t", "c", 1)).await.unwrap();
        assert_eq!(
            counts(&r).await,
            (10, 10),
            "batch 1 deleted, batch 2 still held"
        );
        assert_eq!(r.consumer_status("t")["c"].read_ahead, Some(10));
        let release = ReleaseCommand::new("t", "c");
        r.release(&release).await.unwrap();
        assert_eq!(counts(&r).await, (20, 0), "released");
        assert_eq!(r.consumer_status("t")["c"].read_ahead_batch, None);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_restart_gives_back_what_the_previous_process_read_ahead() {
        let scratch = crate::scratch::dir("ahead");
        let dir = scratch.path().join("state");
        let r = registry(30, Some(&dir)).await;
        let one = r.plan(&cmd(1, 10)).await.unwrap();
        read(&r, &one).await;
        ahead_received(&r).await;
        drop((r, one));
        let again = reopened(30, &dir).await;
        assert!(ahead_of(&again).is_none());
        let status = &again.consumer_status("t")["c"];
        assert_eq!(
            status.open_batches,
            [1],
            "batch 1 came back, batch 2 did not"
        );
        let key = ("t".to_string(), "c".to_string());
        let stored = again.consumers.with(&key, |c| c.stored()).unwrap();
        let back: usize = stored.pending_reject.iter().map(|r| r.receipts.len()).sum();
        assert_eq!(
            back, 10,
            "the heartbeat gives back the 10 messages read ahead"
        );
        drop(again);
    }
}
