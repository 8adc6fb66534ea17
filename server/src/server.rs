//! Bind, serve, shut down.

use std::net::SocketAddr;
use std::sync::Arc;

use arrow_flight::flight_service_server::FlightServiceServer;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use tonic::service::interceptor::InterceptedService;

use crate::auth::BearerAuth;
use crate::config::{Backend, Config};
use crate::flight::SqsFlightService;
use crate::metrics::Metrics;
use crate::registry::{Registry, Table, heartbeat};
use crate::sqs::Queue;
use crate::sqs::aws::{self, AwsQueue};
use crate::sqs::metered::MeteredQueue;

/// The gRPC service name health checks can ask about.
pub const FLIGHT_SERVICE_NAME: &str = "arrow.flight.protocol.FlightService";

/// Largest gRPC message the server decodes or encodes.
pub const MAX_MESSAGE_SIZE: usize = 64 << 20;

/// Why the server stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot bind {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("gRPC transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("reading the listener's address: {0}")]
    Io(#[from] std::io::Error),
    #[error("--state-dir: {0}")]
    State(String),
}

/// Binds `config.listen`.
pub async fn bind(config: &Config) -> Result<TcpListener, ServeError> {
    TcpListener::bind(config.listen)
        .await
        .map_err(|source| ServeError::Bind {
            addr: config.listen,
            source,
        })
}

/// Builds each table's queue client and the registry. SQS tables use
/// `client`, or one built from the standard AWS chain when it is `None`.
/// With `config.state_dir`, the registry is restored from its store (and
/// written to it from then on); without it, it lives in memory only.
pub async fn registry(
    config: &Config,
    client: Option<aws_sdk_sqs::Client>,
) -> Result<Arc<Registry>, ServeError> {
    let needs_sqs = config
        .tables
        .iter()
        .any(|t| matches!(t.backend, Backend::Sqs { .. }));
    let client = match (needs_sqs, client) {
        (true, Some(c)) => Some(c),
        (true, None) => Some(aws::client(config.sqs_endpoint.as_deref()).await),
        (false, _) => None,
    };
    let metrics = Arc::new(Metrics::new());
    let tables = config
        .tables
        .iter()
        .map(|t| {
            let queue: Arc<dyn Queue> = match (&t.backend, &client) {
                (Backend::Sqs { queue_url }, Some(client)) => {
                    Arc::new(AwsQueue::new(client.clone(), queue_url.clone()))
                }
                (Backend::Memory { sample_messages }, _) => {
                    Arc::new(crate::demo::seeded_queue(&t.name, *sample_messages))
                }
                (Backend::Sqs { .. }, None) => unreachable!("client built for SQS tables"),
            };
            let queue = Arc::new(MeteredQueue::new(queue, &t.name, Arc::clone(&metrics)));
            Arc::new(Table::new(t.clone(), queue))
        })
        .collect();
    let mut registry = Registry::new(config, tables, metrics);
    match &config.state_dir {
        Some(dir) => {
            let restored = registry
                .restore(dir)
                .map_err(|e| ServeError::State(e.to_string()))?;
            tracing::info!(state_dir = %dir.display(), consumers = restored.consumers,
                batches = restored.batches, messages = restored.messages,
                "durable registry: restored open batches; every plan, receive and commit is written before it is acted on");
        }
        None => tracing::warn!(
            "no --state-dir: the registry is in memory only; if this process dies, uncommitted \
             batches cannot be replayed or committed and their messages are read again after \
             their visibility timeout (duplicates, never loss)"
        ),
    }
    Ok(Arc::new(registry))
}

/// The location put in endpoints: `--advertise`, else the bound address.
pub fn location(config: &Config, bound: SocketAddr) -> String {
    if let Some(uri) = &config.advertise {
        return uri.clone();
    }
    let mut addr = bound;
    if addr.ip().is_unspecified() {
        tracing::warn!(%bound, "listening on all interfaces without --advertise; endpoints name 127.0.0.1");
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    format!("grpc://{addr}")
}

/// Serves on `listener` until `shutdown` is cancelled.
pub async fn run(
    listener: TcpListener,
    config: Config,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    let registry = registry(&config, None).await?;
    serve(listener, config, registry, shutdown).await
}

/// Serves `registry` on `listener` until `shutdown` is cancelled.
pub async fn serve(
    listener: TcpListener,
    config: Config,
    registry: Arc<Registry>,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    let bound = listener.local_addr()?;
    let tasks = TaskTracker::new();
    tasks.spawn(probe_tables(Arc::clone(&registry)));
    tasks.spawn(heartbeat::run(Arc::clone(&registry), shutdown.clone()));
    let location = location(&config, bound);
    let service = SqsFlightService::new(Arc::clone(&registry), location.clone(), shutdown.clone());
    let auth = BearerAuth::new(config.auth_token.as_deref());
    if config.auth_token.is_none() {
        tracing::warn!("no --auth-token: every caller that reaches the port may read and commit");
    }
    let service = FlightServiceServer::new(service)
        .max_decoding_message_size(MAX_MESSAGE_SIZE)
        .max_encoding_message_size(MAX_MESSAGE_SIZE);
    let service = InterceptedService::new(service, move |r| auth.check(r));
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    health
        .set_service_status(FLIGHT_SERVICE_NAME, tonic_health::ServingStatus::Serving)
        .await;
    if let Some(addr) = config.metrics_listen {
        let ops = TcpListener::bind(addr)
            .await
            .map_err(|source| ServeError::Bind { addr, source })?;
        tracing::info!(addr = %ops.local_addr()?, "metrics, /healthz and /readyz listening");
        let (r, stop) = (Arc::clone(&registry), shutdown.clone());
        tasks.spawn(async move {
            if let Err(e) = crate::http::serve(ops, r, stop).await {
                tracing::error!(error = %e, "operations endpoint failed");
            }
        });
        tasks.spawn(crate::http::poll_depth(
            Arc::clone(&registry),
            shutdown.clone(),
        ));
    }
    tracing::info!(%bound, %location, tables = config.tables.len(), "sqs-flight server listening");
    // One stable line on stdout for scripts and test harnesses that start the
    // server on port 0 and need to know where it is.
    println!("sqs-flight-server listening on {location}");
    let served = tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(service)
        .serve_with_incoming_shutdown(
            TcpListenerStream::new(listener),
            shutdown.clone().cancelled_owned(),
        )
        .await;
    shutdown.cancel();
    tasks.close();
    tasks.wait().await;
    tracing::info!("sqs-flight server stopped");
    Ok(served?)
}

/// Reads each table's visibility timeout at start, so that a missing queue
/// or missing credentials are named in the log right away.
async fn probe_tables(registry: Arc<Registry>) {
    for table in registry.tables() {
        match table.visibility_timeout().await {
            Ok(vt) => {
                tracing::info!(table = %table.name(), visibility_timeout_s = vt.as_secs(), "table ready")
            }
            Err(e) => tracing::error!(table = %table.name(), error = %e, "table not usable yet"),
        }
    }
}

/// Cancels `shutdown` on SIGINT or SIGTERM.
pub async fn stop_on_signal(shutdown: CancellationToken) {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let terminated = async {
        match term.as_mut() {
            Some(t) => {
                t.recv().await;
            }
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminated => {}
    }
    tracing::info!("shutting down");
    shutdown.cancel();
}
