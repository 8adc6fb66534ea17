//! Flight SQL on the server's port: SQL over the queue tables, for ADBC,
//! Polars, DuckDB, pandas and JDBC tools.
//!
//! [`SqlService`] implements arrow-flight's `FlightSqlService`; the main
//! Flight service hands it every call whose command, ticket or action is
//! Flight SQL's ([`is_flight_sql`], [`is_flight_sql_action`]), so the plain
//! Flight surface with its JSON commands does not change.
//!
//! Queries run on DataFusion over a catalog `sqs_flight`, schema `public`,
//! with one table per queue table (same schema, payload columns included)
//! and the JSON functions of `datafusion-functions-json`. A query is a
//! bounded peek ([`peek::PeekTable`]): nothing is deleted, every message it
//! saw is visible again when it has been read. Statements are read-only:
//! DDL, DML and `SET` are refused.
//!
//! Planning has no side effect: GetFlightInfo and CreatePreparedStatement
//! only build the logical plan (its schema is the FlightInfo's); the ticket
//! (and a prepared statement's handle) is the SQL text itself, so DoGet
//! plans it again and only then receives. The DoGet stream carries exactly
//! the FlightInfo's schema, nullability included, and an empty result
//! still sends it.
//!
//! Statements are planned and run in a process of their own, one per
//! statement ([`child`] on the server's side, [`worker`] in the child),
//! within a memory pool, a cap on the process's memory and a time limit:
//! whatever a statement does, it cannot end the server, which holds every
//! consumer's receipts. Its peeks are made in the server ([`peek`]) and
//! only their rows go to the worker ([`remote`]), as Arrow IPC in bounded
//! frames ([`frame`]). The worker encodes the result into the FlightData
//! messages of its DoGet ([`encode`]: dictionaries as dictionaries, view
//! columns compacted), and the server relays them as they are, a message
//! or two in flight: nothing a query makes is expanded in the server.
//!
//! Metadata results ([`metadata`]) are built on the blocking pool, and
//! their filter patterns have a length cap.

pub(crate) mod child;
pub(crate) mod encode;
pub(crate) mod frame;
pub(crate) mod metadata;
pub(crate) mod peek;
pub(crate) mod query;
pub(crate) mod remote;
pub(crate) mod runtime;
pub(crate) mod session;
pub mod worker;

use std::pin::Pin;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::sql::Command;
use arrow_flight::sql::metadata::{SqlInfoData, SqlInfoDataBuilder};
use arrow_flight::sql::server::{FlightSqlService, PeekableFlightDataStream};
use arrow_flight::sql::{
    ActionClosePreparedStatementRequest, ActionCreatePreparedStatementRequest,
    ActionCreatePreparedStatementResult, Any, CommandGetCatalogs, CommandGetDbSchemas,
    CommandGetSqlInfo, CommandGetTableTypes, CommandGetTables, CommandPreparedStatementQuery,
    CommandStatementQuery, CommandStatementUpdate, ProstMessageExt, SqlInfo, TicketStatementQuery,
};
use arrow_flight::{
    Action, FlightData, FlightDescriptor, FlightEndpoint, FlightInfo, IpcMessage, SchemaAsIpc,
    Ticket,
};
use arrow_ipc::writer::IpcWriteOptions;
use arrow_schema::{Schema, SchemaRef};
use datafusion::common::DataFusionError;
use datafusion::execution::context::{SQLOptions, SessionContext};
use futures::{Stream, TryStreamExt};
use prost::Message;
use sqs_flight_schemas::Reason;
use sqs_flight_schemas::json::quote_cut;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use crate::config::sql::SqlConfig;
use crate::error::Error;
use crate::registry::Registry;

/// The catalog and schema that hold the queue tables.
pub(crate) const CATALOG: &str = "sqs_flight";
pub(crate) const SCHEMA: &str = "public";
/// The one table type.
const TABLE_TYPE: &str = "TABLE";
/// Why a statement that would write is refused.
pub(crate) const READ_ONLY: &str = "sqs-flight's SQL is read-only (queries peek: nothing is deleted); \
     send messages with DoPut of the plain Flight surface (`sqs-flight send`, `sqs_flight.write`)";
/// Longest error message of a statement, in characters: DataFusion's
/// messages quote the statement's names and tokens, which a client may
/// make megabytes long.
const MAX_ERROR_CHARS: usize = 512;
/// Type URLs of Flight SQL's protobuf messages start with this.
const FLIGHT_SQL_TYPE_PREFIX: &str = "type.googleapis.com/arrow.flight.protocol.sql.";
/// Flight SQL's DoAction types.
const FLIGHT_SQL_ACTIONS: [&str; 8] = [
    "CreatePreparedStatement",
    "ClosePreparedStatement",
    "CreatePreparedSubstraitPlan",
    "BeginTransaction",
    "EndTransaction",
    "BeginSavepoint",
    "EndSavepoint",
    "CancelQuery",
];

type DoGetStream = Pin<Box<dyn Stream<Item = Result<FlightData, Status>> + Send + 'static>>;

/// Whether `bytes` (a descriptor's command or a ticket) is a Flight SQL
/// message: a protobuf `Any` of one of its types. The JSON commands and the
/// server's own tickets never decode as one.
pub(crate) fn is_flight_sql(bytes: &[u8]) -> bool {
    Any::decode(bytes).is_ok_and(|any| any.type_url.starts_with(FLIGHT_SQL_TYPE_PREFIX))
}

/// Whether a DoAction type is one of Flight SQL's.
pub(crate) fn is_flight_sql_action(kind: &str) -> bool {
    FLIGHT_SQL_ACTIONS.contains(&kind)
}

/// Decodes a Flight SQL command, ticket or action body; bytes that are not
/// one of its messages are INVALID_ARGUMENT, naming at most a short prefix
/// of what was sent (arrow-flight's own dispatch calls them INTERNAL).
pub(crate) fn command(bytes: &[u8]) -> Result<Command, Status> {
    let any = Any::decode(bytes).map_err(|e| {
        Status::from(Error::InvalidArgument(format!(
            "not a Flight SQL message (a protobuf Any): {e}"
        )))
    })?;
    let type_url = quote_cut(&any.type_url);
    match Command::try_from(any) {
        Ok(Command::Unknown(_)) => Err(Status::from(Error::InvalidArgument(format!(
            "unknown Flight SQL message type {type_url:?}"
        )))),
        Ok(command) => Ok(command),
        Err(e) => Err(Status::from(Error::InvalidArgument(format!(
            "{type_url}: {}",
            quote_cut(&e.to_string())
        )))),
    }
}

/// The Flight SQL service over one registry.
pub(crate) struct SqlService {
    registry: Arc<Registry>,
    info: Arc<SqlInfoData>,
    workers: child::Workers,
    builds: metadata::Builds,
}

impl SqlService {
    /// The service. Its statements end when `shutdown` is cancelled.
    pub(crate) fn new(
        registry: Arc<Registry>,
        shutdown: CancellationToken,
        config: &SqlConfig,
    ) -> Result<Self, Error> {
        let workers = child::Workers::new(Arc::clone(&registry), config, shutdown)?;
        Ok(Self {
            registry,
            info: Arc::new(sql_info()?),
            workers,
            builds: metadata::Builds::default(),
        })
    }

    /// GetSchema of a Flight SQL command: a statement's or a prepared
    /// statement's result schema (planned, nothing received).
    pub(crate) async fn schema_for_command(&self, cmd: &[u8]) -> Result<SchemaRef, Status> {
        match command(cmd)? {
            Command::CommandStatementQuery(q) => self.schema_of(&q.query).await,
            Command::CommandPreparedStatementQuery(p) => {
                let handle = &p.prepared_statement_handle;
                let sql = sql_text(handle, "the prepared statement handle")?;
                self.schema_of(&sql).await
            }
            other => Err(crate::error::unimplemented(format!(
                "GetSchema of {} is not supported; use GetFlightInfo",
                other.type_url()
            ))),
        }
    }

    /// The result schema of a read-only statement, planned (no scan) in a
    /// worker process within the time limit.
    async fn schema_of(&self, sql: &str) -> Result<SchemaRef, Status> {
        let mut statement = self.workers.start(frame::Mode::Plan, sql.to_string());
        let schema = first_schema(&mut statement).await;
        statement.end().await;
        schema
    }

    /// Runs `sql` in a worker process: the messages of its result as the
    /// worker encoded them ([`encode`]), relayed as they are. Answers once
    /// the query runs (its peeks are read), so that a failure to start is
    /// the call's own.
    async fn run(&self, sql: &str) -> Result<DoGetStream, Status> {
        let mut statement = self.workers.start(frame::Mode::Run, sql.to_string());
        match started(&mut statement).await {
            Ok(()) => Ok(relay(statement)),
            Err(status) => {
                statement.end().await;
                Err(status)
            }
        }
    }

    fn statement_info(
        &self,
        schema: &Schema,
        ticket: Vec<u8>,
        descriptor: FlightDescriptor,
    ) -> Result<FlightInfo, Status> {
        let endpoint = FlightEndpoint::new().with_ticket(Ticket::new(ticket));
        Ok(FlightInfo::new()
            .try_with_schema(schema)
            .map_err(|e| crate::error::internal(format!("encoding a schema: {e}")))?
            .with_endpoint(endpoint)
            .with_descriptor(descriptor)
            .with_total_records(-1)
            .with_total_bytes(-1))
    }
}

impl SqlService {
    /// The FlightInfo of a metadata command: its result schema, and one
    /// endpoint whose ticket is the command itself.
    fn metadata_info(
        &self,
        schema: SchemaRef,
        query: &impl ProstMessageExt,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let ticket = query.as_any().encode_to_vec();
        Ok(Response::new(self.statement_info(
            &schema,
            ticket,
            request.into_inner(),
        )?))
    }
}

/// The first answer of a statement: its schema.
async fn first_schema(statement: &mut child::Statement) -> Result<SchemaRef, Status> {
    match statement.events.recv().await {
        Some(Ok(child::Event::Schema(schema))) => Ok(schema),
        Some(Err(status)) => Err(status),
        _ => Err(crate::error::internal(
            "a Flight SQL statement ended without its schema",
        )),
    }
}

/// Waits until a statement's query runs (its peeks are read).
async fn started(statement: &mut child::Statement) -> Result<(), Status> {
    match statement.events.recv().await {
        Some(Ok(child::Event::Started)) => Ok(()),
        Some(Err(status)) => Err(status),
        _ => Err(crate::error::internal(
            "a Flight SQL query ended before it started",
        )),
    }
}

/// A running statement's result messages, relayed as the worker made them
/// (the schema first, exactly the planned one), and its failure as the
/// stream's last item; dropping the stream ends the statement (its worker
/// is killed, its peeks released).
fn relay(statement: child::Statement) -> DoGetStream {
    let messages = futures::stream::unfold(Some(statement), |statement| async move {
        let mut statement = statement?;
        let item = match statement.events.recv().await? {
            Ok(child::Event::Data(data)) => Ok(data),
            Ok(_) => Err(crate::error::internal(
                "a Flight SQL worker answered out of turn",
            )),
            Err(status) => Err(status),
        };
        let next = item.is_ok().then_some(statement);
        Some((item, next))
    });
    Box::pin(messages)
}

impl SqlService {
    /// The DoGet of a metadata result, built by `build` off the runtime
    /// ([`metadata::Builds`]).
    async fn metadata<F>(&self, build: F) -> Result<Response<DoGetStream>, Status>
    where
        F: FnOnce() -> Result<RecordBatch, String> + Send + 'static,
    {
        let batch = self.builds.run(build).await?;
        Ok(Response::new(one_batch(batch)))
    }
}

/// One metadata batch as a DoGet stream (a few rows: one per queue table
/// at most).
fn one_batch(batch: RecordBatch) -> DoGetStream {
    let stream = FlightDataEncoderBuilder::new()
        .with_schema(batch.schema())
        .build(futures::stream::iter([Ok(batch)]))
        .map_err(|e| match e {
            FlightError::Tonic(status) => *status,
            other => crate::error::internal(other.to_string()),
        });
    Box::pin(stream)
}

/// Plans a read-only statement: DDL, DML (`COPY ... TO` included) and
/// `SET` are refused before anything runs, as [`Error::InvalidArgument`]
/// naming what to use instead (what `SessionContext::sql_with_options`
/// does, but with a refusal of our own type instead of a planning error
/// told apart by its text).
async fn plan_on(
    ctx: &SessionContext,
    sql: &str,
) -> Result<datafusion::dataframe::DataFrame, DataFusionError> {
    let plan = ctx.state().create_logical_plan(sql).await?;
    SQLOptions::new()
        .with_allow_ddl(false)
        .with_allow_dml(false)
        .with_allow_statements(false)
        .verify_plan(&plan)
        .map_err(|e| {
            let refused = Error::ReadOnly(format!("{READ_ONLY}: {}", cut(e.to_string())));
            DataFusionError::External(Box::new(refused))
        })?;
    ctx.execute_logical_plan(plan).await
}

/// The status of a statement DataFusion refused or failed to run: an
/// error of ours (a scan's SQS failure: UNAVAILABLE...; a write refused by
/// [`plan_on`] with what to use instead) as it is, the memory pool's
/// refusal RESOURCE_EXHAUSTED, an unknown table NOT_FOUND, anything else
/// of the statement INVALID_ARGUMENT, with DataFusion's message cut short.
fn status(memory_limit: u64, e: DataFusionError) -> Status {
    let e = e.find_root();
    if let DataFusionError::External(inner) = e {
        if let Some(ours) = inner.downcast_ref::<Error>() {
            return Status::from(ours);
        }
        if let Some(relayed) = inner.downcast_ref::<remote::Relayed>() {
            let (message, reason) = (cut(relayed.message.clone()), relayed.reason.as_deref());
            return crate::error::relayed(relayed.code, message, reason);
        }
    }
    let message = cut(e.to_string());
    match e {
        DataFusionError::ResourcesExhausted(_) => query::out_of_memory(memory_limit, &message),
        DataFusionError::Plan(text) if is_unknown_table(text) => {
            crate::error::status(tonic::Code::NotFound, message, Reason::UnknownTable)
        }
        _ => Status::from(Error::InvalidArgument(message)),
    }
}

/// Whether a planning error is DataFusion's unknown table (`table 'x' not
/// found`, `table function 'x' not found`): it has no variant of its own,
/// so its text is all there is to tell.
fn is_unknown_table(text: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    lower.contains("table") && lower.contains("not found")
}

/// `message`, cut to [`MAX_ERROR_CHARS`] and marked when cut.
fn cut(message: String) -> String {
    match message.char_indices().nth(MAX_ERROR_CHARS) {
        None => message,
        Some((at, _)) => format!(
            "{}... (message cut, {} bytes)",
            &message[..at],
            message.len()
        ),
    }
}

fn sql_info() -> Result<SqlInfoData, Error> {
    let mut b = SqlInfoDataBuilder::new();
    b.append(SqlInfo::FlightSqlServerName, "sqs-flight");
    b.append(SqlInfo::FlightSqlServerVersion, env!("CARGO_PKG_VERSION"));
    b.append(SqlInfo::FlightSqlServerArrowVersion, "1.3");
    b.append(SqlInfo::FlightSqlServerReadOnly, true);
    b.append(SqlInfo::FlightSqlServerSql, true);
    b.append(SqlInfo::FlightSqlServerSubstrait, false);
    b.append(SqlInfo::FlightSqlServerCancel, false);
    b.append(SqlInfo::SqlDdlCatalog, false);
    b.append(SqlInfo::SqlDdlSchema, false);
    b.append(SqlInfo::SqlDdlTable, false);
    b.append(SqlInfo::SqlIdentifierQuoteChar, "\"");
    b.build()
        .map_err(|e| Error::Internal(format!("building SqlInfo: {e}")))
}

fn sql_text(bytes: &[u8], what: &str) -> Result<String, Status> {
    String::from_utf8(bytes.to_vec())
        .map_err(|_| crate::error::invalid_argument(format!("{what} is not UTF-8 SQL text")))
}

#[tonic::async_trait]
impl FlightSqlService for SqlService {
    type FlightService = SqlService;

    async fn get_flight_info_statement(
        &self,
        query: CommandStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = self.schema_of(&query.query).await?;
        let ticket = TicketStatementQuery {
            statement_handle: query.query.into_bytes().into(),
        }
        .as_any()
        .encode_to_vec();
        Ok(Response::new(self.statement_info(
            &schema,
            ticket,
            request.into_inner(),
        )?))
    }

    async fn get_flight_info_prepared_statement(
        &self,
        cmd: CommandPreparedStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let sql = sql_text(
            &cmd.prepared_statement_handle,
            "the prepared statement handle",
        )?;
        let schema = self.schema_of(&sql).await?;
        let ticket = cmd.as_any().encode_to_vec();
        Ok(Response::new(self.statement_info(
            &schema,
            ticket,
            request.into_inner(),
        )?))
    }

    async fn do_get_statement(
        &self,
        ticket: TicketStatementQuery,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let sql = sql_text(&ticket.statement_handle, "the statement ticket")?;
        Ok(Response::new(self.run(&sql).await?))
    }

    async fn do_get_prepared_statement(
        &self,
        query: CommandPreparedStatementQuery,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let sql = sql_text(
            &query.prepared_statement_handle,
            "the prepared statement handle",
        )?;
        Ok(Response::new(self.run(&sql).await?))
    }

    async fn do_action_create_prepared_statement(
        &self,
        query: ActionCreatePreparedStatementRequest,
        _request: Request<Action>,
    ) -> Result<ActionCreatePreparedStatementResult, Status> {
        let schema = self.schema_of(&query.query).await?;
        let IpcMessage(dataset_schema) = SchemaAsIpc::new(&schema, &IpcWriteOptions::default())
            .try_into()
            .map_err(|e: arrow_schema::ArrowError| {
                crate::error::internal(format!("encoding a schema: {e}"))
            })?;
        Ok(ActionCreatePreparedStatementResult {
            // The handle is the statement: nothing is kept per statement, so
            // nothing leaks when a client never closes it.
            prepared_statement_handle: query.query.into_bytes().into(),
            dataset_schema,
            parameter_schema: Default::default(),
        })
    }

    async fn do_action_close_prepared_statement(
        &self,
        _query: ActionClosePreparedStatementRequest,
        _request: Request<Action>,
    ) -> Result<(), Status> {
        Ok(())
    }

    async fn get_flight_info_catalogs(
        &self,
        query: CommandGetCatalogs,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.metadata_info(query.into_builder().schema(), &query, request)
    }

    async fn do_get_catalogs(
        &self,
        query: CommandGetCatalogs,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        self.metadata(move || {
            let mut b = query.into_builder();
            b.append(CATALOG);
            b.build().map_err(|e| e.to_string())
        })
        .await
    }

    async fn get_flight_info_schemas(
        &self,
        query: CommandGetDbSchemas,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        metadata::check_schemas(&query)?;
        self.metadata_info(query.clone().into_builder().schema(), &query, request)
    }

    async fn do_get_schemas(
        &self,
        query: CommandGetDbSchemas,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        metadata::check_schemas(&query)?;
        self.metadata(move || metadata::schemas(query)).await
    }

    async fn get_flight_info_tables(
        &self,
        query: CommandGetTables,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        metadata::check_tables(&query)?;
        self.metadata_info(query.clone().into_builder().schema(), &query, request)
    }

    async fn do_get_tables(
        &self,
        query: CommandGetTables,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        metadata::check_tables(&query)?;
        let tables: Vec<_> = self
            .registry
            .tables()
            .map(|t| (t.name().to_string(), t.schema()))
            .collect();
        self.metadata(move || metadata::tables(query, tables)).await
    }

    async fn get_flight_info_table_types(
        &self,
        query: CommandGetTableTypes,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.metadata_info(query.into_builder().schema(), &query, request)
    }

    async fn do_get_table_types(
        &self,
        query: CommandGetTableTypes,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        self.metadata(move || {
            let mut b = query.into_builder();
            b.append(TABLE_TYPE);
            b.build().map_err(|e| e.to_string())
        })
        .await
    }

    async fn get_flight_info_sql_info(
        &self,
        query: CommandGetSqlInfo,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder(&self.info).schema();
        self.metadata_info(schema, &query, request)
    }

    async fn do_get_sql_info(
        &self,
        query: CommandGetSqlInfo,
        _request: Request<Ticket>,
    ) -> Result<Response<DoGetStream>, Status> {
        let info = Arc::clone(&self.info);
        self.metadata(move || metadata::sql_info(query, &info))
            .await
    }

    async fn do_put_statement_update(
        &self,
        _ticket: CommandStatementUpdate,
        _request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        Err(Status::from(Error::ReadOnly(READ_ONLY.into())))
    }

    async fn register_sql_info(&self, _id: i32, _result: &SqlInfo) {}
}
