//! A moto queue with an in-process server in front of it ([`Fixture`]),
//! and the Flight calls of the tests on any client, each bounded by
//! [`STEP`].

use std::time::Duration;

use arrow_array::RecordBatch;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::{Action, FlightClient, FlightDescriptor, FlightInfo, Ticket};
use futures::TryStreamExt;
use serde_json::Value;
use sqs_flight_server::config::TableConfig;

use crate::moto::{self, moto};
use crate::rows::{bodies, strings};
use crate::server::{self, TestServer, free_addr};

/// Bound on any single step of a test.
pub const STEP: Duration = Duration::from_secs(60);

/// A moto queue with a server in front of it, as table `t`.
pub struct Fixture {
    pub sqs: aws_sdk_sqs::Client,
    pub queue_url: String,
    pub server: TestServer,
    pub flight: FlightClient,
}

/// Runs `f` with a deadline of [`STEP`].
pub async fn bounded<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(STEP, f)
        .await
        .expect("step finished within its deadline")
}

impl Fixture {
    /// A fresh standard queue holding `n` messages `m0..m{n-1}`, served as table `t`.
    pub async fn standard(n: usize) -> Self {
        Self::with(n, &[], |_| {}).await
    }

    /// Like [`standard`](Self::standard), with queue attributes and a table tweak.
    pub async fn with(
        n: usize,
        attrs: &[(aws_sdk_sqs::types::QueueAttributeName, &str)],
        table: impl FnOnce(&mut TableConfig),
    ) -> Self {
        let sqs = moto().client().await;
        let queue_url = moto::create_queue(&sqs, "sqsf", attrs).await;
        if n > 0 {
            moto::send_bodies(&sqs, &queue_url, (0..n).map(|i| format!("m{i}"))).await;
        }
        Self::serve(sqs, queue_url, table, |_| {}).await
    }

    /// Serves `queue_url` as table `t`, with tweaks to the table and config.
    pub async fn serve(
        sqs: aws_sdk_sqs::Client,
        queue_url: String,
        table: impl FnOnce(&mut TableConfig),
        config: impl FnOnce(&mut sqs_flight_server::Config),
    ) -> Self {
        let mut t = server::sqs_table("t", &queue_url);
        if queue_url.contains(&format!("/{}/", moto::ACCOUNT)) {
            // moto's ReceiveMessage is not atomic: two calls in flight at
            // once now and then get the same message, a duplicate real SQS
            // (almost) never makes. Tests on moto count exactly, so they read
            // with one call per partition; tests/it/receivers.rs and the
            // volume tests run several on rustack.
            t.defaults.receivers = 1;
        }
        table(&mut t);
        let mut settings = server::config(vec![t]);
        config(&mut settings);
        let server = TestServer::start(settings, sqs.clone()).await;
        let flight = server.client().await;
        Self {
            sqs,
            queue_url,
            server,
            flight,
        }
    }

    /// A fresh standard queue of `n` messages `m0..m{n-1}` on moto behind a
    /// fault proxy (draws seeded with `seed`), served as table `t` with
    /// `config`'s tweaks: the fixture (its SQS calls go through the proxy),
    /// the proxy, and a client straight to moto.
    pub async fn behind_proxy(
        name: &str,
        n: usize,
        seed: u64,
        config: impl FnOnce(&mut sqs_flight_server::Config),
    ) -> (Self, crate::faults::FaultProxy, aws_sdk_sqs::Client) {
        let direct = moto().client().await;
        let url = moto::queue_holding(&direct, name, n).await;
        let proxy = crate::faults::FaultProxy::start(&moto().endpoint, seed).await;
        let via_proxy = crate::sqs::sqs_client(&proxy.endpoint).await;
        let f = Self::serve(via_proxy, url, |_| {}, config).await;
        (f, proxy, direct)
    }

    /// [`Fixture::serve`] of the plain table, with the metrics endpoint
    /// (`--metrics-listen`) on a free port, which is returned too.
    pub async fn serve_with_metrics(
        sqs: aws_sdk_sqs::Client,
        queue_url: String,
    ) -> (Self, std::net::SocketAddr) {
        Self::serve_metered(sqs, queue_url, |_| {}).await
    }

    /// A fresh standard queue (named after `name`) holding `n` messages
    /// `m0..m{n-1}`, served as table `t` with `config` applied and the
    /// metrics endpoint on a free port, which is returned too.
    pub async fn metered(
        n: usize,
        name: &str,
        config: impl FnOnce(&mut sqs_flight_server::Config),
    ) -> (Self, std::net::SocketAddr) {
        let sqs = moto().client().await;
        let url = moto::queue_holding(&sqs, name, n).await;
        Self::serve_metered(sqs, url, config).await
    }

    async fn serve_metered(
        sqs: aws_sdk_sqs::Client,
        queue_url: String,
        config: impl FnOnce(&mut sqs_flight_server::Config),
    ) -> (Self, std::net::SocketAddr) {
        let ops = free_addr();
        let tweak = |c: &mut sqs_flight_server::Config| {
            c.metrics_listen = Some(ops);
            config(c);
        };
        (Self::serve(sqs, queue_url, |_| {}, tweak).await, ops)
    }

    /// (visible, in flight) of the queue, from SQS itself.
    pub async fn counts(&self) -> (i64, i64) {
        moto::queue_counts(&self.sqs, &self.queue_url).await
    }

    /// GetFlightInfo of a JSON plan command.
    pub async fn plan(&mut self, cmd: Value) -> Result<FlightInfo, tonic::Status> {
        plan_on(&mut self.flight, &cmd).await
    }

    /// Sends `batches` to table `t` with DoPut; the `sent` of each
    /// PutResult, or the error.
    pub async fn put(&mut self, batches: Vec<RecordBatch>) -> Result<Vec<u64>, tonic::Status> {
        let data = FlightDataEncoderBuilder::new()
            .with_flight_descriptor(Some(FlightDescriptor::new_path(vec!["t".into()])))
            .build(futures::stream::iter(batches.into_iter().map(Ok)));
        bounded(async {
            let results = self.flight.do_put(data).await.map_err(status)?;
            let results: Vec<_> = results.try_collect().await.map_err(status)?;
            Ok(results
                .iter()
                .map(|r| {
                    let v: Value = serde_json::from_slice(&r.app_metadata).unwrap();
                    v["sent"].as_u64().unwrap()
                })
                .collect())
        })
        .await
    }

    /// Reads one ticket to the end.
    pub async fn read(&mut self, ticket: &Ticket) -> Result<Vec<RecordBatch>, tonic::Status> {
        read_on(&mut self.flight, ticket).await
    }

    /// Reads every endpoint of a plan in order.
    pub async fn read_all(&mut self, info: &FlightInfo) -> Vec<RecordBatch> {
        read_all_on(&mut self.flight, info).await
    }

    /// Runs an action and parses its JSON answer.
    pub async fn action(&mut self, kind: &str, body: Value) -> Result<Value, tonic::Status> {
        self.action_raw(kind, &body.to_string()).await
    }

    /// Runs an action with a raw body and parses its JSON answer.
    pub async fn action_raw(&mut self, kind: &str, body: &str) -> Result<Value, tonic::Status> {
        action_raw_on(&mut self.flight, kind, body).await
    }

    /// Consumer `consumer` of table `t` as `status` shows it.
    pub async fn consumer(&mut self, consumer: &str) -> Value {
        consumer_on(&mut self.flight, consumer).await
    }

    /// Commits `batch` of `consumer`: the answer.
    pub async fn commit(&mut self, consumer: &str, batch: u64) -> Value {
        commit_on(&mut self.flight, consumer, batch).await
    }
}

/// A Flight client on a plain `grpc://` URL (a server process's).
pub async fn connect(url: &str) -> FlightClient {
    let uri = url.replace("grpc://", "http://");
    let channel = tonic::transport::Endpoint::from_shared(uri)
        .expect("a valid URL")
        .connect()
        .await
        .expect("connect to the server");
    FlightClient::new(channel)
}

/// ListFlights from a new client of `url` (a server process's), answered
/// within `within`: another client's call while a hostile one runs. The
/// number of flights listed; how long it took is printed.
pub async fn list_flights_within(url: &str, within: Duration, during: &str) -> usize {
    let begun = std::time::Instant::now();
    let mut flight = connect(url).await;
    let listed = tokio::time::timeout(within, async {
        flight
            .list_flights(Vec::<u8>::new())
            .await?
            .try_collect::<Vec<_>>()
            .await
    })
    .await
    .unwrap_or_else(|_| panic!("ListFlights got no answer within {within:?} {during}"));
    eprintln!("{during}: ListFlights answered in {:?}", begun.elapsed());
    listed.expect("ListFlights").len()
}

/// GetFlightInfo of a JSON plan command on a bare client.
pub async fn plan_on(flight: &mut FlightClient, cmd: &Value) -> Result<FlightInfo, tonic::Status> {
    let d = FlightDescriptor::new_cmd(cmd.to_string());
    bounded(flight.get_flight_info(d)).await.map_err(status)
}

/// Reads one ticket to the end on a bare client.
pub async fn read_on(
    flight: &mut FlightClient,
    ticket: &Ticket,
) -> Result<Vec<RecordBatch>, tonic::Status> {
    bounded(async {
        let stream = flight.do_get(ticket.clone()).await.map_err(status)?;
        stream.try_collect().await.map_err(status)
    })
    .await
}

/// Reads every endpoint of a plan in order on a bare client.
pub async fn read_all_on(flight: &mut FlightClient, info: &FlightInfo) -> Vec<RecordBatch> {
    let mut out = Vec::new();
    for e in &info.endpoint {
        let ticket = e.ticket.as_ref().expect("a ticket");
        out.extend(read_on(flight, ticket).await.expect("DoGet"));
    }
    out
}

/// Runs an action on a bare client; its first result parsed as JSON.
pub async fn action_on(
    flight: &mut FlightClient,
    kind: &str,
    body: &Value,
) -> Result<Value, tonic::Status> {
    action_raw_on(flight, kind, &body.to_string()).await
}

/// Runs an action with a raw body on a bare client; its first result
/// parsed as JSON.
pub async fn action_raw_on(
    flight: &mut FlightClient,
    kind: &str,
    body: &str,
) -> Result<Value, tonic::Status> {
    bounded(async {
        let action = Action::new(kind, body.to_string());
        let mut results = flight.do_action(action).await.map_err(status)?;
        let first = results.try_next().await.map_err(status)?;
        Ok(serde_json::from_slice(&first.expect("one result")).expect("JSON answer"))
    })
    .await
}

/// Log output kept in memory, as the writer of a test's tracing subscriber.
#[derive(Clone, Default)]
pub struct LogBuffer(pub std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl LogBuffer {
    /// Everything written so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for LogBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The gRPC status inside a Flight error.
pub fn status(e: arrow_flight::error::FlightError) -> tonic::Status {
    match e {
        arrow_flight::error::FlightError::Tonic(s) => *s,
        other => tonic::Status::unknown(other.to_string()),
    }
}

/// Commits `batch` of `consumer` of table `t`: the answer.
pub async fn commit_on(flight: &mut FlightClient, consumer: &str, batch: u64) -> Value {
    let body = serde_json::json!({"table": "t", "consumer": consumer, "batch": batch});
    action_on(flight, "commit", &body).await.expect("commit")
}

/// Consumer `consumer` of table `t` as `status` shows it.
pub async fn consumer_on(flight: &mut FlightClient, consumer: &str) -> Value {
    let status = action_on(flight, "status", &serde_json::json!({"table": "t"}))
        .await
        .expect("status");
    status["tables"]["t"]["consumers"][consumer].clone()
}

/// The reason a refusal carries in its `sqsf-reason` trailer
/// (docs/protocol.md, "Error reasons").
pub fn reason(s: &tonic::Status) -> Option<&str> {
    s.metadata()
        .get("sqsf-reason")
        .and_then(|v| v.to_str().ok())
}

/// A FIFO queue on `sqs` holding `groups` x `per_group` messages
/// `g{G}-{NN}` (each group's sent in order), served as table `t`.
pub async fn fifo_groups(sqs: aws_sdk_sqs::Client, groups: usize, per_group: usize) -> Fixture {
    let url = moto::create_fifo_queue(&sqs, "fifo", &[]).await;
    let messages: Vec<(String, String)> = (0..groups * per_group)
        .map(|i| {
            let g = i % groups;
            (format!("g{g}"), format!("g{g}-{:02}", i / groups))
        })
        .collect();
    moto::send_fifo_bodies(&sqs, &url, messages).await;
    Fixture::serve(sqs, url, |_| {}, |_| {}).await
}

/// Plans, reads and commits batches 1, 2, ... of `plan` (a plan command
/// without `batch`) until `total` rows came or 3 x `total` batches were
/// read: the (group, body) of each row, in read order.
pub async fn read_groups(
    f: &mut Fixture,
    plan: Value,
    total: usize,
) -> Vec<(Option<String>, String)> {
    let mut rows = Vec::new();
    for batch in 1..=3 * total as u64 {
        let mut cmd = plan.clone();
        cmd["batch"] = batch.into();
        let info = f.plan(cmd).await.unwrap();
        let got = f.read_all(&info).await;
        rows.extend(
            strings(&got, "message_group_id")
                .into_iter()
                .zip(bodies(&got)),
        );
        f.commit("default", batch).await;
        if rows.len() >= total {
            break;
        }
    }
    rows
}
