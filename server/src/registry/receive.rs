//! The receive loop of a ticket's first read.
//!
//! It long-polls SQS, converts each receive into a record batch, and records
//! rows and receipts in the ticket's log *before* any reader streams them.
//! It ends at the first of: `max_messages`, `max_bytes`, `max_wait_ms`
//! without a message, `max_duration_ms`, cancellation (the client hung up),
//! or an error. The log is sealed however it ends, except when the loop
//! ends by an error or a hang-up before it recorded anything: then the
//! ticket stays fresh and the next read receives.
//!
//! With `--state-dir`, each receive's rows and receipts are written to the
//! store before they are recorded (and so before anyone streams them), and
//! the seal is written before the log is sealed.

use std::sync::Arc;
use std::time::Duration;

use sqs_flight_schemas::MessageBatchBuilder;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::store;
use super::ticket::{Closed, Ticket};
use super::{PlannedBatch, Registry, Table};
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::sqs::batching::{self, BulkOp};
use crate::sqs::{MAX_WAIT_SECONDS, ReceiveRequest, Received, SQS_BATCH};

/// Pause between short polls when less than a second of waiting is left.
const SHORT_POLL_PAUSE: Duration = Duration::from_millis(50);

/// Why a receive loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndReason {
    MaxMessages,
    MaxBytes,
    Idle,
    Duration,
    Cancelled,
    Closed,
}

/// What one receive loop did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceiveSummary {
    pub messages: u64,
    pub bytes: u64,
    pub reason: EndReason,
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

/// Everything one receive loop needs.
pub struct Receiver {
    pub registry: Arc<Registry>,
    pub table: Arc<Table>,
    pub batch: Arc<PlannedBatch>,
    pub ticket: Arc<Ticket>,
    pub cancel: CancellationToken,
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

/// A ReceiveMessage call in flight, issued ahead of its turn.
struct Ahead {
    issued: Instant,
    /// Its long-poll time, and the idle time that was left when it was issued.
    wait: Duration,
    left: Duration,
    handle: tokio::task::JoinHandle<Result<Vec<Received>, crate::sqs::SqsError>>,
}

/// What became of one receive.
enum Recorded {
    Yes,
    /// Recorded up to `max_bytes`; the rest went back.
    Full,
    /// The ticket was closed: everything went back.
    Closed,
}

struct Progress {
    messages: u64,
    bytes: u64,
    receives: u64,
}

impl Receiver {
    /// Runs the loop to its end; the ticket is sealed afterwards, or left
    /// fresh if the loop failed or was cancelled before recording anything.
    pub async fn run(self) -> Result<ReceiveSummary> {
        let mut seal = SealOnDrop(Some(Arc::clone(&self.ticket)));
        let result = self.receive().await;
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
        if let Some(store) = &self.registry.store {
            let op = store::Op::Seal {
                id: self.ticket.id.clone(),
            };
            if let Err(e) = store::apply(store, vec![op]).await {
                tracing::warn!(error = %e, "could not write a ticket's seal; after a restart it replays what it recorded");
            }
        }
        self.ticket.seal();
        result
    }

    async fn receive(&self) -> Result<ReceiveSummary> {
        let mut next = None;
        let result = self.receive_loop(&mut next).await;
        // A receive issued ahead whose messages will not be recorded: hand
        // them back (it long-polls no longer than the loop had left).
        if let Some(ahead) = next
            && let Ok(Ok(received)) = ahead.handle.await
        {
            self.give_back(received.into_iter().map(|r| r.receipt).collect())
                .await;
        }
        result
    }

    /// Starts one ReceiveMessage call in a task of its own.
    fn issue(&self, req: ReceiveRequest, left: Duration) -> Ahead {
        let table = Arc::clone(&self.table);
        Ahead {
            issued: Instant::now(),
            wait: req.wait,
            left,
            handle: tokio::spawn(async move { table.queue.receive(req).await }),
        }
    }

    /// The loop. The next ReceiveMessage is issued before a receive is
    /// converted and recorded (written to the state store too), so the
    /// round trip to SQS overlaps that work; at most one call is in flight.
    /// A call issued ahead and not consumed is left in `next`.
    async fn receive_loop(&self, next: &mut Option<Ahead>) -> Result<ReceiveSummary> {
        let vt = self.table.visibility_timeout().await?;
        let p = self.batch.params;
        let start = Instant::now();
        let end_by = start + Duration::from_millis(p.max_duration_ms);
        let mut idle_until = start + Duration::from_millis(p.max_wait_ms);
        let mut done = Progress {
            messages: 0,
            bytes: 0,
            receives: 0,
        };
        let summary = |done: &Progress, reason| ReceiveSummary {
            messages: done.messages,
            bytes: done.bytes,
            reason,
        };
        let request = |done: &Progress, now: Instant, idle_until: Instant| {
            let want = (p.max_messages - done.messages).min(SQS_BATCH as u64) as usize;
            let left = idle_until.min(end_by).saturating_duration_since(now);
            let wait = long_poll(
                idle_until.saturating_duration_since(now),
                end_by.saturating_duration_since(now),
            );
            let req = ReceiveRequest {
                max_messages: want,
                wait,
                visibility_timeout: vt,
            };
            (req, left)
        };
        loop {
            if done.messages >= p.max_messages {
                return Ok(summary(&done, EndReason::MaxMessages));
            }
            if done.bytes >= p.max_bytes {
                return Ok(summary(&done, EndReason::MaxBytes));
            }
            let now = Instant::now();
            if done.receives > 0 && now >= end_by {
                return Ok(summary(&done, EndReason::Duration));
            }
            if done.receives > 0 && now >= idle_until && next.is_none() {
                return Ok(summary(&done, EndReason::Idle));
            }
            if let Err(e) = self.registry.check_budget() {
                if done.messages == 0 {
                    return Err(e);
                }
                return Ok(summary(&done, EndReason::MaxBytes));
            }
            let mut ahead = match next.take() {
                Some(ahead) => ahead,
                None => {
                    let (req, left) = request(&done, now, idle_until);
                    self.issue(req, left)
                }
            };
            let received = tokio::select! {
                _ = self.cancel.cancelled() => {
                    ahead.handle.abort();
                    return Ok(summary(&done, EndReason::Cancelled));
                }
                r = &mut ahead.handle => r
                    .map_err(|e| Error::Internal(format!("receive task: {e}")))?
                    .map_err(|e| Error::sqs(self.table.name(), e))?,
            };
            done.receives += 1;
            if received.is_empty() {
                if ahead.wait.is_zero() && !ahead.left.is_zero() {
                    let pause = ahead.left.min(SHORT_POLL_PAUSE);
                    tokio::select! {
                        _ = self.cancel.cancelled() => return Ok(summary(&done, EndReason::Cancelled)),
                        _ = tokio::time::sleep(pause) => {}
                    }
                }
                continue;
            }
            let now = Instant::now();
            idle_until = now + Duration::from_millis(p.max_wait_ms);
            let visible_until = ahead.issued + vt;
            // Issue the next receive now, unless this one ends the loop.
            let count = received.len() as u64;
            let size: u64 = received.iter().map(|r| r.message.size() as u64).sum();
            let after = Progress {
                messages: done.messages + count,
                bytes: done.bytes + size,
                receives: done.receives,
            };
            if after.messages < p.max_messages && after.bytes < p.max_bytes && now < end_by {
                let (req, left) = request(&after, now, idle_until);
                *next = Some(self.issue(req, left));
            }
            let recorded = self.record(received, &mut done, visible_until).await?;
            self.registry
                .touch(&self.ticket.id.table, &self.ticket.id.consumer);
            match recorded {
                Recorded::Yes => {}
                Recorded::Full => return Ok(summary(&done, EndReason::MaxBytes)),
                Recorded::Closed => return Ok(summary(&done, EndReason::Closed)),
            }
        }
    }

    /// Records one receive. Messages past `max_bytes` are handed back to
    /// SQS unrecorded (the first message of a stream is always kept, so one
    /// large message cannot stall a partition); so is everything when the
    /// ticket was closed meanwhile (its batch committed or released).
    async fn record(
        &self,
        received: Vec<Received>,
        done: &mut Progress,
        visible_until: Instant,
    ) -> Result<Recorded> {
        let max_bytes = self.batch.params.max_bytes;
        let mut builder = MessageBatchBuilder::with_capacity(received.len());
        let mut receipts = Vec::with_capacity(received.len());
        let mut overflow = Vec::new();
        let mut bytes = 0u64;
        for r in received {
            let size = r.message.size() as u64;
            let first = done.messages == 0 && receipts.is_empty();
            if !overflow.is_empty() || (!first && done.bytes + bytes + size > max_bytes) {
                overflow.push(r.receipt);
                continue;
            }
            builder.append(&r.message);
            receipts.push(r.receipt);
            bytes += size;
        }
        let id = &self.ticket.id;
        let batch = builder
            .finish(id.batch as i64, id.partition as i32)
            .and_then(|b| match &self.table.payload {
                Some(decoder) => decoder.extend(b),
                None => Ok(b),
            })
            .map_err(|e| Error::Internal(format!("building a record batch: {e}")))?;
        let n = receipts.len() as u64;
        let full = !overflow.is_empty();
        if let Err(e) = self.persist(&batch, &receipts, bytes, visible_until).await {
            let mut back = receipts;
            back.extend(overflow);
            self.give_back(back).await;
            return Err(e);
        }
        match self.ticket.record(batch, receipts, bytes, visible_until) {
            Ok(()) => {
                let m = &self.registry.metrics;
                Metrics::count(&m.received, &id.table, &id.consumer, n);
                self.give_back(overflow).await;
                done.messages += n;
                done.bytes += bytes;
                Ok(if full { Recorded::Full } else { Recorded::Yes })
            }
            Err(Closed(mut back)) => {
                back.extend(overflow);
                self.give_back(back).await;
                Ok(Recorded::Closed)
            }
        }
    }

    /// Writes one receive to the state store, if there is one.
    async fn persist(
        &self,
        batch: &arrow_array::RecordBatch,
        receipts: &[crate::sqs::ReceiptHandle],
        bytes: u64,
        visible_until: Instant,
    ) -> Result<()> {
        let Some(store) = &self.registry.store else {
            return Ok(());
        };
        let op = store::Op::Chunk {
            id: self.ticket.id.clone(),
            seq: self.ticket.recorded_chunks(),
            meta: store::ChunkMeta {
                receipts: receipts.iter().map(|r| r.expose().to_string()).collect(),
                visible_until_ms: unix_ms(visible_until),
                bytes,
            },
            rows: store::encode_rows(batch)?,
        };
        store::apply(store, vec![op]).await
    }

    async fn give_back(&self, receipts: Vec<crate::sqs::ReceiptHandle>) {
        if receipts.is_empty() {
            return;
        }
        let op = BulkOp::ChangeVisibility(Duration::ZERO);
        let out = batching::run(self.table.queue.as_ref(), op, receipts).await;
        if let Some(e) = out.error {
            tracing::warn!(table = %self.table.name(), error = %e,
                "could not hand unrecorded messages back; they reappear after their visibility timeout");
        }
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
