//! The visibility heartbeat and the consumer lease.
//!
//! Uncommitted messages must stay invisible while their consumer is alive,
//! however long the engine takes between read and commit. Each tick the
//! heartbeat extends, with ChangeMessageVisibilityBatch, every receipt chunk
//! whose visibility ends within half a visibility timeout. A consumer that
//! has not called the server for its lease loses its open batches exactly
//! as `release` would: its messages become visible now for other readers.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::ticket::DueChunk;
use super::{Registry, release_batches};
use crate::metrics::Metrics;
use crate::sqs::batching::BulkOutcome;

/// Shortest heartbeat tick.
pub(crate) const MIN_TICK: Duration = Duration::from_millis(200);
/// Longest heartbeat tick.
pub(crate) const MAX_TICK: Duration = Duration::from_secs(5);

/// The tick for the shortest visibility timeout in use: a quarter of it,
/// within [`MIN_TICK`, `MAX_TICK`].
pub(crate) fn tick_for(min_visibility: Duration) -> Duration {
    (min_visibility / 4).clamp(MIN_TICK, MAX_TICK)
}

/// Runs until `shutdown`, then waits for the receive calls in flight to be
/// handed back ([`Registry::settle`]): the server's shutdown waits for this
/// task.
pub(crate) async fn run(registry: Arc<Registry>, shutdown: CancellationToken) {
    let mut tick = MIN_TICK;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => {
                registry.settle().await;
                return;
            }
            _ = tokio::time::sleep(tick) => {}
        }
        registry.give_back_restored().await;
        expire_leases(&registry).await;
        extend(&registry).await;
        let shortest = registry
            .tables()
            .filter_map(|t| t.known_visibility_timeout())
            .min()
            .unwrap_or(MAX_TICK * 4);
        tick = tick_for(shortest);
    }
}

async fn expire_leases(registry: &Registry) {
    registry.forget_retired(Instant::now());
    for (table, consumer, batches) in registry.take_expired(Instant::now()).await {
        let Ok(t) = registry.table(&table) else {
            continue;
        };
        match release_batches(t, batches).await {
            Ok(released) => {
                Metrics::count(&registry.metrics.released, &table, &consumer, released);
                tracing::info!(%table, %consumer, released, "consumer lease expired; released its messages")
            }
            Err(e) => tracing::warn!(%table, %consumer, error = %e, "lease expiry release failed"),
        }
        // A consumer the expiry forgot takes its series with it.
        registry.forget_consumer_metrics(&table, &consumer);
    }
}

async fn extend(registry: &Registry) {
    let mut open: HashMap<String, Vec<_>> = HashMap::new();
    for (table, planned) in registry.open_batches() {
        open.entry(table).or_default().push(planned);
    }
    for (name, batches) in open {
        let Ok(table) = registry.table(&name) else {
            continue;
        };
        let Some(vt) = table.known_visibility_timeout() else {
            continue;
        };
        let mut chunks: Vec<DueChunk> = Vec::new();
        let mut started = Instant::now();
        // The chunks are picked in the table's turn: a give-back that
        // closed its tickets meanwhile is not extended, one that comes
        // later waits for this.
        let outcome = table
            .change_visibility(vt, || {
                let horizon = Instant::now() + vt / 2;
                chunks = batches
                    .iter()
                    .flat_map(|b| b.tickets.iter())
                    .flat_map(|t| t.due(horizon))
                    .collect();
                started = Instant::now();
                chunks
                    .iter()
                    .flat_map(|c| c.receipts.iter().cloned())
                    .collect()
            })
            .await;
        if !chunks.is_empty() {
            extended(table, vt, started, &chunks, outcome, &registry.metrics);
        }
    }
}

/// Counts an extension and marks the chunks it extended (from `started`,
/// for `vt`); those SQS failed on its side are tried again next tick.
fn extended(
    table: &super::Table,
    vt: Duration,
    started: Instant,
    chunks: &[DueChunk],
    outcome: BulkOutcome,
    metrics: &Metrics,
) {
    let label = crate::metrics::table_labels(table.name());
    if let Some(e) = outcome.error {
        metrics.heartbeat_failures.get_or_create(&label).inc();
        tracing::warn!(table = %table.name(), error = %e, "visibility heartbeat failed; retrying next tick");
        return;
    }
    metrics
        .heartbeat_extended
        .get_or_create(&label)
        .inc_by(outcome.succeeded.len() as u64);
    // Refused receipts belong to messages received again elsewhere: there is
    // nothing to extend, and commit will report them as expired. Entries SQS
    // failed on its own side are unknown: their chunk is tried again next
    // tick instead of being counted as extended.
    let unresolved: std::collections::HashSet<&str> =
        outcome.unresolved.iter().map(|r| r.expose()).collect();
    let mut retry = 0;
    for c in chunks {
        if c.receipts.iter().any(|r| unresolved.contains(r.expose())) {
            retry += 1;
            continue;
        }
        c.ticket.extended(c.index, started + vt);
    }
    if retry > 0 {
        tracing::warn!(table = %table.name(), entries = outcome.unresolved.len(), chunks = retry,
            "visibility heartbeat: SQS failed some entries on its side; retrying them next tick");
    }
    if !outcome.rejected.is_empty() {
        tracing::warn!(table = %table.name(), rejected = outcome.rejected.len(),
            "visibility heartbeat: SQS refused some receipts (messages already visible again)");
    }
    tracing::trace!(table = %table.name(), extended = outcome.succeeded.len(), "heartbeat");
}
