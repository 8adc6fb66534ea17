//! A fault-injecting HTTP/1.1 proxy between aws-sdk-sqs and an SQS emulator.
//!
//! [`FaultProxy::start`] listens on `127.0.0.1:0` and forwards every request
//! to the emulator (moto or rustack). Per SQS operation (the `X-Amz-Target`
//! header, `AmazonSQS.ReceiveMessage`: aws-sdk-sqs speaks AWS JSON 1.0) a
//! seeded share of the calls fails instead, with a [`Fault`] drawn from the
//! configured kinds. A failed call is never forwarded, so the emulator's
//! state shows only the calls that got through. The answers look like
//! SQS's own:
//!
//! - [`Fault::InternalError`]: HTTP 500 `InternalError` (`Receiver` fault);
//!   the SDK's standard retry classifier retries 500, 502, 503 and 504.
//! - [`Fault::Throttled`]: HTTP 400 `RequestThrottled` (with the
//!   `x-amzn-query-error: RequestThrottled;Sender` header real SQS sends for
//!   its query-compatible codes) or a bare `ThrottlingException`; both are
//!   in the SDK's list of throttling codes.
//! - [`Fault::Reset`]: the connection is reset (RST, SO_LINGER 0) once the
//!   request is read, before any answer: the SDK sees an I/O error.
//! - [`Fault::Overloaded`]: HTTP 503 whose body names no error code, as an
//!   emulator at its connection capacity answers (rustack: `{"error":
//!   "runtime is draining or connection capacity is full"}`); the SDK
//!   retries 503.
//!
//! A share of the calls can also fail only for a while: [`Faults::lasting`]
//! ends the spell that long after [`FaultProxy::set`]. And
//! [`Faults::max_connections`] makes the proxy an endpoint with a
//! connection cap, as rustack's gateway is: a connection opened while that
//! many are open gets HTTP 503 with no error code to each request, and is
//! closed ([`OVER_CAPACITY`]). The proxy counts the connections and the
//! requests open at once, and the most of each ([`FaultProxy::peaks`]).
//!
//! On top of that, [`Faults::latency`] delays every forwarded call,
//! [`Faults::hold`] delays the calls whose body holds a marker (say, the
//! heartbeat's `"VisibilityTimeout":30` but not a give-back's `0`),
//! [`Faults::refuse`] answers calls whose body holds a marker with a
//! call-level client fault (HTTP 400 `CODE;Sender`, as SQS refuses a whole
//! SendMessageBatch), and [`FaultProxy::expire`] makes the proxy answer the
//! next `n` entries of DeleteMessageBatch / ChangeMessageVisibilityBatch
//! calls itself, in `Failed` with `ReceiptHandleIsInvalid` (SenderFault
//! true), as SQS does for a receipt whose message was received again. Those
//! receipts stay expired: later entries with the same handle fail too.
//! Neither moto nor rustack ever produces that answer.
//!
//! Two rules make SQS's at-least-once deliveries, which the emulators never
//! make on their own: [`Faults::duplicate_receives`] and
//! [`Faults::redeliver_deleted`] (see [At-least-once
//! deliveries](#at-least-once-deliveries)).
//!
//! S3's calls (the large payloads' objects, which moto serves on the same
//! port) go by their HTTP method: `S3.GET`, `S3.PUT`, `S3.DELETE`.
//!
//! Everything injected is counted per operation and kind ([`FaultProxy::count`],
//! [`FaultProxy::report`]), next to the number of calls seen ([`CALLS`]).
//! A `GET /counts` to the proxy answers the counts as JSON
//! ([`FaultProxy::counts`]).
//!
//! # At-least-once deliveries
//!
//! - **Duplicate receive** ([`Faults::duplicate_receives`]): a seeded share
//!   of the messages an answer to ReceiveMessage carries are handed once
//!   more, to the next ReceiveMessage of the same queue (one already in
//!   flight, or the next one), with a receipt handle the proxy makes up
//!   ([`DUPLICATED`]). As with SQS, only the newest receipt works from then
//!   on: an entry of DeleteMessage(Batch) or ChangeMessageVisibility(Batch)
//!   with the older one is answered as a success and not forwarded ("the
//!   request succeeds, but the message might not be deleted";
//!   [`STALE_RECEIPT`]), and the made-up one is forwarded as the emulator's
//!   receipt it stands for ([`NEW_RECEIPT`]). The message's visibility
//!   restarts with the second delivery, as with SQS: the proxy sets it at
//!   the emulator to the receive's VisibilityTimeout ([`RESTARTED`]). A
//!   message is duplicated once at most, and not once it was deleted.
//! - **Redelivery of a deleted message** ([`Faults::redeliver_deleted`]):
//!   a seeded share of the messages whose delete the emulator confirmed are
//!   handed again (the same id, body and attributes) to a later
//!   ReceiveMessage of their queue, with a made-up receipt
//!   ([`REDELIVERED`]); deletes and visibility changes of that receipt are
//!   answered by the proxy itself, as successes ([`REDELIVERED_RECEIPT`]).
//!
//! A ReceiveMessage never gets more messages than its MaxNumberOfMessages:
//! messages to hand again take their place in the call forwarded to the
//! emulator (which then does not wait: SQS answers at once when it has
//! messages), and wait for the next call when an answer is full.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{self, HeaderName};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Value, json};
use sqs_flight_server::sqs::aws::{self, Retries};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use self::replay::{Replay, Replays};

mod replay;

/// Count key of every call the proxy saw, faulted or not.
pub const CALLS: &str = "calls";
/// Count key of the batch entries answered as `ReceiptHandleIsInvalid`.
pub const EXPIRED: &str = "ReceiptHandleIsInvalid";
/// Count key (operation `connection`) of the connections answered 503 for
/// [`Faults::max_connections`].
pub const OVER_CAPACITY: &str = "over capacity";
/// Count key of the calls refused by [`Faults::refuse`].
pub const REFUSED: &str = "Refused";
/// Count key of the calls delayed by [`Faults::latency`].
pub const DELAYED: &str = "latency";
/// Count key of the calls [`Faults::hold`] delayed, counted when they are
/// forwarded (after the hold).
pub const HELD: &str = "held";
/// Count key of the calls [`Faults::hold`] is holding now or has held.
pub const HOLDING: &str = "holding";
/// Count key of the calls [`Faults::hold`] delayed, counted once the proxy
/// has their answer (from upstream, or its own).
pub const HELD_ANSWERED: &str = "held answered";
/// Count key (ReceiveMessage) of the messages handed a second time by
/// [`Faults::duplicate_receives`].
pub const DUPLICATED: &str = "duplicated";
/// Count key (ReceiveMessage) of the deleted messages handed again by
/// [`Faults::redeliver_deleted`].
pub const REDELIVERED: &str = "redelivered";
/// Count key (ReceiveMessage) of the duplicates whose visibility the proxy
/// restarted at the emulator when it handed them out.
pub const RESTARTED: &str = "visibility restarted";
/// Count key (per delete or visibility operation) of the entries that used
/// a receipt after a newer one of its message was handed out: answered as
/// successes, never forwarded.
pub const STALE_RECEIPT: &str = "stale receipt";
/// Count key (per delete or visibility operation) of the entries that used
/// the made-up receipt of a duplicate: forwarded as the emulator's receipt.
pub const NEW_RECEIPT: &str = "new receipt";
/// Count key (per delete or visibility operation) of the entries that used
/// the made-up receipt of a redelivered deleted message: answered here.
pub const REDELIVERED_RECEIPT: &str = "redelivered receipt";

/// A way for one call to fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    InternalError,
    Throttled,
    Reset,
    Overloaded,
}

impl Fault {
    pub const ALL: [Fault; 4] = [
        Fault::InternalError,
        Fault::Throttled,
        Fault::Reset,
        Fault::Overloaded,
    ];

    /// Its count key.
    pub fn name(self) -> &'static str {
        match self {
            Fault::InternalError => "InternalError",
            Fault::Throttled => "Throttled",
            Fault::Reset => "Reset",
            Fault::Overloaded => "Overloaded",
        }
    }
}

/// What the proxy does to the calls it forwards.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Share of the calls of an operation (`ReceiveMessage`) that fail.
    share: HashMap<String, f64>,
    kinds: Vec<Fault>,
    latency: Option<Duration>,
    /// (operation, marker, code)
    refusals: Vec<(String, String, String)>,
    /// (operation, marker, how long)
    holds: Vec<(String, String, Duration)>,
    /// Share of the received messages handed a second time.
    duplicate: f64,
    /// Share of the deleted messages handed again.
    redeliver: f64,
    /// How long after [`FaultProxy::set`] the shares apply.
    lasting: Option<Duration>,
    /// Connections open at once past which a new one gets 503.
    max_connections: Option<usize>,
}

impl Faults {
    /// Nothing fails: every call is forwarded.
    pub fn none() -> Self {
        Self::default()
    }

    /// Failing calls fail with one of `kinds`, drawn uniformly.
    pub fn of(kinds: &[Fault]) -> Self {
        Self {
            kinds: kinds.to_vec(),
            ..Self::default()
        }
    }

    /// `share` (0 to 1) of the calls of `operation` (`ReceiveMessage`, ...) fail.
    pub fn on(mut self, operation: &str, share: f64) -> Self {
        self.share.insert(operation.to_string(), share);
        self
    }

    /// The shares of [`Faults::on`] apply for `spell` after
    /// [`FaultProxy::set`], then no call fails that way.
    pub fn lasting(mut self, spell: Duration) -> Self {
        self.lasting = Some(spell);
        self
    }

    /// A connection opened while `n` are open is answered HTTP 503 (no
    /// error code, as rustack at its capacity) and closed.
    pub fn max_connections(mut self, n: usize) -> Self {
        self.max_connections = Some(n);
        self
    }

    /// Every forwarded call waits `latency` first.
    pub fn latency(mut self, latency: Duration) -> Self {
        self.latency = Some(latency);
        self
    }

    /// Calls of `operation` whose request body contains `marker` wait `hold`
    /// before they are forwarded (counted as [`HOLDING`] when they arrive,
    /// as [`HELD`] when they leave, as [`HELD_ANSWERED`] once answered);
    /// other calls pass at once.
    pub fn hold(mut self, operation: &str, marker: &str, hold: Duration) -> Self {
        self.holds
            .push((operation.to_string(), marker.to_string(), hold));
        self
    }

    /// `share` (0 to 1) of the messages received are handed once more, with
    /// a new receipt, to another ReceiveMessage (see the module doc).
    pub fn duplicate_receives(mut self, share: f64) -> Self {
        self.duplicate = share;
        self
    }

    /// `share` (0 to 1) of the messages deleted are handed again to a later
    /// ReceiveMessage, with a receipt the proxy answers for (module doc).
    pub fn redeliver_deleted(mut self, share: f64) -> Self {
        self.redeliver = share;
        self
    }

    /// Calls of `operation` whose request body contains `marker` are refused
    /// as a whole with HTTP 400 `code` (SQS's `CODE;Sender`), unforwarded,
    /// after [`Faults::latency`] if set (counted as [`REFUSED`] when they
    /// arrive).
    pub fn refuse(mut self, operation: &str, marker: &str, code: &str) -> Self {
        self.refusals
            .push((operation.to_string(), marker.to_string(), code.to_string()));
        self
    }
}

/// A running proxy; it stops when dropped.
pub struct FaultProxy {
    /// `http://127.0.0.1:PORT`, the endpoint to give aws-sdk-sqs.
    pub endpoint: String,
    shared: Arc<Shared>,
    stop: CancellationToken,
}

struct Shared {
    /// `127.0.0.1:PORT` of the emulator.
    upstream: String,
    client: Client<HttpConnector, Full<Bytes>>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    faults: Faults,
    rng: u64,
    /// Batch entries still to answer as expired, per operation.
    expire: HashMap<String, usize>,
    /// Receipt handles answered as expired once: they stay so.
    expired: HashSet<String>,
    counts: BTreeMap<(String, String), u64>,
    replays: Replays,
    /// When the shares stop applying ([`Faults::lasting`]).
    spell_ends: Option<tokio::time::Instant>,
    /// Connections and requests open now, and the most at once.
    open: Peaks,
}

/// Connections and requests open at once (see [`FaultProxy::peaks`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Peaks {
    pub connections: usize,
    pub requests: usize,
    pub most_connections: usize,
    pub most_requests: usize,
}

impl State {
    /// splitmix64: small, seeded, good enough to pick faults.
    fn next(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn count(&mut self, op: &str, kind: &str, n: u64) {
        *self
            .counts
            .entry((op.to_string(), kind.to_string()))
            .or_default() += n;
    }
}

/// What to do with one call.
enum Plan {
    Fail(Fault),
    Refuse(String),
    /// Forward `body`, then add `failed` and `succeeded` to the answer's
    /// `Failed` and `Successful` entries (nothing left to forward: answer
    /// without forwarding). `replay` finishes a ReceiveMessage or a delete.
    Forward {
        body: Bytes,
        failed: Vec<Value>,
        succeeded: Vec<Value>,
        replay: Replay,
    },
}

impl FaultProxy {
    /// Starts a proxy in front of `upstream` (`http://127.0.0.1:PORT`), with
    /// no faults yet; `seed` fixes the sequence of draws.
    pub async fn start(upstream: &str, seed: u64) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port for the fault proxy");
        let addr = listener.local_addr().expect("proxy address");
        let shared = Arc::new(Shared {
            upstream: upstream
                .trim_start_matches("http://")
                .trim_end_matches('/')
                .to_string(),
            client: Client::builder(TokioExecutor::new()).build_http(),
            state: Mutex::new(State {
                rng: seed,
                ..State::default()
            }),
        });
        let stop = CancellationToken::new();
        tokio::spawn(accept(listener, Arc::clone(&shared), stop.clone()));
        Self {
            endpoint: format!("http://{addr}"),
            shared,
            stop,
        }
    }

    /// An SQS client through the proxy with the server's retry policy
    /// ([`aws::retrying`]), `attempts` per call and short backoffs (20 ms
    /// doubling, at most 200 ms): its retries of one call last well under a
    /// second, so a test does not sleep for seconds.
    pub async fn retrying_client(&self, attempts: u32) -> aws_sdk_sqs::Client {
        let base = crate::sqs::sqs_client(&self.endpoint).await;
        let retries = Retries {
            max_attempts: attempts,
            initial_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_millis(200),
        };
        let config = aws::retrying(base.config().to_builder(), retries).build();
        aws_sdk_sqs::Client::from_conf(config)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.shared.state()
    }

    /// Replaces the faults (counts are kept).
    pub fn set(&self, faults: Faults) {
        let mut s = self.state();
        s.spell_ends = faults.lasting.map(|d| tokio::time::Instant::now() + d);
        s.faults = faults;
    }

    /// Connections and requests open now, and the most open at once since
    /// the start or [`FaultProxy::reset_peaks`].
    pub fn peaks(&self) -> Peaks {
        self.state().open
    }

    /// Whether the spell of [`Faults::lasting`] is over (false without one).
    pub fn spell_over(&self) -> bool {
        self.state()
            .spell_ends
            .is_some_and(|end| tokio::time::Instant::now() >= end)
    }

    /// Starts the most-at-once counts again from what is open now.
    pub fn reset_peaks(&self) {
        let mut s = self.state();
        s.open.most_connections = s.open.connections;
        s.open.most_requests = s.open.requests;
    }

    /// Answers the next `n` entries of `operation` (`DeleteMessageBatch` or
    /// `ChangeMessageVisibilityBatch`) as `ReceiptHandleIsInvalid`.
    pub fn expire(&self, operation: &str, n: usize) {
        *self
            .state()
            .expire
            .entry(operation.to_string())
            .or_default() += n;
    }

    /// How many `kind` (a [`Fault::name`], [`CALLS`], [`EXPIRED`],
    /// [`REFUSED`], [`DELAYED`]) the proxy counted for `operation`.
    pub fn count(&self, operation: &str, kind: &str) -> u64 {
        let key = (operation.to_string(), kind.to_string());
        self.state().counts.get(&key).copied().unwrap_or(0)
    }

    /// Every fault injected, all operations and kinds (calls and delays not
    /// included).
    pub fn injected(&self) -> u64 {
        self.state()
            .counts
            .iter()
            .filter(|((_, kind), _)| {
                ![CALLS, DELAYED, HELD, HOLDING, HELD_ANSWERED].contains(&kind.as_str())
            })
            .map(|(_, n)| n)
            .sum()
    }

    /// How many `kind` the proxy counted over all operations.
    pub fn total(&self, kind: &str) -> u64 {
        self.state()
            .counts
            .iter()
            .filter(|((_, k), _)| k == kind)
            .map(|(_, n)| n)
            .sum()
    }

    /// The message ids [`Faults::duplicate_receives`] handed a second time.
    pub fn duplicated_ids(&self) -> HashSet<String> {
        self.state().replays.duplicated_out.clone()
    }

    /// Every count as JSON: `{"ReceiveMessage": {"calls": 12, ...}, ...}`.
    pub fn counts(&self) -> Value {
        self.shared.counts()
    }

    /// Forgets the counts.
    pub fn clear_counts(&self) {
        self.state().counts.clear();
    }

    /// One line per operation: `ReceiveMessage: calls 812, InternalError 70, ...`.
    pub fn report(&self) -> String {
        let mut lines: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for ((op, kind), n) in &self.state().counts {
            lines
                .entry(op.clone())
                .or_default()
                .push(format!("{kind} {n}"));
        }
        lines
            .into_iter()
            .map(|(op, kinds)| format!("{op}: {}\n", kinds.join(", ")))
            .collect()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Decides the fate of one call (under the lock, so draws are ordered),
    /// and how long it waits before it is forwarded, if it is.
    fn plan(&self, op: &str, body: Bytes) -> (Plan, Option<Duration>, bool) {
        let mut s = self.state();
        s.count(op, CALLS, 1);
        let text = String::from_utf8_lossy(&body);
        let refusal = s
            .faults
            .refusals
            .iter()
            .find(|(o, marker, _)| o == op && text.contains(marker.as_str()))
            .map(|(_, _, code)| code.clone());
        if let Some(code) = refusal {
            s.count(op, REFUSED, 1);
            return (Plan::Refuse(code), s.faults.latency, false);
        }
        let spell_over = s
            .spell_ends
            .is_some_and(|end| tokio::time::Instant::now() >= end);
        let share = match spell_over {
            true => 0.0,
            false => s.faults.share.get(op).copied().unwrap_or(0.0),
        };
        if share > 0.0 && !s.faults.kinds.is_empty() && s.unit() < share {
            let i = (s.next() % s.faults.kinds.len() as u64) as usize;
            let fault = s.faults.kinds[i];
            s.count(op, fault.name(), 1);
            return (Plan::Fail(fault), None, false);
        }
        let mut latency = s.faults.latency;
        if latency.is_some() {
            s.count(op, DELAYED, 1);
        }
        let hold = s
            .faults
            .holds
            .iter()
            .find(|(o, marker, _)| o == op && text.contains(marker.as_str()))
            .map(|(_, _, hold)| *hold);
        if let Some(hold) = hold {
            s.count(op, HOLDING, 1);
            latency = Some(latency.unwrap_or_default() + hold);
        }
        let (body, succeeded, replay) = replay::route(&mut s, op, body);
        let (body, failed) = expire_entries(&mut s, op, body);
        let plan = Plan::Forward {
            body,
            failed,
            succeeded,
            replay,
        };
        (plan, latency, hold.is_some())
    }

    fn counts(&self) -> Value {
        let mut out = serde_json::Map::new();
        for ((op, kind), n) in &self.state().counts {
            let entry = out.entry(op.clone()).or_insert_with(|| json!({}));
            entry[kind] = json!(n);
        }
        Value::Object(out)
    }
}

/// Takes the entries to answer as expired out of a batch request body.
fn expire_entries(s: &mut State, op: &str, body: Bytes) -> (Bytes, Vec<Value>) {
    let batch = op == "DeleteMessageBatch" || op == "ChangeMessageVisibilityBatch";
    let budget = s.expire.get(op).copied().unwrap_or(0);
    if !batch || (budget == 0 && s.expired.is_empty()) {
        return (body, Vec::new());
    }
    let Ok(mut request) = serde_json::from_slice::<Value>(&body) else {
        return (body, Vec::new());
    };
    let Some(Value::Array(entries)) = request.get_mut("Entries").map(std::mem::take) else {
        return (body, Vec::new());
    };
    let (mut keep, mut failed) = (Vec::new(), Vec::new());
    for entry in entries {
        let handle = entry["ReceiptHandle"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let budget = s.expire.entry(op.to_string()).or_default();
        let expire = if s.expired.contains(&handle) {
            true
        } else if *budget > 0 {
            *budget -= 1;
            s.expired.insert(handle);
            true
        } else {
            false
        };
        if expire {
            failed.push(json!({
                "Id": entry["Id"],
                "Code": "ReceiptHandleIsInvalid",
                "Message": "The receipt handle has expired.",
                "SenderFault": true,
            }));
        } else {
            keep.push(entry);
        }
    }
    s.count(op, EXPIRED, failed.len() as u64);
    request["Entries"] = Value::Array(keep);
    (Bytes::from(request.to_string()), failed)
}

async fn accept(listener: TcpListener, shared: Arc<Shared>, stop: CancellationToken) {
    loop {
        let tcp = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(_) => continue,
            },
        };
        // Closing a socket with SO_LINGER 0 sends RST: a reset, not an EOF.
        let _ = tcp.set_zero_linger();
        let _ = tcp.set_nodelay(true);
        let shared = Arc::clone(&shared);
        let stop = stop.clone();
        let open = Open::connection(&shared);
        if open.over_capacity {
            tokio::spawn(over_capacity(tcp, open, stop));
            continue;
        }
        tokio::spawn(async move {
            let _open = open;
            let reset = CancellationToken::new();
            let trigger = reset.clone();
            let service = service_fn(move |req| {
                let (shared, trigger) = (Arc::clone(&shared), trigger.clone());
                async move { Ok::<_, Infallible>(handle(&shared, req, &trigger).await) }
            });
            let conn = http1::Builder::new().serve_connection(TokioIo::new(tcp), service);
            // Dropping the connection drops (and so resets) the socket.
            tokio::select! {
                _ = conn => {}
                _ = reset.cancelled() => {}
                _ = stop.cancelled() => {}
            }
        });
    }
}

/// One connection (or request) open, counted in [`State::open`] until
/// dropped.
struct Open {
    shared: Arc<Shared>,
    request: bool,
    /// A connection past [`Faults::max_connections`].
    over_capacity: bool,
}

impl Open {
    fn connection(shared: &Arc<Shared>) -> Self {
        let mut s = shared.state();
        let cap = s.faults.max_connections;
        let over_capacity = cap.is_some_and(|cap| s.open.connections >= cap);
        s.open.connections += 1;
        s.open.most_connections = s.open.most_connections.max(s.open.connections);
        if over_capacity {
            s.count("connection", OVER_CAPACITY, 1);
        }
        Self {
            shared: Arc::clone(shared),
            request: false,
            over_capacity,
        }
    }

    fn request(shared: &Arc<Shared>) -> Self {
        let mut s = shared.state();
        s.open.requests += 1;
        s.open.most_requests = s.open.most_requests.max(s.open.requests);
        Self {
            shared: Arc::clone(shared),
            request: true,
            over_capacity: false,
        }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        let mut s = self.shared.state();
        match self.request {
            true => s.open.requests -= 1,
            false => s.open.connections -= 1,
        }
    }
}

/// Answers each request of a connection past the cap with 503 and closes
/// it, as rustack's gateway does.
async fn over_capacity(tcp: tokio::net::TcpStream, open: Open, stop: CancellationToken) {
    let service = service_fn(|_req: Request<Incoming>| async {
        let mut answer = json_answer(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"error": "connection capacity exhausted (injected)"}),
        );
        answer.headers_mut().insert(
            header::CONNECTION,
            header::HeaderValue::from_static("close"),
        );
        Ok::<_, Infallible>(answer)
    });
    let conn = http1::Builder::new()
        .keep_alive(false)
        .serve_connection(TokioIo::new(tcp), service);
    tokio::select! {
        _ = conn => {}
        _ = stop.cancelled() => {}
    }
    drop(open);
}

async fn handle(
    shared: &Arc<Shared>,
    req: Request<Incoming>,
    reset: &CancellationToken,
) -> Response<Full<Bytes>> {
    let _open = Open::request(shared);
    let op = req
        .headers()
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .map(|t| t.trim_start_matches("AmazonSQS.").to_string())
        .unwrap_or_default();
    if op.is_empty() && req.method() == hyper::Method::GET && req.uri().path() == "/counts" {
        return json_answer(StatusCode::OK, &shared.counts());
    }
    // S3 (large payloads) names no operation: its calls go by method,
    // `S3.GET` for GetObject, `S3.PUT`, `S3.DELETE`.
    let op = match op.is_empty() {
        true => format!("S3.{}", req.method()),
        false => op,
    };
    let (parts, body) = req.into_parts();
    let body = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return answer(StatusCode::BAD_REQUEST, format!("reading the request: {e}")),
    };
    let (plan, latency, held) = shared.plan(&op, body);
    if let Some(latency) = latency {
        tokio::time::sleep(latency).await;
    }
    if held {
        shared.state().count(&op, HELD, 1);
    }
    let response = answer_as_planned(shared, plan, parts, reset).await;
    if held {
        shared.state().count(&op, HELD_ANSWERED, 1);
    }
    response
}

/// The answer to a call whose fate [`Shared::plan`] decided: a fault, a
/// refusal, or what upstream (or the replay of a duplicate) answers.
async fn answer_as_planned(
    shared: &Arc<Shared>,
    plan: Plan,
    parts: hyper::http::request::Parts,
    reset: &CancellationToken,
) -> Response<Full<Bytes>> {
    match plan {
        Plan::Fail(Fault::Reset) => {
            reset.cancel();
            std::future::pending().await
        }
        Plan::Fail(Fault::InternalError) => sqs_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            "Receiver",
            "We encountered an internal error. Please try again. (injected)",
        ),
        Plan::Fail(Fault::Throttled) => {
            if shared.state().next().is_multiple_of(2) {
                sqs_error(
                    StatusCode::BAD_REQUEST,
                    "RequestThrottled",
                    "Sender",
                    "Rate exceeded (injected)",
                )
            } else {
                let body =
                    json!({"__type": "ThrottlingException", "message": "Rate exceeded (injected)"});
                json_answer(StatusCode::BAD_REQUEST, &body)
            }
        }
        Plan::Fail(Fault::Overloaded) => json_answer(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"error": "connection capacity is full (injected)"}),
        ),
        Plan::Refuse(code) => sqs_error(
            StatusCode::BAD_REQUEST,
            &code,
            "Sender",
            "The request was refused (injected).",
        ),
        Plan::Forward {
            body,
            failed,
            succeeded,
            replay,
        } => {
            let headers = parts.headers.clone();
            if let Some(answer) = replay.local_answer(&body, &failed, &succeeded) {
                restart_visibility(shared, &headers).await;
                return json_answer(StatusCode::OK, &answer);
            }
            match forward(shared, parts, body).await {
                Ok((parts, body)) => {
                    let body = replay.finish(&mut shared.state(), parts.status, body);
                    let body = add_entries(parts.status, body, "Failed", failed);
                    let body = add_entries(parts.status, body, "Successful", succeeded);
                    restart_visibility(shared, &headers).await;
                    Response::from_parts(parts, Full::new(body))
                }
                Err(e) => {
                    replay.abandon(&mut shared.state());
                    answer(
                        StatusCode::BAD_GATEWAY,
                        format!("fault proxy: upstream: {e}"),
                    )
                }
            }
        }
    }
}

/// Hop-by-hop and length headers: hyper sets them for the new message.
fn hop(name: &HeaderName) -> bool {
    name == header::CONNECTION
        || name == header::CONTENT_LENGTH
        || name == header::TRANSFER_ENCODING
        || name.as_str() == "keep-alive"
}

/// Sends the call to the emulator; its answer, length headers dropped.
async fn forward(
    shared: &Shared,
    parts: hyper::http::request::Parts,
    body: Bytes,
) -> Result<(hyper::http::response::Parts, Bytes), String> {
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut req = Request::builder()
        .method(parts.method)
        .uri(format!("http://{}{path}", shared.upstream));
    for (name, value) in parts.headers.iter().filter(|(n, _)| !hop(n)) {
        req = req.header(name, value);
    }
    let req = req.body(Full::new(body)).map_err(|e| e.to_string())?;
    let response = shared
        .client
        .request(req)
        .await
        .map_err(|e| e.to_string())?;
    let (mut parts, body) = response.into_parts();
    let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
    let names: Vec<HeaderName> = parts.headers.keys().filter(|n| hop(n)).cloned().collect();
    for name in names {
        parts.headers.remove(name);
    }
    Ok((parts, body))
}

/// Restarts at the emulator the visibility of the messages just handed a
/// second time (SQS restarts it at each delivery), with the headers of the
/// call that handed them; counted as [`RESTARTED`].
async fn restart_visibility(shared: &Shared, headers: &hyper::HeaderMap) {
    let restarts = shared.state().replays.take_restarts();
    let mut by_queue: BTreeMap<String, Vec<(String, i64)>> = BTreeMap::new();
    for (queue, receipt, timeout) in restarts {
        by_queue.entry(queue).or_default().push((receipt, timeout));
    }
    for (queue, entries) in by_queue {
        for chunk in entries.chunks(10) {
            let entries: Vec<Value> = (0..)
                .zip(chunk)
                .map(|(i, (receipt, timeout))| {
                    json!({"Id": format!("r{i}"), "ReceiptHandle": receipt,
                           "VisibilityTimeout": timeout})
                })
                .collect();
            let body = json!({"QueueUrl": queue, "Entries": entries});
            let mut req = Request::post(format!("http://{}/", shared.upstream));
            for (name, value) in headers.iter().filter(|(n, _)| !hop(n)) {
                if name.as_str() != "x-amz-target" {
                    req = req.header(name, value);
                }
            }
            let req = req
                .header("x-amz-target", "AmazonSQS.ChangeMessageVisibilityBatch")
                .body(Full::new(Bytes::from(body.to_string())))
                .expect("a valid request");
            if let Ok(answer) = shared.client.request(req).await {
                let _ = answer.into_body().collect().await;
            }
            shared
                .state()
                .count("ReceiveMessage", RESTARTED, chunk.len() as u64);
        }
    }
}

/// Adds entries answered here (`Failed` or `Successful`) to a successful
/// batch call's answer.
fn add_entries(status: StatusCode, body: Bytes, list: &str, entries: Vec<Value>) -> Bytes {
    if entries.is_empty() || !status.is_success() {
        return body;
    }
    let Ok(mut answer) = serde_json::from_slice::<Value>(&body) else {
        return body;
    };
    match answer.get_mut(list).and_then(Value::as_array_mut) {
        Some(have) => have.extend(entries),
        None => answer[list] = Value::Array(entries),
    }
    Bytes::from(answer.to_string())
}

/// An SQS JSON-protocol error answer.
fn sqs_error(status: StatusCode, code: &str, fault: &str, message: &str) -> Response<Full<Bytes>> {
    let body = json!({"__type": format!("com.amazonaws.sqs#{code}"), "message": message});
    let mut response = json_answer(status, &body);
    let query_error = format!("{code};{fault}")
        .parse()
        .expect("ASCII header value");
    response
        .headers_mut()
        .insert("x-amzn-query-error", query_error);
    response
}

fn json_answer(status: StatusCode, body: &Value) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/x-amz-json-1.0")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("static answer")
}

fn answer(status: StatusCode, text: String) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .body(Full::new(Bytes::from(text)))
        .expect("static answer")
}
