//! A queue table as a SQL worker process sees it: a scan asks the server
//! for a peek ([`Peeker`]) and holds the rows it gets back.
//!
//! The worker has no registry, no receipts and no SQS client: the server
//! plans, reads and releases the peek in its own process
//! ([`super::peek`]) and streams the rows over the worker's stdin, so
//! whatever the query does afterwards, the messages are visible again and
//! nothing of the peek outlives the server's side of it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::memory::MemorySourceConfig;
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::{DataFusionError, Result as DfResult, ScalarValue, plan_err};
use datafusion::logical_expr::{Expr, TableType};
use datafusion::physical_plan::ExecutionPlan;
use tokio::sync::{mpsc, oneshot};

use super::frame::{self, Frame, FrameError, Kind, PeekFailed, PeekRequest};
use crate::error::Error;

/// A failure the server sent back (a peek's), with its status code.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub(crate) struct Relayed {
    pub code: i32,
    pub message: String,
    pub reason: Option<String>,
}

/// A peek's partitions as they arrive, and who waits for them.
struct Pending {
    partitions: Vec<Vec<RecordBatch>>,
    done: oneshot::Sender<Result<Vec<Vec<RecordBatch>>, DataFusionError>>,
}

/// Asks the server for peeks and hands each scan its rows.
pub(crate) struct Peeker {
    out: mpsc::Sender<(Kind, Vec<u8>)>,
    pending: Mutex<HashMap<u64, Pending>>,
    next: AtomicU64,
}

impl Peeker {
    /// A peeker that writes its requests to `out` (the worker's stdout).
    pub(crate) fn new(out: mpsc::Sender<(Kind, Vec<u8>)>) -> Self {
        Self {
            out,
            pending: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
        }
    }

    /// The rows of a peek of `table` (one `Vec` per partition).
    async fn peek(
        &self,
        table: &str,
        sizes: Sizes,
        limit: Option<usize>,
    ) -> DfResult<Vec<Vec<RecordBatch>>> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let request = PeekRequest {
            id,
            table: table.to_string(),
            max_messages: sizes.max_messages,
            partitions: sizes.partitions,
            max_wait_ms: sizes.max_wait_ms,
            limit: limit.map(|n| n as u64),
        };
        let (done, answer) = oneshot::channel();
        let pending = Pending {
            partitions: Vec::new(),
            done,
        };
        self.lock().insert(id, pending);
        let body = serde_json::to_vec(&request).map_err(|e| internal(e.to_string()))?;
        self.out
            .send((Kind::Peek, body))
            .await
            .map_err(|_| internal("the server is gone".into()))?;
        answer
            .await
            .map_err(|_| internal("the server dropped the peek".into()))?
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Pending>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes one of the server's peek frames.
    pub(crate) fn on_frame(&self, frame: Frame) -> Result<(), FrameError> {
        match frame.kind {
            Kind::PeekRows => {
                let (id, partition, ipc) = frame::untag(frame.kind, &frame.payload)?;
                let (_, batches) = frame::decode_ipc(ipc)?;
                let mut pending = self.lock();
                let Some(p) = pending.get_mut(&id) else {
                    return Ok(());
                };
                let at = partition as usize;
                if p.partitions.len() <= at {
                    p.partitions.resize_with(at + 1, Vec::new);
                }
                p.partitions[at].extend(batches);
            }
            Kind::PeekEnd => {
                let (id, count, _) = frame::untag(frame.kind, &frame.payload)?;
                if let Some(mut p) = self.lock().remove(&id) {
                    let count = (count as usize).max(p.partitions.len());
                    p.partitions.resize_with(count, Vec::new);
                    let _ = p.done.send(Ok(p.partitions));
                }
            }
            Kind::PeekError => {
                let failed: PeekFailed = frame::json(frame.kind, &frame.payload)?;
                if let Some(p) = self.lock().remove(&failed.id) {
                    let relayed = Relayed {
                        code: failed.code,
                        message: failed.message,
                        reason: failed.reason,
                    };
                    let _ = p
                        .done
                        .send(Err(DataFusionError::External(Box::new(relayed))));
                }
            }
            other => {
                return Err(FrameError::Malformed(other, "not for a worker".into()));
            }
        }
        Ok(())
    }
}

fn internal(message: String) -> DataFusionError {
    DataFusionError::External(Box::new(Error::Internal(format!("a SQL peek: {message}"))))
}

/// Plan fields a query may set with `peek(table, max_messages
/// [, partitions [, max_wait_ms]])`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Sizes {
    pub max_messages: Option<u64>,
    pub partitions: Option<u64>,
    pub max_wait_ms: Option<u64>,
}

/// One queue table of a worker's catalog.
pub(crate) struct RemoteTable {
    name: String,
    schema: SchemaRef,
    sizes: Sizes,
    peeker: Arc<Peeker>,
}

impl RemoteTable {
    pub(crate) fn new(name: &str, schema: SchemaRef, peeker: Arc<Peeker>) -> Self {
        Self {
            name: name.to_string(),
            schema,
            sizes: Sizes::default(),
            peeker,
        }
    }
}

impl std::fmt::Debug for RemoteTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteTable")
            .field("table", &self.name)
            .finish()
    }
}

#[async_trait]
impl TableProvider for RemoteTable {
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
        let partitions = self.peeker.peek(&self.name, self.sizes, limit).await?;
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
pub(crate) struct PeekFunction {
    pub tables: HashMap<String, SchemaRef>,
    pub peeker: Arc<Peeker>,
}

impl std::fmt::Debug for PeekFunction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeekFunction")
    }
}

const PEEK_USAGE: &str = "peek(table, max_messages [, partitions [, max_wait_ms]]): a table name \
     and whole numbers";

impl TableFunctionImpl for PeekFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> DfResult<Arc<dyn TableProvider>> {
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
        let Some(schema) = self.tables.get(table.as_str()) else {
            let mut known: Vec<&str> = self.tables.keys().map(String::as_str).collect();
            known.sort();
            let unknown = Error::UnknownTable {
                table: table.clone(),
                known: known.join(", "),
            };
            return Err(DataFusionError::External(Box::new(unknown)));
        };
        let mut provider = RemoteTable::new(table, Arc::clone(schema), Arc::clone(&self.peeker));
        provider.sizes = Sizes {
            max_messages: numbers.first().copied(),
            partitions: numbers.get(1).copied(),
            max_wait_ms: numbers.get(2).copied(),
        };
        Ok(Arc::new(provider))
    }
}
