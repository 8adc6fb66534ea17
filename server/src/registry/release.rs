//! Release and lease expiry: a consumer's open batches forgotten and their
//! messages made visible again at once (docs/protocol.md, "Visibility").

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::Serialize;
use sqs_flight_schemas::ReleaseCommand;
use tokio::time::Instant;

use super::consumers::{ConsumerKey, Expired, Left};
use super::store::Op;
use super::{PlannedBatch, Registry, Table};
use crate::error::{Error, Result};
use crate::metrics::Metrics;

/// How long the metric series of a consumer forgotten at a release stay:
/// many scrapes of any Prometheus, so its released messages are counted.
pub(super) const RETIRED_SERIES_FOR: Duration = Duration::from_secs(600);

/// The answer of a release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReleaseOutcome {
    pub(super) released: u64,
}

/// Consumers forgotten at a release, oldest first, with when: their
/// metric series are kept for [`RETIRED_SERIES_FOR`].
#[derive(Default)]
pub(super) struct Retired {
    queue: Mutex<VecDeque<(Instant, ConsumerKey)>>,
}

impl Retired {
    fn lock(&self) -> MutexGuard<'_, VecDeque<(Instant, ConsumerKey)>> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Retires `key` now.
    fn push(&self, key: ConsumerKey) {
        self.lock().push_back((Instant::now(), key));
    }

    /// Takes the consumers retired [`RETIRED_SERIES_FOR`] before `now`, and
    /// the oldest past `keep_at_most` of them.
    fn due(&self, now: Instant, keep_at_most: u64) -> Vec<ConsumerKey> {
        let mut retired = self.lock();
        let mut due = Vec::new();
        while retired.front().is_some_and(|(at, _)| {
            retired.len() as u64 > keep_at_most
                || now.saturating_duration_since(*at) >= RETIRED_SERIES_FOR
        }) {
            due.extend(retired.pop_front().map(|(_, key)| key));
        }
        due
    }
}

impl Registry {
    /// Makes every uncommitted message of the consumer visible now and
    /// forgets its open batches; a consumer left with nothing (it never
    /// committed) is forgotten. Its metric series stay (the released
    /// messages are counted in them): an eviction at `max_consumers` or a
    /// lease expiry removes them, and those of a forgotten consumer go
    /// [`RETIRED_SERIES_FOR`] later (sooner past `max_consumers` of them).
    /// With `read_ahead_only`, only the batch received ahead is given back
    /// (a client that stops and keeps its open batches for a restart).
    pub async fn release(&self, cmd: &ReleaseCommand) -> Result<ReleaseOutcome> {
        let table = Arc::clone(self.table(&cmd.table)?);
        let key = (cmd.table.clone(), cmd.consumer.clone());
        let taken = self.consumers.take_from(&key, |c| {
            c.touch();
            if cmd.read_ahead_only {
                c.take_ahead(&self.usage).into_iter().collect()
            } else {
                c.take_open(&self.usage)
            }
        });
        let (open, state) = match taken {
            Some((open, left)) => (open, Some(left)),
            None => (Vec::new(), None),
        };
        if state == Some(Left::Nothing) {
            // After the consumers' lock: retiring may forget series.
            self.retire(key);
        }
        self.forget(&cmd.table, &cmd.consumer, &open, state).await;
        let released = release_batches(&table, open).await?;
        tracing::info!(table = %cmd.table, consumer = %cmd.consumer, released, "release");
        Metrics::count(&self.metrics.released, &cmd.table, &cmd.consumer, released);
        self.forget_retired(Instant::now());
        Ok(ReleaseOutcome { released })
    }

    /// Keeps the series of a consumer forgotten at a release until
    /// [`Registry::forget_retired`] drops them.
    fn retire(&self, key: ConsumerKey) {
        self.retired.push(key);
    }

    /// Drops the series of consumers retired [`RETIRED_SERIES_FOR`] before
    /// `now`, and of the oldest past `max_consumers` of them (unless they
    /// came back), so that released consumers do not grow the metrics; run
    /// at each release and heartbeat tick.
    pub(super) fn forget_retired(&self, now: Instant) {
        for (table, consumer) in self.retired.due(now, self.caps.consumers) {
            self.forget_consumer_metrics(&table, &consumer);
        }
    }

    /// Removes released batches from the journal, and the consumer with
    /// them if it was forgotten.
    async fn forget(
        &self,
        table: &str,
        consumer: &str,
        batches: &[Arc<PlannedBatch>],
        state: Option<Left>,
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
            let (table, consumer) = (table.to_string(), consumer.to_string());
            match state {
                Some(Left::Kept(state)) => ops.push(Op::Consumer {
                    table,
                    consumer,
                    state,
                }),
                Some(Left::Nothing) => ops.push(Op::DropConsumer { table, consumer }),
                None => {}
            }
            Ok(ops)
        };
        if let Err(e) = self.journal.write(ops).await {
            tracing::warn!(error = %e, %table, %consumer, "could not remove released batches from the state store");
        }
    }

    /// Takes the open batches of consumers whose lease ran out.
    pub(super) async fn take_expired(
        &self,
        now: Instant,
    ) -> Vec<(String, String, Vec<Arc<PlannedBatch>>)> {
        // As after a release: a consumer left with nothing (it never
        // committed) is forgotten, so that status does not list it.
        let expired = self.consumers.take_expired(now, self.lease, &self.usage);
        let mut out = Vec::with_capacity(expired.len());
        for Expired { key, batches, left } in expired {
            let (t, name) = key;
            self.forget(&t, &name, &batches, Some(left)).await;
            out.push((t, name, batches));
        }
        out
    }
}

/// Closes the batches' tickets and makes their messages visible now; how
/// many. A row with a second receipt (two overlapping calls brought its
/// message, see `dedup::offer`) is given back with both and counts once.
pub(super) async fn release_batches(table: &Table, batches: Vec<Arc<PlannedBatch>>) -> Result<u64> {
    let (mut receipts, mut second) = (Vec::new(), Vec::new());
    for t in batches.iter().flat_map(|b| b.tickets.iter()) {
        let (own, seconds) = t.close_with_second_receipts();
        receipts.extend(own);
        second.extend(seconds.into_iter().map(|(_, second, own)| (second, own)));
    }
    receipts.extend(second.iter().map(|(receipt, _)| receipt.clone()));
    if receipts.is_empty() {
        return Ok(0);
    }
    let outcome = table.change_visibility(Duration::ZERO, || receipts).await;
    let (released, refused) = outcome.per_message(&second);
    if refused > 0 || !outcome.unresolved.is_empty() {
        tracing::warn!(table = %table.name(), rejected = refused,
            unresolved = outcome.unresolved.len(),
            "some released messages could not be made visible; they reappear after their visibility timeout");
    }
    match outcome.error {
        Some(e) => Err(Error::sqs(table.name(), e)),
        None => Ok(released),
    }
}
