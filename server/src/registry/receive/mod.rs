//! The receive loop of a ticket's first read.
//!
//! It long-polls SQS with up to `receivers` ReceiveMessage calls in flight
//! (see [`Calls`]: one call first, more while receives come back full,
//! fewer when they bring less than they asked for), converts each receive
//! into a record batch, and records rows and receipts in the ticket's log
//! *before* any reader streams them, one receive at a time, in the order
//! the calls come back. The calls in flight never ask for more than
//! `max_messages` minus what was received.
//!
//! It ends at the first of: `max_messages`, `max_bytes`, `max_wait_ms`
//! without a message from any call, `max_duration_ms`, cancellation (the
//! client hung up, or the server stops), SQS's in-flight cap, a receive
//! the endpoint pushed back past its retries once something was recorded
//! (throttling, 503, no connection: see [`crate::sqs::congestion`]), or an
//! error. The calls in flight are never more than the endpoint's window.
//! The log is sealed however it ends, except when the loop ends by an
//! error, a hang-up or the cap before it recorded anything: then the
//! ticket stays fresh and the next read receives.
//!
//! SQS refuses a ReceiveMessage with `OverLimit` while the queue holds as
//! many messages in flight as it allows (120,000 for a standard queue).
//! A loop that recorded something then ends as if full; a loop the
//! registry started (read-ahead, `receive_at_plan`) that recorded nothing
//! ends at once, leaving the ticket fresh. A
//! consumer's first read that recorded nothing has the registry give back
//! the batches received ahead of the table's consumers (messages in flight
//! nobody asked for yet) and tries again every [`OVER_LIMIT_PAUSE`] until
//! `max_wait_ms` passes without a message; then it fails UNAVAILABLE.
//!
//! Calls still in flight when the loop ends are never aborted: SQS may
//! already have handed them messages, which an aborted call would leave
//! hidden for a whole visibility timeout. They are left to finish (each
//! long-polls no longer than `max_wait_ms` rounded up to a second, at most
//! 20 s) in a task of the registry's, and what they bring goes back to SQS
//! at once (visibility 0), unrecorded; so does anything received past
//! `max_bytes`. Whatever SQS delivered is thus either recorded in the
//! ticket (held by its consumer) or visible again. A stopping server waits
//! for those calls up to `--shutdown-grace`, at most 5 s (see
//! [`Registry::settle`]).
//!
//! With `--state-dir` or `--state-url`, each receive's rows and receipts
//! are written to the store before they are recorded (and so before anyone
//! streams them), while the loop goes on receiving (see [`durable`]: one
//! write in flight, carrying every receive that waited for it), and the
//! seal is written before the log is sealed. Both carry the ticket's
//! plan id, and the store writes neither once its batch was released or
//! planned again, so a restart never adopts what a released plan received.

mod calls;
mod durable;
mod record;
mod state;

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use self::calls::width_at;
use self::calls::{CallResult, Calls, Width};
use self::state::{Finished, LoopState};
use super::backlog::DEPTH_MAX_AGE;
use super::dedup::{self, Key, Span};
use super::store;
use super::ticket::Ticket;
use super::{PlannedBatch, Registry, Table};
use crate::error::{Error, Result};
use crate::sqs::{MAX_WAIT_SECONDS, ReceiptHandle, SqsError};

/// Pause between short polls when less than a second of waiting is left.
const SHORT_POLL_PAUSE: Duration = Duration::from_millis(50);

/// Pause before a first read that recorded nothing tries again after SQS
/// refused a receive for the queue's in-flight cap (`OverLimit`).
const OVER_LIMIT_PAUSE: Duration = Duration::from_secs(1);

/// Why a receive loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndReason {
    MaxMessages,
    MaxBytes,
    Idle,
    Duration,
    Cancelled,
    Closed,
    /// SQS refused a receive for the queue's in-flight cap (`OverLimit`).
    OverLimit,
    /// The endpoint pushed a receive back past its retries (throttling,
    /// 503, no connection) after the loop had recorded messages.
    PushedBack,
}

/// What one receive loop did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceiveSummary {
    pub(super) messages: u64,
    pub(super) bytes: u64,
    pub(super) reason: EndReason,
}

/// Seals the ticket if the loop is dropped half way (abort or panic).
struct SealOnDrop(Option<Arc<Ticket>>);

impl Drop for SealOnDrop {
    fn drop(&mut self) {
        if let Some(t) = self.0.take() {
            t.seal();
        }
    }
}

/// Milliseconds since the Unix epoch at `at`.
fn unix_ms(at: Instant) -> u64 {
    let wall = std::time::SystemTime::now() + at.saturating_duration_since(Instant::now());
    wall.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The receive loop of one ticket's first read, with everything it needs.
/// (Not to be confused with the plan field `receivers`: the ReceiveMessage
/// calls one loop keeps in flight, see [`Calls`].)
pub struct ReceiveLoop {
    pub(super) registry: Arc<Registry>,
    pub(super) table: Arc<Table>,
    pub(super) batch: Arc<PlannedBatch>,
    pub(super) ticket: Arc<Ticket>,
    pub(super) cancel: CancellationToken,
    /// Started by the registry (read-ahead, or a plan with
    /// `receive_at_plan`: see [`super::ahead`]), not by a read of the
    /// consumer's: it does not renew the consumer's lease.
    pub(super) background: bool,
}

/// The long-poll time of the next receive: the idle time left rounded *up*
/// to SQS's whole seconds (a 1 s `max_wait_ms` must long-poll, not spin on
/// short polls that SQS bills one by one), but never past the duration
/// limit, which is rounded down.
fn long_poll(idle_left: Duration, duration_left: Duration) -> Duration {
    let idle = idle_left.as_millis().div_ceil(1000) as u64;
    let secs = idle.min(duration_left.as_secs()).min(MAX_WAIT_SECONDS);
    Duration::from_secs(secs)
}

/// What became of one receive.
enum Recorded {
    Yes,
    /// Recorded up to `max_bytes`; the rest went back.
    Full,
    /// The ticket was closed: everything went back.
    Closed,
}

/// What one receive loop received so far.
#[derive(Clone, Copy)]
struct Progress {
    messages: u64,
    bytes: u64,
    receives: u64,
}

impl ReceiveLoop {
    /// Runs the loop to its end; the ticket is sealed afterwards, or left
    /// fresh if the loop failed or was cancelled before recording anything.
    pub async fn run(self) -> Result<ReceiveSummary> {
        // The registry waits for this loop (and the calls it leaves in
        // flight) when the server stops.
        let _tracked = self.registry.background.receiving().token();
        let mut seal = SealOnDrop(Some(Arc::clone(&self.ticket)));
        let width = Width::new(
            self.batch.params.receivers,
            self.table.warm_receivers(),
            self.table.depth_within(DEPTH_MAX_AGE),
        );
        let mut calls = Calls::new(width);
        let Finished {
            end: result,
            sealed,
        } = self.receive_loop(&mut calls).await;
        if let Some(width) = calls.ending() {
            self.table.keep_warm_receivers(width);
        }
        self.hand_back_in_flight(calls.set);
        seal.0 = None;
        let nothing = match &result {
            Ok(s) => s.messages == 0 && s.reason == EndReason::Cancelled,
            Err(_) => true,
        };
        if nothing && self.ticket.recorded_chunks() == 0 {
            let error = match &result {
                Err(e) => e,
                Ok(_) => &Error::Internal(
                    "the first read of this ticket ended before it received anything; read it again".into(),
                ),
            };
            if self.ticket.fail(error) {
                return result;
            }
        }
        // Unless written with the loop's last receives.
        if !sealed {
            let seal = || {
                Ok(vec![store::Op::Seal {
                    id: self.ticket.id().clone(),
                }])
            };
            if let Err(e) = self.registry.journal.write(seal).await {
                tracing::warn!(error = %e, "could not write a ticket's seal; after a restart it replays what it recorded");
            }
        }
        self.ticket.seal();
        self.registry.read_ahead_after(&self.table, &self.ticket);
        result
    }

    /// Lets the calls still in flight when the loop ended (at `max_bytes`,
    /// the duration limit, an error or a cancellation) finish, in a task
    /// the registry tracks, and hands back what each brings as it comes:
    /// it will not be recorded. Each long-polls no longer than the loop had
    /// left when it was issued. They are never aborted: SQS may have handed
    /// them messages already.
    fn hand_back_in_flight(&self, mut set: JoinSet<CallResult>) {
        if set.is_empty() {
            return;
        }
        let table = Arc::clone(&self.table);
        let registry = Arc::clone(&self.registry);
        self.registry.background.receiving().spawn(async move {
            while let Some(done) = set.join_next().await {
                if let Ok((call, Ok(received))) = done {
                    let keys: Vec<Key> = received
                        .iter()
                        .map(|r| dedup::key(&r.message.message_id))
                        .collect();
                    let receipts = received.into_iter().map(|r| r.receipt).collect();
                    let mut renewed = Vec::new();
                    let span = Span {
                        issued: call.issued,
                        answered: Instant::now(),
                    };
                    let sorted = table
                        .dedup()
                        .unrecorded(&keys, receipts, span, &mut renewed);
                    let m = &registry.metrics;
                    m.duplicates(table.name(), "held", sorted.held);
                    m.duplicates(table.name(), "committed", sorted.delete.len() as u64);
                    journal_renewed(&registry, &table, renewed).await;
                    tracing::debug!(table = %table.name(), messages = sorted.give_back.len(),
                        "handing back what a call in flight brought after its loop ended");
                    hand_back(&table, sorted.give_back).await;
                    delete_again(&table, sorted.delete).await;
                }
            }
        });
    }

    /// The loop. Up to `receivers` ReceiveMessage calls are in flight at
    /// once (see [`Calls`]); their results are recorded one at a time, in
    /// the order they come back, so the ticket's log has one order that
    /// every replay repeats. The next calls are issued before a receive is
    /// converted, so SQS's round trips overlap that work, and the state
    /// store's writes overlap both; the loop returns once what it kept is
    /// written and recorded. Calls still in flight when it returns are left
    /// in `calls`. Its state and the steps of each turn are
    /// [`LoopState`]'s.
    async fn receive_loop(&self, calls: &mut Calls) -> Finished {
        let mut state = match LoopState::start(self, calls).await {
            Ok(state) => state,
            Err(e) => {
                return Finished {
                    end: Err(e),
                    sealed: false,
                };
            }
        };
        let end = loop {
            if let ControlFlow::Break(end) = state.turn().await {
                break end;
            }
        };
        state.finish(end).await
    }

    /// Reacts to a receive SQS refused for the queue's in-flight cap: logs
    /// it (at info the loop's `first` time) and, for a consumer's read,
    /// gives back the batches received ahead of the table's consumers.
    fn on_over_limit(&self, first: bool) {
        let id = self.ticket.id();
        if first {
            tracing::info!(table = %id.table, consumer = %id.consumer, batch = id.batch,
                partition = id.partition, ahead = self.background,
                "SQS refused a receive: the queue is at its in-flight cap (OverLimit)");
        }
        if !self.background {
            let why = format!("the queue of table {:?} is at its in-flight cap", id.table);
            self.registry.evict_ahead(|k| k.0 == id.table, &why);
        }
    }
}

/// An `OverLimit` refusal, its message saying what it means.
fn explained(e: SqsError) -> SqsError {
    match e {
        SqsError::Service {
            operation,
            code,
            message,
        } => SqsError::Service {
            operation,
            code,
            message: format!(
                "{message}; the queue holds as many messages in flight as SQS allows \
                 (120,000 for a standard queue): commit or release batches, or read fewer at once"
            ),
        },
        other => other,
    }
}

/// Deletes again messages SQS delivered after a commit deleted them.
async fn delete_again(table: &Table, receipts: Vec<ReceiptHandle>) {
    if receipts.is_empty() {
        return;
    }
    tracing::debug!(table = %table.name(), messages = receipts.len(),
        "deleting again what SQS delivered after a commit deleted it");
    let out = table.delete(receipts).await;
    if let Some(e) = out.error {
        tracing::warn!(table = %table.name(), error = %e,
            "could not delete again a message committed lately; it is dropped again when it comes back within the window");
    }
}

/// Writes the receipts held rows took (see [`super::dedup`]) to the
/// registry's journal, after they were taken. A failure is logged: after a
/// restart such a row has its older receipt, which SQS no longer acts on,
/// and the message comes back as a duplicate the restored held ids drop
/// again.
async fn journal_renewed(registry: &Registry, table: &Table, renewed: Vec<dedup::Renewed>) {
    if renewed.is_empty() {
        return;
    }
    let ops = || {
        Ok(renewed
            .into_iter()
            .map(|r| store::Op::Renew {
                id: r.id,
                seq: r.seq,
                offset: r.offset,
                receipt: r.receipt,
            })
            .collect())
    };
    if let Err(e) = registry.journal.write(ops).await {
        tracing::warn!(table = %table.name(), error = %e,
            "could not write renewed receipts to the state store");
    }
}

/// Makes unrecorded messages visible again now.
async fn hand_back(table: &Table, receipts: Vec<crate::sqs::ReceiptHandle>) {
    if receipts.is_empty() {
        return;
    }
    let out = table.hand_back_unrecorded(receipts).await;
    if let Some(e) = out.error {
        tracing::warn!(table = %table.name(), error = %e,
            "could not hand unrecorded messages back; they reappear after their visibility timeout");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_polls_round_idle_up_and_duration_down() {
        let ms = Duration::from_millis;
        assert_eq!(long_poll(ms(1000), ms(30_000)), Duration::from_secs(1));
        assert_eq!(long_poll(ms(300), ms(30_000)), Duration::from_secs(1));
        assert_eq!(long_poll(ms(2500), ms(30_000)), Duration::from_secs(3));
        assert_eq!(long_poll(ms(20_000), ms(900)), Duration::ZERO);
        assert_eq!(long_poll(ms(60_000), ms(60_000)), Duration::from_secs(20));
        assert_eq!(long_poll(Duration::ZERO, ms(30_000)), Duration::ZERO);
    }
}
