//! A queue table as DataFusion sees it: every scan is a bounded peek.
//!
//! Scanning plans a batch for a consumer of its own (one per scan, so two
//! queries at once never release each other's messages), reads every
//! partition with [`Registry::read`], exactly as DoGet does (rule 1 of
//! docs/protocol.md#the-rules included),
//! then releases the batch, so nothing is deleted and every message it saw
//! is visible again at once, and forgets the consumer and its metrics. The
//! rows stay in memory for the query. Only execution scans: building the
//! logical plan (GetFlightInfo, prepare) receives nothing.
//!
//! The query runs on the SQL threads ([`super::runtime`]); its peek runs
//! as a task on the server's own runtime (`io`), like every other SQS
//! call, and is aborted when the query is dropped (its client went away,
//! its time ran out, the server stops). Then the guard releases the batch
//! at once instead of the peek waiting out `max_wait_ms`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::memory::MemorySourceConfig;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::{DataFusionError, Result as DfResult};
use datafusion::logical_expr::{Expr, TableType};
use datafusion::physical_plan::ExecutionPlan;
use futures::TryStreamExt;
use sqs_flight_schemas::{PlanCommand, ReleaseCommand};
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::error::Error;
use crate::registry::Registry;

/// Peeks so far in this process, for unique consumer names.
static PEEKS: AtomicU64 = AtomicU64::new(0);

/// The prefix of the consumers that SQL queries peek with.
pub const PEEK_CONSUMER_PREFIX: &str = "sql-peek-";

pub fn external(e: Error) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

/// One queue table of the SQL catalog.
pub struct PeekTable {
    registry: Arc<Registry>,
    table: String,
    schema: SchemaRef,
    shutdown: CancellationToken,
    /// The server's runtime: where the peek's SQS calls run.
    io: Handle,
    /// Plan fields set by the query (`peek(table, ...)`), over the table's.
    sizes: Sizes,
}

/// The plan fields a query may set with `peek(table, max_messages
/// [, partitions [, max_wait_ms]])`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sizes {
    pub max_messages: Option<u64>,
    pub partitions: Option<u64>,
    pub max_wait_ms: Option<u64>,
}

impl PeekTable {
    pub fn new(
        registry: Arc<Registry>,
        table: &str,
        shutdown: CancellationToken,
        io: Handle,
    ) -> Result<Self, Error> {
        let schema = registry.table(table)?.schema();
        Ok(Self {
            registry,
            table: table.to_string(),
            schema,
            shutdown,
            io,
            sizes: Sizes::default(),
        })
    }

    /// The same table, peeked with `sizes` (checked against the server's
    /// limits when the peek is planned, like any plan command's fields).
    pub fn with_sizes(mut self, sizes: Sizes) -> Self {
        self.sizes = sizes;
        self
    }

    /// Plans a batch for a fresh consumer, reads it whole, releases it:
    /// on the server's runtime, aborted if this future is dropped.
    async fn peek(&self, limit: Option<usize>) -> Result<Vec<Vec<RecordBatch>>, Error> {
        let cmd = self.command(limit);
        let (registry, shutdown) = (Arc::clone(&self.registry), self.shutdown.clone());
        let io = self.io.clone();
        let task = self.io.spawn(read_and_release(registry, cmd, shutdown, io));
        AbortOnDropHandle::new(task)
            .await
            .map_err(|e| Error::Internal(format!("the SQL peek of {} ended: {e}", self.table)))?
    }

    /// The plan command of one peek: a fresh consumer, the query's sizes.
    fn command(&self, limit: Option<usize>) -> PlanCommand {
        let n = PEEKS.fetch_add(1, Ordering::Relaxed);
        let consumer = format!("{PEEK_CONSUMER_PREFIX}{}-{n}", std::process::id());
        let mut cmd = PlanCommand::new(self.table.clone(), consumer);
        cmd.max_messages = self.sizes.max_messages;
        cmd.partitions = self.sizes.partitions;
        cmd.max_wait_ms = self.sizes.max_wait_ms;
        if let Some(limit) = limit {
            // `LIMIT n` pushed down: one partition asks for n messages at most
            // (within the server's limits).
            let max = self.registry.plan_limits().max_messages;
            cmd.partitions = Some(1);
            cmd.max_messages = Some((limit as u64).clamp(1, max));
        }
        cmd
    }
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
        let reads = planned.tickets.iter().map(|t| async {
            let rows: Vec<RecordBatch> = registry.read(&t.id, &shutdown)?.try_collect().await?;
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
    let cmd = ReleaseCommand {
        table: table.to_string(),
        consumer: consumer.to_string(),
    };
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

impl std::fmt::Debug for PeekTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeekTable")
            .field("table", &self.table)
            .finish()
    }
}

#[async_trait]
impl TableProvider for PeekTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let partitions = self.peek(limit).await.map_err(external)?;
        let partitions = if partitions.is_empty() {
            vec![Vec::new()]
        } else {
            partitions
        };
        let exec = MemorySourceConfig::try_new_exec(
            &partitions,
            Arc::clone(&self.schema),
            projection.cloned(),
        )?;
        Ok(exec)
    }
}

/// `peek(table, max_messages [, partitions [, max_wait_ms]])`: the table,
/// peeked with these plan fields for this query only.
pub struct PeekFunction {
    pub registry: Arc<Registry>,
    pub shutdown: CancellationToken,
    /// The server's runtime: where the peek's SQS calls run.
    pub io: Handle,
}

impl std::fmt::Debug for PeekFunction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeekFunction")
    }
}

const PEEK_USAGE: &str = "peek(table, max_messages [, partitions [, max_wait_ms]]): a table name \
     and whole numbers";

impl datafusion::catalog::TableFunctionImpl for PeekFunction {
    fn call_with_args(
        &self,
        args: datafusion::catalog::TableFunctionArgs,
    ) -> DfResult<Arc<dyn TableProvider>> {
        use datafusion::common::{ScalarValue, plan_err};
        let exprs = args.exprs();
        if !(2..=4).contains(&exprs.len()) {
            return plan_err!("{PEEK_USAGE}; got {} arguments", exprs.len());
        }
        let table = match &exprs[0] {
            Expr::Literal(ScalarValue::Utf8(Some(t)) | ScalarValue::LargeUtf8(Some(t)), _) => t,
            other => return plan_err!("{PEEK_USAGE}; the table is {other}"),
        };
        let mut numbers = Vec::with_capacity(3);
        for e in &exprs[1..] {
            let n = match e {
                Expr::Literal(v, _) => v.clone().cast_to(&arrow_schema::DataType::UInt64).ok(),
                _ => None,
            };
            match n {
                Some(ScalarValue::UInt64(Some(n))) => numbers.push(n),
                _ => return plan_err!("{PEEK_USAGE}; got {e}"),
            }
        }
        let sizes = Sizes {
            max_messages: numbers.first().copied(),
            partitions: numbers.get(1).copied(),
            max_wait_ms: numbers.get(2).copied(),
        };
        let registry = Arc::clone(&self.registry);
        let provider = PeekTable::new(registry, table, self.shutdown.clone(), self.io.clone())
            .map_err(external)?
            .with_sizes(sizes);
        Ok(Arc::new(provider))
    }
}
