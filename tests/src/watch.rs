//! A queue whose ReceiveMessage calls a test watches.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use sqs_flight_server::registry::{Registry, Table};
use sqs_flight_server::sqs::aws::AwsQueue;
use sqs_flight_server::sqs::{
    BatchOutcome, OutgoingMessage, Queue, QueueAttributes, ReceiptHandle, ReceiveRequest, Received,
    SqsError,
};

use crate::server::{self, TestServer};

/// What a test watches of a queue's ReceiveMessage calls.
pub trait ReceiveWatch: Send + Sync + 'static {
    /// A call is about to go out.
    fn before(&self) {}
    /// A call came back.
    fn after(&self, _got: &Result<Vec<Received>, SqsError>) {}
}

/// An SQS queue whose ReceiveMessage calls `watch` sees; every other call
/// goes straight through.
pub struct Watched<W> {
    pub inner: AwsQueue,
    pub watch: Arc<W>,
}

impl<W: ReceiveWatch> Queue for Watched<W> {
    fn receive(&self, req: ReceiveRequest) -> BoxFuture<'_, Result<Vec<Received>, SqsError>> {
        async move {
            self.watch.before();
            let got = self.inner.receive(req).await;
            self.watch.after(&got);
            got
        }
        .boxed()
    }
    fn delete_batch(&self, r: Vec<ReceiptHandle>) -> BoxFuture<'_, Result<BatchOutcome, SqsError>> {
        self.inner.delete_batch(r)
    }
    fn change_visibility_batch(
        &self,
        r: Vec<ReceiptHandle>,
        t: Duration,
    ) -> BoxFuture<'_, Result<BatchOutcome, SqsError>> {
        self.inner.change_visibility_batch(r, t)
    }
    fn send_batch(&self, m: Vec<OutgoingMessage>) -> BoxFuture<'_, Result<BatchOutcome, SqsError>> {
        self.inner.send_batch(m)
    }
    fn is_fifo(&self) -> bool {
        self.inner.is_fifo()
    }
    fn attributes(&self) -> BoxFuture<'_, Result<QueueAttributes, SqsError>> {
        self.inner.attributes()
    }
}

/// A server whose table `t` is `url` behind a [`Watched`] queue.
pub async fn watched<W: ReceiveWatch>(
    sqs: &aws_sdk_sqs::Client,
    url: &str,
    watch: Arc<W>,
) -> TestServer {
    let config = server::config(vec![server::sqs_table("t", url)]);
    let inner = AwsQueue::new(sqs.clone(), url.to_string());
    let table = Table::new(config.tables[0].clone(), Arc::new(Watched { inner, watch }));
    let metrics = Arc::new(sqs_flight_server::metrics::Metrics::new());
    let registry = Arc::new(Registry::new(&config, vec![Arc::new(table)], metrics));
    TestServer::start_with_registry(config, registry).await
}
