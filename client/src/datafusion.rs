//! SQL over queues: a DataFusion [`TableProvider`] for an sqs-flight table.
//!
//! A [`SqsFlightTable`] reads **one batch** of its consumer. The first scan
//! plans the batch (the consumer's next one, or the batch named in the
//! [`PlanOptions`]); every later scan through the same provider reads that
//! same batch again, because its tickets replay the same rows. So a query
//! that reads the table twice (a self-join), and every query run before the
//! commit, sees the same messages. Nothing is deleted until
//! [`commit`](SqsFlightTable::commit); [`release`](SqsFlightTable::release)
//! gives the messages back to the queue instead. Either way the provider
//! then forgets the batch, and the next scan plans the next one.
//!
//! Each endpoint of the batch is one DataFusion partition, read on its own
//! task; only the projected columns leave the scan.
//!
//! The provider's schema is the one the server gives for the table, so a
//! table whose server config declares a payload has its typed `payload`
//! struct and `payload_error` columns: `SELECT payload['user'], count(*)
//! ... GROUP BY 1` (also `get_field(payload, 'user')` or
//! `t.payload.user`) needs no JSON parsing on the client.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use sqs_flight_client::datafusion::{SqsFlightTable, session_context};
//! use sqs_flight_client::{Client, PlanOptions};
//!
//! let client = Client::connect("grpc://127.0.0.1:50051").await?;
//! let orders = Arc::new(SqsFlightTable::try_new(client, "demo", PlanOptions::consumer("report")).await?);
//! let ctx = session_context()?;
//! ctx.register_table("demo", orders.clone())?;
//! ctx.sql("SELECT json_get_str(body, 'event') AS event, count(*) FROM demo GROUP BY 1")
//!     .await?
//!     .show()
//!     .await?;
//! orders.commit().await?; // delete what the query read
//! # Ok(())
//! # }
//! ```

use std::sync::Arc;

use ::datafusion::catalog::{Session, TableProvider};
use ::datafusion::common::{DataFusionError, Result as DfResult, TableReference};
use ::datafusion::execution::{SendableRecordBatchStream, TaskContext};
use ::datafusion::logical_expr::{Expr, TableType};
use ::datafusion::physical_plan::ExecutionPlan;
use ::datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use ::datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use ::datafusion::prelude::SessionContext;
use arrow_schema::SchemaRef;
use async_trait::async_trait;
use futures::{StreamExt, TryStreamExt};
use tokio::sync::Mutex;

use crate::Client;
use crate::answer::{Committed, Released};
use crate::error::{Error, Result};
use crate::plan::{Endpoint, Plan, PlanOptions};

/// A queue table as a DataFusion table, one batch per provider at a time.
#[derive(Debug)]
pub struct SqsFlightTable {
    client: Client,
    table: String,
    options: PlanOptions,
    schema: SchemaRef,
    /// The batch scans read, once the first scan has planned it. A tokio
    /// mutex: it is held across the planning call, so that two scans that
    /// start together agree on one batch.
    planned: Mutex<Option<Plan>>,
}

impl SqsFlightTable {
    /// A provider for `table`, reading batches of `options.consumer` with
    /// `options`' limits. Fetches the table's schema (and so checks that the
    /// table exists).
    pub async fn try_new(client: Client, table: &str, options: PlanOptions) -> Result<Self> {
        let schema = client.schema(table).await?;
        Ok(Self {
            client,
            table: table.to_string(),
            options,
            schema,
            planned: Mutex::new(None),
        })
    }

    pub fn table(&self) -> &str {
        &self.table
    }

    pub fn consumer(&self) -> &str {
        self.options.consumer_name()
    }

    /// The batch that scans read, if one has been planned.
    pub async fn batch(&self) -> Option<u64> {
        self.planned.lock().await.as_ref().map(|p| p.batch)
    }

    /// The batch that scans read, planned on first use.
    pub async fn plan(&self) -> Result<Plan> {
        let mut planned = self.planned.lock().await;
        if let Some(plan) = planned.as_ref() {
            return Ok(plan.clone());
        }
        let plan = self.client.plan(&self.table, &self.options).await?;
        if plan.schema != self.schema {
            return Err(Error::protocol(
                "GetFlightInfo",
                format!(
                    "table {:?} changed schema since it was registered",
                    self.table
                ),
            ));
        }
        *planned = Some(plan.clone());
        Ok(plan)
    }

    /// Commits the batch scans read (deleting its messages from SQS), so
    /// that the next scan plans the next batch. `None` when no scan planned
    /// a batch.
    pub async fn commit(&self) -> Result<Option<Committed>> {
        let mut planned = self.planned.lock().await;
        let Some(plan) = planned.as_ref() else {
            return Ok(None);
        };
        let committed = self
            .client
            .commit(&plan.table, &plan.consumer, plan.batch)
            .await?;
        *planned = None;
        Ok(Some(committed))
    }

    /// Releases the consumer's uncommitted messages (they become visible
    /// again now) and forgets the batch. `None` when no scan planned one.
    pub async fn release(&self) -> Result<Option<Released>> {
        let mut planned = self.planned.lock().await;
        let Some(plan) = planned.as_ref() else {
            return Ok(None);
        };
        let released = self.client.release(&plan.table, &plan.consumer).await?;
        *planned = None;
        Ok(Some(released))
    }
}

fn external(e: Error) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

#[async_trait]
impl TableProvider for SqsFlightTable {
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
        let plan = self.plan().await.map_err(external)?;
        let partitions = plan
            .endpoints
            .into_iter()
            .map(|endpoint| {
                Arc::new(EndpointStream {
                    client: self.client.clone(),
                    endpoint,
                    schema: Arc::clone(&self.schema),
                }) as Arc<dyn PartitionStream>
            })
            .collect();
        let exec = StreamingTableExec::try_new(
            Arc::clone(&self.schema),
            partitions,
            projection,
            [],
            false,
            limit,
        )?;
        Ok(Arc::new(exec))
    }
}

/// One endpoint of the planned batch, as a DataFusion partition.
#[derive(Debug)]
struct EndpointStream {
    client: Client,
    endpoint: Endpoint,
    schema: SchemaRef,
}

impl PartitionStream for EndpointStream {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let client = self.client.clone();
        let endpoint = self.endpoint.clone();
        let rows = futures::stream::once(async move { client.read(&endpoint).await })
            .try_flatten()
            .map_err(external)
            .boxed();
        Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            rows,
        ))
    }
}

/// A DataFusion session with the JSON functions of
/// `datafusion-functions-json` (`json_get_str(body, 'event')`,
/// `json_get_int`, `json_contains`, the `->` and `->>` operators, ...).
pub fn session_context() -> DfResult<SessionContext> {
    let mut ctx = SessionContext::new();
    datafusion_functions_json::register_all(&mut ctx)?;
    Ok(ctx)
}

/// Registers every table of the server in `ctx` under its own name, each a
/// provider with `options`, and returns the providers (to commit or release
/// them after the queries).
pub async fn register_all_tables(
    ctx: &SessionContext,
    client: &Client,
    options: &PlanOptions,
) -> Result<Vec<Arc<SqsFlightTable>>> {
    let mut providers = Vec::new();
    for name in client.tables().await? {
        let provider =
            Arc::new(SqsFlightTable::try_new(client.clone(), &name, options.clone()).await?);
        ctx.register_table(TableReference::bare(name.as_str()), provider.clone())
            .map_err(|e| Error::InvalidConfig {
                what: "table name",
                reason: e.to_string(),
            })?;
        providers.push(provider);
    }
    Ok(providers)
}

/// The client error inside a DataFusion error, if the query failed on a
/// Flight call: DataFusion wraps it, sometimes more than once.
pub fn client_error<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a Error> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = current {
        if let Some(found) = err.downcast_ref::<Error>() {
            return Some(found);
        }
        current = err.source();
    }
    None
}
