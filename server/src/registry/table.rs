//! A table: one queue served under a name, with its schema and what its
//! receive loops share.
//!
//! The queue is private to this file: the registry receives, deletes and
//! changes visibility through the table's methods, and a visibility change
//! of held messages (a give-back, the heartbeat's extension) goes through
//! [`Table::change_visibility`], which takes the table's turn itself.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow_schema::SchemaRef;
use sqs_flight_schemas::payload::{PayloadDecoder, schema_with_payload_error};

use super::backlog::LastDepth;
use super::dedup::{Dedup, Dropped};
use crate::config::plan::DEFAULT_MAX_MESSAGES;
use crate::config::{PlanParams, TableConfig};
use crate::error::{Error, Result};
use crate::large_payload::{LargePayloads, ObjectStore};
use crate::sqs::batching::{self, BulkOp, BulkOutcome};
use crate::sqs::{
    OutgoingMessage, Queue, QueueAttributes, ReceiptHandle, ReceiveRequest, Received, SqsError,
};
use crate::write::WriteError;

/// A table: its configuration, its queue and its schema.
pub struct Table {
    config: TableConfig,
    queue: Arc<dyn Queue>,
    /// Decodes JSON bodies when the table declares a payload.
    payload: Option<PayloadDecoder>,
    /// Reads and writes bodies in S3 when the table has `large_payloads`
    /// (set with [`Table::with_object_store`]).
    large: Option<LargePayloads>,
    schema: SchemaRef,
    visibility: tokio::sync::OnceCell<Duration>,
    /// Batch calls one bulk operation keeps in flight.
    bulk_concurrency: usize,
    /// ReceiveMessage calls in flight a partition's receive loop ended with
    /// last (0: none yet); the next one opens that many once its first call
    /// comes back full, so a busy queue does not pay the ramp from one call
    /// at every micro-batch (see `receive::Calls`).
    warm_receivers: AtomicUsize,
    /// Held while a visibility change of held messages is on its way to
    /// SQS: see [`Table::change_visibility`].
    visibility_turn: tokio::sync::Mutex<()>,
    /// The ids of the messages held and of those committed lately.
    dedup: Arc<Dedup>,
    /// The queue's depth as [`Table::attributes`] read it last (see
    /// `backlog.rs`).
    depth: LastDepth,
    /// ReceiveMessage calls in flight per consumer, until what each brought
    /// is recorded or handed back ([`ReceiveCall`]). A consumer has an
    /// entry only while its count is above 0, so the map is bounded by the
    /// calls in flight (`receivers` per ticket, `max_tickets` tickets).
    receiving: Mutex<HashMap<String, usize>>,
}

/// One ReceiveMessage call of a consumer's, counted in
/// [`Table::receives_in_flight`] from its issue until it is dropped: after
/// what the call brought is recorded, or handed back to SQS.
pub(super) struct ReceiveCall {
    table: Arc<Table>,
    consumer: String,
}

impl std::fmt::Debug for ReceiveCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReceiveCall")
            .field("table", &self.table.name())
            .field("consumer", &self.consumer)
            .finish()
    }
}

impl Drop for ReceiveCall {
    fn drop(&mut self) {
        let mut receiving = self
            .table
            .receiving
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(n) = receiving.get_mut(&self.consumer) {
            *n -= 1;
            if *n == 0 {
                receiving.remove(&self.consumer);
            }
        }
    }
}

impl Table {
    /// A table; its payload spec was checked when the config was loaded.
    pub fn new(config: TableConfig, queue: Arc<dyn Queue>) -> Self {
        let base = sqs_flight_schemas::table_schema();
        let payload = config
            .payload
            .as_ref()
            .and_then(|spec| PayloadDecoder::new(spec, &base).ok());
        let reads_large = config.large_payloads.as_ref().is_some_and(|l| l.read);
        let schema = match &payload {
            Some(p) => p.table_schema(),
            // A large payload that cannot be read says why in its row.
            None if reads_large => schema_with_payload_error(&base),
            None => base,
        };
        Self {
            config,
            queue,
            payload,
            large: None,
            schema,
            visibility: tokio::sync::OnceCell::new(),
            bulk_concurrency: crate::config::DEFAULT_SQS_BATCH_CONCURRENCY as usize,
            warm_receivers: AtomicUsize::new(0),
            visibility_turn: tokio::sync::Mutex::new(()),
            dedup: Arc::new(Dedup::new(
                Duration::from_secs(crate::config::DEFAULT_DEDUP_WINDOW_SECS),
                crate::config::DEFAULT_DEDUP_WINDOW_IDS,
            )),
            depth: LastDepth::default(),
            receiving: Mutex::default(),
        }
    }

    /// The same table remembering committed ids for `window`, at most
    /// `max_ids` of them (see [`Dedup`]).
    pub fn with_dedup_window(mut self, window: Duration, max_ids: u64) -> Self {
        self.dedup = Arc::new(Dedup::new(window, max_ids));
        self
    }

    /// The same table reading and writing its large payloads through
    /// `store` (nothing changes for a table without `large_payloads`).
    pub fn with_object_store(mut self, store: Arc<dyn ObjectStore>) -> Self {
        self.large = self
            .config
            .large_payloads
            .clone()
            .map(|c| LargePayloads::new(c, store));
        self
    }

    /// Its large payloads, when it has `large_payloads` and a store.
    pub(crate) fn large_payloads(&self) -> Option<&LargePayloads> {
        self.large.as_ref()
    }

    /// The ids of the messages held and of those committed lately.
    pub(super) fn dedup(&self) -> &Arc<Dedup> {
        &self.dedup
    }

    /// SQS duplicates that added no row since the process started.
    pub fn duplicates_dropped(&self) -> Dropped {
        self.dedup.dropped()
    }

    /// The same table whose bulk operations keep `n` batch calls in flight.
    pub fn with_bulk_concurrency(mut self, n: u32) -> Self {
        self.bulk_concurrency = (n as usize).max(1);
        self
    }

    /// Runs a delete or visibility change over `receipts` in SQS batches,
    /// with the table's bulk concurrency.
    async fn bulk(&self, op: BulkOp, receipts: Vec<ReceiptHandle>) -> BulkOutcome {
        if receipts.is_empty() {
            return BulkOutcome::default();
        }
        batching::run(self.queue.as_ref(), op, receipts, self.bulk_concurrency).await
    }

    /// Changes the visibility of held messages to `timeout`, one change at
    /// a time per table: the heartbeat's extension, and the give-backs of a
    /// release, a lease expiry or a reject. `pick` names the receipts once
    /// the turn is taken.
    ///
    /// The heartbeat picks the chunks to extend in its `pick`, and a
    /// give-back closes its tickets before it calls this; so an extension
    /// already on its way to SQS lands before the give-back, and never
    /// hides a message again after it was given back (or, with a reject
    /// delay, shortens that delay). Deletes do not wait.
    pub(super) async fn change_visibility(
        &self,
        timeout: Duration,
        pick: impl FnOnce() -> Vec<ReceiptHandle>,
    ) -> BulkOutcome {
        let _turn = self.visibility_turn.lock().await;
        let receipts = pick();
        self.bulk(BulkOp::ChangeVisibility(timeout), receipts).await
    }

    /// Makes messages a receive loop did not record visible again now.
    /// They are in no ticket, so the heartbeat never extends them: this
    /// needs no turn, and a receive loop does not wait for the heartbeat's
    /// calls to hand them back.
    pub(super) async fn hand_back_unrecorded(&self, receipts: Vec<ReceiptHandle>) -> BulkOutcome {
        self.bulk(BulkOp::ChangeVisibility(Duration::ZERO), receipts)
            .await
    }

    /// Deletes messages; no turn: a deleted message cannot be hidden again.
    pub(super) async fn delete(&self, receipts: Vec<ReceiptHandle>) -> BulkOutcome {
        self.bulk(BulkOp::Delete, receipts).await
    }

    /// Deletes a commit's messages, retrying what the endpoint pushed back
    /// for up to [`batching::PUSH_BACK_PATIENCE`].
    pub(super) async fn delete_committed(&self, receipts: Vec<ReceiptHandle>) -> BulkOutcome {
        if receipts.is_empty() {
            return BulkOutcome::default();
        }
        let (queue, n) = (self.queue.as_ref(), self.bulk_concurrency);
        batching::run_patiently(
            queue,
            BulkOp::Delete,
            receipts,
            n,
            batching::PUSH_BACK_PATIENCE,
        )
        .await
    }

    /// Calls the window of the queue's endpoint allows in flight now (see
    /// [`crate::sqs::congestion`]); `None` when its calls are not held to one.
    pub(super) fn sqs_window(&self) -> Option<usize> {
        self.queue.congestion().map(|c| c.width())
    }

    /// One ReceiveMessage call.
    pub(super) async fn receive(&self, req: ReceiveRequest) -> Result<Vec<Received>, SqsError> {
        self.queue.receive(req).await
    }

    /// Sends `messages` (rows numbered from `first_row`): how many were
    /// sent, and the first error (see [`crate::write::send::send_all`]).
    pub async fn send(
        &self,
        messages: Vec<OutgoingMessage>,
        first_row: u64,
    ) -> (u64, Option<WriteError>) {
        // Large bodies go to S3 first; a failed put stops the write at its
        // row, as a refused row does.
        let (messages, refused) = match &self.large {
            Some(large) => large.offload(messages).await,
            None => (messages, None),
        };
        let (sent, error) =
            crate::write::send::send_all(self.queue.as_ref(), messages, first_row).await;
        let refused = refused.map(|(i, error)| WriteError::Offload {
            row: first_row + i as u64,
            error: Box::new(error),
        });
        (sent, error.or(refused))
    }

    /// The largest message body DoPut may take for this table: SQS's limit,
    /// or `max_object_bytes` when large bodies go to S3.
    pub fn max_body_bytes(&self) -> usize {
        match &self.large {
            Some(large) if large.writes() => {
                usize::try_from(large.max_object_bytes()).unwrap_or(usize::MAX)
            }
            _ => crate::write::rows::MAX_MESSAGE_BYTES,
        }
    }

    /// True for a FIFO queue.
    pub fn is_fifo(&self) -> bool {
        self.queue.is_fifo()
    }

    /// The queue's attributes (GetQueueAttributes); the depth read is
    /// kept for sizing batches to the backlog.
    pub async fn attributes(&self) -> Result<QueueAttributes, SqsError> {
        let started = tokio::time::Instant::now();
        let attributes = self.queue.attributes().await?;
        self.depth.record(started, attributes.visible);
        Ok(attributes)
    }

    /// The queue's depth as read at most `max_age` ago, if it was.
    pub(super) fn depth_within(&self, max_age: Duration) -> Option<u64> {
        self.depth.within(max_age)
    }

    /// The plan parameters of the table's configuration.
    pub fn defaults(&self) -> PlanParams {
        self.config.defaults
    }

    /// Whether the table's `max_messages` is the built-in default: only
    /// then are batches sized to the backlog. Written or not, as
    /// `--print-config` writes every default and its output reads back as
    /// the same configuration.
    pub(super) fn leaves_max_messages_to_default(&self) -> bool {
        self.config.defaults.max_messages == DEFAULT_MAX_MESSAGES
    }

    /// Decodes JSON bodies when the table declares a payload.
    pub(super) fn payload(&self) -> Option<&PayloadDecoder> {
        self.payload.as_ref()
    }

    /// The table's Arrow schema (with `payload` columns when declared).
    pub fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// The visibility timeout receives use: the configured one, else the
    /// queue's attribute (read once), never below the minimum a heartbeat
    /// can keep up with.
    pub async fn visibility_timeout(&self) -> Result<Duration> {
        let vt = self
            .visibility
            .get_or_try_init(|| async {
                let vt = match self.config.visibility_timeout {
                    Some(vt) => vt,
                    None => {
                        let attrs = self.queue.attributes().await;
                        attrs
                            .map_err(|e| Error::sqs(self.name(), e))?
                            .visibility_timeout
                    }
                };
                let min = Duration::from_secs(crate::config::MIN_VISIBILITY_TIMEOUT_SECS);
                Ok::<_, Error>(vt.max(min))
            })
            .await?;
        Ok(*vt)
    }

    /// The visibility timeout if it is known already.
    pub fn known_visibility_timeout(&self) -> Option<Duration> {
        self.visibility.get().copied()
    }

    /// ReceiveMessage calls in flight the table's last receive loop ended
    /// with (0: none yet).
    pub(super) fn warm_receivers(&self) -> usize {
        self.warm_receivers.load(Ordering::Relaxed)
    }

    /// Counts a ReceiveMessage call of `consumer`'s until the guard drops.
    pub(super) fn receive_call(self: &Arc<Self>, consumer: &str) -> ReceiveCall {
        let mut receiving = self.receiving.lock().unwrap_or_else(|e| e.into_inner());
        *receiving.entry(consumer.to_string()).or_default() += 1;
        ReceiveCall {
            table: Arc::clone(self),
            consumer: consumer.to_string(),
        }
    }

    /// `consumer`'s ReceiveMessage calls in flight, or whose messages are
    /// not recorded or handed back yet: SQS shows those messages in flight,
    /// and the registry does not count them anywhere yet.
    pub(super) fn receives_in_flight(&self, consumer: &str) -> usize {
        let receiving = self.receiving.lock().unwrap_or_else(|e| e.into_inner());
        receiving.get(consumer).copied().unwrap_or(0)
    }

    /// Remembers the calls in flight a receive loop ended with, for the next.
    pub(super) fn keep_warm_receivers(&self, n: usize) {
        self.warm_receivers.store(n, Ordering::Relaxed);
    }
}
