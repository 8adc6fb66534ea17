//! An in-process server in front of the embedded in-memory queue, for the
//! timing tests (lease, heartbeat, visibility) that run on tokio's paused
//! time (`#[tokio::test(start_paused = true)]`): the queue's visibility
//! timeouts, the heartbeat and the leases all run on `tokio::time`, so a
//! test jumps over minutes at once instead of sleeping through them.
//!
//! Not for what SQS itself does: that is tested against moto ([`crate::fixture`]).

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_flight::{FlightClient, FlightInfo};
use serde_json::Value;
use sqs_flight_server::config::{Config, TableConfig};
use sqs_flight_server::registry::{Registry, Table};
use sqs_flight_server::sqs::Queue;
use sqs_flight_server::sqs::memory::MemoryQueue;

use crate::fixture::{action_on, commit_on, plan_on, read_all_on};
use crate::server::{self, TestServer};

/// A memory queue with a server in front of it, as table `t`.
pub struct MemoryFixture {
    pub queue: Arc<MemoryQueue>,
    pub server: TestServer,
    pub flight: FlightClient,
}

impl MemoryFixture {
    /// A queue holding `n` messages `m0..m{n-1}`, served as table `t` with
    /// tweaks to the table and config.
    pub async fn start(
        n: usize,
        table: impl FnOnce(&mut TableConfig),
        config: impl FnOnce(&mut Config),
    ) -> Self {
        let queue = Arc::new(MemoryQueue::new("t"));
        for i in 0..n {
            queue.send(format!("m{i}"), Vec::new());
        }
        let mut t = TableConfig::memory("t", 0);
        table(&mut t);
        let mut settings = server::config(vec![t]);
        config(&mut settings);
        let served: Arc<dyn Queue> = queue.clone();
        let t = Arc::new(Table::new(settings.tables[0].clone(), served));
        let metrics = Arc::new(sqs_flight_server::metrics::Metrics::new());
        let registry = Arc::new(Registry::new(&settings, vec![t], metrics));
        let server = TestServer::start_with_registry(settings, registry).await;
        let flight = server.client().await;
        Self {
            queue,
            server,
            flight,
        }
    }

    /// (visible, in flight) of the queue.
    pub async fn counts(&self) -> (i64, i64) {
        let a = self
            .queue
            .attributes()
            .await
            .expect("memory queue attributes");
        (a.visible as i64, a.in_flight as i64)
    }

    /// GetFlightInfo of a JSON plan command.
    pub async fn plan(&mut self, cmd: Value) -> Result<FlightInfo, tonic::Status> {
        plan_on(&mut self.flight, &cmd).await
    }

    /// Reads every endpoint of a plan in order.
    pub async fn read_all(&mut self, info: &FlightInfo) -> Vec<RecordBatch> {
        read_all_on(&mut self.flight, info).await
    }

    /// Runs an action and parses its JSON answer.
    pub async fn action(&mut self, kind: &str, body: Value) -> Result<Value, tonic::Status> {
        action_on(&mut self.flight, kind, &body).await
    }

    /// Commits `batch` of `consumer`.
    pub async fn commit(&mut self, consumer: &str, batch: u64) -> Value {
        commit_on(&mut self.flight, consumer, batch).await
    }
}
