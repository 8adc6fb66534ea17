//! A SQL query's peek of a queue table, made in the server's process.
//!
//! A worker process's scan ([`super::remote`]) asks for a peek; the server
//! plans a batch for a consumer of its own (one per scan, so two queries
//! at once never release each other's messages), reads every partition
//! with [`Registry::read`], exactly as DoGet does (rule 1 of
//! docs/protocol.md#the-rules included), then releases the batch, so
//! nothing is deleted and every message it saw is visible again at once,
//! and forgets the consumer and its metrics. Only the rows go to the
//! worker; receipts never leave the server. Only execution scans: building
//! the logical plan (GetFlightInfo, prepare) receives nothing.
//!
//! The peek is a task of the statement on the server's runtime, aborted
//! when the statement ends (its client went away, its time ran out, its
//! worker died, the server stops). Then the guard releases the batch at
//! once instead of the peek waiting out `max_wait_ms`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow_array::RecordBatch;
use futures::TryStreamExt;
use sqs_flight_schemas::{PlanCommand, ReleaseCommand};
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

use super::frame::PeekRequest;
use crate::error::Error;
use crate::registry::Registry;

/// Peeks so far in this process, for unique consumer names.
static PEEKS: AtomicU64 = AtomicU64::new(0);

/// The prefix of the consumers that SQL queries peek with.
pub(crate) const PEEK_CONSUMER_PREFIX: &str = "sql-peek-";

/// Plans, reads whole and releases the peek a worker asked for (one `Vec`
/// per partition). Dropped half way, its batch is released all the same.
pub(crate) async fn peek(
    registry: Arc<Registry>,
    request: PeekRequest,
    shutdown: CancellationToken,
) -> Result<Vec<Vec<RecordBatch>>, Error> {
    let cmd = command(&registry, &request)?;
    read_and_release(registry, cmd, shutdown, Handle::current()).await
}

/// The plan command of one peek: a fresh consumer, the query's sizes.
fn command(registry: &Registry, request: &PeekRequest) -> Result<PlanCommand, Error> {
    let table = registry.table(&request.table)?;
    let n = PEEKS.fetch_add(1, Ordering::Relaxed);
    let consumer = format!("{PEEK_CONSUMER_PREFIX}{}-{n}", std::process::id());
    let mut cmd = PlanCommand::new(request.table.clone(), consumer);
    // A peek takes the table's size, not the backlog's: a query sees at
    // most `partitions` x `max_messages` messages.
    cmd.max_messages = request.max_messages.or(Some(table.defaults().max_messages));
    cmd.partitions = request.partitions;
    cmd.max_wait_ms = request.max_wait_ms;
    // A peek is released once read: nothing to read ahead for.
    cmd.read_ahead = Some(0);
    if let Some(limit) = request.limit {
        // `LIMIT n` pushed down: one partition asks for n messages at most
        // (within the server's limits).
        let max = registry.plan_limits().max_messages;
        cmd.partitions = Some(1);
        cmd.max_messages = Some(limit.clamp(1, max));
    }
    Ok(cmd)
}

/// Plans `cmd`, reads every partition at once (as a client reads a plan),
/// then releases the batch. Whatever happens, nothing of the peek stays in
/// flight or in the registry: the guard stays armed until the release has
/// finished, so a peek dropped half way (reading or releasing) is released
/// by it.
async fn read_and_release(
    registry: Arc<Registry>,
    cmd: PlanCommand,
    shutdown: CancellationToken,
    io: Handle,
) -> Result<Vec<Vec<RecordBatch>>, Error> {
    let mut guard = ReleaseOnDrop {
        registry: Arc::clone(&registry),
        table: cmd.table.clone(),
        consumer: cmd.consumer.clone(),
        io,
        armed: true,
    };
    let read = async {
        let planned = registry.plan(&cmd).await?;
        let reads = planned.tickets().iter().map(|t| async {
            let rows: Vec<RecordBatch> = registry.read(t.id(), &shutdown)?.try_collect().await?;
            Ok::<_, Error>(rows)
        });
        futures::future::try_join_all(reads).await
    }
    .await;
    let released = release(&registry, &cmd.table, &cmd.consumer).await;
    guard.armed = false;
    let partitions = read?;
    released?;
    Ok(partitions)
}

/// Releases a peek's batch and forgets its consumer (metrics included).
async fn release(registry: &Registry, table: &str, consumer: &str) -> Result<(), Error> {
    let cmd = ReleaseCommand::new(table, consumer);
    let released = registry.release(&cmd).await;
    registry.forget_consumer_metrics(table, consumer);
    released.map(|_| ())
}

/// Releases a peek whose query was dropped half way, in a task of its own
/// on the server's runtime.
struct ReleaseOnDrop {
    registry: Arc<Registry>,
    table: String,
    consumer: String,
    io: Handle,
    armed: bool,
}

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (registry, table, consumer) = (
            Arc::clone(&self.registry),
            std::mem::take(&mut self.table),
            std::mem::take(&mut self.consumer),
        );
        // Detached on purpose: it must outlive the dropped query, and it
        // ends by itself once SQS has answered.
        self.io.spawn(async move {
            if let Err(e) = release(&registry, &table, &consumer).await {
                tracing::warn!(%table, %consumer, error = %e,
                    "could not release an abandoned SQL peek; its lease returns its messages");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, TableConfig};

    fn request(max_messages: Option<u64>) -> PeekRequest {
        PeekRequest {
            id: 0,
            table: "t".into(),
            max_messages,
            partitions: None,
            max_wait_ms: None,
            limit: None,
        }
    }

    #[tokio::test]
    async fn a_peek_asks_for_the_tables_max_messages_so_the_backlog_never_sizes_it() {
        let mut table = TableConfig::memory("t", 0);
        table.defaults.max_messages = 300;
        let config = Config::new("127.0.0.1:0".parse().unwrap(), vec![table]);
        let registry = Registry::build(&config, None).await.unwrap();
        let cmd = command(&registry, &request(None)).unwrap();
        assert_eq!(cmd.max_messages, Some(300));
        let cmd = command(&registry, &request(Some(7))).unwrap();
        assert_eq!(cmd.max_messages, Some(7), "the query's own size");
    }
}
