//! The operations port: `/metrics` (Prometheus), `/healthz` (the process
//! answers) and `/readyz` (every table's queue answered GetQueueAttributes
//! at the last check, made every [`READY_CHECK_INTERVAL`]), served over
//! HTTP/1.1 within the bounds of [`conns`].

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::registry::Registry;

mod conns;

pub(crate) use conns::Limits;

/// How long `/readyz` waits for each queue.
pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(3);
/// How often the queue depth gauges are refreshed.
pub const DEPTH_POLL_INTERVAL: Duration = Duration::from_secs(15);

/// What the operations endpoints read.
#[derive(Clone)]
struct Ops {
    registry: Arc<Registry>,
    ready: Readiness,
}

/// Serves the operations endpoints on `listener`, within `limits`, until
/// `shutdown`; `/readyz` answers from `ready`.
pub(crate) async fn serve(
    listener: TcpListener,
    registry: Arc<Registry>,
    ready: Readiness,
    limits: Limits,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(Ops { registry, ready });
    conns::serve(listener, app, limits, shutdown).await
}

async fn metrics(State(ops): State<Ops>) -> impl IntoResponse {
    let content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8";
    (
        [(header::CONTENT_TYPE, content_type)],
        ops.registry.render_metrics(),
    )
}

/// How often every table's queue is checked with one GetQueueAttributes.
/// The gRPC health status and `/readyz` answer from the last check, so
/// that no request (none needs a token) makes an SQS call.
pub const READY_CHECK_INTERVAL: Duration = Duration::from_secs(5);
/// How long `/readyz` waits for the first check after the server starts.
pub(crate) const FIRST_CHECK_WAIT: Duration = Duration::from_secs(5);

/// The last readiness check: `None` until the first one ends, then one
/// line per table whose queue did not answer (empty when ready). The lines
/// name the table only; SQS's error text (which can name accounts and
/// roles) goes to the log.
pub(crate) type Readiness = watch::Receiver<Option<Vec<String>>>;

/// Where [`follow_health`] publishes its checks, and the [`Readiness`]
/// that `/readyz` reads.
pub(crate) fn readiness_channel() -> (watch::Sender<Option<Vec<String>>>, Readiness) {
    watch::channel(None)
}

/// A table whose queue is not ready: what a caller is told, and the cause
/// for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Problem {
    pub public: String,
    pub cause: String,
}

/// Checks every table's queue with GetQueueAttributes, at once, each
/// within [`READY_TIMEOUT`]; empty when all answer.
pub(crate) async fn readiness(registry: &Registry) -> Vec<Problem> {
    let checks = registry.tables().map(|table| async move {
        let name = table.name();
        match tokio::time::timeout(READY_TIMEOUT, table.attributes()).await {
            Ok(Ok(_)) => None,
            Ok(Err(e)) => Some(Problem {
                public: format!("table {name}: {} (see the server log)", unready_because(&e)),
                cause: format!("table {name}: {e}"),
            }),
            Err(_) => Some(Problem {
                public: format!("table {name}: SQS did not answer within {READY_TIMEOUT:?}"),
                cause: format!("table {name}: no answer within {READY_TIMEOUT:?}"),
            }),
        }
    });
    let mut problems: Vec<Problem> = futures::future::join_all(checks)
        .await
        .into_iter()
        .flatten()
        .collect();
    let state = tokio::time::timeout(READY_TIMEOUT, registry.check_state_log()).await;
    match state {
        Ok(Ok(())) => {}
        Ok(Err(crate::error::Error::Fenced(why))) => problems.push(Problem {
            public: "state log: fenced: another server took it over; this one changes nothing"
                .into(),
            cause: why,
        }),
        Ok(Err(e)) => problems.push(Problem {
            public: "state log: not reachable (see the server log)".into(),
            cause: e.to_string(),
        }),
        Err(_) => problems.push(Problem {
            public: format!("state log: did not answer within {READY_TIMEOUT:?}"),
            cause: format!("state log: no answer within {READY_TIMEOUT:?}"),
        }),
    }
    problems
}

/// Why a table whose queue failed is not ready, in words that name no
/// account or role.
fn unready_because(e: &crate::sqs::SqsError) -> &'static str {
    match e {
        crate::sqs::SqsError::Identity { role: Some(_), .. } => "its role could not be assumed",
        _ => "SQS not reachable",
    }
}

/// Every [`READY_CHECK_INTERVAL`], checks [`readiness`], publishes it to
/// `ready` (for `/readyz`) and keeps the gRPC health status of `service`
/// equal to it: SERVING while every table's queue answers, NOT_SERVING
/// otherwise (the overall status `""` stays SERVING: the process is
/// alive). Ends with `shutdown`, setting NOT_SERVING.
pub(crate) async fn follow_health(
    registry: Arc<Registry>,
    health: tonic_health::server::HealthReporter,
    service: &'static str,
    ready: watch::Sender<Option<Vec<String>>>,
    shutdown: CancellationToken,
) {
    use tonic_health::ServingStatus;
    let mut last = None;
    loop {
        let problems = tokio::select! {
            _ = shutdown.cancelled() => break,
            p = readiness(&registry) => p,
        };
        let status = if problems.is_empty() {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        let public: Vec<String> = problems.iter().map(|p| p.public.clone()).collect();
        let changed = ready.borrow().as_ref() != Some(&public);
        if changed && !problems.is_empty() {
            let causes: Vec<&str> = problems.iter().map(|p| p.cause.as_str()).collect();
            tracing::warn!(problems = %causes.join("; "), "not ready (gRPC health NOT_SERVING, /readyz 503)");
        }
        ready.send_replace(Some(public));
        if last != Some(status) {
            if status == ServingStatus::Serving && last.is_some() {
                tracing::info!("ready again (gRPC health SERVING)");
            }
            health.set_service_status(service, status).await;
            last = Some(status);
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(READY_CHECK_INTERVAL) => {}
        }
    }
    health
        .set_service_status(service, ServingStatus::NotServing)
        .await;
}

/// `/readyz`: the last check, waiting up to [`FIRST_CHECK_WAIT`] for the
/// first one.
async fn readyz(State(ops): State<Ops>) -> impl IntoResponse {
    let mut readiness = ops.ready.clone();
    let checked = tokio::time::timeout(FIRST_CHECK_WAIT, readiness.wait_for(Option::is_some))
        .await
        .ok()
        .and_then(Result::ok)
        .and_then(|last| last.clone());
    match checked {
        Some(problems) if problems.is_empty() => (StatusCode::OK, "ready\n".to_string()),
        Some(problems) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready\n{}\n", problems.join("\n")),
        ),
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready\nthe queues have not been checked yet\n".to_string(),
        ),
    }
}

/// Refreshes the queue depth gauges every [`DEPTH_POLL_INTERVAL`].
pub(crate) async fn poll_depth(registry: Arc<Registry>, shutdown: CancellationToken) {
    loop {
        for table in registry.tables() {
            if let Ok(a) = table.attributes().await {
                registry.record_queue_depth(table.name(), &a);
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(DEPTH_POLL_INTERVAL) => {}
        }
    }
}
