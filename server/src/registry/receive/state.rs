//! What one receive loop carries from one turn to the next, and the named
//! steps of a turn: check the limits ([`LoopState::within_limits`]), start
//! calls up to the width ([`LoopState::start_calls`]), wait for the next
//! answer ([`LoopState::next_answer`]), take it ([`LoopState::take_answer`])
//! and record what it brought ([`LoopState::record_answer`]).

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::calls::{Call, CallResult, Calls};
use super::durable::Durable;
use super::{
    EndReason, OVER_LIMIT_PAUSE, Progress, ReceiveLoop, ReceiveSummary, Recorded, SHORT_POLL_PAUSE,
    explained, long_poll,
};
use crate::error::{Error, Result};
use crate::registry::dedup::Span;
use crate::sqs::{ReceiveRequest, Received, SQS_BATCH, SqsError};

/// What a step answers: go on (with what the next step needs), or end the
/// loop with its result.
type Step<T = ()> = ControlFlow<Result<ReceiveSummary>, T>;

/// The deadlines of one receive loop.
struct Clock {
    end_by: Instant,
    idle_until: Instant,
    /// No call is issued before this (a pause between empty short polls).
    pause_until: Option<Instant>,
}

/// The state of one receive loop: its calls in flight (and their width),
/// what it received so far, its deadlines, and the last `OverLimit`
/// refusal.
pub(super) struct LoopState<'a> {
    receive: &'a ReceiveLoop,
    calls: &'a mut Calls,
    /// The queue's visibility timeout, asked for once.
    vt: Duration,
    clock: Clock,
    done: Progress,
    /// The last receive's OverLimit refusal, while nothing was recorded.
    refused: Option<SqsError>,
    /// What it received and the journal has not written yet.
    durable: Durable,
}

/// How a loop ended: its result, and whether the ticket's seal was
/// written with its last receives.
pub(super) struct Finished {
    pub(super) end: Result<ReceiveSummary>,
    pub(super) sealed: bool,
}

/// What the loop waits for next.
enum Event {
    /// A call came back.
    Answer(CallResult),
    /// The journal's write in flight landed, with this outcome.
    Landed(Result<()>),
    /// The pending receives are due to be written.
    Due,
    /// A pause between calls is over.
    PauseOver,
}

impl<'a> LoopState<'a> {
    /// The state of a loop starting now, with nothing in flight.
    pub(super) async fn start(receive: &'a ReceiveLoop, calls: &'a mut Calls) -> Result<Self> {
        let vt = receive.table.visibility_timeout().await?;
        let p = receive.batch.params;
        let start = Instant::now();
        Ok(LoopState {
            receive,
            calls,
            vt,
            clock: Clock {
                end_by: start + Duration::from_millis(p.max_duration_ms),
                idle_until: start + Duration::from_millis(p.max_wait_ms),
                pause_until: None,
            },
            done: Progress {
                messages: 0,
                bytes: 0,
                receives: 0,
            },
            refused: None,
            durable: Durable::new(receive.registry.journal.linger()),
        })
    }

    /// One turn of the loop: at most one answer taken and recorded, or
    /// one write of the journal handed over or landed.
    pub(super) async fn turn(&mut self) -> Step {
        let now = self.within_limits()?;
        self.start_calls(now)?;
        match self.next_event(now).await? {
            Event::Answer((call, result)) => match self.take_answer(&call, result)? {
                Some(received) => self.record_answer(call, received).await,
                None => ControlFlow::Continue(()),
            },
            Event::Landed(outcome) => self.landed(outcome).await,
            Event::Due => self.flush().await,
            Event::PauseOver => ControlFlow::Continue(()),
        }
    }

    /// Ends the loop with `end` once what it kept is written and in the
    /// ticket's log; a write that fails ends it with that error. A loop
    /// that received something and ended well writes the ticket's seal with
    /// its last receives; answers whether it did.
    pub(super) async fn finish(mut self, end: Result<ReceiveSummary>) -> Finished {
        let seal = matches!(&end, Ok(s) if s.messages > 0);
        match self.receive.drain(&mut self.durable, seal).await {
            Ok(sealed) => Finished { end, sealed },
            Err(e) => Finished {
                end: Err(e),
                sealed: false,
            },
        }
    }

    /// Hands the pending receives to the journal; on failure they go back
    /// and the loop ends.
    async fn flush(&mut self) -> Step {
        if let Err(e) = self.receive.flush(&mut self.durable, false) {
            let everything = self.durable.take_all();
            self.receive.give_back(everything).await;
            return ControlFlow::Break(Err(e));
        }
        // In memory, or when the writer was quick, it has landed already.
        match self.durable.landed_now() {
            Some(outcome) => self.landed(outcome).await,
            None => ControlFlow::Continue(()),
        }
    }

    /// Puts what the journal wrote into the ticket's log, then hands over
    /// what is due already.
    async fn landed(&mut self, outcome: Result<()>) -> Step {
        match self.receive.landed(&mut self.durable, outcome).await {
            Err(e) => ControlFlow::Break(Err(e)),
            Ok(Recorded::Closed) => ControlFlow::Break(Ok(self.summary(EndReason::Closed))),
            Ok(_) => self.flush_if_due().await,
        }
    }

    /// Hands the pending receives to the journal if they are due now. At
    /// its limits, the loop ends at the next turn and writes them with the
    /// ticket's seal instead.
    async fn flush_if_due(&mut self) -> Step {
        if self.at_limits() {
            return ControlFlow::Continue(());
        }
        match self.durable.due_at() {
            Some(at) if at <= Instant::now() => Box::pin(self.flush()).await,
            _ => ControlFlow::Continue(()),
        }
    }

    /// The loop's summary if it ended now for `reason`.
    fn summary(&self, reason: EndReason) -> ReceiveSummary {
        ReceiveSummary {
            messages: self.done.messages,
            bytes: self.done.bytes,
            reason,
        }
    }

    /// Whether the loop has received `max_messages` or `max_bytes`.
    fn at_limits(&self) -> bool {
        let p = self.receive.batch.params;
        self.done.messages >= p.max_messages || self.done.bytes >= p.max_bytes
    }

    /// Ends the loop at `max_messages`, `max_bytes` or, once something was
    /// received, the duration limit; otherwise answers the time now.
    fn within_limits(&mut self) -> Step<Instant> {
        let p = self.receive.batch.params;
        if self.done.messages >= p.max_messages {
            return ControlFlow::Break(Ok(self.summary(EndReason::MaxMessages)));
        }
        if self.done.bytes >= p.max_bytes {
            return ControlFlow::Break(Ok(self.summary(EndReason::MaxBytes)));
        }
        let now = Instant::now();
        if self.done.receives > 0 && now >= self.clock.end_by {
            return ControlFlow::Break(self.ended(EndReason::Duration));
        }
        ControlFlow::Continue(now)
    }

    /// Issues calls up to the width; ends the loop when none is in flight
    /// and none may be issued (the registry is full, or the loop is idle).
    fn start_calls(&mut self, now: Instant) -> Step {
        let done = self.done;
        if let Err(e) = self.refill(&done, now)
            && self.calls.in_flight() == 0
        {
            if self.done.messages == 0 {
                return ControlFlow::Break(Err(e));
            }
            return ControlFlow::Break(Ok(self.summary(EndReason::MaxBytes)));
        }
        if self.calls.in_flight() == 0 && self.clock.pause_until.is_none_or(|t| now >= t) {
            // Nothing in flight and nothing more may be asked: no
            // message from any receiver for `max_wait_ms`.
            return ControlFlow::Break(self.ended(EndReason::Idle));
        }
        ControlFlow::Continue(())
    }

    /// Waits for the next call to come back, the journal's write to land,
    /// the pending receives to fall due, the end of a pause, or a
    /// cancellation (which ends the loop).
    async fn next_event(&mut self, now: Instant) -> Step<Event> {
        let pause = self.clock.pause_until.filter(|t| *t > now);
        let due = self.durable.due_at();
        let joined = tokio::select! {
            // Calls in flight are left to finish and handed back.
            _ = self.receive.cancel.cancelled() => {
                return ControlFlow::Break(Ok(self.summary(EndReason::Cancelled)));
            }
            outcome = self.durable.landing(), if self.durable.is_writing() => {
                return ControlFlow::Continue(Event::Landed(outcome));
            }
            _ = tokio::time::sleep_until(due.unwrap_or(now)), if due.is_some() => {
                return ControlFlow::Continue(Event::Due);
            }
            _ = tokio::time::sleep_until(pause.unwrap_or(now)), if pause.is_some() => {
                self.clock.pause_until = None;
                return ControlFlow::Continue(Event::PauseOver);
            }
            Some(joined) = self.calls.set.join_next() => joined,
        };
        match joined {
            Ok(answer) => ControlFlow::Continue(Event::Answer(answer)),
            Err(e) => ControlFlow::Break(Err(Error::Internal(format!("receive task: {e}")))),
        }
    }

    /// Takes a call's answer: what it received, `None` when there is
    /// nothing to record (an empty receive, or an `OverLimit` refusal the
    /// loop waits out), or the end of the loop.
    fn take_answer(
        &mut self,
        call: &Call,
        result: Result<Vec<Received>, SqsError>,
    ) -> Step<Option<Vec<Received>>> {
        let received = match result {
            Ok(received) => {
                self.refused = None;
                received
            }
            Err(e) if e.is_over_limit() => return self.over_limit(call, e),
            // The endpoint pushed back past the call's retries: a loop
            // that recorded something ends with it, as if full, and
            // its window has narrowed for the next one.
            Err(e) if e.is_push_back() && self.done.messages > 0 => {
                self.calls.finished(call, 0);
                tracing::info!(table = %self.receive.table.name(), error = %e, messages = self.done.messages,
                    "SQS pushed back a receive; the loop ends with what it received");
                return ControlFlow::Break(Ok(self.summary(EndReason::PushedBack)));
            }
            Err(e) => return ControlFlow::Break(Err(Error::sqs(self.receive.table.name(), e))),
        };
        self.calls.finished(call, received.len());
        self.done.receives += 1;
        if received.is_empty() {
            if call.wait.is_zero() && !call.left.is_zero() {
                self.clock.pause_until = Some(Instant::now() + call.left.min(SHORT_POLL_PAUSE));
            }
            return ControlFlow::Continue(None);
        }
        ControlFlow::Continue(Some(received))
    }

    /// A receive SQS refused for the queue's in-flight cap: the loop ends
    /// if it recorded something (as if full) or the registry started it;
    /// a consumer's first read that recorded nothing pauses and tries
    /// again.
    fn over_limit(&mut self, call: &Call, e: SqsError) -> Step<Option<Vec<Received>>> {
        self.calls.finished(call, 0);
        self.done.receives += 1;
        self.receive.on_over_limit(self.refused.is_none());
        if self.done.messages > 0 {
            return ControlFlow::Break(Ok(self.summary(EndReason::OverLimit)));
        }
        if self.receive.background {
            let error = Error::sqs(self.receive.table.name(), explained(e));
            return ControlFlow::Break(Err(error));
        }
        let now = Instant::now();
        let left = self
            .clock
            .idle_until
            .min(self.clock.end_by)
            .saturating_duration_since(now);
        self.clock.pause_until = Some(now + left.min(OVER_LIMIT_PAUSE));
        self.refused = Some(e);
        ControlFlow::Continue(None)
    }

    /// Records the messages a call brought, after issuing the next calls;
    /// ends the loop when the receive filled `max_bytes` or found the
    /// ticket closed.
    async fn record_answer(&mut self, call: Call, received: Vec<Received>) -> Step {
        let p = self.receive.batch.params;
        let now = Instant::now();
        self.clock.idle_until = now + Duration::from_millis(p.max_wait_ms);
        // Messages came: a pause between empty short polls no longer applies.
        self.clock.pause_until = None;
        let visible_until = call.issued + self.vt;
        // Issue the next calls now, unless this receive ends the loop.
        let after = Progress {
            messages: self.done.messages + received.len() as u64,
            bytes: self.done.bytes
                + received
                    .iter()
                    .map(|r| r.message.size() as u64)
                    .sum::<u64>(),
            receives: self.done.receives,
        };
        // A full registry stops new calls; the loop ends once none is in flight.
        let _ = self.refill(&after, now);
        let span = Span {
            issued: call.issued,
            answered: now,
        };
        let recorded = self
            .receive
            .record(
                received,
                &mut self.done,
                &mut self.durable,
                span,
                visible_until,
            )
            .await;
        drop(call); // recorded or handed back: no longer counted as receiving
        let recorded = match recorded {
            Ok(recorded) => recorded,
            Err(e) => return ControlFlow::Break(Err(e)),
        };
        if !self.receive.background {
            let id = self.receive.ticket.id();
            self.receive.registry.touch(&id.table, &id.consumer);
        }
        match recorded {
            Recorded::Yes => self.flush_if_due().await,
            Recorded::Full => ControlFlow::Break(Ok(self.summary(EndReason::MaxBytes))),
            Recorded::Closed => ControlFlow::Break(Ok(self.summary(EndReason::Closed))),
        }
    }

    /// What a loop that ran out of time (`max_wait_ms` or
    /// `max_duration_ms`) answers: its summary, or, when it recorded
    /// nothing and SQS refused its receives for the in-flight cap, that
    /// refusal.
    fn ended(&mut self, reason: EndReason) -> Result<ReceiveSummary> {
        let summary = self.summary(reason);
        match self.refused.take() {
            Some(e) if summary.messages == 0 => {
                Err(Error::sqs(self.receive.table.name(), explained(e)))
            }
            _ => Ok(summary),
        }
    }

    /// Issues calls until `target` are in flight, each asking for no more
    /// than `max_messages` minus what was received or is asked for already
    /// (`done`), none after the idle or duration deadline or during a
    /// pause. Fails when the registry is full.
    fn refill(&mut self, done: &Progress, now: Instant) -> Result<()> {
        let p = self.receive.batch.params;
        let clock = &self.clock;
        // The first call goes out whatever the deadlines (a `max_wait_ms`
        // of 0 is one short poll); later ones only before them.
        let first = done.receives == 0 && self.calls.in_flight() == 0;
        let late = now > clock.idle_until || now >= clock.end_by;
        if (late && !first) || clock.pause_until.is_some_and(|t| now < t) {
            return Ok(());
        }
        // No more than the endpoint's window allows in flight, all its
        // calls together (see `crate::sqs::congestion`).
        let width = self
            .calls
            .target()
            .min(self.receive.table.sqs_window().unwrap_or(usize::MAX));
        while self.calls.in_flight() < width.max(1) {
            let want = p
                .max_messages
                .saturating_sub(done.messages + self.calls.asked);
            if want == 0 || done.bytes >= p.max_bytes {
                break;
            }
            self.receive.registry.check_budget()?;
            let idle_left = self.clock.idle_until.saturating_duration_since(now);
            let duration_left = self.clock.end_by.saturating_duration_since(now);
            let req = ReceiveRequest {
                max_messages: want.min(SQS_BATCH as u64) as usize,
                wait: long_poll(idle_left, duration_left),
                visibility_timeout: self.vt,
            };
            self.issue(req, idle_left.min(duration_left));
        }
        Ok(())
    }

    /// Starts one ReceiveMessage call in a task of its own.
    fn issue(&mut self, req: ReceiveRequest, left: Duration) {
        let table = Arc::clone(&self.receive.table);
        let call = Call {
            issued: Instant::now(),
            took: Duration::ZERO,
            wait: req.wait,
            left,
            asked: req.max_messages as u64,
            _counted: Some(table.receive_call(&self.receive.ticket.id().consumer)),
        };
        self.calls.asked += call.asked;
        self.calls.set.spawn(async move {
            let mut call = call;
            let result = table.receive(req).await;
            call.took = call.issued.elapsed();
            (call, result)
        });
    }
}
