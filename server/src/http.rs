//! The operations port: `/metrics` (Prometheus), `/healthz` (the process
//! answers) and `/readyz` (every table's queue answers GetQueueAttributes).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::registry::Registry;

/// How long `/readyz` waits for each queue.
pub const READY_TIMEOUT: Duration = Duration::from_secs(3);
/// How often the queue depth gauges are refreshed.
pub const DEPTH_POLL_INTERVAL: Duration = Duration::from_secs(15);

/// Serves the operations endpoints on `listener` until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    registry: Arc<Registry>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .with_state(registry);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

async fn metrics(State(registry): State<Arc<Registry>>) -> impl IntoResponse {
    let content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8";
    (
        [(header::CONTENT_TYPE, content_type)],
        registry.render_metrics(),
    )
}

/// Why the server is not ready: one line per table whose queue does not
/// answer GetQueueAttributes within [`READY_TIMEOUT`]; empty when ready.
pub async fn readiness(registry: &Registry) -> Vec<String> {
    let mut problems = Vec::new();
    for table in registry.tables() {
        match tokio::time::timeout(READY_TIMEOUT, table.queue.attributes()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => problems.push(format!("table {}: {e}", table.name())),
            Err(_) => problems.push(format!(
                "table {}: no answer within {READY_TIMEOUT:?}",
                table.name()
            )),
        }
    }
    problems
}

/// How often the gRPC health status of the Flight service is refreshed.
pub const HEALTH_POLL_INTERVAL: Duration = Duration::from_secs(5);

/// Keeps the gRPC health status of `service` equal to [`readiness`]:
/// SERVING while every table's queue answers, NOT_SERVING otherwise (the
/// overall status `""` stays SERVING: the process is alive). Ends with
/// `shutdown`, setting NOT_SERVING.
pub async fn follow_health(
    registry: Arc<Registry>,
    health: tonic_health::server::HealthReporter,
    service: &'static str,
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
        if last != Some(status) {
            if status == ServingStatus::NotServing {
                tracing::warn!(problems = %problems.join("; "), "gRPC health: NOT_SERVING");
            } else if last.is_some() {
                tracing::info!("gRPC health: SERVING again");
            }
            health.set_service_status(service, status).await;
            last = Some(status);
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(HEALTH_POLL_INTERVAL) => {}
        }
    }
    health
        .set_service_status(service, ServingStatus::NotServing)
        .await;
}

async fn ready(State(registry): State<Arc<Registry>>) -> impl IntoResponse {
    let problems = readiness(&registry).await;
    if problems.is_empty() {
        (StatusCode::OK, "ready\n".to_string())
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready\n{}\n", problems.join("\n")),
        )
    }
}

/// Refreshes the queue depth gauges every [`DEPTH_POLL_INTERVAL`].
pub async fn poll_depth(registry: Arc<Registry>, shutdown: CancellationToken) {
    loop {
        for table in registry.tables() {
            if let Ok(a) = table.queue.attributes().await {
                registry.record_queue_depth(table.name(), &a);
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(DEPTH_POLL_INTERVAL) => {}
        }
    }
}
