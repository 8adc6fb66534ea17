//! One statement's outcomes as statuses (each naming its limit and flag),
//! and its execution inside a SQL worker process.

use std::sync::Arc;
use std::time::Duration;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{DataFusionError, Result as DfResult};
use datafusion::dataframe::DataFrame;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::coop::CooperativeExec;
use tonic::Status;

use crate::config::sql::show_bytes;
use crate::error::Error;
use crate::metrics::Metrics;

/// DEADLINE_EXCEEDED, naming the limit and its flag.
pub(crate) fn too_long(timeout: Duration) -> Status {
    Status::from(Error::DeadlineExceeded(format!(
        "the Flight SQL query ran longer than its time limit of {} s and was stopped \
         (--sql-query-timeout, TOML sql.query_timeout)",
        timeout.as_secs()
    )))
}

/// RESOURCE_EXHAUSTED, naming the limit and its flag.
pub(crate) fn out_of_memory(memory_limit: u64, detail: &str) -> Status {
    Status::from(Error::limit(
        "sql.memory_limit",
        format!(
            "the Flight SQL query needs more memory than the {} its operators may use \
         (--sql-memory-limit, TOML sql.memory_limit): {detail}",
            show_bytes(memory_limit)
        ),
    ))
}

/// UNAVAILABLE: the server stops.
pub(crate) fn shutting_down() -> Status {
    Status::from(Error::ShuttingDown(
        "the server is shutting down: the Flight SQL query was stopped".into(),
    ))
}

/// Starts `df`: its physical plan (a queue table is peeked now), every
/// operator made [cooperative](cooperative), executed.
pub(crate) async fn execute(df: DataFrame) -> DfResult<SendableRecordBatchStream> {
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
pub(crate) struct Running(Arc<Metrics>);

impl Running {
    pub(crate) fn new(metrics: &Arc<Metrics>) -> Self {
        metrics.sql_queries_running.inc();
        Self(Arc::clone(metrics))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.sql_queries_running.dec();
    }
}
