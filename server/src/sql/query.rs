//! One statement's work on the SQL runtime, owned by its gRPC call.
//!
//! [`Runner::call`] plans on the SQL threads; [`Runner::stream`] plans,
//! starts the execution there, and hands its batches to the gRPC side
//! through a channel of [`QUEUED_BATCHES`]. The task is aborted when its
//! owner is dropped (the client went away), when the time limit runs out
//! (the deadline is kept on the gRPC side, so it fires even while the SQL
//! threads are busy), and when the server stops.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{DataFusionError, Result as DfResult};
use datafusion::dataframe::DataFrame;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::coop::CooperativeExec;
use futures::{Stream, StreamExt};
use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tonic::Status;

use crate::config::sql::show_bytes;
use crate::error::Error;
use crate::metrics::Metrics;

/// Result batches a query may have ready before its client reads them.
pub const QUEUED_BATCHES: usize = 2;

/// A query's batches as the gRPC side reads them.
pub type Batches = Pin<Box<dyn Stream<Item = Result<RecordBatch, Status>> + Send + 'static>>;

/// Starts statements on the SQL runtime, within the limits.
#[derive(Clone)]
pub struct Runner {
    pub handle: Handle,
    pub stop: CancellationToken,
    pub timeout: Duration,
    pub memory_limit: u64,
    pub metrics: Arc<Metrics>,
}

impl Runner {
    /// Runs `work` (planning) on the SQL threads within the time limit.
    pub async fn call<T: Send + 'static>(
        &self,
        work: impl Future<Output = Result<T, Status>> + Send + 'static,
    ) -> Result<T, Status> {
        let deadline = Instant::now() + self.timeout;
        let task = self.spawn(work);
        match tokio::time::timeout_at(deadline, task).await {
            Ok(joined) => joined.map_err(|e| self.lost(e))?,
            Err(_) => Err(self.too_long()),
        }
    }

    /// Runs `start` on the SQL threads (planning and starting the query:
    /// a queue table is peeked then), then streams its batches, each
    /// carrying `schema`. An error of `start` is the call's own.
    pub async fn stream<F>(&self, schema: SchemaRef, start: F) -> Result<Batches, Status>
    where
        F: Future<Output = Result<Batches, Status>> + Send + 'static,
    {
        let deadline = Instant::now() + self.timeout;
        let (started, ready) = oneshot::channel();
        let (tx, rx) = mpsc::channel(QUEUED_BATCHES);
        let task = self.spawn(produce(start, schema, started, tx));
        let mut task = Some(task);
        match tokio::time::timeout_at(deadline, ready).await {
            Err(_) => return Err(self.too_long()),
            Ok(Ok(Err(status))) => return Err(status),
            Ok(Ok(Ok(()))) => {}
            Ok(Err(_)) => {
                let ended = task.take().expect("the task").await;
                return Err(ended.map_or_else(
                    |e| self.lost(e),
                    |r| {
                        r.err().unwrap_or_else(|| {
                            Status::internal("a Flight SQL query ended before it started")
                        })
                    },
                ));
            }
        }
        let runner = self.clone();
        let batches = futures::stream::unfold(
            (rx, task, runner),
            move |(mut rx, task, runner)| async move {
                let task = task?;
                match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some(Ok(batch))) => Some((Ok(batch), (rx, Some(task), runner))),
                    Ok(Some(Err(status))) => Some((Err(status), (rx, None, runner))),
                    Ok(None) => match task.await {
                        Ok(Ok(())) => None,
                        Ok(Err(status)) => Some((Err(status), (rx, None, runner))),
                        Err(e) => Some((Err(runner.lost(e)), (rx, None, runner))),
                    },
                    Err(_) => Some((Err(runner.too_long()), (rx, None, runner))),
                }
            },
        );
        Ok(Box::pin(batches))
    }

    /// Spawns `work` on the SQL threads: counted while it runs, ended by the
    /// server's stop, aborted when the handle is dropped.
    fn spawn<T: Send + 'static>(
        &self,
        work: impl Future<Output = Result<T, Status>> + Send + 'static,
    ) -> AbortOnDropHandle<Result<T, Status>> {
        let (stop, running) = (self.stop.clone(), Running::new(&self.metrics));
        AbortOnDropHandle::new(self.handle.spawn(async move {
            let _running = running;
            tokio::select! {
                done = work => done,
                _ = stop.cancelled() => Err(shutting_down()),
            }
        }))
    }

    /// DEADLINE_EXCEEDED, naming the limit and its flag.
    fn too_long(&self) -> Status {
        Status::from(Error::DeadlineExceeded(format!(
            "the Flight SQL query ran longer than its time limit of {} s and was stopped \
             (--sql-query-timeout, TOML sql.query_timeout)",
            self.timeout.as_secs()
        )))
    }

    /// RESOURCE_EXHAUSTED, naming the limit and its flag.
    pub fn out_of_memory(&self, detail: &str) -> Status {
        Status::from(Error::ResourceExhausted(format!(
            "the Flight SQL query needs more memory than the {} that all queries may use \
             (--sql-memory-limit, TOML sql.memory_limit): {detail}",
            show_bytes(self.memory_limit)
        )))
    }

    /// Why a task ended without an answer: cancelled by the server's stop,
    /// or a panic.
    fn lost(&self, e: tokio::task::JoinError) -> Status {
        if e.is_cancelled() {
            shutting_down()
        } else {
            Status::from(Error::Internal("a Flight SQL query panicked".into()))
        }
    }
}

fn shutting_down() -> Status {
    Status::from(Error::ShuttingDown(
        "the server is shutting down: the Flight SQL query was stopped".into(),
    ))
}

/// The task on the SQL threads: start the query, say so (or why not) on
/// `started`, then send its batches, each with exactly `schema`.
async fn produce<F>(
    start: F,
    schema: SchemaRef,
    started: oneshot::Sender<Result<(), Status>>,
    tx: mpsc::Sender<Result<RecordBatch, Status>>,
) -> Result<(), Status>
where
    F: Future<Output = Result<Batches, Status>> + Send,
{
    let mut stream = match start.await {
        Ok(stream) => stream,
        Err(status) => {
            let _ = started.send(Err(status));
            return Ok(());
        }
    };
    if started.send(Ok(())).is_err() {
        return Ok(());
    }
    while let Some(batch) = stream.next().await {
        let batch = batch.and_then(|b| {
            RecordBatch::try_new(Arc::clone(&schema), b.columns().to_vec())
                .map_err(|e| Status::from(Error::Internal(format!("result batch: {e}"))))
        });
        let failed = batch.is_err();
        if tx.send(batch).await.is_err() || failed {
            break;
        }
    }
    Ok(())
}

/// Starts `df`: its physical plan (a queue table is peeked now), every
/// operator made [cooperative](cooperative), executed.
pub async fn execute(df: DataFrame) -> DfResult<SendableRecordBatchStream> {
    let task = Arc::new(df.task_ctx());
    let plan = cooperative(df.create_physical_plan().await?)?;
    datafusion::physical_plan::execute_stream(plan, task)
}

/// `plan` with every operator's output consuming tokio's task budget.
///
/// DataFusion yields to tokio only where its leaves read: an operator that
/// makes many batches out of few (a cross join) can run for hours inside
/// one poll of its parent (an aggregate), and a task that never yields
/// cannot be aborted. With each operator's stream wrapped, the task yields
/// every 128 batches or so, and an abort (client gone, time limit, stop)
/// takes effect then.
fn cooperative(plan: Arc<dyn ExecutionPlan>) -> DfResult<Arc<dyn ExecutionPlan>> {
    plan.transform_up(|node| {
        if node.is::<CooperativeExec>() {
            return Ok(Transformed::no(node));
        }
        let wrapped: Arc<dyn ExecutionPlan> = Arc::new(CooperativeExec::new(node));
        Ok(Transformed::yes(wrapped))
    })
    .map(|t| t.data)
    .map_err(|e: DataFusionError| e)
}

/// Counts a statement in `sql_queries_running` until it is dropped.
struct Running(Arc<Metrics>);

impl Running {
    fn new(metrics: &Arc<Metrics>) -> Self {
        metrics.sql_queries_running.inc();
        Self(Arc::clone(metrics))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.sql_queries_running.dec();
    }
}
