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
//! # Locking
//!
//! One `std::sync::Mutex` guards the consumer map and is never held across
//! an `.await`; each ticket has its own lock for its log. SQS calls run with
//! no lock held. Commits of one consumer are serialized by an async mutex so
//! that two commits cannot both delete the same receipts.

mod build;
pub mod heartbeat;
mod journal;
mod packed;
mod read;
pub mod receive;
mod reject;
pub mod store;
mod table;
pub mod ticket;
pub mod usage;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::Serialize;
use sqs_flight_schemas::{CommitCommand, PlanCommand, ReleaseCommand, TicketId};
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use crate::config::plan::{OutOfBounds, PlanOverrides};
use crate::config::{Config, PlanParams};
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::sqs::batching::BulkOp;
use crate::sqs::{QueueAttributes, ReceiptHandle};
pub use build::BuildError;
use journal::Journal;
use reject::Rejects;
use store::{Op, StoredBatch, StoredConsumer, StoredReject};
pub use table::Table;
use ticket::Ticket;
use usage::Usage;

/// Longest a stopping server waits for receive calls left in flight
/// ([`Registry::settle`]), after its shutdown grace period for open calls:
/// a default long poll (`max_wait_ms` 1000) comes back well within it.
pub const MAX_SETTLE: Duration = Duration::from_secs(5);

/// One planned batch of a consumer.
pub struct PlannedBatch {
    pub batch: u64,
    pub plan: u64,
    pub params: PlanParams,
    pub tickets: Vec<Arc<Ticket>>,
}

struct Consumer {
    committed: Option<u64>,
    last_planned: Option<u64>,
    batches: BTreeMap<u64, Arc<PlannedBatch>>,
    /// Receipts of committed batches whose delete has not succeeded yet.
    pending_delete: Vec<ReceiptHandle>,
    /// Rejects written to the journal and not given back yet: those of a
    /// previous process (the heartbeat gives them back once), and those of
    /// the commit under way, kept here so that any other write of the
    /// consumer's state (a plan) keeps them too until the give-back is
    /// done (see [`reject`]).
    pending_reject: Vec<PendingReject>,
    /// Messages given back by its commits since this process started.
    rejected: u64,
    last_seen: Instant,
    commit_lock: Arc<tokio::sync::Mutex<()>>,
}

/// The messages one commit rejected, to give back hidden for `delay_seconds`.
struct PendingReject {
    delay_seconds: u32,
    receipts: Vec<ReceiptHandle>,
    /// Found in the store at the start (else: the commit under way's).
    restored: bool,
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
        }
    }
}

impl Consumer {
    fn new() -> Self {
        Self {
            committed: None,
            last_planned: None,
            batches: BTreeMap::new(),
            pending_delete: Vec::new(),
            pending_reject: Vec::new(),
            rejected: 0,
            last_seen: Instant::now(),
            commit_lock: Arc::default(),
        }
    }

    /// What the store keeps of this consumer.
    fn stored(&self) -> StoredConsumer {
        StoredConsumer {
            committed: self.committed,
            last_planned: self.last_planned,
            pending_delete: self
                .pending_delete
                .iter()
                .map(|r| r.expose().to_string())
                .collect(),
            pending_reject: self
                .pending_reject
                .iter()
                .map(PendingReject::stored)
                .collect(),
        }
    }

    fn next_batch(&self) -> u64 {
        self.last_planned.max(self.committed).map_or(1, |b| b + 1)
    }

    /// Whether nothing of this consumer is worth keeping: no watermark, no
    /// open batch, no delete to retry. A released consumer that never
    /// committed is forgotten, so that `status` lists only consumers that
    /// hold or committed something (a peek leaves no trace).
    fn is_empty(&self) -> bool {
        self.committed.is_none()
            && self.batches.is_empty()
            && self.pending_delete.is_empty()
            && self.pending_reject.is_empty()
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

    /// Takes every open batch (release, lease expiry).
    fn take_open(&mut self) -> Vec<Arc<PlannedBatch>> {
        self.last_planned = self.committed;
        std::mem::take(&mut self.batches).into_values().collect()
    }
}

type ConsumerKey = (String, String);

/// What a commit takes from the registry: receipts to delete, receipts to
/// give back, and the consumer's watermark.
struct Taken {
    delete: Vec<ReceiptHandle>,
    reject: Vec<ReceiptHandle>,
    committed: u64,
}

/// The answer of a commit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CommitOutcome {
    pub committed_batch: u64,
    pub deleted: u64,
    pub expired: u64,
    /// Messages given back to SQS by this commit.
    pub rejected: u64,
}

/// The answer of a release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReleaseOutcome {
    pub released: u64,
}

/// A consumer in `status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConsumerStatus {
    pub committed_batch: Option<u64>,
    pub last_planned_batch: Option<u64>,
    pub open_batches: Vec<u64>,
    pub in_flight: u64,
    /// The age now, in milliseconds, of the oldest message (by
    /// `SentTimestamp`) of the last planned batch; `None` when that batch
    /// holds no message (not read yet, empty, committed or released).
    pub oldest_age_ms: Option<u64>,
    /// Messages its commits gave back to SQS since this process started.
    pub rejected: u64,
}

/// Every table, consumer, batch and ticket the server knows.
pub struct Registry {
    metrics: Arc<Metrics>,
    tables: BTreeMap<String, Arc<Table>>,
    consumers: Mutex<HashMap<ConsumerKey, Consumer>>,
    usage: Arc<Usage>,
    next_plan: AtomicU64,
    /// How long a consumer keeps its open batches without calling.
    lease: Duration,
    /// The largest value each plan field may take.
    limits: PlanParams,
    /// The budget of uncommitted messages and bytes held for replay.
    max_bytes: u64,
    max_messages: u64,
    /// Where changes are written before they are acted on (`--state-dir`).
    journal: Journal,
    /// Receive loops, and the calls they left in flight, until what those
    /// calls bring is handed back; [`Registry::settle`] waits for them.
    receiving: TaskTracker,
    /// How long [`Registry::settle`] waits (`--shutdown-grace`).
    shutdown_grace: Duration,
    /// Whether the store held rejects still to give back at the start.
    restored_rejects: AtomicBool,
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
            consumers: Mutex::new(HashMap::new()),
            usage: Arc::default(),
            next_plan: AtomicU64::new(seed),
            lease: config.consumer_lease,
            limits: config.limits,
            max_bytes: config.registry_max_bytes,
            max_messages: config.registry_max_messages,
            journal: Journal::Memory,
            receiving: TaskTracker::new(),
            shutdown_grace: config.shutdown_grace,
            restored_rejects: AtomicBool::new(false),
        }
    }

    /// Waits, up to the shutdown grace period but no more than
    /// [`MAX_SETTLE`], for the receive loops to end and for the
    /// ReceiveMessage calls they left in flight to come back and be handed
    /// back to SQS (see [`receive`]). A call still in flight after that is
    /// dropped with the process: what it brings stays hidden for its
    /// visibility timeout.
    pub async fn settle(&self) {
        self.receiving.close();
        let limit = self.shutdown_grace.min(MAX_SETTLE);
        if tokio::time::timeout(limit, self.receiving.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                waited_s = limit.as_secs_f64(),
                "receive calls still in flight after the shutdown grace period; what they bring reappears after its visibility timeout"
            );
        }
    }

    fn consumers(&self) -> MutexGuard<'_, HashMap<ConsumerKey, Consumer>> {
        self.consumers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every table, by name.
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

    /// DoGet streams (and SQL peek reads) open now.
    pub fn open_streams(&self) -> i64 {
        self.metrics.doget_streams_open.get()
    }

    /// Drops every metric series of a consumer (a Flight SQL peek's, once
    /// it is released), so that the metrics do not grow with queries.
    pub fn forget_consumer_metrics(&self, table: &str, consumer: &str) {
        self.metrics.forget_consumer(table, consumer);
    }

    /// Sets the queue depth gauges of `table` from its queue's attributes.
    pub fn record_queue_depth(&self, table: &str, attributes: &QueueAttributes) {
        let label = crate::metrics::table_labels(table);
        let m = &self.metrics;
        m.queue_depth
            .get_or_create(&label)
            .set(attributes.visible as i64);
        m.queue_in_flight
            .get_or_create(&label)
            .set(attributes.in_flight as i64);
    }

    /// The metrics in the text exposition format, with the gauges computed
    /// from the registry set first.
    pub fn render_metrics(&self) -> String {
        self.refresh_gauges();
        self.metrics.render()
    }

    /// Refuses new receives once the registry holds its budget.
    pub fn check_budget(&self) -> Result<()> {
        let (messages, bytes) = self.usage.snapshot();
        if messages >= self.max_messages || bytes >= self.max_bytes {
            return Err(Error::ResourceExhausted(format!(
                "the registry holds {messages} uncommitted messages ({bytes} bytes); its limit \
                 is {} messages or {} bytes: commit or release batches first",
                self.max_messages, self.max_bytes
            )));
        }
        Ok(())
    }

    /// Renews the lease of a consumer (any RPC that names it).
    pub fn touch(&self, table: &str, consumer: &str) {
        if let Some(c) = self
            .consumers()
            .get_mut(&(table.to_string(), consumer.to_string()))
        {
            c.last_seen = Instant::now();
        }
    }

    /// Checks the command's parameters against the table and the limits.
    fn params(&self, table: &Table, cmd: &PlanCommand) -> Result<PlanParams> {
        let p = PlanOverrides::from(cmd).over(table.config.defaults);
        p.check(self.limits).map_err(|e| {
            Error::InvalidArgument(match e {
                OutOfBounds::AboveLimit {
                    field,
                    value,
                    limit,
                } => format!("plan command: field `{field}` is {value}, above the limit {limit}"),
                OutOfBounds::Zero { field } => {
                    format!("plan command: field `{field}` must be at least 1")
                }
            })
        })?;
        Ok(p)
    }

    /// Plans a batch, or returns the plan made earlier for it (rule 4 of
    /// docs/protocol.md#the-rules). A new plan is in the journal before
    /// this returns.
    pub async fn plan(&self, cmd: &PlanCommand) -> Result<Arc<PlannedBatch>> {
        let (planned, state) = self.plan_in_memory(cmd)?;
        if let Some(state) = state {
            let ops = || {
                Ok(vec![
                    Op::Batch {
                        table: cmd.table.clone(),
                        consumer: cmd.consumer.clone(),
                        batch: planned.batch,
                        stored: StoredBatch::new(planned.plan, planned.params),
                    },
                    Op::Consumer {
                        table: cmd.table.clone(),
                        consumer: cmd.consumer.clone(),
                        state,
                    },
                ])
            };
            self.journal.write(ops).await?;
        }
        Ok(planned)
    }

    /// The plan, and the consumer's state to store if the plan is new.
    fn plan_in_memory(
        &self,
        cmd: &PlanCommand,
    ) -> Result<(Arc<PlannedBatch>, Option<StoredConsumer>)> {
        let table = self.table(&cmd.table)?;
        let params = self.params(table, cmd)?;
        let mut consumers = self.consumers();
        let c = consumers
            .entry((cmd.table.clone(), cmd.consumer.clone()))
            .or_insert_with(Consumer::new);
        c.last_seen = Instant::now();
        let batch = cmd.batch.unwrap_or_else(|| c.next_batch());
        if let Some(committed) = c.committed.filter(|&w| batch <= w) {
            return Err(Error::Committed {
                table: cmd.table.clone(),
                consumer: cmd.consumer.clone(),
                batch,
                committed,
            });
        }
        if let Some(planned) = c.batches.get(&batch) {
            return Ok((Arc::clone(planned), None));
        }
        let plan = self.next_plan.fetch_add(1, Ordering::Relaxed);
        let tickets = (0..params.partitions as u32)
            .map(|partition| {
                let id = TicketId {
                    table: cmd.table.clone(),
                    consumer: cmd.consumer.clone(),
                    batch,
                    partition,
                    plan,
                };
                Arc::new(Ticket::new(id, Arc::clone(&self.usage)))
            })
            .collect();
        let planned = Arc::new(PlannedBatch {
            batch,
            plan,
            params,
            tickets,
        });
        c.batches.insert(batch, Arc::clone(&planned));
        c.last_planned = c.last_planned.max(Some(batch));
        tracing::debug!(table = %cmd.table, consumer = %cmd.consumer, batch, partitions = params.partitions, "planned batch");
        Ok((planned, Some(c.stored())))
    }

    /// The ticket `id` names, if its plan is still open.
    pub fn ticket(&self, id: &TicketId) -> Result<(Arc<Table>, Arc<PlannedBatch>, Arc<Ticket>)> {
        let table = Arc::clone(self.table(&id.table)?);
        let mut consumers = self.consumers();
        let not_planned = || Error::NotPlanned {
            table: id.table.clone(),
            consumer: id.consumer.clone(),
            batch: id.batch,
        };
        let c = consumers
            .get_mut(&(id.table.clone(), id.consumer.clone()))
            .ok_or_else(not_planned)?;
        c.last_seen = Instant::now();
        if let Some(committed) = c.committed.filter(|&w| id.batch <= w) {
            return Err(Error::Committed {
                table: id.table.clone(),
                consumer: id.consumer.clone(),
                batch: id.batch,
                committed,
            });
        }
        let planned = c
            .batches
            .get(&id.batch)
            .filter(|p| p.plan == id.plan)
            .ok_or_else(not_planned)?;
        let ticket = planned.tickets.get(id.partition as usize).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "ticket names partition {} of a batch planned with {} partitions",
                id.partition,
                planned.tickets.len()
            ))
        })?;
        Ok((table, Arc::clone(planned), Arc::clone(ticket)))
    }

    /// Deletes every message recorded for the consumer in batches <= N and
    /// raises its watermark to N (rule 2 of docs/protocol.md#the-rules);
    /// the messages the command rejects are given back to SQS instead
    /// (see [`reject`]).
    ///
    /// A consumer the registry does not know (it never planned a batch, or
    /// it was released and forgotten) has nothing to delete: the commit
    /// succeeds, deletes nothing and records nothing, so that `status` does
    /// not list a consumer that never read (a typo in its name, a commit
    /// sent before the first read). Ids to reject are refused there, as
    /// everywhere they are not found.
    pub async fn commit(&self, cmd: &CommitCommand) -> Result<CommitOutcome> {
        let table = Arc::clone(self.table(&cmd.table)?);
        let key = (cmd.table.clone(), cmd.consumer.clone());
        let lock = {
            let mut consumers = self.consumers();
            let Some(c) = consumers.get_mut(&key) else {
                drop(consumers);
                // Finds no id: refuses the commit if it names any.
                self.pick_rejects(&key, cmd)?;
                tracing::info!(table = %cmd.table, consumer = %cmd.consumer, batch = cmd.batch,
                    "commit for a consumer that has read nothing: nothing to delete");
                return Ok(CommitOutcome {
                    committed_batch: cmd.batch,
                    deleted: 0,
                    expired: 0,
                    rejected: 0,
                });
            };
            c.last_seen = Instant::now();
            Arc::clone(&c.commit_lock)
        };
        let _serial = lock.lock().await;
        // Before anything changes: an id that cannot be rejected refuses
        // the whole commit.
        let rejects = self.pick_rejects(&key, cmd)?;
        // The watermark, the receipts to delete and those to give back are
        // in the journal before anything changes: a crash after this
        // retries the delete at the restart and gives the rejects back, and
        // a failed write leaves the commit undone.
        let ops = || Ok(self.commit_ops(&key, cmd.batch, &rejects));
        if let Err(e) = self.journal.write(ops).await {
            return Err(Error::Internal(format!(
                "commit of batch {} not done: {e}; nothing was deleted, commit again",
                cmd.batch
            )));
        }
        let taken = self.take_committed(&key, cmd.batch, &rejects);
        let sent = taken.delete.len() + taken.reject.len();
        let (outcome, rejected) = tokio::join!(
            table.bulk(BulkOp::Delete, taken.delete),
            reject::give_back(&table, &cmd.consumer, taken.reject, rejects.delay_seconds()),
        );
        let result = CommitOutcome {
            committed_batch: taken.committed,
            deleted: outcome.succeeded.len() as u64,
            expired: outcome.rejected.len() as u64,
            rejected,
        };
        self.keep_unresolved(&key, outcome.unresolved, sent).await;
        tracing::info!(table = %cmd.table, consumer = %cmd.consumer, batch = cmd.batch,
            committed = result.committed_batch, deleted = result.deleted, expired = result.expired,
            rejected = result.rejected, "commit");
        self.count_commit(&key, &result);
        match outcome.error {
            Some(e) => Err(Error::sqs(&cmd.table, e)),
            None => Ok(result),
        }
    }

    /// Counts what a commit did in the metrics (and its rejects in status).
    fn count_commit(&self, key: &ConsumerKey, result: &CommitOutcome) {
        let (table, consumer) = key;
        Metrics::count(&self.metrics.deleted, table, consumer, result.deleted);
        Metrics::count(&self.metrics.expired, table, consumer, result.expired);
        self.count_rejected(key, result.rejected);
    }

    /// What a commit of `batch` writes before it acts: the committed batches
    /// forgotten, and the consumer with its new watermark, their receipts
    /// added to its pending deletes, and those of the rejected messages to
    /// its pending rejects.
    fn commit_ops(&self, key: &ConsumerKey, batch: u64, rejects: &Rejects) -> Vec<Op> {
        let (done, tickets, mut state) = {
            let mut consumers = self.consumers();
            let c = consumers.entry(key.clone()).or_insert_with(Consumer::new);
            let done = c.batches.range(..=batch);
            let tickets: Vec<Arc<Ticket>> = done
                .clone()
                .flat_map(|(_, b)| b.tickets.iter().cloned())
                .collect();
            let done: Vec<u64> = done.map(|(&b, _)| b).collect();
            let mut state = c.stored();
            state.committed = c.committed.max(Some(batch));
            (done, tickets, state)
        };
        // Outside the consumers' lock, as everywhere a ticket's log is read.
        let mut rejected = Vec::new();
        for t in &tickets {
            let (delete, reject) = rejects.split(t, t.receipts());
            state.pending_delete.extend(delete);
            rejected.extend(reject);
        }
        if !rejected.is_empty() {
            state.pending_reject.push(StoredReject {
                delay_seconds: rejects.delay_seconds(),
                receipts: rejected,
            });
        }
        let (table, consumer) = key;
        let mut ops: Vec<Op> = done
            .iter()
            .map(|&batch| Op::Forget {
                table: table.clone(),
                consumer: consumer.clone(),
                batch,
            })
            .collect();
        ops.push(Op::Consumer {
            table: table.clone(),
            consumer: consumer.clone(),
            state,
        });
        ops
    }

    /// Raises the consumer's watermark to `batch`, closes the tickets of the
    /// batches up to it and takes their receipts, with the pending deletes
    /// of earlier commits: what the commit deletes, what it gives back, and
    /// the watermark.
    fn take_committed(&self, key: &ConsumerKey, batch: u64, rejects: &Rejects) -> Taken {
        let (done, mut delete, committed) = {
            let mut consumers = self.consumers();
            let c = consumers.entry(key.clone()).or_insert_with(Consumer::new);
            let keep = c.batches.split_off(&(batch + 1));
            let done = std::mem::replace(&mut c.batches, keep);
            c.committed = c.committed.max(Some(batch));
            let committed = c.committed.unwrap_or(batch);
            let pending = std::mem::take(&mut c.pending_delete);
            (done, pending, committed)
        };
        let mut reject = Vec::new();
        for planned in done.values() {
            for t in &planned.tickets {
                let (d, r) = rejects.split(t, t.close());
                delete.extend(d);
                reject.extend(r);
            }
        }
        if !reject.is_empty()
            && let Some(c) = self.consumers().get_mut(key)
        {
            c.pending_reject.push(PendingReject {
                delay_seconds: rejects.delay_seconds(),
                receipts: reject.clone(),
                restored: false,
            });
        }
        Taken {
            delete,
            reject,
            committed,
        }
    }

    /// Keeps the receipts whose delete SQS neither did nor refused, for the
    /// next commit to retry. The journal holds the `sent` receipts as
    /// pending deletes or rejects: now only the unresolved deletes are, and
    /// the commit's rejects are off the list (nothing to rewrite when none
    /// were sent).
    async fn keep_unresolved(
        &self,
        key: &ConsumerKey,
        unresolved: Vec<ReceiptHandle>,
        sent: usize,
    ) {
        if let Some(c) = self.consumers().get_mut(key) {
            c.pending_delete.extend(unresolved);
            // The commit's own rejects are given back (or given up on).
            c.pending_reject.retain(|r| r.restored);
        }
        if sent > 0 {
            self.write_consumer(key, "pending deletes").await;
        }
    }

    /// Writes the consumer's state as it is now to the journal; a failure
    /// is logged (`what` says what the write was for).
    async fn write_consumer(&self, key: &ConsumerKey, what: &str) {
        let Some(state) = self.consumers().get(key).map(Consumer::stored) else {
            return;
        };
        let (table, consumer) = key;
        let op = || {
            Ok(vec![Op::Consumer {
                table: table.clone(),
                consumer: consumer.clone(),
                state,
            }])
        };
        if let Err(e) = self.journal.write(op).await {
            tracing::warn!(error = %e, %table, %consumer, "could not write {what} to the state store");
        }
    }

    /// Makes every uncommitted message of the consumer visible now and
    /// forgets its open batches.
    pub async fn release(&self, cmd: &ReleaseCommand) -> Result<ReleaseOutcome> {
        let table = Arc::clone(self.table(&cmd.table)?);
        let (open, state) = {
            let mut consumers = self.consumers();
            let key = (cmd.table.clone(), cmd.consumer.clone());
            let taken = consumers.get_mut(&key).map(|c| {
                c.last_seen = Instant::now();
                (c.take_open(), c.stored(), c.is_empty())
            });
            match taken {
                Some((open, state, forget)) => {
                    if forget {
                        consumers.remove(&key);
                    }
                    (open, Some(state))
                }
                None => (Vec::new(), None),
            }
        };
        self.forget(&cmd.table, &cmd.consumer, &open, state).await;
        let released = release_batches(&table, open).await?;
        tracing::info!(table = %cmd.table, consumer = %cmd.consumer, released, "release");
        Metrics::count(&self.metrics.released, &cmd.table, &cmd.consumer, released);
        Ok(ReleaseOutcome { released })
    }

    /// Removes released batches from the journal.
    async fn forget(
        &self,
        table: &str,
        consumer: &str,
        batches: &[Arc<PlannedBatch>],
        state: Option<StoredConsumer>,
    ) {
        let ops = || {
            let mut ops: Vec<Op> = batches
                .iter()
                .map(|b| Op::Forget {
                    table: table.to_string(),
                    consumer: consumer.to_string(),
                    batch: b.batch,
                })
                .collect();
            if let Some(state) = state {
                ops.push(Op::Consumer {
                    table: table.to_string(),
                    consumer: consumer.to_string(),
                    state,
                });
            }
            Ok(ops)
        };
        if let Err(e) = self.journal.write(ops).await {
            tracing::warn!(error = %e, %table, %consumer, "could not remove released batches from the state store");
        }
    }

    /// Takes the open batches of consumers whose lease ran out.
    async fn take_expired(&self, now: Instant) -> Vec<(String, String, Vec<Arc<PlannedBatch>>)> {
        let expired: Vec<_> = {
            let mut consumers = self.consumers();
            let expired: Vec<_> = consumers
                .iter_mut()
                .filter(|(_, c)| {
                    !c.batches.is_empty() && now.duration_since(c.last_seen) > self.lease
                })
                .map(|((t, name), c)| (t.clone(), name.clone(), c.take_open(), c.stored()))
                .collect();
            // As after a release: a consumer left with nothing (it never
            // committed) is forgotten, so that status does not list it.
            for (t, name, _, _) in &expired {
                let key = (t.clone(), name.clone());
                if consumers.get(&key).is_some_and(Consumer::is_empty) {
                    consumers.remove(&key);
                }
            }
            expired
        };
        let mut out = Vec::with_capacity(expired.len());
        for (t, name, batches, state) in expired {
            self.forget(&t, &name, &batches, Some(state)).await;
            out.push((t, name, batches));
        }
        out
    }

    /// Whether a consumer holds open (uncommitted) batches, or committed
    /// messages whose delete is still to be retried, or rejects of a
    /// previous process still to give back: a server told to exit when idle
    /// keeps running until they are committed, released, released by the
    /// lease's expiry (which makes their messages visible again at once),
    /// deleted, or given back.
    pub fn holds_work(&self) -> bool {
        self.consumers().values().any(|c| {
            !c.pending_delete.is_empty() || !c.pending_reject.is_empty() || !c.batches.is_empty()
        })
    }

    /// Open batches of every consumer, for the heartbeat.
    fn open_batches(&self) -> Vec<(String, Arc<PlannedBatch>)> {
        let consumers = self.consumers();
        consumers
            .iter()
            .flat_map(|((t, _), c)| c.batches.values().map(move |b| (t.clone(), Arc::clone(b))))
            .collect()
    }

    /// Sets the gauges computed from the registry, before a scrape.
    fn refresh_gauges(&self) {
        let m = &self.metrics;
        let (messages, bytes) = self.usage.snapshot();
        m.registry_messages.set(messages as i64);
        m.registry_bytes.set(bytes as i64);
        for table in self.tables.keys() {
            for (consumer, s) in self.consumer_status(table) {
                let labels = crate::metrics::consumer_labels(table, &consumer);
                m.open_batches
                    .get_or_create(&labels)
                    .set(s.open_batches.len() as i64);
                let committed = s.committed_batch.map_or(-1, |b| b as i64);
                m.committed_batch.get_or_create(&labels).set(committed);
                m.consumer_in_flight
                    .get_or_create(&labels)
                    .set(s.in_flight as i64);
            }
        }
    }

    /// The consumers of `table`, for `status`.
    pub fn consumer_status(&self, table: &str) -> BTreeMap<String, ConsumerStatus> {
        let now_ms = unix_now_ms();
        let consumers = self.consumers();
        consumers
            .iter()
            .filter(|((t, _), _)| t == table)
            .map(|((_, name), c)| {
                let in_flight = c
                    .batches
                    .values()
                    .flat_map(|b| b.tickets.iter())
                    .map(|t| t.in_flight())
                    .sum::<u64>()
                    + c.pending_delete.len() as u64;
                let status = ConsumerStatus {
                    committed_batch: c.committed,
                    last_planned_batch: c.last_planned,
                    open_batches: c.batches.keys().copied().collect(),
                    in_flight,
                    oldest_age_ms: c
                        .newest_batch_oldest_sent_ms()
                        .map(|sent| age_ms(now_ms, sent)),
                    rejected: c.rejected,
                };
                (name.clone(), status)
            })
            .collect()
    }
}

/// Milliseconds since the Unix epoch now.
fn unix_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The age at `now_ms` of a message sent at `sent_ms`; zero if it was
/// sent "later" (SQS's clock ahead of this host's).
fn age_ms(now_ms: i64, sent_ms: i64) -> u64 {
    u64::try_from(now_ms.saturating_sub(sent_ms)).unwrap_or(0)
}

/// Closes the batches' tickets and makes their messages visible now.
async fn release_batches(table: &Table, batches: Vec<Arc<PlannedBatch>>) -> Result<u64> {
    let receipts: Vec<ReceiptHandle> = batches
        .iter()
        .flat_map(|b| b.tickets.iter())
        .flat_map(|t| t.close())
        .collect();
    if receipts.is_empty() {
        return Ok(0);
    }
    let op = BulkOp::ChangeVisibility(Duration::ZERO);
    let _turn = table.visibility_turn().await;
    let outcome = table.bulk(op, receipts).await;
    if !outcome.rejected.is_empty() || !outcome.unresolved.is_empty() {
        tracing::warn!(table = %table.name(), rejected = outcome.rejected.len(),
            unresolved = outcome.unresolved.len(),
            "some released messages could not be made visible; they reappear after their visibility timeout");
    }
    match outcome.error {
        Some(e) => Err(Error::sqs(table.name(), e)),
        None => Ok(outcome.succeeded.len() as u64),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use sqs_flight_schemas::message::messages_to_batch;

    use super::*;
    use crate::config::{Config, TableConfig};
    use crate::sqs::ReceiveRequest;

    /// A registry on a 30-message demo queue with its store in `dir`.
    async fn durable(dir: &std::path::Path) -> Arc<Registry> {
        let table = TableConfig::memory("t", 30);
        let mut config = Config::new("127.0.0.1:0".parse().unwrap(), vec![table]);
        config.state_dir = Some(dir.to_path_buf());
        Registry::build(&config, None).await.unwrap()
    }

    /// Receives up to ten messages into partition 0 of `batch`, as a first
    /// read does.
    async fn read_some(r: &Registry, batch: &PlannedBatch) -> usize {
        let table = r.table("t").unwrap();
        let req = ReceiveRequest {
            max_messages: 10,
            wait: Duration::ZERO,
            visibility_timeout: Duration::from_secs(30),
        };
        let got = table.queue.receive(req).await.unwrap();
        let messages: Vec<_> = got.iter().map(|g| g.message.clone()).collect();
        let rows = messages_to_batch(&messages, batch.batch as i64, 0).unwrap();
        let receipts = got.into_iter().map(|g| g.receipt).collect();
        let until = Instant::now() + Duration::from_secs(30);
        batch.tickets[0].record(rows, receipts, 0, until).unwrap();
        messages.len()
    }

    /// Records one message sent at `sent_ms` into partition 0 of `batch`.
    fn record_sent(batch: &PlannedBatch, sent_ms: i64) {
        let message = sqs_flight_schemas::SqsMessage {
            message_id: format!("m{sent_ms}"),
            body: "b".into(),
            sent_timestamp: Some(sent_ms),
            ..Default::default()
        };
        let rows = messages_to_batch(&[message], batch.batch as i64, 0).unwrap();
        let receipt = vec![ReceiptHandle::new(format!("r{sent_ms}"))];
        let until = Instant::now() + Duration::from_secs(30);
        batch.tickets[0].record(rows, receipt, 1, until).unwrap();
    }

    #[tokio::test]
    async fn status_shows_the_age_of_the_oldest_message_of_the_newest_batch() {
        let config = Config::new(
            "127.0.0.1:0".parse().unwrap(),
            vec![TableConfig::memory("t", 0)],
        );
        let r = Registry::build(&config, None).await.unwrap();
        let plan = |batch| PlanCommand {
            table: "t".into(),
            consumer: "c".into(),
            batch: Some(batch),
            partitions: Some(2),
            max_messages: None,
            max_wait_ms: None,
            max_bytes: None,
            max_duration_ms: None,
            receivers: None,
        };
        let age = || r.consumer_status("t")["c"].oldest_age_ms;
        const HOUR: i64 = 3_600_000;
        let now = unix_now_ms();
        let first = r.plan(&plan(1)).await.unwrap();
        assert_eq!(age(), None, "nothing received yet");
        record_sent(&first, now - 24 * HOUR);
        record_sent(&first, now - HOUR);
        let day = age().unwrap();
        assert!(day >= 24 * HOUR as u64, "the oldest message counts: {day}");

        let second = r.plan(&plan(2)).await.unwrap();
        assert_eq!(age(), None, "the newest batch holds nothing yet");
        record_sent(&second, now - HOUR);
        let hour = age().unwrap();
        assert!(
            (HOUR as u64..day).contains(&hour),
            "the newest batch's, not the older one's: {hour}"
        );

        let third = r.plan(&plan(3)).await.unwrap();
        record_sent(&third, now + HOUR);
        assert_eq!(age(), Some(0), "a timestamp ahead of this clock is age 0");
    }

    async fn in_flight(r: &Registry) -> u64 {
        r.table("t")
            .unwrap()
            .queue
            .attributes()
            .await
            .unwrap()
            .in_flight
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_commit_the_store_cannot_write_deletes_nothing_and_can_be_made_again() {
        let dir = std::env::temp_dir().join(format!("sqsf-commit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let r = durable(&dir).await;
        let plan = PlanCommand {
            table: "t".into(),
            consumer: "c".into(),
            batch: Some(1),
            partitions: Some(1),
            max_messages: None,
            max_wait_ms: None,
            max_bytes: None,
            max_duration_ms: None,
            receivers: None,
        };
        let batch = r.plan(&plan).await.unwrap();
        let read = read_some(&r, &batch).await;
        assert_eq!(read, 10);
        assert_eq!(in_flight(&r).await, 10);

        let commit = CommitCommand::new("t", "c", 1);
        let store = Arc::clone(r.journal.store().unwrap());
        store.fail_writes.store(true, Ordering::SeqCst);
        let err = r.commit(&commit).await.unwrap_err().to_string();
        assert!(err.contains("nothing was deleted"), "{err}");
        assert_eq!(in_flight(&r).await, 10, "no message was deleted");
        let status = &r.consumer_status("t")["c"];
        assert_eq!(status.committed_batch, None, "the watermark did not move");
        assert_eq!(batch.tickets[0].in_flight(), 10, "the rows are still held");

        store.fail_writes.store(false, Ordering::SeqCst);
        let done = r.commit(&commit).await.unwrap();
        assert_eq!(
            (done.committed_batch, done.deleted, done.expired),
            (1, 10, 0)
        );
        assert_eq!(in_flight(&r).await, 0);
        drop((r, store, batch));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
