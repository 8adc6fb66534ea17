//! Flight on loopback: the sqs-flight server in-process, a client that
//! plans, reads and commits batches, and the raw Flight server of the
//! baseline (ready batches served as they are).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use arrow_array::RecordBatch;
use arrow_flight::flight_service_server::{FlightService, FlightServiceServer};
use arrow_flight::{
    Action, ActionType, Criteria, Empty, FlightClient, FlightData, FlightDescriptor, FlightInfo,
    HandshakeRequest, HandshakeResponse, PollInfo, PutResult, SchemaResult, Ticket,
};
use arrow_schema::SchemaRef;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use serde_json::json;
use sqs_flight_schemas::PlanCommand;
use sqs_flight_server::config::Config;
use sqs_flight_server::config::plan::{LIMIT_MAX_BYTES, LIMIT_MAX_DURATION_MS};
use sqs_flight_server::registry::Registry;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status, Streaming};

/// Largest gRPC message either side sends or takes (the server's own).
const MAX_MESSAGE_SIZE: usize = sqs_flight_server::server::MAX_MESSAGE_SIZE;

/// A server task on a loopback port, stopped on drop.
pub struct Running {
    pub addr: SocketAddr,
    shutdown: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl Running {
    /// A Flight client of this server.
    pub async fn client(&self) -> Result<FlightClient> {
        connect(self.addr).await
    }

    /// Stops the server and waits (bounded) for it.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Serves `registry` with the sqs-flight server on a free loopback port.
pub async fn start_server(mut config: Config, registry: Arc<Registry>) -> Result<Running> {
    config.listen = "127.0.0.1:0".parse().expect("a socket address");
    let listener = sqs_flight_server::server::bind(&config).await?;
    let addr = listener.local_addr()?;
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    let task = tokio::spawn(async move {
        if let Err(e) = sqs_flight_server::server::serve(listener, config, registry, stop).await {
            eprintln!("sqs-flight server failed: {e}");
        }
    });
    Ok(Running {
        addr,
        shutdown,
        task: Some(task),
    })
}

/// A Flight client of `addr`.
pub async fn connect(addr: SocketAddr) -> Result<FlightClient> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .with_context(|| format!("connect to {addr}"))?;
    Ok(FlightClient::new_from_inner(
        arrow_flight::flight_service_client::FlightServiceClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_SIZE)
            .max_encoding_message_size(MAX_MESSAGE_SIZE),
    ))
}

/// What to plan: the GetFlightInfo plan command (docs/protocol.md, "GetFlightInfo").
#[derive(Debug, Clone)]
pub struct Plan<'a> {
    pub table: &'a str,
    pub consumer: &'a str,
    pub batch: u64,
    pub partitions: u64,
    pub max_messages: u64,
    pub max_wait_ms: u64,
    /// ReceiveMessage calls each partition keeps in flight (None: the
    /// server's default).
    pub receivers: Option<u64>,
    /// `read_ahead` (None: the server's default, off).
    pub read_ahead: Option<u64>,
}

/// GetFlightInfo; the tickets of the batch, one per partition.
pub async fn plan(client: &mut FlightClient, p: &Plan<'_>) -> Result<Vec<Ticket>> {
    // Byte and duration limits at their maximum: the figures end partitions
    // on message counts (and idle time), never half way on bytes or time.
    let cmd = PlanCommand {
        batch: Some(p.batch),
        partitions: Some(p.partitions),
        max_messages: Some(p.max_messages),
        max_wait_ms: Some(p.max_wait_ms),
        max_bytes: Some(LIMIT_MAX_BYTES),
        max_duration_ms: Some(LIMIT_MAX_DURATION_MS),
        receivers: p.receivers,
        read_ahead: p.read_ahead,
        ..PlanCommand::new(p.table, p.consumer)
    };
    let info: FlightInfo = client
        .get_flight_info(FlightDescriptor::new_cmd(cmd.to_json()))
        .await
        .context("GetFlightInfo")?;
    info.endpoint
        .into_iter()
        .map(|e| e.ticket.context("an endpoint without a ticket"))
        .collect()
}

/// Rows and body bytes of a read.
#[derive(Debug, Clone, Copy, Default)]
pub struct Read {
    pub rows: u64,
    pub body_bytes: u64,
}

/// Body bytes of a batch (the `body` column's values).
pub fn body_bytes(b: &RecordBatch) -> u64 {
    use arrow_array::Array;
    use arrow_array::cast::AsArray;
    b.column_by_name("body").map_or(0, |c| {
        let s = c.as_string::<i32>();
        let o = s.value_offsets();
        (o[s.len()] - o[0]) as u64
    })
}

/// DoGet of one ticket to the end.
pub async fn read_ticket(client: &mut FlightClient, ticket: Ticket) -> Result<Read> {
    let mut stream = client.do_get(ticket).await.context("DoGet")?;
    let mut read = Read::default();
    while let Some(b) = stream.try_next().await.context("DoGet stream")? {
        read.rows += b.num_rows() as u64;
        read.body_bytes += body_bytes(&b);
    }
    Ok(read)
}

/// DoGet of one ticket, keeping the batches.
pub async fn collect_ticket(client: &mut FlightClient, ticket: Ticket) -> Result<Vec<RecordBatch>> {
    let stream = client.do_get(ticket).await.context("DoGet")?;
    stream.try_collect().await.context("DoGet stream")
}

/// DoGet of every ticket at once, one connection each.
pub async fn read_all(addr: SocketAddr, tickets: Vec<Ticket>) -> Result<Read> {
    let reads = tickets.into_iter().map(|t| async move {
        let mut c = connect(addr).await?;
        read_ticket(&mut c, t).await
    });
    let parts = futures::future::try_join_all(reads).await?;
    Ok(parts.iter().fold(Read::default(), |a, r| Read {
        rows: a.rows + r.rows,
        body_bytes: a.body_bytes + r.body_bytes,
    }))
}

/// DoAction `commit`; the number deleted.
pub async fn commit(
    client: &mut FlightClient,
    table: &str,
    consumer: &str,
    batch: u64,
) -> Result<u64> {
    let body = json!({"table": table, "consumer": consumer, "batch": batch});
    let mut answers = client
        .do_action(Action::new("commit", body.to_string()))
        .await
        .context("DoAction commit")?;
    let answer = answers
        .try_next()
        .await?
        .context("commit returned nothing")?;
    let v: serde_json::Value = serde_json::from_slice(&answer)?;
    let deleted = v["deleted"]
        .as_u64()
        .context("commit answer without `deleted`")?;
    if v["expired"].as_u64() != Some(0) {
        bail!("commit reported expired receipts: {v}");
    }
    Ok(deleted)
}

/// The baseline of figure 2: a Flight server that answers every DoGet with
/// the same ready batches, encoded with the sqs-flight server's encoder
/// settings (so that the figure measures the server's work, not a
/// different encoding).
#[derive(Clone)]
pub struct RawFlight {
    schema: SchemaRef,
    batches: Arc<Vec<RecordBatch>>,
}

/// Serves `batches` on a free loopback port.
pub async fn start_raw(schema: SchemaRef, batches: Vec<RecordBatch>) -> Result<Running> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let service = FlightServiceServer::new(RawFlight {
        schema,
        batches: Arc::new(batches),
    })
    .max_decoding_message_size(MAX_MESSAGE_SIZE)
    .max_encoding_message_size(MAX_MESSAGE_SIZE);
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    let task = tokio::spawn(async move {
        let served = tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming_shutdown(
                TcpIncoming::from(listener).with_nodelay(Some(true)),
                stop.cancelled_owned(),
            )
            .await;
        if let Err(e) = served {
            eprintln!("raw Flight server failed: {e}");
        }
    });
    Ok(Running {
        addr,
        shutdown,
        task: Some(task),
    })
}

type Rpc<T> = BoxStream<'static, Result<T, Status>>;

fn nope<T>() -> Result<T, Status> {
    Err(Status::unimplemented("the raw baseline serves DoGet only"))
}

#[tonic::async_trait]
impl FlightService for RawFlight {
    type HandshakeStream = Rpc<HandshakeResponse>;
    type ListFlightsStream = Rpc<FlightInfo>;
    type DoGetStream = Rpc<FlightData>;
    type DoPutStream = Rpc<PutResult>;
    type DoExchangeStream = Rpc<FlightData>;
    type DoActionStream = Rpc<arrow_flight::Result>;
    type ListActionsStream = Rpc<ActionType>;

    async fn do_get(&self, _: Request<Ticket>) -> Result<Response<Self::DoGetStream>, Status> {
        let batches = Arc::clone(&self.batches);
        let rows = futures::stream::iter((0..batches.len()).map(move |i| Ok(batches[i].clone())));
        let flight = sqs_flight_server::testing::encoder()
            .with_schema(Arc::clone(&self.schema))
            .build(rows)
            .map_err(|e| Status::internal(e.to_string()));
        Ok(Response::new(flight.boxed()))
    }

    async fn handshake(
        &self,
        _: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<Self::HandshakeStream>, Status> {
        nope()
    }
    async fn list_flights(
        &self,
        _: Request<Criteria>,
    ) -> Result<Response<Self::ListFlightsStream>, Status> {
        nope()
    }
    async fn get_flight_info(
        &self,
        _: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        nope()
    }
    async fn poll_flight_info(
        &self,
        _: Request<FlightDescriptor>,
    ) -> Result<Response<PollInfo>, Status> {
        nope()
    }
    async fn get_schema(
        &self,
        _: Request<FlightDescriptor>,
    ) -> Result<Response<SchemaResult>, Status> {
        nope()
    }
    async fn do_put(
        &self,
        _: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoPutStream>, Status> {
        nope()
    }
    async fn do_exchange(
        &self,
        _: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoExchangeStream>, Status> {
        nope()
    }
    async fn do_action(
        &self,
        _: Request<Action>,
    ) -> Result<Response<Self::DoActionStream>, Status> {
        nope()
    }
    async fn list_actions(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<Self::ListActionsStream>, Status> {
        nope()
    }
}
