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
    registry.refresh_gauges();
    let content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8";
    (
        [(header::CONTENT_TYPE, content_type)],
        registry.metrics.render(),
    )
}

async fn ready(State(registry): State<Arc<Registry>>) -> impl IntoResponse {
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
                let label = crate::metrics::table(table.name());
                registry
                    .metrics
                    .queue_depth
                    .get_or_create(&label)
                    .set(a.visible as i64);
                registry
                    .metrics
                    .queue_in_flight
                    .get_or_create(&label)
                    .set(a.in_flight as i64);
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(DEPTH_POLL_INTERVAL) => {}
        }
    }
}
