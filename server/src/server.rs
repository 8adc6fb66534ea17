//! Bind, serve, shut down.
//!
//! Shutdown runs in two steps. When `shutdown` is cancelled (SIGTERM or
//! SIGINT), the server stops accepting connections and calls and lets the
//! open ones finish, for at most the configured grace period. Then it cuts
//! what is left: receive loops stop (their streams end with the rows they
//! had, tickets sealed), Flight SQL queries stop, and connections still
//! open a moment later are dropped with the process. The SQL threads are
//! shut down without waiting, so no query holds the process.
//!
//! Connections come through [`incoming`]: caps on open connections in
//! total and per client, and a deadline for a connection's first bytes.
//! Calls are counted per connection, per client and in all by [`calls`],
//! which gives a call's one request message a deadline. HTTP/2 pings every
//! [`HTTP2_KEEPALIVE_INTERVAL`] close a connection whose peer has gone;
//! header blocks are bounded.

pub(crate) mod calls;
pub(crate) mod incoming;

pub use incoming::raise_fd_limit;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arrow_flight::flight_service_server::FlightServiceServer;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Identity, ServerTlsConfig};

use crate::auth::{BearerAuth, MarkHandshake};
use crate::config::{Config, TlsFiles};
use crate::flight::SqsFlightService;
use crate::idle::{Activity, exit_when_idle};
use crate::instance::Instance;
use crate::registry::{Registry, heartbeat};
use crate::request_budget::{RequestBudget, WithRequestBudget};

/// The gRPC service name health checks can ask about.
pub(crate) const FLIGHT_SERVICE_NAME: &str = "arrow.flight.protocol.FlightService";

/// Largest gRPC message the server decodes or encodes.
pub const MAX_MESSAGE_SIZE: usize = 64 << 20;

/// How long a TLS handshake may take before the connection is dropped.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection with nothing received for this long gets an HTTP/2 ping.
pub(crate) const HTTP2_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// A ping unanswered for this long closes its connection.
pub(crate) const HTTP2_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);
/// Largest header block of a request (hyper's default, made explicit): an
/// unauthenticated request holds no more than this in headers.
pub(crate) const MAX_HEADER_LIST_BYTES: u32 = 16 << 10;
/// Largest gRPC health check request decoded (its only field is a service
/// name); tonic's default would be 4 MiB, and health needs no token.
pub(crate) const MAX_HEALTH_REQUEST_BYTES: usize = 1 << 10;

/// After the grace period, how long streams whose receive loop was cut get
/// to send their end before their connections are dropped.
const CUT_STREAMS_WAIT: Duration = Duration::from_secs(1);

/// Why the server stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The cause is part of the message (not a `source`), so that it is
    /// printed once.
    #[error("cannot bind {flag} {addr}: {}", bind_reason(.error, .flag))]
    Bind {
        flag: &'static str,
        addr: SocketAddr,
        error: std::io::Error,
    },
    #[error("gRPC transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("reading the listener's address: {0}")]
    Io(#[from] std::io::Error),
    #[error("TLS: {0}")]
    Tls(String),
    #[error(transparent)]
    Registry(#[from] crate::registry::BuildError),
    #[error("Flight SQL: {0}")]
    Sql(String),
    #[error(transparent)]
    SelfSigned(#[from] crate::tls_self_signed::SelfSignedError),
    #[error("--ready-file {path}: {error}")]
    ReadyFile { path: String, error: std::io::Error },
}

/// The TLS settings of `files`, read and checked now, so that a missing or
/// malformed file is named at start.
pub(crate) fn tls_config(files: &TlsFiles) -> Result<ServerTlsConfig, ServeError> {
    let read = |path: &std::path::Path, flag: &str, marker: &str, what: &str| {
        let pem = std::fs::read(path)
            .map_err(|e| ServeError::Tls(format!("cannot read {flag} {}: {e}", path.display())))?;
        if !String::from_utf8_lossy(&pem).contains(marker) {
            return Err(ServeError::Tls(format!(
                "{flag} {}: no {what} in it (expected a PEM block with {marker})",
                path.display()
            )));
        }
        Ok(pem)
    };
    let cert = read(
        &files.cert,
        "--tls-cert",
        "-----BEGIN CERTIFICATE-----",
        "PEM certificate",
    )?;
    let key = read(
        &files.key,
        "--tls-key",
        "PRIVATE KEY-----",
        "PEM private key",
    )?;
    Ok(ServerTlsConfig::new()
        .identity(Identity::from_pem(cert, key))
        .timeout(TLS_HANDSHAKE_TIMEOUT))
}

/// A tonic server builder, with TLS when `config` has it. Parses the
/// certificate and key (and checks that they match) before anything binds
/// or spawns.
fn server_builder(config: &Config) -> Result<tonic::transport::Server, ServeError> {
    let builder = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(HTTP2_KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(HTTP2_KEEPALIVE_TIMEOUT))
        .max_concurrent_streams(config.max_calls_per_connection)
        .http2_max_header_list_size(MAX_HEADER_LIST_BYTES);
    let Some(files) = &config.tls else {
        return Ok(builder);
    };
    let tls = tls_config(files)?;
    // The AWS SDK and the client bring two rustls crypto providers into one
    // build, so rustls needs the process's default set; a second install
    // (another server in the same process) is refused harmlessly.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    builder.tls_config(tls).map_err(|e| {
        let mut reason = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            reason = format!("{reason}: {s}");
            source = s.source();
        }
        ServeError::Tls(format!(
            "--tls-cert {} and --tls-key {} do not make a usable identity: {reason}",
            files.cert.display(),
            files.key.display()
        ))
    })
}

/// Binds `config.listen`.
pub async fn bind(config: &Config) -> Result<TcpListener, ServeError> {
    TcpListener::bind(config.listen)
        .await
        .map_err(|error| ServeError::Bind {
            flag: "--listen",
            addr: config.listen,
            error,
        })
}

/// Why a bind failed, and what to do when the address is taken.
fn bind_reason(error: &std::io::Error, flag: &str) -> String {
    match error.kind() {
        std::io::ErrorKind::AddrInUse => format!(
            "the address is already in use (is another sqs-flight-server running?); stop that \
             process, or pass another address, e.g. {flag} 127.0.0.1:0 for any free port"
        ),
        _ => error.to_string(),
    }
}

/// The location put in endpoints: `--advertise`, else the bound address.
pub(crate) fn location(config: &Config, bound: SocketAddr) -> String {
    if let Some(uri) = &config.advertise {
        return uri.clone();
    }
    let mut addr = bound;
    if addr.ip().is_unspecified() {
        tracing::warn!(%bound, "listening on all interfaces without --advertise; endpoints name 127.0.0.1");
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    let scheme = if config.tls.is_some() {
        "grpc+tls"
    } else {
        "grpc"
    };
    format!("{scheme}://{addr}")
}

/// Serves on `listener` until `shutdown` is cancelled.
pub async fn run(
    listener: TcpListener,
    config: Config,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    let config = with_self_signed_tls(config).await?;
    let registry = Registry::build(&config, None).await?;
    serve(listener, config, registry, shutdown).await
}

/// `--tls-self-signed DIR`: the certificate made (or found) in DIR for
/// the advertised host becomes the server's TLS identity.
async fn with_self_signed_tls(mut config: Config) -> Result<Config, ServeError> {
    let Some(dir) = config.startup.tls_self_signed.clone() else {
        return Ok(config);
    };
    let hosts = crate::tls_self_signed::hosts_for(config.advertise.as_deref());
    let files = tokio::task::spawn_blocking(move || crate::tls_self_signed::ensure(&dir, &hosts))
        .await
        .map_err(|e| ServeError::Tls(format!("--tls-self-signed: {e}")))??;
    config.tls = Some(files);
    Ok(config)
}

/// `--ready-file`: says where this server listens and who it is, once it does.
async fn publish_ready(
    config: &Config,
    instance: &Instance,
    location: &str,
    bound: SocketAddr,
) -> Result<(), ServeError> {
    let Some(path) = config.startup.ready_file.clone() else {
        return Ok(());
    };
    let ready = crate::instance::Ready {
        url: location.to_string(),
        pid: instance.pid,
        instance_id: instance.instance_id.clone(),
        started_at: instance.started_at,
        listen: bound.to_string(),
    };
    let shown = path.display().to_string();
    tokio::task::spawn_blocking(move || crate::instance::write_ready_file(&path, &ready))
        .await
        .map_err(std::io::Error::other)
        .and_then(|r| r)
        .map_err(|error| ServeError::ReadyFile { path: shown, error })
}

/// Serves `registry` on `listener` until `shutdown` is cancelled, then
/// lets open calls finish for `config.shutdown_grace` at most (see the
/// module docs).
pub async fn serve(
    listener: TcpListener,
    config: Config,
    registry: Arc<Registry>,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    let bound = listener.local_addr()?;
    // Two tonic servers share the port's connections: a client's first few
    // carry `max_calls_per_connection` streams each, the ones beside them
    // a few (incoming.rs, "Narrow connections").
    let roomy = server_builder(&config)?;
    let narrow_calls = config
        .max_calls_per_connection
        .min(incoming::NARROW_CALLS_PER_CONNECTION);
    let narrow = roomy.clone().max_concurrent_streams(narrow_calls);
    // Ends receive loops, the heartbeat and the operations endpoint: once
    // the server has drained, or when the grace period is over.
    let stop = CancellationToken::new();
    let tasks = TaskTracker::new();
    tasks.spawn(probe_tables(Arc::clone(&registry)));
    tasks.spawn(heartbeat::run(Arc::clone(&registry), stop.clone()));
    let location = location(&config, bound);
    let activity = Activity::new();
    let auth = BearerAuth::new(config.auth_token.as_deref()).with_activity(activity.clone());
    let sql = crate::sql::SqlService::new(Arc::clone(&registry), stop.clone(), &config.sql)
        .map_err(|e| ServeError::Sql(e.to_string()))?;
    let instance = Arc::new(Instance::new());
    let sql = Arc::new(sql);
    tracing::info!(
        threads = config.sql.threads,
        memory_limit_bytes = config.sql.memory_limit,
        query_timeout_s = config.sql.query_timeout.as_secs(),
        worker_data_limit_bytes = config.sql.worker_data_limit(),
        "Flight SQL: each statement runs in a worker process of its own, within these limits"
    );
    let service = SqsFlightService::new(Arc::clone(&registry), location.clone(), stop.clone())
        .with_instance(Arc::clone(&instance))
        .with_auth(auth.clone())
        .with_activity(activity.clone())
        .with_sql(Arc::clone(&sql));
    if config.auth_token.is_none() {
        tracing::warn!("no --auth-token: every caller that reaches the port may read and commit");
    }
    if config.tls.is_none() {
        tracing::warn!("no --tls-cert: Flight traffic, tokens included, is not encrypted");
    }
    let service = FlightServiceServer::new(service.with_limits((&config).into()))
        .max_decoding_message_size(usize::try_from(config.max_request_bytes).unwrap_or(usize::MAX))
        .max_encoding_message_size(MAX_MESSAGE_SIZE);
    let call_auth = auth.clone();
    let service = MarkHandshake::new(InterceptedService::new(service, move |r| auth.check(r)));
    let budget = RequestBudget::new(config.max_buffered_request_bytes);
    let service = WithRequestBudget::new(service, budget);
    let service = crate::flight::envelope::Envelope::new(service, (&config).into());
    let calls = calls::CallSettings::of(&config);
    let service = calls::Calls::new(service, calls, Some(call_auth));
    if let Some(idle) = config.idle_exit {
        tracing::info!(
            idle_exit_s = idle.as_secs(),
            "exits after this long without an authenticated RPC, once no stream is open and no batch is held"
        );
        tasks.spawn(exit_when_idle(
            Arc::clone(&registry),
            activity,
            idle,
            shutdown.clone(),
        ));
    }
    let (health, health_service) = tonic_health::server::health_reporter();
    let health_service = health_service.max_decoding_message_size(MAX_HEALTH_REQUEST_BYTES);
    let health_service = calls::Calls::new(health_service, calls, None);
    health
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    health
        .set_service_status(FLIGHT_SERVICE_NAME, tonic_health::ServingStatus::Serving)
        .await;
    let (ready_tx, ready) = crate::http::readiness_channel();
    tasks.spawn(crate::http::follow_health(
        Arc::clone(&registry),
        health.clone(),
        FLIGHT_SERVICE_NAME,
        ready_tx,
        shutdown.clone(),
    ));
    if let Some(addr) = config.metrics_listen {
        let ops = TcpListener::bind(addr)
            .await
            .map_err(|error| ServeError::Bind {
                flag: "--metrics-listen",
                addr,
                error,
            })?;
        tracing::info!(addr = %ops.local_addr()?, "metrics, /healthz and /readyz listening (plain HTTP)");
        let (r, ops_stop) = (Arc::clone(&registry), stop.clone());
        let ops_limits = crate::http::Limits::of(&config);
        tasks.spawn(async move {
            if let Err(e) = crate::http::serve(ops, r, ready, ops_limits, ops_stop).await {
                tracing::error!(error = %e, "operations endpoint failed");
            }
        });
        tasks.spawn(crate::http::poll_depth(Arc::clone(&registry), stop.clone()));
    }
    tracing::info!(%bound, %location, tables = config.tables.len(), tls = config.tls.is_some(),
        instance_id = %instance.instance_id, "sqs-flight server listening");
    // One stable line on stdout for people and shell scripts; programs that
    // start the server on port 0 read --ready-file instead (the Python
    // launcher and the test harnesses do).
    println!("sqs-flight-server listening on {location}");
    if let Err(e) = publish_ready(&config, &instance, &location, bound).await {
        shutdown.cancel();
        stop.cancel();
        tasks.close();
        tasks.wait().await;
        return Err(e);
    }
    let limits = incoming::Limits::of(&config);
    tracing::info!(
        max_connections = limits.max_connections,
        max_connections_per_client = limits.per_client,
        preface_timeout_s = limits.preface_timeout.as_secs(),
        max_calls_per_connection = calls.limits.per_connection,
        narrow_after_connections = incoming::ROOMY_CONNECTIONS,
        narrow_calls_per_connection = narrow_calls,
        max_calls_per_client = calls.limits.per_client,
        max_calls = calls.limits.total,
        request_body_timeout_s = calls.body_timeout.as_secs(),
        "connection limits"
    );
    let (roomy_conns, narrow_conns) = incoming::split(incoming::incoming(listener, limits));
    let serve_on = |mut builder: tonic::transport::Server, conns| {
        builder
            .add_service(health_service.clone())
            .add_service(service.clone())
            .serve_with_incoming_shutdown(conns, shutdown.clone().cancelled_owned())
    };
    let (roomy, narrow) = (serve_on(roomy, roomy_conns), serve_on(narrow, narrow_conns));
    let server = async move { tokio::try_join!(roomy, narrow).map(|_| ()) };
    let served = drain(server, &shutdown, &stop, config.shutdown_grace, &registry).await;
    shutdown.cancel();
    stop.cancel();
    // Whatever a query is doing, it is in a worker process, killed when
    // its call ended with `stop`.
    tasks.close();
    tasks.wait().await;
    if let Some(path) = config.startup.ready_file.clone() {
        let id = instance.instance_id.clone();
        let _ = tokio::task::spawn_blocking(move || crate::instance::remove_ready_file(&path, &id))
            .await;
    }
    tracing::info!("sqs-flight server stopped");
    Ok(served?)
}

/// Runs `server` until it ends by itself or `shutdown` is cancelled; then
/// gives its open calls `grace` to finish before cancelling `stop` (which
/// ends the receive loops) and, [`CUT_STREAMS_WAIT`] later, dropping it.
async fn drain<F>(
    server: F,
    shutdown: &CancellationToken,
    stop: &CancellationToken,
    grace: Duration,
    registry: &Registry,
) -> Result<(), tonic::transport::Error>
where
    F: Future<Output = Result<(), tonic::transport::Error>>,
{
    let mut server = std::pin::pin!(server);
    tokio::select! {
        // Shutdown first: a server that has just stopped because of it is
        // drained (and logged) below.
        biased;
        _ = shutdown.cancelled() => {}
        served = &mut server => return served,
    }
    let open = || registry.open_streams();
    tracing::info!(
        open_doget_streams = open(),
        grace_s = grace.as_secs_f64(),
        "shutting down: accepting no new connections or calls; open calls may finish within the grace period"
    );
    if let Ok(served) = tokio::time::timeout(grace, &mut server).await {
        tracing::info!("every open call finished within the grace period");
        return served;
    }
    tracing::warn!(
        open_doget_streams = open(),
        grace_s = grace.as_secs_f64(),
        "shutdown grace period is over: cutting the open streams (their tickets keep what was received)"
    );
    stop.cancel();
    match tokio::time::timeout(CUT_STREAMS_WAIT, &mut server).await {
        Ok(served) => served,
        Err(_) => {
            tracing::warn!(
                open_doget_streams = open(),
                "dropping the connections still open"
            );
            Ok(())
        }
    }
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

/// Cancels `shutdown` on SIGINT or SIGTERM; a second signal exits at once.
/// The handlers are installed before this returns, so that a signal sent as
/// soon as the server is listening is not met by the default action (which
/// kills the process without a shutdown). Call it from within the runtime.
pub fn stop_on_signal(shutdown: CancellationToken) -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    tokio::spawn(async move {
        let signal = next_signal(&mut int, &mut term).await;
        tracing::info!(signal, "signal received");
        shutdown.cancel();
        // A second signal does not wait for the grace period.
        let signal = next_signal(&mut int, &mut term).await;
        tracing::warn!(
            signal,
            "second signal: exiting now, cutting every open stream"
        );
        std::process::exit(1);
    });
    Ok(())
}

/// Waits for SIGINT or SIGTERM and names it.
async fn next_signal(
    int: &mut tokio::signal::unix::Signal,
    term: &mut tokio::signal::unix::Signal,
) -> &'static str {
    tokio::select! {
        _ = int.recv() => "SIGINT",
        _ = term.recv() => "SIGTERM",
    }
}
