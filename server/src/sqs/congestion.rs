//! Back-pressure from one SQS endpoint: how many calls the server keeps in
//! flight to it, narrowed when the endpoint pushes back and widened again
//! as calls succeed, as TCP's congestion window is.
//!
//! Every call of an [`super::aws::AwsQueue`] holds a [`Permit`] of its
//! endpoint's [`Congestion`] from before its first attempt until its last
//! one is answered (its retries and their pauses included), so the calls in
//! flight to one endpoint, and with them the connections the server holds
//! to it (an HTTP/1.1 call in flight holds one), never exceed
//! `sqs_max_connections`. Receives, deletes, visibility changes and sends
//! share the permits; the receive loops also keep no more calls in flight
//! than the window allows (see `registry::receive`), so their own width
//! policies are the upper bound this narrows.
//!
//! Every attempt's answer is read by [`Observer`], an interceptor of the
//! SQS client:
//!
//! - a push-back (HTTP 503 or 429, a throttling code such as
//!   `RequestThrottled`, `ThrottlingException` or `SlowDown`, or no answer
//!   at all: a refused, reset or timed-out connection) halves the window
//!   (multiplicative decrease), at most once per window's worth of calls:
//!   an attempt that started before the last decrease does not decrease it
//!   again, as TCP halves once per loss event, not once per lost segment;
//! - an answered attempt (HTTP 2xx) widens it: by one call per success
//!   below the threshold the last decrease left (slow start, which the
//!   window is in only before its first push-back), by one call per
//!   window's worth of successes above it (additive increase: one call
//!   more per round trip);
//! - any other answer (a 4xx the sender caused, a 500) changes nothing.
//!
//! The window never falls below [`MIN_WINDOW`] nor rises above the cap.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use aws_sdk_sqs::config::http::HttpResponse;
use aws_sdk_sqs::config::interceptors::{
    BeforeTransmitInterceptorContextRef, FinalizerInterceptorContextRef,
};
use aws_sdk_sqs::config::{ConfigBag, Intercept, RuntimeComponents};
use tokio::sync::{Semaphore, SemaphorePermit};

/// The narrowest the window gets: a few calls, so that one long poll in
/// flight never stops a commit's deletes, and a narrow endpoint is still
/// probed often enough to widen again.
pub(crate) const MIN_WINDOW: usize = 4;

/// Throttling error codes of SQS and the AWS SDKs' list of them: answered
/// to a call the endpoint refused for its rate, whatever the HTTP status.
pub(crate) const THROTTLING_CODES: &[&str] = &[
    "RequestThrottled",
    "ThrottlingException",
    "Throttling",
    "ThrottledException",
    "RequestThrottledException",
    "TooManyRequestsException",
    "ProvisionedThroughputExceededException",
    "TransactionInProgressException",
    "RequestLimitExceeded",
    "BandwidthLimitExceeded",
    "LimitExceededException",
    "SlowDown",
    "PriorRequestNotComplete",
    "EC2ThrottledException",
    "KmsThrottled",
    "KMS.ThrottlingException",
];

/// What one attempt's answer says of the endpoint's capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Signal {
    /// Answered (2xx): the endpoint took the call.
    Took,
    /// Refused for capacity or rate, or not answered at all.
    PushBack,
    /// Answered with an error that says nothing of capacity.
    Neither,
}

/// Reads an HTTP answer: its status, its error code if any (the
/// `x-amzn-query-error` header, else the JSON body's `__type` or `code`).
pub(crate) fn signal_of(status: u16, code: Option<&str>) -> Signal {
    if (200..300).contains(&status) {
        return Signal::Took;
    }
    if status == 503 || status == 429 {
        return Signal::PushBack;
    }
    match code {
        Some(code) if THROTTLING_CODES.contains(&code) => Signal::PushBack,
        _ => Signal::Neither,
    }
}

/// The error code an error answer carries: SQS's `x-amzn-query-error:
/// CODE;Sender` header, else the JSON body's `__type` (after its `#`) or
/// `code`.
fn error_code(response: &HttpResponse) -> Option<String> {
    if let Some(header) = response.headers().get("x-amzn-query-error") {
        return header.split(';').next().map(str::to_string);
    }
    let body = response.body().bytes()?;
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let code = value
        .get("__type")
        .or_else(|| value.get("code"))
        .and_then(serde_json::Value::as_str)?;
    Some(code.rsplit('#').next().unwrap_or(code).to_string())
}

/// The window's state.
#[derive(Debug)]
struct Window {
    /// Calls allowed in flight, fractional so that additive increase can
    /// add a share of a call per success.
    width: f64,
    /// Below it the window grows by one per success (slow start).
    threshold: f64,
    /// Permits the semaphore stands for: `width` rounded down.
    granted: usize,
    /// Permits in use to drop rather than return (the window shrank below
    /// what was in flight).
    withheld: usize,
    /// Bumped at each decrease.
    epoch: u64,
}

/// The congestion window of one SQS endpoint, with the permits calls take.
#[derive(Debug)]
pub struct Congestion {
    cap: usize,
    permits: Semaphore,
    window: Mutex<Window>,
    /// Attempts the endpoint pushed back, since the start.
    push_backs: AtomicU64,
    /// Times the window was halved, since the start.
    decreases: AtomicU64,
}

/// A call's place in its endpoint's window; given back when dropped.
pub(crate) struct Permit<'a> {
    permit: Option<SemaphorePermit<'a>>,
    owner: &'a Congestion,
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        let Some(permit) = self.permit.take() else {
            return;
        };
        let mut w = self.owner.lock();
        if w.withheld > 0 {
            w.withheld -= 1;
            permit.forget();
        }
    }
}

tokio::task_local! {
    /// The window's epoch when the current call's latest attempt started
    /// (set by [`Observer`] before each attempt, read after it).
    static ATTEMPT_EPOCH: std::cell::Cell<u64>;
}

impl Congestion {
    /// A window of `cap` calls (at least [`MIN_WINDOW`] and one), open
    /// wide until the endpoint first pushes back.
    pub(crate) fn new(cap: usize) -> Arc<Self> {
        let cap = cap.max(1);
        Arc::new(Self {
            cap,
            permits: Semaphore::new(cap),
            window: Mutex::new(Window {
                width: cap as f64,
                threshold: cap as f64,
                granted: cap,
                withheld: 0,
                epoch: 0,
            }),
            push_backs: AtomicU64::new(0),
            decreases: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Window> {
        self.window.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Calls the window allows in flight now.
    pub(crate) fn width(&self) -> usize {
        self.lock().granted
    }

    /// Attempts the endpoint pushed back since the start.
    pub(crate) fn push_backs(&self) -> u64 {
        self.push_backs.load(Ordering::Relaxed)
    }

    /// Times the window was halved since the start.
    #[cfg(test)]
    fn decreases(&self) -> u64 {
        self.decreases.load(Ordering::Relaxed)
    }

    /// Waits for a place in the window. The semaphore is fair: calls get
    /// places in the order they asked.
    pub(crate) async fn permit(&self) -> Permit<'_> {
        // Never closed: an error cannot happen, but costs nothing to handle.
        let permit = self.permits.acquire().await.ok();
        Permit {
            permit,
            owner: self,
        }
    }

    /// Runs `call` (one SQS call and its retries) holding a permit, with
    /// its attempts observed by [`Observer`].
    pub(crate) async fn run<T>(&self, call: impl std::future::Future<Output = T>) -> T {
        let _permit = self.permit().await;
        let epoch = self.lock().epoch;
        ATTEMPT_EPOCH.scope(std::cell::Cell::new(epoch), call).await
    }

    /// An attempt started: remembers the epoch it started in.
    fn attempt_started(&self) {
        let epoch = self.lock().epoch;
        let _ = ATTEMPT_EPOCH.try_with(|e| e.set(epoch));
    }

    /// An attempt ended with `signal`.
    pub(crate) fn observe(&self, signal: Signal) {
        let started = ATTEMPT_EPOCH.try_with(std::cell::Cell::get).ok();
        self.observe_in(signal, started);
    }

    /// [`Congestion::observe`] of an attempt that started in epoch
    /// `started` (`None`: unknown, counts as the current one).
    fn observe_in(&self, signal: Signal, started: Option<u64>) {
        let mut w = self.lock();
        match signal {
            Signal::Neither => return,
            Signal::Took => {
                let step = if w.width < w.threshold {
                    1.0
                } else {
                    1.0 / w.width
                };
                w.width = (w.width + step).min(self.cap as f64);
            }
            Signal::PushBack => {
                self.push_backs.fetch_add(1, Ordering::Relaxed);
                if started.is_some_and(|e| e != w.epoch) {
                    // Started before the last decrease: already answered for.
                    return;
                }
                let floor = MIN_WINDOW.min(self.cap) as f64;
                w.threshold = (w.width / 2.0).max(floor);
                w.width = w.threshold;
                w.epoch += 1;
                self.decreases.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.regrant(&mut w);
    }

    /// Brings the semaphore's permits to the window's width.
    fn regrant(&self, w: &mut Window) {
        let target = (w.width as usize).clamp(1, self.cap);
        if target > w.granted {
            let mut more = target - w.granted;
            let cancelled = more.min(w.withheld);
            w.withheld -= cancelled;
            more -= cancelled;
            self.permits.add_permits(more);
        } else if target < w.granted {
            let fewer = w.granted - target;
            let taken = self.permits.forget_permits(fewer);
            w.withheld += fewer - taken;
        }
        w.granted = target;
    }
}

/// The SQS client's interceptor that tells an endpoint's [`Congestion`]
/// what each attempt's answer said.
#[derive(Debug, Clone)]
pub(crate) struct Observer(pub Arc<Congestion>);

impl Intercept for Observer {
    fn name(&self) -> &'static str {
        "sqs-flight congestion observer"
    }

    fn read_before_attempt(
        &self,
        _context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), aws_sdk_sqs::error::BoxError> {
        self.0.attempt_started();
        Ok(())
    }

    fn read_after_attempt(
        &self,
        context: &FinalizerInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), aws_sdk_sqs::error::BoxError> {
        let signal = match (context.response(), context.output_or_error()) {
            (Some(response), _) => {
                let status = response.status().as_u16();
                let code = (!(200..300).contains(&status))
                    .then(|| error_code(response))
                    .flatten();
                signal_of(status, code.as_deref())
            }
            // No answer: the connection was refused, reset or timed out.
            (None, Some(Err(e))) if e.is_connector_error() || e.is_timeout_error() => {
                Signal::PushBack
            }
            _ => Signal::Neither,
        };
        self.0.observe(signal);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_read_by_status_and_code() {
        assert_eq!(signal_of(200, None), Signal::Took);
        assert_eq!(signal_of(503, None), Signal::PushBack);
        assert_eq!(signal_of(429, None), Signal::PushBack);
        assert_eq!(signal_of(400, Some("RequestThrottled")), Signal::PushBack);
        assert_eq!(signal_of(400, Some("SlowDown")), Signal::PushBack);
        assert_eq!(
            signal_of(400, Some("InvalidParameterValue")),
            Signal::Neither
        );
        assert_eq!(signal_of(500, Some("InternalError")), Signal::Neither);
    }

    #[test]
    fn a_push_back_halves_the_window_once_per_epoch_and_successes_widen_it_again() {
        let c = Congestion::new(64);
        assert_eq!(c.width(), 64, "open wide until the first push-back");
        let epoch = Some(0);
        c.observe_in(Signal::PushBack, epoch);
        assert_eq!(c.width(), 32);
        // Attempts that started before that decrease do not halve it again.
        for _ in 0..10 {
            c.observe_in(Signal::PushBack, epoch);
        }
        assert_eq!((c.width(), c.push_backs(), c.decreases()), (32, 11, 1));
        c.observe_in(Signal::PushBack, Some(1));
        c.observe_in(Signal::PushBack, Some(2));
        c.observe_in(Signal::PushBack, Some(3));
        assert_eq!(c.width(), 4);
        c.observe_in(Signal::PushBack, Some(4));
        assert_eq!(c.width(), MIN_WINDOW, "never below the floor");
        // Additive increase: about one call more per window's worth of
        // successes (each adds 1 / width).
        let successes_to = |c: &Congestion, width: usize| {
            let mut n = 0;
            while c.width() < width {
                c.observe_in(Signal::Took, None);
                n += 1;
            }
            n
        };
        assert_eq!(successes_to(&c, 5), 5);
        assert_eq!(successes_to(&c, 6), 5);
        assert_eq!(successes_to(&c, 12), 54, "6 + 7 + ... + 11, about");
        for _ in 0..10_000 {
            c.observe_in(Signal::Took, None);
        }
        assert_eq!(c.width(), 64, "never above the cap");
        c.observe_in(Signal::Neither, None);
        assert_eq!(c.width(), 64);
    }

    #[tokio::test]
    async fn calls_in_flight_never_exceed_the_window() {
        let c = Congestion::new(8);
        let held: Vec<Permit<'_>> = futures::future::join_all((0..8).map(|_| c.permit())).await;
        // The window halves while all eight are in flight: the four given
        // back first are withheld, and a new call waits.
        c.observe_in(Signal::PushBack, Some(0));
        assert_eq!(c.width(), 4);
        let mut held = held.into_iter();
        for p in held.by_ref().take(4) {
            drop(p);
        }
        let waiting = tokio::time::timeout(std::time::Duration::from_millis(20), c.permit()).await;
        assert!(waiting.is_err(), "eight were in flight; four now allowed");
        drop(held.next());
        let got = tokio::time::timeout(std::time::Duration::from_millis(20), c.permit()).await;
        assert!(got.is_ok(), "three in flight of four allowed");
        drop(got);
        drop(held);
        let all: Vec<Permit<'_>> = futures::future::join_all((0..4).map(|_| c.permit())).await;
        assert_eq!(c.permits.available_permits(), 0, "four in flight");
        drop(all);
        assert_eq!(c.permits.available_permits(), 4);
    }
}
