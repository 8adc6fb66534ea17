//! A table's queue that stops receiving, deleting and changing
//! visibilities once its server is fenced (another server took its state
//! log over): whatever the registry then tries, SQS is left as the new
//! server expects it. Sends (DoPut) and attribute reads go on.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;

use super::replica::Fence;
use crate::sqs::{
    BatchOutcome, OutgoingMessage, Queue, QueueAttributes, ReceiptHandle, ReceiveRequest, Received,
    SqsError, congestion::Congestion,
};

/// `inner`, refusing what would change SQS once `fence` is up.
pub struct FencedQueue {
    inner: Arc<dyn Queue>,
    fence: Arc<Fence>,
}

impl FencedQueue {
    pub fn new(inner: Arc<dyn Queue>, fence: Arc<Fence>) -> Self {
        Self { inner, fence }
    }

    fn refused(&self) -> Option<SqsError> {
        self.fence.fenced().map(|why| SqsError::Fenced {
            message: why.to_string(),
        })
    }
}

impl Queue for FencedQueue {
    fn receive(&self, req: ReceiveRequest) -> BoxFuture<'_, Result<Vec<Received>, SqsError>> {
        match self.refused() {
            Some(e) => futures::future::ready(Err(e)).boxed(),
            None => self.inner.receive(req),
        }
    }

    fn delete_batch(
        &self,
        receipts: Vec<ReceiptHandle>,
    ) -> BoxFuture<'_, Result<BatchOutcome, SqsError>> {
        match self.refused() {
            Some(e) => futures::future::ready(Err(e)).boxed(),
            None => self.inner.delete_batch(receipts),
        }
    }

    fn change_visibility_batch(
        &self,
        receipts: Vec<ReceiptHandle>,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<BatchOutcome, SqsError>> {
        match self.refused() {
            Some(e) => futures::future::ready(Err(e)).boxed(),
            None => self.inner.change_visibility_batch(receipts, timeout),
        }
    }

    fn send_batch(
        &self,
        messages: Vec<OutgoingMessage>,
    ) -> BoxFuture<'_, Result<BatchOutcome, SqsError>> {
        self.inner.send_batch(messages)
    }

    fn is_fifo(&self) -> bool {
        self.inner.is_fifo()
    }

    fn attributes(&self) -> BoxFuture<'_, Result<QueueAttributes, SqsError>> {
        self.inner.attributes()
    }

    fn congestion(&self) -> Option<&Arc<Congestion>> {
        self.inner.congestion()
    }
}
