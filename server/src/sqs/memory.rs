//! The embedded in-memory queue: the demo backend and the unit tests' queue.
//!
//! It keeps SQS's receive semantics: a received message is invisible for its
//! visibility timeout, each receive issues a new receipt handle and only the
//! latest handle deletes or changes the message, and the receive count and
//! first-receive time are tracked. It is not a stand-in for SQS in the
//! integration tests, which run against real SQS-compatible servers.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::FutureExt;
use futures::future::BoxFuture;
use sqs_flight_schemas::SqsMessage;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::{
    BatchOutcome, FailedEntry, OutgoingMessage, Queue, QueueAttributes, ReceiptHandle,
    ReceiveRequest, Received, SqsError,
};

/// Visibility timeout of the embedded queue, like SQS's default.
pub const MEMORY_VISIBILITY_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a waiting receive looks for messages whose timeout ran out.
const POLL: Duration = Duration::from_millis(50);
/// The error code SQS gives for a stale or unknown receipt handle.
const INVALID_RECEIPT: &str = "ReceiptHandleIsInvalid";

struct Stored {
    message: SqsMessage,
    visible_at: Instant,
    /// The handle of the latest receive; only it deletes the message.
    receipt: Option<String>,
}

#[derive(Default)]
struct State {
    messages: VecDeque<Stored>,
    next_id: u64,
    receives: u64,
}

/// An in-memory standard queue.
pub struct MemoryQueue {
    name: String,
    state: Mutex<State>,
    arrived: Notify,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl MemoryQueue {
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            state: Mutex::new(State::default()),
            arrived: Notify::new(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A poisoned lock only means a panic elsewhere; the data is still whole.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends one message with `attributes` (name, text value).
    pub fn send(&self, body: impl Into<String>, attributes: Vec<(String, String)>) -> String {
        let mut st = self.state();
        st.next_id += 1;
        let id = format!("{}-{:08}", self.name, st.next_id);
        st.messages.push_back(Stored {
            message: SqsMessage {
                message_id: id.clone(),
                body: body.into(),
                sent_timestamp: Some(now_ms()),
                sender_id: Some("sqs-flight-embedded".into()),
                message_attributes: attributes,
                ..SqsMessage::default()
            },
            visible_at: Instant::now(),
            receipt: None,
        });
        drop(st);
        self.arrived.notify_waiters();
        id
    }

    fn take_visible(&self, max: usize, visibility: Duration) -> Vec<Received> {
        let now = Instant::now();
        let mut st = self.state();
        let State {
            messages, receives, ..
        } = &mut *st;
        let mut out = Vec::new();
        for stored in messages
            .iter_mut()
            .filter(|s| s.visible_at <= now)
            .take(max)
        {
            *receives += 1;
            let handle = format!("{}#{}", stored.message.message_id, receives);
            stored.receipt = Some(handle.clone());
            stored.visible_at = now + visibility;
            let m = &mut stored.message;
            m.receive_count = Some(m.receive_count.unwrap_or(0) + 1);
            m.first_receive_timestamp.get_or_insert_with(now_ms);
            out.push(Received {
                message: m.clone(),
                receipt: ReceiptHandle::new(handle),
            });
        }
        out
    }

    fn apply(
        &self,
        receipts: &[ReceiptHandle],
        op: impl Fn(&mut State, usize) -> bool,
    ) -> BatchOutcome {
        let mut st = self.state();
        let mut outcome = BatchOutcome::default();
        for (i, r) in receipts.iter().enumerate() {
            let pos = st
                .messages
                .iter()
                .position(|s| s.receipt.as_deref() == Some(r.expose()));
            match pos {
                Some(p) if op(&mut st, p) => outcome.succeeded.push(i),
                _ => outcome.failed.push(FailedEntry {
                    index: i,
                    code: INVALID_RECEIPT.into(),
                    sender_fault: true,
                }),
            }
        }
        outcome
    }
}

impl Queue for MemoryQueue {
    fn receive(&self, req: ReceiveRequest) -> BoxFuture<'_, Result<Vec<Received>, SqsError>> {
        async move {
            let deadline = Instant::now() + req.wait;
            loop {
                let notified = self.arrived.notified();
                let got = self.take_visible(req.max_messages, req.visibility_timeout);
                let now = Instant::now();
                if !got.is_empty() || now >= deadline {
                    return Ok(got);
                }
                let _ = tokio::time::timeout((deadline - now).min(POLL), notified).await;
            }
        }
        .boxed()
    }

    fn delete_batch(
        &self,
        receipts: Vec<ReceiptHandle>,
    ) -> BoxFuture<'_, Result<BatchOutcome, SqsError>> {
        let outcome = self.apply(&receipts, |st, p| st.messages.remove(p).is_some());
        async move { Ok(outcome) }.boxed()
    }

    fn change_visibility_batch(
        &self,
        receipts: Vec<ReceiptHandle>,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<BatchOutcome, SqsError>> {
        let now = Instant::now();
        let outcome = self.apply(&receipts, |st, p| {
            let s = &mut st.messages[p];
            if s.visible_at <= now {
                return false; // the receive expired: SQS refuses the handle
            }
            s.visible_at = now + timeout;
            true
        });
        if timeout.is_zero() {
            self.arrived.notify_waiters();
        }
        async move { Ok(outcome) }.boxed()
    }

    fn send_batch(
        &self,
        messages: Vec<OutgoingMessage>,
    ) -> BoxFuture<'_, Result<BatchOutcome, SqsError>> {
        let succeeded = messages
            .into_iter()
            .enumerate()
            .map(|(i, m)| {
                self.send(m.body, m.attributes);
                i
            })
            .collect();
        async move {
            Ok(BatchOutcome {
                succeeded,
                failed: Vec::new(),
            })
        }
        .boxed()
    }

    fn is_fifo(&self) -> bool {
        false
    }

    fn attributes(&self) -> BoxFuture<'_, Result<QueueAttributes, SqsError>> {
        let now = Instant::now();
        let st = self.state();
        let visible = st.messages.iter().filter(|s| s.visible_at <= now).count() as u64;
        let attrs = QueueAttributes {
            visible,
            in_flight: st.messages.len() as u64 - visible,
            visibility_timeout: MEMORY_VISIBILITY_TIMEOUT,
        };
        async move { Ok(attrs) }.boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(n: usize, vt_ms: u64) -> ReceiveRequest {
        ReceiveRequest {
            max_messages: n,
            wait: Duration::ZERO,
            visibility_timeout: Duration::from_millis(vt_ms),
        }
    }

    #[tokio::test]
    async fn received_messages_are_hidden_until_their_timeout() {
        let q = MemoryQueue::new("t");
        for i in 0..3 {
            q.send(format!("m{i}"), vec![]);
        }
        let first = q.receive(req(2, 200)).await.unwrap();
        assert_eq!(first.len(), 2);
        let rest = q.receive(req(10, 200)).await.unwrap();
        assert_eq!(rest.len(), 1);
        assert!(q.receive(req(10, 200)).await.unwrap().is_empty());
        tokio::time::sleep(Duration::from_millis(250)).await;
        let again = q.receive(req(10, 200)).await.unwrap();
        assert_eq!(again.len(), 3);
        assert_eq!(again[0].message.receive_count, Some(2));
        // The first receive's handles are stale now.
        let stale: Vec<_> = first.iter().map(|r| r.receipt.clone()).collect();
        let out = q.delete_batch(stale).await.unwrap();
        assert_eq!(out.failed.len(), 2);
        let fresh: Vec<_> = again.iter().map(|r| r.receipt.clone()).collect();
        let out = q.delete_batch(fresh).await.unwrap();
        assert_eq!(out.succeeded, vec![0, 1, 2]);
        assert_eq!(q.attributes().await.unwrap().visible, 0);
        assert_eq!(q.attributes().await.unwrap().in_flight, 0);
    }

    #[tokio::test]
    async fn change_visibility_to_zero_releases() {
        let q = MemoryQueue::new("t");
        q.send("a", vec![]);
        let got = q.receive(req(10, 60_000)).await.unwrap();
        assert_eq!(q.attributes().await.unwrap().in_flight, 1);
        let receipts = got.iter().map(|r| r.receipt.clone()).collect();
        q.change_visibility_batch(receipts, Duration::ZERO)
            .await
            .unwrap();
        assert_eq!(q.attributes().await.unwrap().visible, 1);
    }

    #[tokio::test]
    async fn long_poll_wakes_on_send() {
        let q = std::sync::Arc::new(MemoryQueue::new("t"));
        let q2 = q.clone();
        let waiter = tokio::spawn(async move {
            q2.receive(ReceiveRequest {
                max_messages: 10,
                wait: Duration::from_secs(5),
                visibility_timeout: Duration::from_secs(30),
            })
            .await
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        q.send("late", vec![]);
        let got = tokio::time::timeout(Duration::from_secs(2), waiter)
            .await
            .expect("long poll returns when a message arrives")
            .unwrap()
            .unwrap();
        assert_eq!(got.len(), 1);
    }
}
