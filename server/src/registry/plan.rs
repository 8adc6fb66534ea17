//! Planning: a consumer's batch made, or the plan made earlier for it
//! returned (rule 4 of docs/protocol.md#the-rules), and the first reads a
//! plan with `receive_at_plan` 1 starts at once.
//!
//! A plan checks the caps (see [`super::caps`]), may forget idle consumers and
//! give back batches received ahead to make room, takes or makes the
//! consumer's batch ahead (see [`super::ahead`]) and adds its batch, all under
//! one lock of the consumers; then it writes the journal, and only then
//! starts any receive.

use std::sync::Arc;

use sqs_flight_schemas::{PlanCommand, TicketId};
use tokio::time::Instant;

use super::ahead::AheadChange;
use super::consumer::Consumer;
use super::consumers::{ConsumerKey, ConsumerMap, take_ahead};
use super::release::release_batches;
use super::store::{Op, StoredBatch, StoredConsumer};
use super::ticket::Ticket;
use super::{PlannedBatch, Registry, Table};
use crate::config::PlanParams;
use crate::config::plan::PlanOverrides;
use crate::error::{Error, Result};

/// What [`Registry::plan_in_memory`] made.
struct PlanMade {
    planned: Arc<PlannedBatch>,
    /// The consumer's state to store, if the plan is new (made, or a batch
    /// received ahead taken).
    state: Option<StoredConsumer>,
    /// Consumers forgotten to make room.
    forgotten: Vec<ConsumerKey>,
    /// Whether the plan took the batch received ahead.
    took_ahead: bool,
    ahead: AheadChange,
}

impl PlanMade {
    /// A plan made earlier, returned again.
    fn earlier(planned: &Arc<PlannedBatch>) -> Self {
        Self {
            planned: Arc::clone(planned),
            state: None,
            forgotten: Vec::new(),
            took_ahead: false,
            ahead: AheadChange::default(),
        }
    }
}

/// The journal's ops removing forgotten consumers.
pub(super) fn drop_ops(forgotten: &[ConsumerKey]) -> Vec<Op> {
    forgotten
        .iter()
        .map(|(table, consumer)| Op::DropConsumer {
            table: table.clone(),
            consumer: consumer.clone(),
        })
        .collect()
}

impl Registry {
    /// Checks the command's parameters against the table and the limits;
    /// `max_messages` left to the default is sized to the backlog.
    pub(super) fn params(&self, table: &Table, cmd: &PlanCommand) -> Result<PlanParams> {
        let p = PlanOverrides::from(cmd).over(table.defaults());
        p.check(self.limits).map_err(Error::PlanField)?;
        Ok(self.backlog.size(table, cmd, p))
    }

    /// Plans a batch, or returns the plan made earlier for it (rule 4 of
    /// docs/protocol.md#the-rules). A new plan is in the journal before
    /// this returns, with the batch it plans ahead (see [`super::ahead`]).
    pub async fn plan(self: &Arc<Self>, cmd: &PlanCommand) -> Result<Arc<PlannedBatch>> {
        let made = self.plan_in_memory(cmd)?;
        let Some(state) = made.state else {
            return Ok(made.planned);
        };
        let key = (cmd.table.clone(), cmd.consumer.clone());
        let planned = &made.planned;
        let ops = || {
            let (forget, ahead) = made.ahead.ops(&key);
            let mut ops = drop_ops(&made.forgotten);
            ops.extend(forget);
            ops.push(Op::Batch {
                table: cmd.table.clone(),
                consumer: cmd.consumer.clone(),
                batch: planned.batch,
                stored: StoredBatch::new(planned.plan, planned.params),
            });
            ops.extend(ahead);
            ops.push(Op::Consumer {
                table: cmd.table.clone(),
                consumer: cmd.consumer.clone(),
                state,
            });
            Ok(ops)
        };
        let written = self.journal.write(ops).await;
        for (table, consumer) in &made.forgotten {
            self.forget_consumer_metrics(table, consumer);
        }
        let table = Arc::clone(self.table(&cmd.table)?);
        if made.took_ahead {
            tracing::debug!(table = %cmd.table, consumer = %cmd.consumer, batch = planned.batch,
                "plan took the batch received ahead");
        }
        self.after_plan(&table, planned, made.ahead, written.is_ok())
            .await;
        written?;
        Ok(made.planned)
    }

    /// The plan, the consumer's state to store if the plan is new, the
    /// idle consumers forgotten to make room for a new one (see [`super::caps`]),
    /// and what became of the batch received ahead (see [`super::ahead`]).
    fn plan_in_memory(self: &Arc<Self>, cmd: &PlanCommand) -> Result<PlanMade> {
        let table = self.table(&cmd.table)?;
        let params = self.params(table, cmd)?;
        self.consumers
            .atomically(|consumers| self.plan_locked(consumers, table, cmd, params))
    }

    /// [`Registry::plan_in_memory`] under the consumers' lock.
    fn plan_locked(
        self: &Arc<Self>,
        consumers: &mut ConsumerMap,
        table: &Arc<Table>,
        cmd: &PlanCommand,
        params: PlanParams,
    ) -> Result<PlanMade> {
        let key = (cmd.table.clone(), cmd.consumer.clone());
        let count = consumers.len() as u64;
        let mut ahead = AheadChange::default();
        if let Some(c) = consumers.get_mut(&key)
            && let Some(made) = self.plan_again(table, c, cmd, count, &mut ahead)
        {
            return made;
        }
        let forgotten = match self.room_for(consumers, &key, params.partitions) {
            Ok(forgotten) => forgotten,
            Err(e) => {
                if let Some(dropped) = ahead.dropped {
                    let table = Arc::clone(table);
                    tokio::spawn(async move { release_batches(&table, vec![dropped]).await });
                }
                return Err(e);
            }
        };
        let count = consumers.len() as u64 + u64::from(!consumers.contains_key(&key));
        let c = consumers.entry(key).or_insert_with(Consumer::new);
        let batch = cmd.batch.unwrap_or_else(|| c.next_batch());
        let planned = self.new_plan(table, &cmd.consumer, batch, params);
        c.add_batch(Arc::clone(&planned), &self.usage);
        ahead.made = self.plan_ahead(table, c, cmd, &planned, count);
        tracing::debug!(table = %cmd.table, consumer = %cmd.consumer, batch, partitions = params.partitions, "planned batch");
        Ok(PlanMade {
            planned,
            state: Some(c.stored()),
            forgotten,
            took_ahead: false,
            ahead,
        })
    }

    /// A plan's answer from what the known consumer `c` holds already: a
    /// batch it committed (refused), planned (the same plan again), or
    /// received ahead with the same command (taken). `None` if the plan is
    /// to make a new batch; a batch ahead it does not take is then in
    /// `ahead.dropped`.
    fn plan_again(
        &self,
        table: &Table,
        c: &mut Consumer,
        cmd: &PlanCommand,
        count: u64,
        ahead: &mut AheadChange,
    ) -> Option<Result<PlanMade>> {
        c.touch();
        let batch = cmd.batch.unwrap_or_else(|| c.next_batch());
        if let Some(committed) = c.committed_through(batch) {
            return Some(Err(Error::Committed {
                table: cmd.table.clone(),
                consumer: cmd.consumer.clone(),
                batch,
                committed,
            }));
        }
        if let Some(planned) = c.planned(batch) {
            return Some(Ok(PlanMade::earlier(planned)));
        }
        let planned = self.adopt_or_drop_ahead(c, batch, cmd, ahead)?;
        ahead.made = self.plan_ahead(table, c, cmd, &planned, count);
        Some(Ok(PlanMade {
            planned,
            state: Some(c.stored()),
            forgotten: Vec::new(),
            took_ahead: true,
            ahead: std::mem::take(ahead),
        }))
    }

    /// Checks the caps for a plan of `partitions` by `key` (see
    /// [`Registry::make_room`]). Batches received ahead make way for a
    /// plan the tickets, consumers or budget refuse (not for a consumer at
    /// its own open-batch cap).
    fn room_for(
        self: &Arc<Self>,
        consumers: &mut ConsumerMap,
        key: &ConsumerKey,
        partitions: u64,
    ) -> Result<Vec<ConsumerKey>> {
        let now = Instant::now();
        let room = self.make_room(consumers, key, partitions, now);
        let open = consumers
            .get(key)
            .map_or(0, |c| c.open_batch_count() as u64);
        if !matches!(room, Err(Error::ResourceExhausted(_))) || open >= self.caps.open_batches {
            return room;
        }
        let taken = take_ahead(consumers, &self.usage, |_| true);
        if !self.give_back_evicted(taken, "to make room for a plan") {
            return room;
        }
        self.make_room(consumers, key, partitions, now)
    }

    /// A new plan of `batch` for `consumer`: a fresh ticket per partition.
    pub(super) fn new_plan(
        &self,
        table: &Table,
        consumer: &str,
        batch: u64,
        params: PlanParams,
    ) -> Arc<PlannedBatch> {
        let plan = self
            .next_plan
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tickets = (0..params.partitions as u32)
            .map(|partition| {
                let id = TicketId {
                    table: table.name().to_string(),
                    consumer: consumer.to_string(),
                    batch,
                    partition,
                    plan,
                };
                let dedup = Arc::clone(table.dedup());
                Arc::new(Ticket::new(id, Arc::clone(&self.usage)).with_dedup(dedup))
            })
            .collect();
        Arc::new(PlannedBatch {
            batch,
            plan,
            params,
            tickets,
        })
    }

    /// After a new plan: starts the first reads of `planned` itself if its
    /// `receive_at_plan` asks for it and every earlier open batch of its
    /// consumer has received; starts the batch it made ahead if every
    /// partition of `planned` has received already (a plan that took a
    /// batch received ahead); and gives back the batch ahead it dropped.
    /// A plan the journal did not take (`journaled` false: the plan fails)
    /// starts no receive.
    pub(super) async fn after_plan(
        self: &Arc<Self>,
        table: &Arc<Table>,
        planned: &Arc<PlannedBatch>,
        change: AheadChange,
        journaled: bool,
    ) {
        if journaled
            && planned.params.receive_at_plan == 1
            && self.earlier_batches_received(planned)
        {
            // Tickets a read began already (a batch taken from read-ahead)
            // are left to it.
            self.start_first_reads(table, planned);
        }
        if let Some(made) = &change.made
            && journaled
            && planned.received()
        {
            self.start_first_reads(table, made);
        }
        if let Some(dropped) = change.dropped {
            let batch = dropped.batch;
            match release_batches(table, vec![dropped]).await {
                Ok(n) => tracing::debug!(table = %table.name(), batch, messages = n,
                    "gave back a batch received ahead that the plan did not take"),
                Err(e) => tracing::warn!(table = %table.name(), batch, error = %e,
                    "could not give back a batch received ahead; its messages reappear after their visibility timeout"),
            }
        }
    }

    /// Whether every open batch of `planned`'s consumer numbered below it
    /// has received (each first read ended): only then may a plan start
    /// its receives, so that a batch never takes what a partition of an
    /// earlier one still to be read would have got.
    fn earlier_batches_received(&self, planned: &PlannedBatch) -> bool {
        let Some(first) = planned.tickets.first() else {
            return false;
        };
        let id = first.id();
        let key = (id.table.clone(), id.consumer.clone());
        self.consumers
            .with(&key, |c| {
                c.open_batches()
                    .filter(|b| b.batch < planned.batch)
                    .all(|b| b.received())
            })
            .unwrap_or(false)
    }
}
