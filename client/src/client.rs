//! [`Client`]: the typed calls of the sqs-flight protocol over Arrow Flight.

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use arrow_array::RecordBatch;
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{Action, Criteria, FlightClient, FlightDescriptor, HandshakeRequest};
use arrow_schema::SchemaRef;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use serde::de::DeserializeOwned;
use sqs_flight_schemas::{CommitCommand, PlanCommand, ReleaseCommand, StatusCommand};
use tokio::task::JoinSet;
use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, Channel, ClientTlsConfig};

use crate::answer::{Committed, Released, Status};
use crate::commit::CommitOptions;
use crate::connect::Links;
use crate::error::{Error, Result, chain};
use crate::plan::{Endpoint, Plan, PlanOptions};
use crate::url::ServerUrl;

/// How long connecting may take before it counts as unreachable.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest gRPC message the client decodes; the server's encoding limit.
pub const MAX_MESSAGE_SIZE: usize = 64 << 20;
/// HTTP/2 ping interval, so that a long idle DoGet survives NAT and proxies.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(30);

/// Record batches of one endpoint, in the server's order.
pub type RecordBatchStream = BoxStream<'static, Result<RecordBatch>>;

/// Settings of a connection; [`Client::builder`] makes one.
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    url: String,
    token: Option<String>,
    token_file: Option<PathBuf>,
    ca_pem: Option<Vec<u8>>,
    ca_file: Option<PathBuf>,
    domain: Option<String>,
    connect_timeout: Duration,
}

impl ClientBuilder {
    /// Sends `authorization: Bearer TOKEN` with every call (servers started
    /// with `--auth-token`).
    pub fn bearer_token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Sends the token read from `path` (a trailing line break dropped),
    /// as [`bearer_token`](Self::bearer_token) does; read by `connect`,
    /// which fails naming the file when it is unreadable or empty.
    pub fn bearer_token_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.token_file = Some(path.into());
        self
    }

    /// Trusts this PEM certificate authority instead of the system roots
    /// (a server with a self-signed certificate).
    pub fn ca_certificate_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca_pem = Some(pem.into());
        self
    }

    /// [`ca_certificate_pem`](Self::ca_certificate_pem) from a PEM file,
    /// read by `connect`, which fails naming the file when it is unreadable
    /// or holds no certificate.
    pub fn ca_certificate_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca_file = Some(path.into());
        self
    }

    /// The name the server's certificate must carry, when it differs from
    /// the URL's host.
    pub fn tls_domain(mut self, domain: impl Into<String>) -> Self {
        self.domain = Some(domain.into());
        self
    }

    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Connects now, so that an unreachable server is reported here, with
    /// its cause, rather than by the first call.
    pub async fn connect(mut self) -> Result<Client> {
        let url = ServerUrl::parse(&self.url)?;
        self.read_files()?;
        let authorization = self.authorization()?;
        let invalid = |e: &dyn std::error::Error| Error::InvalidUrl {
            url: self.url.clone(),
            reason: chain(e),
        };
        let mut endpoint = Channel::from_shared(url.http_uri())
            .map_err(|e| invalid(&e))?
            .connect_timeout(self.connect_timeout)
            .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
            .keep_alive_while_idle(true);
        if url.tls {
            endpoint = endpoint
                .tls_config(self.tls_config())
                .map_err(|e| invalid(&e))?;
        }
        let unreachable = |reason: String| Error::Connect {
            url: url.to_string(),
            reason,
        };
        let links = Links::new(!url.tls);
        let channel = endpoint
            .connect_with_connector(links.connector())
            .await
            .map_err(|e| unreachable(chain(&e)))?;
        links
            .first_answer(self.connect_timeout)
            .await
            .map_err(unreachable)?;
        Ok(Client {
            channel,
            authorization,
            url: url.to_string(),
            links,
        })
    }

    /// Reads the token and CA files, if any, into the builder.
    fn read_files(&mut self) -> Result<()> {
        let unreadable =
            |what: &'static str, path: &PathBuf, reason: String| Error::InvalidConfig {
                what,
                reason: format!("{}: {reason}", path.display()),
            };
        if let Some(path) = &self.token_file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| unreadable("token file", path, e.to_string()))?;
            let token = text.trim_end_matches(['\n', '\r']);
            if token.is_empty() {
                return Err(unreadable("token file", path, "it is empty".into()));
            }
            self.token = Some(token.to_string());
        }
        if let Some(path) = &self.ca_file {
            let pem =
                std::fs::read(path).map_err(|e| unreadable("TLS CA file", path, e.to_string()))?;
            if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
                return Err(unreadable(
                    "TLS CA file",
                    path,
                    "no PEM certificate (-----BEGIN CERTIFICATE-----) in it".into(),
                ));
            }
            self.ca_pem = Some(pem);
        }
        Ok(())
    }

    fn authorization(&self) -> Result<Option<MetadataValue<tonic::metadata::Ascii>>> {
        let Some(token) = &self.token else {
            return Ok(None);
        };
        let mut value: MetadataValue<_> =
            format!("Bearer {token}")
                .parse()
                .map_err(|_| Error::InvalidConfig {
                    what: "bearer token",
                    reason: "it must be visible ASCII without spaces or control characters".into(),
                })?;
        value.set_sensitive(true);
        Ok(Some(value))
    }

    fn tls_config(&self) -> ClientTlsConfig {
        let tls = ClientTlsConfig::new();
        let tls = match &self.ca_pem {
            Some(pem) => tls.ca_certificate(Certificate::from_pem(pem)),
            None => tls.with_native_roots(),
        };
        match &self.domain {
            Some(d) => tls.domain_name(d.clone()),
            None => tls,
        }
    }
}

/// A connection to one sqs-flight server. Cheap to clone; clones share the
/// connection, and every method takes `&self`, so one client serves
/// concurrent tasks.
///
/// Endpoints are read through this connection: an sqs-flight server only
/// advertises itself, and the address it advertises may not be reachable
/// from here (NAT, containers, a listener on 0.0.0.0).
#[derive(Debug, Clone)]
pub struct Client {
    channel: Channel,
    authorization: Option<MetadataValue<tonic::metadata::Ascii>>,
    url: String,
    links: Links,
}

impl Client {
    /// Connection settings for `url`: `grpc://host:port` (plain),
    /// `grpc+tls://host:port` (TLS), also `http://`, `https://` or a bare
    /// `host:port`; the port defaults to 50051.
    pub fn builder(url: impl Into<String>) -> ClientBuilder {
        ClientBuilder {
            url: url.into(),
            token: None,
            token_file: None,
            ca_pem: None,
            ca_file: None,
            domain: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
        }
    }

    /// Connects to `url` with default settings.
    pub async fn connect(url: impl Into<String>) -> Result<Self> {
        Self::builder(url).connect().await
    }

    /// The server's URL, normalised (`grpc://host:port`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The answer of `call`, or UNAVAILABLE when the client is left with no
    /// connection while it waits (a request sent as its connection closed
    /// may otherwise wait for ever).
    pub(crate) async fn answered<T, E>(
        &self,
        call: impl Future<Output = std::result::Result<T, E>>,
    ) -> Result<T>
    where
        Error: From<E>,
    {
        tokio::select! {
            biased;
            answer = call => answer.map_err(Error::from),
            () = self.links.cut() => Err(Error::Unavailable {
                code: tonic::Code::Unavailable,
                message: format!("the connection to {} closed before the server answered", self.url),
                reason: None,
            }),
        }
    }

    pub(crate) fn flight(&self) -> FlightClient {
        let inner = FlightServiceClient::new(self.channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_SIZE)
            .max_encoding_message_size(MAX_MESSAGE_SIZE);
        let mut client = FlightClient::new_from_inner(inner);
        if let Some(value) = &self.authorization {
            client.metadata_mut().insert("authorization", value.clone());
        }
        client
    }

    /// Flight's Handshake, with the token (if any) as header and payload:
    /// checks the token without touching a table. Returns the server's
    /// answer payload (its token, or empty when it has none).
    pub async fn handshake(&self) -> Result<bytes::Bytes> {
        let payload = self
            .authorization
            .as_ref()
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or_default()
            .as_bytes()
            .to_vec();
        let mut client = FlightServiceClient::new(self.channel.clone());
        let request = HandshakeRequest {
            protocol_version: 0,
            payload: payload.into(),
        };
        let mut request = tonic::Request::new(futures::stream::iter([request]));
        if let Some(value) = &self.authorization {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        let mut answers = self.answered(client.handshake(request)).await?.into_inner();
        let answer = answers
            .message()
            .await
            .map_err(Error::from)?
            .ok_or_else(|| Error::protocol("Handshake", "no answer"))?;
        Ok(answer.payload)
    }

    /// The names of the server's tables (ListFlights).
    pub async fn tables(&self) -> Result<Vec<String>> {
        let mut flight = self.flight();
        let infos: Vec<_> = self
            .answered(flight.list_flights(Criteria::default().expression))
            .await?
            .try_collect()
            .await?;
        infos
            .iter()
            .map(
                |info| match info.flight_descriptor.as_ref().map(|d| d.path.as_slice()) {
                    Some([name]) => Ok(name.clone()),
                    _ => Err(Error::protocol(
                        "ListFlights",
                        "a FlightInfo without a PATH [table] descriptor",
                    )),
                },
            )
            .collect()
    }

    /// The Arrow schema of `table` (GetSchema).
    pub async fn schema(&self, table: &str) -> Result<SchemaRef> {
        let descriptor = FlightDescriptor::new_path(vec![table.to_string()]);
        let mut flight = self.flight();
        let schema = self.answered(flight.get_schema(descriptor)).await?;
        Ok(std::sync::Arc::new(schema))
    }

    /// Plans a batch of `table` (GetFlightInfo). Planning the same
    /// (table, consumer, batch) again returns the same plan.
    pub async fn plan(&self, table: &str, options: &PlanOptions) -> Result<Plan> {
        self.plan_command(&options.command(table)).await
    }

    /// Plans a batch from a ready-made command.
    pub async fn plan_command(&self, cmd: &PlanCommand) -> Result<Plan> {
        let descriptor = FlightDescriptor::new_cmd(cmd.to_json());
        let mut flight = self.flight();
        let info = self.answered(flight.get_flight_info(descriptor)).await?;
        Plan::from_flight_info(&info)
    }

    /// Reads one endpoint (DoGet). The first read of a ticket receives from
    /// SQS; every later read replays the same rows.
    pub async fn read(&self, endpoint: &Endpoint) -> Result<RecordBatchStream> {
        let mut flight = self.flight();
        let stream = self
            .answered(flight.do_get(endpoint.ticket.clone()))
            .await?;
        Ok(stream.map_err(Error::from).boxed())
    }

    /// Reads every endpoint of `plan` at once, one task per partition, and
    /// returns the rows in partition order. The first error stops the other
    /// reads (the batch stays open: read it again, or release it).
    pub async fn read_batch(&self, plan: &Plan) -> Result<Vec<RecordBatch>> {
        let mut reads = JoinSet::new();
        for endpoint in plan.endpoints.clone() {
            let client = self.clone();
            reads.spawn(async move {
                let rows: Vec<RecordBatch> = client.read(&endpoint).await?.try_collect().await?;
                Ok::<_, Error>((endpoint.partition, rows))
            });
        }
        let mut partitions = vec![Vec::new(); plan.endpoints.len()];
        while let Some(joined) = reads.join_next().await {
            let (partition, rows) = joined.map_err(|e| Error::protocol("DoGet", e))??;
            partitions[partition] = rows;
        }
        Ok(partitions.into_iter().flatten().collect())
    }

    /// Deletes every message of `consumer` read in batches <= `batch` and
    /// raises its watermark. Idempotent.
    pub async fn commit(&self, table: &str, consumer: &str, batch: u64) -> Result<Committed> {
        let cmd = CommitCommand::new(table, consumer, batch);
        self.action("commit", cmd.to_json()).await
    }

    /// Like [`Client::commit`], except that the messages `options` reject
    /// go back to SQS instead of being deleted (visible again after their
    /// delay, with a higher receive count, so a queue's redrive policy moves
    /// a poison message to its dead-letter queue). An id the consumer does
    /// not hold in an open batch up to `batch` refuses the whole commit
    /// (INVALID_ARGUMENT) and nothing changes.
    pub async fn commit_with(
        &self,
        table: &str,
        consumer: &str,
        batch: u64,
        options: &CommitOptions,
    ) -> Result<Committed> {
        let cmd = options.command(table, consumer, batch);
        self.action("commit", cmd.to_json()).await
    }

    /// Makes every uncommitted message of `consumer` visible again now and
    /// forgets its open batches.
    pub async fn release(&self, table: &str, consumer: &str) -> Result<Released> {
        let cmd = ReleaseCommand::new(table, consumer);
        self.action("release", cmd.to_json()).await
    }

    /// Queue depths and consumers of one table, or of all of them.
    pub async fn status(&self, table: Option<&str>) -> Result<Status> {
        let cmd = StatusCommand {
            table: table.map(str::to_string),
            max_age_ms: None,
        };
        self.action("status", cmd.to_json()).await
    }

    /// Runs a DoAction and parses its single JSON answer.
    async fn action<T: DeserializeOwned>(&self, kind: &'static str, body: Vec<u8>) -> Result<T> {
        let mut flight = self.flight();
        let mut results = self
            .answered(flight.do_action(Action::new(kind, body)))
            .await?;
        let first = results
            .try_next()
            .await?
            .ok_or_else(|| Error::protocol(kind, "no result"))?;
        serde_json::from_slice(&first).map_err(|e| Error::protocol(kind, e))
    }
}
