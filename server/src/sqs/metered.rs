//! A [`Queue`] decorator that records each call's latency and error code,
//! and the congestion window of the queue's endpoint after it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::BoxFuture;

use super::congestion::Congestion;
use super::{
    BatchOutcome, OutgoingMessage, Queue, QueueAttributes, ReceiptHandle, ReceiveRequest, Received,
    SqsError,
};
use crate::metrics::Metrics;

/// Times every call of `inner` into `metrics`, labelled by `table`.
pub(crate) struct MeteredQueue {
    inner: Arc<dyn Queue>,
    table: String,
    metrics: Arc<Metrics>,
    /// The endpoint's push-backs already counted in `sqs_push_backs`.
    push_backs: AtomicU64,
}

impl MeteredQueue {
    pub(crate) fn new(inner: Arc<dyn Queue>, table: &str, metrics: Arc<Metrics>) -> Self {
        Self {
            inner,
            table: table.to_string(),
            metrics,
            push_backs: AtomicU64::new(0),
        }
    }

    /// Sets `sqs_window` and counts the endpoint's new push-backs.
    fn window(&self) {
        let Some(window) = self.inner.congestion() else {
            return;
        };
        let labels = crate::metrics::table_labels(&self.table);
        let width = i64::try_from(window.width()).unwrap_or(i64::MAX);
        self.metrics.sqs_window.get_or_create(&labels).set(width);
        let total = window.push_backs();
        let seen = self.push_backs.fetch_max(total, Ordering::Relaxed);
        if total > seen {
            self.metrics
                .sqs_push_backs
                .get_or_create(&labels)
                .inc_by(total - seen);
        }
    }

    fn timed<'a, T: Send + 'a>(
        &'a self,
        operation: &'static str,
        call: BoxFuture<'a, Result<T, SqsError>>,
    ) -> BoxFuture<'a, Result<T, SqsError>> {
        async move {
            let start = Instant::now();
            let result = call.await;
            let code = result.as_ref().err().map(SqsError::code);
            self.metrics
                .sqs_call(&self.table, operation, start.elapsed(), code);
            self.window();
            result
        }
        .boxed()
    }
}

impl Queue for MeteredQueue {
    fn receive(&self, req: ReceiveRequest) -> BoxFuture<'_, Result<Vec<Received>, SqsError>> {
        self.timed("ReceiveMessage", self.inner.receive(req))
    }

    fn delete_batch(
        &self,
        receipts: Vec<ReceiptHandle>,
    ) -> BoxFuture<'_, Result<BatchOutcome, SqsError>> {
        self.timed("DeleteMessageBatch", self.inner.delete_batch(receipts))
    }

    fn change_visibility_batch(
        &self,
        receipts: Vec<ReceiptHandle>,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<BatchOutcome, SqsError>> {
        let call = self.inner.change_visibility_batch(receipts, timeout);
        self.timed("ChangeMessageVisibilityBatch", call)
    }

    fn send_batch(
        &self,
        messages: Vec<OutgoingMessage>,
    ) -> BoxFuture<'_, Result<BatchOutcome, SqsError>> {
        self.timed("SendMessageBatch", self.inner.send_batch(messages))
    }

    fn is_fifo(&self) -> bool {
        self.inner.is_fifo()
    }

    fn attributes(&self) -> BoxFuture<'_, Result<QueueAttributes, SqsError>> {
        self.timed("GetQueueAttributes", self.inner.attributes())
    }

    fn congestion(&self) -> Option<&Arc<Congestion>> {
        self.inner.congestion()
    }
}
