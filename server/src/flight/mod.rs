//! The Flight service: one short method per RPC, each delegating to the
//! registry ([`crate::registry`]) or to [`do_get`] and [`actions`].

pub(crate) mod actions;
pub(crate) mod attributes_cache;
pub(crate) mod do_get;
pub(crate) mod do_put;
pub(crate) mod envelope;
pub(crate) mod ipc_bounds;
pub(crate) mod limits;

use std::pin::Pin;
use std::sync::Arc;

use arrow_flight::flight_descriptor::DescriptorType;
use arrow_flight::flight_service_server::FlightService;
use arrow_flight::{
    Action, ActionType, Criteria, Empty, FlightData, FlightDescriptor, FlightEndpoint, FlightInfo,
    HandshakeRequest, HandshakeResponse, PollInfo, PutResult, SchemaAsIpc, SchemaResult, Ticket,
};
use arrow_schema::ArrowError;
use futures::Stream;
use futures::stream::{self, BoxStream};
use serde_json::json;
use sqs_flight_schemas::PlanCommand;
use sqs_flight_schemas::command::{DEFAULT_CONSUMER, check_name};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

use crate::auth::BearerAuth;
use crate::error::Error;
use crate::registry::{PlannedBatch, Registry};

/// How long a Handshake without a valid header may take to send the
/// message whose payload is the token.
const HANDSHAKE_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

type RpcStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// The Flight service over one registry.
pub(crate) struct SqsFlightService {
    registry: Arc<Registry>,
    limits: limits::ClientLimits,
    /// Schemas and dictionaries held by all DoPut streams (`max_put_held_bytes`).
    put_held: Arc<ipc_bounds::HeldBudget>,
    streams: limits::StreamCounter,
    location: String,
    shutdown: CancellationToken,
    auth: BearerAuth,
    /// Flight SQL: commands, tickets and actions of Flight SQL go there.
    sql: Option<Arc<crate::sql::SqlService>>,
    /// What the `server_info` action answers.
    instance: Arc<crate::instance::Instance>,
    /// The queue counts `status` read last.
    attributes: attributes_cache::AttributesCache,
}

impl SqsFlightService {
    /// `location` is the URI put in every endpoint; `shutdown` stops open
    /// receive loops when the server stops.
    pub(crate) fn new(
        registry: Arc<Registry>,
        location: String,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            registry,
            limits: limits::ClientLimits::default(),
            put_held: ipc_bounds::HeldBudget::new(crate::config::DEFAULT_MAX_PUT_HELD_BYTES),
            streams: limits::StreamCounter::default(),
            location,
            shutdown,
            auth: BearerAuth::default(),
            sql: None,
            instance: Arc::default(),
            attributes: attributes_cache::AttributesCache::default(),
        }
    }

    /// The identity `server_info` answers (by default one made here).
    pub(crate) fn with_instance(mut self, instance: Arc<crate::instance::Instance>) -> Self {
        self.instance = instance;
        self
    }

    /// Serves Flight SQL beside the plain Flight surface.
    pub(crate) fn with_sql(mut self, sql: Arc<crate::sql::SqlService>) -> Self {
        self.sql = Some(sql);
        self
    }

    /// The Flight SQL service, if `bytes` (a command or a ticket) is one of
    /// its messages. The caller checks the message with
    /// [`crate::sql::command`] before arrow-flight's dispatch, which calls
    /// an undecodable one INTERNAL.
    fn sql_for(&self, bytes: &[u8]) -> Option<&crate::sql::SqlService> {
        self.sql
            .as_deref()
            .filter(|_| crate::sql::is_flight_sql(bytes))
    }

    /// The token Handshake checks (the interceptor checks every other RPC).
    pub(crate) fn with_auth(mut self, auth: BearerAuth) -> Self {
        self.auth = auth;
        self
    }

    /// Counts every open stream in `activity` (for `--idle-exit`).
    pub(crate) fn with_activity(mut self, activity: crate::idle::Activity) -> Self {
        self.streams = limits::StreamCounter::new(activity);
        self
    }

    /// What one client may make the server do.
    pub(crate) fn with_limits(mut self, limits: limits::ClientLimits) -> Self {
        self.limits = limits;
        self.put_held = ipc_bounds::HeldBudget::new(limits.max_put_held_bytes);
        self
    }

    fn flight_info(
        &self,
        descriptor: FlightDescriptor,
        cmd: &PlanCommand,
        planned: &PlannedBatch,
    ) -> Result<FlightInfo, Error> {
        let schema = self.registry.table(&cmd.table)?.schema();
        let endpoints = planned.tickets().iter().map(|t| {
            FlightEndpoint::new()
                .with_ticket(Ticket::new(t.id().encode()))
                .with_location(self.location.clone())
        });
        let metadata =
            json!({"table": cmd.table, "consumer": cmd.consumer, "batch": planned.batch()});
        FlightInfo::new()
            .try_with_schema(&schema)
            .map(|info| {
                info.with_descriptor(descriptor)
                    .with_endpoints(endpoints.collect())
                    .with_app_metadata(metadata.to_string().into_bytes())
                    .with_total_records(-1)
                    .with_total_bytes(-1)
            })
            .map_err(schema_error)
    }
}

fn schema_error(e: ArrowError) -> Error {
    Error::Internal(format!("encoding the table schema: {e}"))
}

/// The plan command a descriptor stands for.
fn plan_command(descriptor: &FlightDescriptor) -> Result<PlanCommand, Error> {
    match DescriptorType::try_from(descriptor.r#type) {
        Ok(DescriptorType::Cmd) => Ok(PlanCommand::parse(&descriptor.cmd)?),
        Ok(DescriptorType::Path) => match descriptor.path.as_slice() {
            [table] => {
                check_name("PATH descriptor", "table", table)?;
                Ok(PlanCommand::new(table.clone(), DEFAULT_CONSUMER))
            }
            path => Err(Error::InvalidArgument(format!(
                "a PATH descriptor names one table, got {} path elements",
                path.len()
            ))),
        },
        _ => Err(Error::InvalidArgument(
            "descriptor must be PATH [table] or CMD (JSON plan command)".into(),
        )),
    }
}

fn unimplemented<T>(rpc: &str) -> Result<T, Status> {
    Err(crate::error::unimplemented(format!(
        "{rpc} is not supported by sqs-flight"
    )))
}

#[tonic::async_trait]
impl FlightService for SqsFlightService {
    type HandshakeStream = RpcStream<HandshakeResponse>;
    type ListFlightsStream = RpcStream<FlightInfo>;
    type DoGetStream = RpcStream<FlightData>;
    type DoPutStream = RpcStream<PutResult>;
    type DoExchangeStream = RpcStream<FlightData>;
    type DoActionStream = RpcStream<arrow_flight::Result>;
    type ListActionsStream = RpcStream<ActionType>;

    /// Succeeds when the call carries the token, as an `authorization:
    /// Bearer TOKEN` header or as the payload of its first message, or when
    /// the server has none; answers with the token as payload (and header).
    async fn handshake(
        &self,
        request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<Self::HandshakeStream>, Status> {
        let answer = || {
            let token = self.auth.token().unwrap_or_default();
            let response = HandshakeResponse {
                protocol_version: 0,
                payload: bytes::Bytes::copy_from_slice(token.as_bytes()),
            };
            let stream: Self::HandshakeStream = Box::pin(stream::iter([Ok(response)]));
            let mut response = Response::new(stream);
            if let Ok(value) = format!("Bearer {token}").parse()
                && !token.is_empty()
            {
                response.metadata_mut().insert("authorization", value);
            }
            Ok(response)
        };
        let by_header = self.auth.check_metadata(request.metadata());
        if by_header.is_ok() {
            return answer();
        }
        let mut messages = request.into_inner();
        let first = tokio::time::timeout(HANDSHAKE_READ_TIMEOUT, messages.message())
            .await
            .map_err(|_| {
                crate::error::unauthenticated(
                    "Handshake: no token within 10 s; send `authorization: Bearer TOKEN` \
                     or the token as the payload",
                )
            })??;
        match first {
            Some(m) if !m.payload.is_empty() => {
                if self.auth.payload_matches(&m.payload) {
                    answer()
                } else {
                    Err(crate::error::unauthenticated(
                        "Handshake: the payload is not this server's token",
                    ))
                }
            }
            _ => Err(by_header.unwrap_err()),
        }
    }

    async fn list_flights(
        &self,
        _request: Request<Criteria>,
    ) -> Result<Response<Self::ListFlightsStream>, Status> {
        let infos: Vec<Result<FlightInfo, Status>> = self
            .registry
            .tables()
            .map(|t| {
                FlightInfo::new()
                    .try_with_schema(&t.schema())
                    .map(|i| {
                        i.with_descriptor(FlightDescriptor::new_path(vec![t.name().to_string()]))
                            .with_total_records(-1)
                            .with_total_bytes(-1)
                    })
                    .map_err(|e| schema_error(e).into())
            })
            .collect();
        Ok(Response::new(Box::pin(stream::iter(infos))))
    }

    async fn get_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let cmd = &request.get_ref().cmd;
        self.limits
            .check_command("the GetFlightInfo command", cmd)?;
        if let Some(sql) = self.sql_for(&request.get_ref().cmd) {
            crate::sql::command(&request.get_ref().cmd)?;
            return FlightService::get_flight_info(sql, request).await;
        }
        let descriptor = request.into_inner();
        let cmd = plan_command(&descriptor)?;
        let planned = self.registry.plan(&cmd).await?;
        Ok(Response::new(self.flight_info(descriptor, &cmd, &planned)?))
    }

    async fn poll_flight_info(
        &self,
        _request: Request<FlightDescriptor>,
    ) -> Result<Response<PollInfo>, Status> {
        unimplemented("PollFlightInfo (use GetFlightInfo)")
    }

    async fn get_schema(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<SchemaResult>, Status> {
        let cmd = &request.get_ref().cmd;
        self.limits.check_command("the GetSchema command", cmd)?;
        let schema = match self.sql_for(&request.get_ref().cmd) {
            Some(sql) => sql.schema_for_command(&request.get_ref().cmd).await?,
            None => {
                let cmd = plan_command(&request.into_inner())?;
                self.registry.table(&cmd.table)?.schema()
            }
        };
        let options = arrow_ipc_options();
        let result =
            SchemaResult::try_from(SchemaAsIpc::new(&schema, &options)).map_err(schema_error)?;
        Ok(Response::new(result))
    }

    async fn do_get(
        &self,
        request: Request<Ticket>,
    ) -> Result<Response<Self::DoGetStream>, Status> {
        let ticket = &request.get_ref().ticket;
        self.limits.check_command("the DoGet ticket", ticket)?;
        let max = self.limits.max_streams_per_client;
        let guard = self.streams.acquire(request.remote_addr(), max)?;
        if let Some(sql) = self.sql_for(&request.get_ref().ticket) {
            crate::sql::command(&request.get_ref().ticket)?;
            let stream = FlightService::do_get(sql, request).await?.into_inner();
            return Ok(Response::new(Box::pin(limits::Guarded::new(stream, guard))));
        }
        let stream = do_get::do_get(&self.registry, &request.into_inner(), &self.shutdown)?;
        Ok(Response::new(Box::pin(limits::Guarded::new(stream, guard))))
    }

    async fn do_put(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoPutStream>, Status> {
        let max = self.limits.max_streams_per_client;
        let guard = self.streams.acquire(request.remote_addr(), max)?;
        let held = Arc::clone(&self.put_held);
        let results =
            do_put::do_put(&self.registry, request.into_inner(), self.limits, held).await?;
        Ok(Response::new(Box::pin(limits::Guarded::new(
            results, guard,
        ))))
    }

    async fn do_exchange(
        &self,
        _request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoExchangeStream>, Status> {
        unimplemented("DoExchange")
    }

    async fn do_action(
        &self,
        request: Request<Action>,
    ) -> Result<Response<Self::DoActionStream>, Status> {
        let action = request.get_ref();
        self.limits
            .check_command("the DoAction type", action.r#type.as_bytes())?;
        self.limits
            .check_command("the DoAction body", &action.body)?;
        if let Some(sql) = self.sql.as_deref()
            && crate::sql::is_flight_sql_action(&request.get_ref().r#type)
        {
            crate::sql::command(&request.get_ref().body)?;
            return FlightService::do_action(sql, request).await;
        }
        let body = actions::do_action(
            &self.registry,
            &self.instance,
            &self.attributes,
            request.into_inner(),
        )
        .await?;
        let result = arrow_flight::Result::new(body);
        let s: BoxStream<'static, Result<arrow_flight::Result, Status>> =
            Box::pin(stream::iter([Ok(result)]));
        Ok(Response::new(s))
    }

    async fn list_actions(
        &self,
        _request: Request<Empty>,
    ) -> Result<Response<Self::ListActionsStream>, Status> {
        let list = actions::ACTIONS.iter().map(|(name, description)| {
            Ok(ActionType {
                r#type: name.to_string(),
                description: description.to_string(),
            })
        });
        Ok(Response::new(Box::pin(stream::iter(
            list.collect::<Vec<_>>(),
        ))))
    }
}

fn arrow_ipc_options() -> arrow_ipc::writer::IpcWriteOptions {
    arrow_ipc::writer::IpcWriteOptions::default()
}
