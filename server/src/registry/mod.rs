//! The registry: per (table, consumer) the planned batches, the tickets of
//! each batch with the rows and receipt handles they received, the committed
//! watermark, and the consumer's lease.
//!
//! # Why it exists
//!
//! SQS deletes a message only with the receipt handle of the receive that
//! got it, and a distributed engine commits on a coordinator that never saw
//! those handles. The registry keeps every handle here, keyed by ticket, so
//! the engine only says "batch N is done" ([`Registry::commit`]).
//!
//! # Layout
//!
//! This file holds the registry and its planned batches; beside it:
//! `consumers.rs` (the consumer map and its lock), `consumer.rs` (one
//! consumer's state, and the only code that changes it), `plan.rs` (a
//! plan: made or made earlier, and the first reads `receive_at_plan`
//! starts), `ahead.rs` (read-ahead), `table.rs` (a queue served under a
//! name; visibility changes take its turn), `receive/` (a first read's
//! receive loop; `receive/record.rs` records one receive,
//! `receive/calls.rs` the width of its ReceiveMessage calls) and `read.rs`
//! (a ticket's rows), `ticket.rs` (one partition's log of rows and
//! receipts; `row_receipts.rs` the receipts a row uses besides its
//! receive's, `receipts.rs` packs the receipts, `packed.rs` the rows it
//! keeps), `commit.rs` and `reject.rs`, `release.rs` (and lease expiry),
//! `heartbeat.rs`, `status.rs` (and the metrics), `journal.rs` and
//! `store.rs` (`--state-dir`), `build.rs`, `background.rs` (the tasks a
//! stopping server waits for), `caps.rs` (what a plan may add: caps on
//! consumers, open batches and tickets, and the budget), and `backlog.rs`
//! (a plan's `max_messages` sized to the queue's depth).
//!
//! # Locking
//!
//! One `std::sync::Mutex` guards the consumer map; only `consumers.rs`
//! takes it, and never across an `.await`. Each ticket has its own lock
//! for its log. SQS calls run with no lock held. Commits of one consumer
//! are serialized by an async mutex so that two commits cannot both delete
//! the same receipts.

#![warn(unreachable_pub)]

mod ahead;
mod background;
mod backlog;
mod build;
mod caps;
mod commit;
mod consumer;
mod consumers;
pub(crate) mod dedup;
pub(crate) mod heartbeat;
mod journal;
mod packed;
mod plan;
mod read;
mod receipts;
pub mod receive;
mod reject;
mod release;
mod row_receipts;
mod status;
pub(crate) mod store;
mod table;
#[cfg(test)]
mod test_support;
pub(crate) mod ticket;
pub(crate) mod usage;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::Duration;

use sqs_flight_schemas::TicketId;

use crate::config::{Config, PlanParams};
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use background::Background;
use backlog::Backlog;
pub use build::BuildError;
use caps::Caps;
pub use caps::{CONSUMER_COST_BYTES, TICKET_COST_BYTES};
pub use commit::CommitOutcome;
use consumer::Consumer;
use consumers::{ConsumerKey, Consumers};
use journal::Journal;
pub use release::ReleaseOutcome;
use release::{Retired, release_batches};
pub use status::ConsumerStatus;
pub use table::Table;
use ticket::Ticket;
use usage::Usage;

/// Longest a stopping server waits for receive calls left in flight
/// ([`Registry::settle`]), after its shutdown grace period for open calls:
/// a default long poll (`max_wait_ms` 1000) comes back well within it.
pub const MAX_SETTLE: Duration = Duration::from_secs(5);

/// One planned batch of a consumer.
pub struct PlannedBatch {
    batch: u64,
    plan: u64,
    params: PlanParams,
    tickets: Vec<Arc<Ticket>>,
}

impl PlannedBatch {
    /// The batch's number.
    pub fn batch(&self) -> u64 {
        self.batch
    }

    /// One ticket per partition.
    pub fn tickets(&self) -> &[Arc<Ticket>] {
        &self.tickets
    }

    /// Whether every partition has received: each ticket's first read
    /// ended, so its rows are fixed.
    fn received(&self) -> bool {
        self.tickets.iter().all(|t| t.is_sealed())
    }
}

/// The error for a ticket whose batch is not an open batch of its
/// consumer's (never planned, or planned again since).
fn not_planned(id: &TicketId) -> Error {
    Error::NotPlanned {
        table: id.table.clone(),
        consumer: id.consumer.clone(),
        batch: id.batch,
    }
}

/// Every table, consumer, batch and ticket the server knows.
pub struct Registry {
    metrics: Arc<Metrics>,
    tables: BTreeMap<String, Arc<Table>>,
    consumers: Consumers,
    usage: Arc<Usage>,
    next_plan: AtomicU64,
    /// How long a consumer keeps its open batches without calling.
    lease: Duration,
    /// The largest value each plan field may take.
    limits: PlanParams,
    /// How plans that leave `max_messages` to the default are sized to
    /// the backlog (see [`backlog`]).
    backlog: Backlog,
    /// Consumers, open batches per consumer and tickets, and the budget
    /// of uncommitted messages and bytes (see [`caps`]).
    caps: Caps,
    /// Where changes are written before they are acted on (`--state-dir`).
    journal: Journal,
    /// Receive loops and deletes run behind, which
    /// [`Registry::settle`] waits for.
    background: Background,
    /// Whether a commit answers before its deletes are done
    /// (`--deletes-behind`, see [`commit`]).
    deletes_behind: bool,
    /// Whether the store held rejects still to give back at the start.
    restored_rejects: AtomicBool,
    /// Consumers forgotten at a release whose metric series are kept for a
    /// while (see [`release::RETIRED_SERIES_FOR`]).
    retired: Retired,
}

impl Registry {
    pub fn new(config: &Config, tables: Vec<Arc<Table>>, metrics: Arc<Metrics>) -> Self {
        // Plan ids start from the clock so that tickets of an earlier server
        // process are not mistaken for this one's.
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_micros() as u64);
        Self {
            metrics,
            tables: tables
                .into_iter()
                .map(|t| (t.name().to_string(), t))
                .collect(),
            consumers: Consumers::default(),
            usage: Arc::default(),
            next_plan: AtomicU64::new(seed),
            lease: config.consumer_lease,
            limits: config.limits,
            backlog: Backlog::new(config),
            caps: Caps {
                consumers: config.max_consumers,
                open_batches: config.max_open_batches_per_consumer,
                tickets: config.max_tickets,
                max_bytes: config.registry_max_bytes,
                max_messages: config.registry_max_messages,
            },
            journal: Journal::Memory,
            background: Background::new(config.shutdown_grace),
            deletes_behind: config.deletes_behind,
            restored_rejects: AtomicBool::new(false),
            retired: Retired::default(),
        }
    }

    /// Waits, up to the shutdown grace period but no more than
    /// [`MAX_SETTLE`], for the receive loops to end and for the
    /// ReceiveMessage calls they left in flight to come back and be handed
    /// back to SQS (see [`receive`]), and for the deletes of commits that
    /// answered before them (`--deletes-behind`). A call still in flight
    /// after that is dropped with the process: what a receive brings stays
    /// hidden for its visibility timeout, and a delete not done is retried
    /// at the restart with `--state-dir` (without it, its messages reappear
    /// after their visibility timeout). Then waits for the journal's
    /// writes handed over without waiting.
    pub async fn settle(&self) {
        self.background.settle().await;
        self.give_back_every_ahead().await;
        // Writes handed over without waiting land before the server stops.
        self.journal.settle().await;
    }

    /// Every table, by name.
    /// Whether this server still owns its state log (`--state-url`): fails
    /// with [`crate::error::Error::Fenced`] once another server took it
    /// over, and with `StateUnavailable` while it cannot be reached.
    pub async fn check_state_log(&self) -> crate::error::Result<()> {
        self.journal.check_state_log().await
    }

    pub fn tables(&self) -> impl Iterator<Item = &Arc<Table>> {
        self.tables.values()
    }

    /// The table named `name`, or NOT_FOUND.
    pub fn table(&self, name: &str) -> Result<&Arc<Table>> {
        self.tables.get(name).ok_or_else(|| Error::UnknownTable {
            table: name.to_string(),
            known: self.tables.keys().cloned().collect::<Vec<_>>().join(", "),
        })
    }

    /// Messages and bytes held for replay.
    pub fn usage(&self) -> (u64, u64) {
        self.usage.snapshot()
    }

    /// The largest value each plan field may take (`--limit-*`).
    pub fn plan_limits(&self) -> PlanParams {
        self.limits
    }

    /// The server's metrics, for the parts that count their own (the SQL
    /// runner's running queries).
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Renews the lease of a consumer (any RPC that names it).
    pub fn touch(&self, table: &str, consumer: &str) {
        let key = (table.to_string(), consumer.to_string());
        self.consumers.with(&key, Consumer::touch);
    }

    /// The ticket `id` names, if its plan is still open.
    pub fn ticket(&self, id: &TicketId) -> Result<(Arc<Table>, Arc<PlannedBatch>, Arc<Ticket>)> {
        let table = Arc::clone(self.table(&id.table)?);
        let key = (id.table.clone(), id.consumer.clone());
        self.consumers
            .with(&key, |c| Self::planned_ticket(c, id))
            .ok_or_else(|| not_planned(id))?
            .map(|(planned, ticket)| (table, planned, ticket))
    }

    /// The batch and ticket `id` names among the consumer `c`'s open
    /// batches.
    fn planned_ticket(c: &mut Consumer, id: &TicketId) -> Result<(Arc<PlannedBatch>, Arc<Ticket>)> {
        c.touch();
        if let Some(committed) = c.committed_through(id.batch) {
            return Err(Error::Committed {
                table: id.table.clone(),
                consumer: id.consumer.clone(),
                batch: id.batch,
                committed,
            });
        }
        let planned = c
            .planned(id.batch)
            .filter(|p| p.plan == id.plan)
            .ok_or_else(|| not_planned(id))?;
        let ticket = planned.tickets.get(id.partition as usize).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "ticket names partition {} of a batch planned with {} partitions",
                id.partition,
                planned.tickets.len()
            ))
        })?;
        Ok((Arc::clone(planned), Arc::clone(ticket)))
    }

    /// Whether a consumer holds open (uncommitted) batches, or committed
    /// messages whose delete is still to be retried, or rejects of a
    /// previous process still to give back: a server told to exit when idle
    /// keeps running until they are committed, released, released by the
    /// lease's expiry (which makes their messages visible again at once),
    /// deleted, or given back.
    pub fn holds_work(&self) -> bool {
        self.consumers.any_holds_work()
    }

    /// Open batches of every consumer, for the heartbeat.
    fn open_batches(&self) -> Vec<(String, Arc<PlannedBatch>)> {
        self.consumers.open_batches()
    }
}
