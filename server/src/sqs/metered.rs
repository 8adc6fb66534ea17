//! A [`Queue`] decorator that records each call's latency and error code.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::BoxFuture;

use super::{
    BatchOutcome, OutgoingMessage, Queue, QueueAttributes, ReceiptHandle, ReceiveRequest, Received,
    SqsError,
};
use crate::metrics::Metrics;

/// Times every call of `inner` into `metrics`, labelled by `table`.
pub struct MeteredQueue {
    inner: Arc<dyn Queue>,
    table: String,
    metrics: Arc<Metrics>,
}

impl MeteredQueue {
    pub fn new(inner: Arc<dyn Queue>, table: &str, metrics: Arc<Metrics>) -> Self {
        Self {
            inner,
            table: table.to_string(),
            metrics,
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
}
