//! The embedded in-memory queue: the demo backend and the unit tests' queue.
//!
//! It keeps SQS's receive semantics: a received message is invisible for its
//! visibility timeout, each receive issues a new receipt handle and only the
//! latest handle deletes or changes the message, the receive count and
//! first-receive time are tracked, and a message sent with a delay is
//! hidden until the delay ends. It is not a stand-in for SQS in the
//! integration tests, which run against real SQS-compatible servers.
//!
//! Every operation costs in proportion to the messages it touches, not to
//! the queue's length: visible messages wait in send order, hidden ones
//! (in flight or delayed) in the order of the time they become visible,
//! and a receipt handle names its message.
//!
//! A simulated round trip ([`MemoryQueue::with_rtt`], a table's `rtt_ms`)
//! makes every call take that much longer, half on the way to the queue and
//! half on the way back, on `tokio::time` (so paused-time tests jump over
//! it). A long poll counts it once: the wait at the queue plus one round
//! trip, as with SQS. Messages sent with [`MemoryQueue::send`] (the seed)
//! pay none.

use std::collections::{BTreeSet, HashMap};
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
pub(crate) const MEMORY_VISIBILITY_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a waiting receive looks for messages whose timeout ran out.
const POLL: Duration = Duration::from_millis(50);
/// The error code SQS gives for a stale or unknown receipt handle.
const INVALID_RECEIPT: &str = "ReceiptHandleIsInvalid";
/// Messages an in-memory queue holds at most (visible, in flight and
/// delayed): the demo table lives in the server's memory, and a DoPut of
/// ten million one-byte rows, inside every DoPut limit, would otherwise
/// keep about 6 GB there (about 580 B a message; 250,000 of them about
/// 145 MB, room for the benches' in-memory runs of 200,000). A send past it
/// fails with [`QUEUE_FULL`].
pub(crate) const MEMORY_QUEUE_MAX_MESSAGES: usize = 250_000;
/// Bytes of bodies and attributes an in-memory queue holds at most.
pub(crate) const MEMORY_QUEUE_MAX_BYTES: usize = 128 << 20;
/// The code of a send refused because the in-memory queue is full.
pub(crate) const QUEUE_FULL: &str = "QueueFull";

struct Stored {
    message: SqsMessage,
    /// When a hidden message becomes visible; its key in `State::hidden`.
    /// Meaningless while the message is visible.
    visible_at: Instant,
    /// The number of the latest receive; only its handle deletes the
    /// message. None until the first receive.
    receipt: Option<u64>,
}

#[derive(Default)]
struct State {
    /// Every message, by sequence number (send order).
    messages: HashMap<u64, Stored>,
    /// Sequence numbers of the visible messages.
    visible: BTreeSet<u64>,
    /// In-flight and delayed messages: (visible again at, sequence number).
    hidden: BTreeSet<(Instant, u64)>,
    /// How many of `hidden` are delayed sends, not receives.
    delayed: u64,
    next_seq: u64,
    receives: u64,
    /// Bytes of the bodies and attributes of `messages`.
    bytes: usize,
}

/// Bytes a message counts against [`MEMORY_QUEUE_MAX_BYTES`].
fn message_bytes(body: &str, attributes: &[(String, String)]) -> usize {
    body.len()
        + attributes
            .iter()
            .map(|(k, v)| k.len() + v.len())
            .sum::<usize>()
}

impl State {
    /// Makes every hidden message whose time came visible.
    fn reveal(&mut self, now: Instant) {
        while let Some(&(at, seq)) = self.hidden.first() {
            if at > now {
                break;
            }
            self.hidden.pop_first();
            if self.messages.get(&seq).is_some_and(|s| s.receipt.is_none()) {
                self.delayed -= 1;
            }
            self.visible.insert(seq);
        }
    }

    /// The message a receipt handle names, if the handle is its latest.
    fn lookup(&self, handle: &str) -> Option<u64> {
        let (seq, receive) = handle.split_once('.')?;
        let (seq, receive) = (seq.parse().ok()?, receive.parse().ok()?);
        let stored = self.messages.get(&seq)?;
        (stored.receipt == Some(receive)).then_some(seq)
    }

    /// Takes message `seq` out of the visible or the hidden set.
    fn unlink(&mut self, seq: u64) {
        if !self.visible.remove(&seq)
            && let Some(s) = self.messages.get(&seq)
        {
            self.hidden.remove(&(s.visible_at, seq));
        }
    }
}

/// An in-memory standard queue.
pub struct MemoryQueue {
    name: String,
    state: Mutex<State>,
    arrived: Notify,
    /// Simulated round trip added to every call.
    rtt: Duration,
}

/// Sleeps `d` on `tokio::time`; nothing at all for zero.
async fn travel(d: Duration) {
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
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
            rtt: Duration::ZERO,
        }
    }

    /// The same queue, each of its calls taking `rtt` longer (whole
    /// milliseconds: half before the call acts, the rest after).
    pub(crate) fn with_rtt(self, rtt: Duration) -> Self {
        Self { rtt, ..self }
    }

    /// One call through the simulated link: half the round trip there,
    /// `act` at the queue (an async block, so it runs only once there),
    /// the rest of the round trip back.
    async fn call<T>(&self, act: impl Future<Output = T>) -> T {
        let there = Duration::from_millis(self.rtt.as_millis() as u64 / 2);
        travel(there).await;
        let out = act.await;
        travel(self.rtt.saturating_sub(there)).await;
        out
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A poisoned lock only means a panic elsewhere; the data is still whole.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends one message with `attributes` (name, text value).
    pub fn send(&self, body: impl Into<String>, attributes: Vec<(String, String)>) -> String {
        self.send_delayed(body.into(), attributes, Duration::ZERO)
    }

    /// Sends one message that stays hidden for `delay`.
    fn send_delayed(
        &self,
        body: String,
        attributes: Vec<(String, String)>,
        delay: Duration,
    ) -> String {
        let now = Instant::now();
        let mut st = self.state();
        st.next_seq += 1;
        let seq = st.next_seq;
        let id = format!("{}-{seq:08}", self.name);
        let visible_at = now + delay;
        st.bytes += message_bytes(&body, &attributes);
        st.messages.insert(
            seq,
            Stored {
                message: SqsMessage {
                    message_id: id.clone(),
                    body,
                    sent_timestamp: Some(now_ms()),
                    sender_id: Some("sqs-flight-embedded".into()),
                    message_attributes: attributes,
                    ..SqsMessage::default()
                },
                visible_at,
                receipt: None,
            },
        );
        if delay.is_zero() {
            st.visible.insert(seq);
        } else {
            st.hidden.insert((visible_at, seq));
            st.delayed += 1;
        }
        drop(st);
        if delay.is_zero() {
            self.arrived.notify_waiters();
        }
        id
    }

    fn take_visible(&self, max: usize, visibility: Duration) -> Vec<Received> {
        let now = Instant::now();
        let mut st = self.state();
        st.reveal(now);
        let visible_at = now + visibility;
        let mut out = Vec::with_capacity(max.min(st.visible.len()));
        while out.len() < max {
            let Some(seq) = st.visible.pop_first() else {
                break;
            };
            st.receives += 1;
            let receive = st.receives;
            st.hidden.insert((visible_at, seq));
            let Some(stored) = st.messages.get_mut(&seq) else {
                continue; // not reachable: the sets only hold stored messages
            };
            stored.receipt = Some(receive);
            stored.visible_at = visible_at;
            let m = &mut stored.message;
            m.receive_count = Some(m.receive_count.unwrap_or(0) + 1);
            m.first_receive_timestamp.get_or_insert_with(now_ms);
            out.push(Received {
                message: m.clone(),
                receipt: ReceiptHandle::new(format!("{seq}.{receive}")),
            });
        }
        out
    }

    fn apply(
        &self,
        receipts: &[ReceiptHandle],
        mut op: impl FnMut(&mut State, u64) -> bool,
    ) -> BatchOutcome {
        let mut st = self.state();
        let mut outcome = BatchOutcome::default();
        for (i, r) in receipts.iter().enumerate() {
            match st.lookup(r.expose()) {
                Some(seq) if op(&mut st, seq) => outcome.succeeded.push(i),
                _ => outcome.failed.push(FailedEntry {
                    index: i,
                    code: INVALID_RECEIPT.into(),
                    sender_fault: true,
                }),
            }
        }
        outcome
    }

    /// Takes up to `req.max_messages` visible messages, waiting up to
    /// `req.wait` for the first ones.
    async fn wait_for_visible(&self, req: ReceiveRequest) -> Vec<Received> {
        let deadline = Instant::now() + req.wait;
        loop {
            let notified = self.arrived.notified();
            let got = self.take_visible(req.max_messages, req.visibility_timeout);
            let now = Instant::now();
            if !got.is_empty() || now >= deadline {
                return got;
            }
            let _ = tokio::time::timeout((deadline - now).min(POLL), notified).await;
        }
    }

    /// Changes the visibility of the messages `receipts` name.
    fn change_visibility(&self, receipts: &[ReceiptHandle], timeout: Duration) -> BatchOutcome {
        let now = Instant::now();
        let outcome = self.apply(receipts, |st, seq| {
            let Some(s) = st.messages.get_mut(&seq) else {
                return false;
            };
            let key = (s.visible_at, seq);
            if s.visible_at <= now || !st.hidden.contains(&key) {
                return false; // the receive expired: SQS refuses the handle
            }
            st.hidden.remove(&key);
            if timeout.is_zero() {
                st.visible.insert(seq);
            } else {
                s.visible_at = now + timeout;
                st.hidden.insert((s.visible_at, seq));
            }
            true
        });
        if timeout.is_zero() {
            self.arrived.notify_waiters();
        }
        outcome
    }

    /// Whether `messages` fit under [`MEMORY_QUEUE_MAX_MESSAGES`] and
    /// [`MEMORY_QUEUE_MAX_BYTES`], else the [`QUEUE_FULL`] refusal (a
    /// service error: UNAVAILABLE to a DoPut, which can send again once
    /// messages were committed).
    fn room_for(&self, messages: &[OutgoingMessage]) -> Result<(), SqsError> {
        let st = self.state();
        let bytes: usize = messages
            .iter()
            .map(|m| message_bytes(&m.body, &m.attributes) + 32)
            .sum();
        if st.messages.len() + messages.len() <= MEMORY_QUEUE_MAX_MESSAGES
            && st.bytes + bytes <= MEMORY_QUEUE_MAX_BYTES
        {
            return Ok(());
        }
        Err(SqsError::Service {
            operation: "SendMessageBatch",
            code: QUEUE_FULL.into(),
            message: format!(
                "the in-memory queue {} is full: it holds {} messages of {} bytes, at most \
                 {MEMORY_QUEUE_MAX_MESSAGES} messages and {MEMORY_QUEUE_MAX_BYTES} bytes; \
                 read and commit some first",
                self.name,
                st.messages.len(),
                st.bytes
            ),
        })
    }

    /// Sends `messages`, each with its delay.
    fn send_all(&self, messages: Vec<OutgoingMessage>) -> BatchOutcome {
        let succeeded = messages
            .into_iter()
            .enumerate()
            .map(|(i, m)| {
                // DoPut checks the delay (0 to 900 s) before it gets here.
                let delay = Duration::from_secs(m.delay_seconds.unwrap_or(0).max(0) as u64);
                let mut attributes = m.attributes;
                if let Some(size) = m.payload_size {
                    let name = crate::large_payload::RESERVED_ATTRIBUTE;
                    attributes.push((name.to_string(), size.to_string()));
                    attributes.sort();
                }
                self.send_delayed(m.body, attributes, delay);
                i
            })
            .collect();
        BatchOutcome {
            succeeded,
            failed: Vec::new(),
        }
    }

    fn counts(&self) -> QueueAttributes {
        let mut st = self.state();
        st.reveal(Instant::now());
        QueueAttributes {
            visible: st.visible.len() as u64,
            in_flight: st.hidden.len() as u64 - st.delayed,
            visibility_timeout: MEMORY_VISIBILITY_TIMEOUT,
        }
    }
}

impl Queue for MemoryQueue {
    fn receive(&self, req: ReceiveRequest) -> BoxFuture<'_, Result<Vec<Received>, SqsError>> {
        self.call(async move { Ok(self.wait_for_visible(req).await) })
            .boxed()
    }

    fn delete_batch(
        &self,
        receipts: Vec<ReceiptHandle>,
    ) -> BoxFuture<'_, Result<BatchOutcome, SqsError>> {
        self.call(async move {
            Ok(self.apply(&receipts, |st, seq| {
                st.unlink(seq);
                let removed = st.messages.remove(&seq);
                if let Some(gone) = &removed {
                    let m = &gone.message;
                    st.bytes -= message_bytes(&m.body, &m.message_attributes);
                }
                removed.is_some()
            }))
        })
        .boxed()
    }

    fn change_visibility_batch(
        &self,
        receipts: Vec<ReceiptHandle>,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<BatchOutcome, SqsError>> {
        self.call(async move { Ok(self.change_visibility(&receipts, timeout)) })
            .boxed()
    }

    fn send_batch(
        &self,
        messages: Vec<OutgoingMessage>,
    ) -> BoxFuture<'_, Result<BatchOutcome, SqsError>> {
        self.call(async move {
            self.room_for(&messages)?;
            Ok(self.send_all(messages))
        })
        .boxed()
    }

    fn is_fifo(&self) -> bool {
        false
    }

    fn attributes(&self) -> BoxFuture<'_, Result<QueueAttributes, SqsError>> {
        self.call(async move { Ok(self.counts()) }).boxed()
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
    async fn a_full_queue_refuses_sends_until_messages_are_deleted() {
        let q = MemoryQueue::new("t");
        for _ in 0..MEMORY_QUEUE_MAX_MESSAGES / 10 {
            let batch = (0..10).map(|_| outgoing("x", None)).collect();
            assert_eq!(q.send_batch(batch).await.unwrap().succeeded.len(), 10);
        }
        let e = q.send_batch(vec![outgoing("y", None)]).await.unwrap_err();
        assert_eq!(e.code(), QUEUE_FULL, "{e}");
        assert!(e.to_string().contains("is full"), "{e}");
        let got = q.receive(req(10, 60_000)).await.unwrap();
        let receipts = got.iter().map(|r| r.receipt.clone()).collect();
        assert_eq!(q.delete_batch(receipts).await.unwrap().succeeded.len(), 10);
        let sent = q.send_batch(vec![outgoing("y", None)]).await.unwrap();
        assert_eq!(sent.succeeded.len(), 1, "room again once messages are gone");
    }

    #[tokio::test]
    async fn a_queue_full_of_bytes_refuses_sends() {
        let q = MemoryQueue::new("t");
        let big = "b".repeat(256 << 10);
        let fit = MEMORY_QUEUE_MAX_BYTES / (256 << 10) - 1;
        for _ in 0..fit {
            q.send_batch(vec![outgoing(&big, None)]).await.unwrap();
        }
        let e = q.send_batch(vec![outgoing(&big, None)]).await.unwrap_err();
        assert_eq!(e.code(), QUEUE_FULL, "{e}");
        assert_eq!(
            q.counts().visible,
            fit as u64,
            "nothing of the refused batch kept"
        );
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

    fn outgoing(body: &str, delay: Option<i32>) -> OutgoingMessage {
        OutgoingMessage {
            body: body.into(),
            delay_seconds: delay,
            ..OutgoingMessage::default()
        }
    }

    #[tokio::test]
    async fn receives_in_send_order_past_the_messages_in_flight() {
        let q = MemoryQueue::new("t");
        for i in 0..25 {
            q.send(format!("m{i}"), vec![]);
        }
        let mut bodies = Vec::new();
        for _ in 0..3 {
            let got = q.receive(req(10, 60_000)).await.unwrap();
            bodies.extend(got.into_iter().map(|r| r.message.body));
        }
        let want: Vec<_> = (0..25).map(|i| format!("m{i}")).collect();
        assert_eq!(bodies, want);
        let attrs = q.attributes().await.unwrap();
        assert_eq!((attrs.visible, attrs.in_flight), (0, 25));
    }

    #[tokio::test]
    async fn delayed_sends_stay_hidden_until_their_delay_ends() {
        let q = MemoryQueue::new("t");
        let sends = vec![outgoing("later", Some(1)), outgoing("now", None)];
        let out = q.send_batch(sends).await.unwrap();
        assert_eq!(out.succeeded, vec![0, 1]);
        // A delayed message is neither visible nor in flight.
        let attrs = q.attributes().await.unwrap();
        assert_eq!((attrs.visible, attrs.in_flight), (1, 0));
        let got = q.receive(req(10, 60_000)).await.unwrap();
        let bodies: Vec<_> = got.iter().map(|r| r.message.body.as_str()).collect();
        assert_eq!(bodies, ["now"]);
        // A long poll picks the delayed message up when its delay ends.
        let got = q
            .receive(ReceiveRequest {
                max_messages: 10,
                wait: Duration::from_secs(5),
                visibility_timeout: Duration::from_secs(60),
            })
            .await
            .unwrap();
        let bodies: Vec<_> = got.iter().map(|r| r.message.body.as_str()).collect();
        assert_eq!(bodies, ["later"]);
        assert_eq!(got[0].message.receive_count, Some(1));
        let attrs = q.attributes().await.unwrap();
        assert_eq!((attrs.visible, attrs.in_flight), (0, 2));
    }

    #[tokio::test]
    async fn handles_change_and_delete_only_their_own_receive() {
        let q = MemoryQueue::new("t");
        q.send("a", vec![]);
        q.send("b", vec![]);
        let got = q.receive(req(10, 60_000)).await.unwrap();
        let handles: Vec<_> = got.iter().map(|r| r.receipt.clone()).collect();
        // Extending keeps the message hidden; garbage handles are refused
        // one by one, never with a panic.
        let mixed = vec![
            handles[0].clone(),
            ReceiptHandle::new("garbage".into()),
            ReceiptHandle::new("99.1".into()),
            ReceiptHandle::new("1.999".into()),
        ];
        let out = q
            .change_visibility_batch(mixed, Duration::from_secs(120))
            .await
            .unwrap();
        assert_eq!(out.succeeded, vec![0]);
        let failed: Vec<_> = out.failed.iter().map(|f| f.index).collect();
        assert_eq!(failed, vec![1, 2, 3]);
        assert!(out.failed.iter().all(|f| f.code == INVALID_RECEIPT));
        assert_eq!(q.attributes().await.unwrap().in_flight, 2);
        // Delete one; the other goes back and is received with a new handle.
        let out = q.delete_batch(vec![handles[0].clone()]).await.unwrap();
        assert_eq!(out.succeeded, vec![0]);
        let out = q
            .change_visibility_batch(vec![handles[1].clone()], Duration::ZERO)
            .await
            .unwrap();
        assert_eq!(out.succeeded, vec![0]);
        let again = q.receive(req(10, 60_000)).await.unwrap();
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].message.body, "b");
        assert_eq!(again[0].message.receive_count, Some(2));
        assert_ne!(again[0].receipt, handles[1]);
        let out = q.delete_batch(vec![handles[1].clone()]).await.unwrap();
        assert_eq!(out.failed.len(), 1, "a stale handle deletes nothing");
        let out = q.delete_batch(vec![handles[0].clone()]).await.unwrap();
        assert_eq!(out.failed.len(), 1, "a deleted message is gone");
        let out = q
            .delete_batch(vec![again[0].receipt.clone()])
            .await
            .unwrap();
        assert_eq!(out.succeeded, vec![0]);
        let attrs = q.attributes().await.unwrap();
        assert_eq!((attrs.visible, attrs.in_flight), (0, 0));
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

    /// The result of `call` and the time it took on tokio's clock.
    async fn timed<T>(call: impl Future<Output = T>) -> (T, Duration) {
        let start = Instant::now();
        let out = call.await;
        (out, start.elapsed())
    }

    /// Each kind of call once, on a queue holding one message: the time
    /// each took.
    async fn every_call(q: &MemoryQueue) -> Vec<(&'static str, Duration)> {
        let (_, send) = timed(q.send_batch(vec![outgoing("a", None)])).await;
        let (got, receive) = timed(q.receive(req(10, 60_000))).await;
        let handles: Vec<_> = got.unwrap().into_iter().map(|r| r.receipt).collect();
        assert_eq!(handles.len(), 2);
        let (changed, change) =
            timed(q.change_visibility_batch(handles.clone(), Duration::from_secs(90))).await;
        assert_eq!(changed.unwrap().succeeded, vec![0, 1]);
        let (deleted, delete) = timed(q.delete_batch(handles)).await;
        assert_eq!(deleted.unwrap().succeeded, vec![0, 1]);
        let (_, attributes) = timed(q.attributes()).await;
        vec![
            ("send_batch", send),
            ("receive", receive),
            ("change_visibility_batch", change),
            ("delete_batch", delete),
            ("attributes", attributes),
        ]
    }

    #[tokio::test(start_paused = true)]
    async fn every_call_takes_the_round_trip() {
        // 25 ms: an odd count of milliseconds, split 12 there and 13 back.
        let rtt = Duration::from_millis(25);
        let q = MemoryQueue::new("t").with_rtt(rtt);
        q.send("seed", vec![]);
        for (call, took) in every_call(&q).await {
            assert_eq!(took, rtt, "{call}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn no_round_trip_adds_nothing() {
        let q = MemoryQueue::new("t");
        q.send("seed", vec![]);
        for (call, took) in every_call(&q).await {
            assert_eq!(took, Duration::ZERO, "{call}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_poll_counts_the_round_trip_once() {
        let q = std::sync::Arc::new(MemoryQueue::new("t").with_rtt(Duration::from_millis(50)));
        let long_poll = ReceiveRequest {
            max_messages: 10,
            wait: Duration::from_secs(2),
            visibility_timeout: Duration::from_secs(30),
        };
        // Nothing comes: the whole wait at the queue, plus one round trip.
        let (got, took) = timed(q.receive(long_poll)).await;
        assert!(got.unwrap().is_empty());
        assert_eq!(took, Duration::from_millis(2050));
        // A message sent 300 ms into the poll, 275 ms after the request
        // reached the queue, is back 25 ms later.
        let q2 = q.clone();
        let sender = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            q2.send("late", vec![]);
        });
        let (got, took) = timed(q.receive(long_poll)).await;
        assert_eq!(got.unwrap().len(), 1);
        assert_eq!(took, Duration::from_millis(325));
        sender.await.unwrap();
    }
}
