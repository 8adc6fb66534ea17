//! One ticket's log: the rows it received, in order, and their receipts.
//!
//! The first DoGet of a ticket starts the receive task, which appends to the
//! log; every DoGet (the first included) streams by following the log until
//! it is sealed. That one mechanism gives repeatable reads: a replay, a
//! concurrent reader and the first reader all see the same rows in the same
//! order, and a receive that dies half way seals the log with what it had.

use std::sync::{Arc, Mutex, MutexGuard};

use arrow_array::RecordBatch;
use futures::Stream;
use sqs_flight_schemas::TicketId;
use tokio::sync::watch;
use tokio::time::Instant;

use super::usage::Usage;
use crate::sqs::ReceiptHandle;

/// Where a ticket's receive stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Never read.
    Fresh,
    /// The first DoGet's receive task is appending.
    Receiving,
    /// Complete: later reads replay.
    Sealed,
}

/// The receipts of one receive call and until when they are hidden.
struct Chunk {
    receipts: Vec<ReceiptHandle>,
    visible_until: Instant,
}

struct Log {
    phase: Phase,
    /// Committed or released: nothing more may be recorded.
    closed: bool,
    batches: Vec<RecordBatch>,
    chunks: Vec<Chunk>,
    messages: u64,
    bytes: u64,
}

/// A receipt chunk due for a visibility extension.
pub struct DueChunk {
    pub ticket: Arc<Ticket>,
    pub index: usize,
    pub receipts: Vec<ReceiptHandle>,
}

/// One repeatable read.
pub struct Ticket {
    pub id: TicketId,
    log: Mutex<Log>,
    changed: watch::Sender<u64>,
    usage: Arc<Usage>,
}

/// A record refused because the ticket is closed; the receipts come back.
#[derive(Debug, PartialEq, Eq)]
pub struct Closed(pub Vec<ReceiptHandle>);

impl Ticket {
    pub fn new(id: TicketId, usage: Arc<Usage>) -> Self {
        Self {
            id,
            log: Mutex::new(Log {
                phase: Phase::Fresh,
                closed: false,
                batches: Vec::new(),
                chunks: Vec::new(),
                messages: 0,
                bytes: 0,
            }),
            changed: watch::Sender::new(0),
            usage,
        }
    }

    fn log(&self) -> MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn notify(&self) {
        self.changed.send_modify(|v| *v += 1);
    }

    /// True for exactly one caller, the first reader: it must receive.
    pub fn begin(&self) -> bool {
        let mut log = self.log();
        let first = log.phase == Phase::Fresh && !log.closed;
        if first {
            log.phase = Phase::Receiving;
        }
        first
    }

    /// Appends one receive's rows and receipts, before they are streamed.
    pub fn record(
        &self,
        batch: RecordBatch,
        receipts: Vec<ReceiptHandle>,
        bytes: u64,
        visible_until: Instant,
    ) -> Result<(), Closed> {
        let mut log = self.log();
        if log.closed {
            return Err(Closed(receipts));
        }
        let messages = receipts.len() as u64;
        log.messages += messages;
        log.bytes += bytes;
        log.batches.push(batch);
        log.chunks.push(Chunk {
            receipts,
            visible_until,
        });
        drop(log);
        self.usage.add(messages, bytes);
        self.notify();
        Ok(())
    }

    /// Ends the receive: every later read replays.
    pub fn seal(&self) {
        let mut log = self.log();
        if log.phase != Phase::Sealed {
            log.phase = Phase::Sealed;
            drop(log);
            self.notify();
        }
    }

    /// Closes the ticket for good (commit or release) and hands over its
    /// receipts; its rows are dropped.
    pub fn close(&self) -> Vec<ReceiptHandle> {
        let mut log = self.log();
        log.closed = true;
        log.phase = Phase::Sealed;
        let (messages, bytes) = (log.messages, log.bytes);
        log.messages = 0;
        log.bytes = 0;
        log.batches.clear();
        let receipts = log.chunks.drain(..).flat_map(|c| c.receipts).collect();
        drop(log);
        self.usage.remove(messages, bytes);
        self.notify();
        receipts
    }

    /// Messages held (not yet committed or released).
    pub fn in_flight(&self) -> u64 {
        self.log().messages
    }

    /// Rows and bytes recorded so far.
    pub fn totals(&self) -> (u64, u64) {
        let log = self.log();
        (log.messages, log.bytes)
    }

    /// Chunks whose visibility ends before `horizon`.
    pub fn due(self: &Arc<Self>, horizon: Instant) -> Vec<DueChunk> {
        let log = self.log();
        log.chunks
            .iter()
            .enumerate()
            .filter(|(_, c)| c.visible_until < horizon)
            .map(|(index, c)| DueChunk {
                ticket: Arc::clone(self),
                index,
                receipts: c.receipts.clone(),
            })
            .collect()
    }

    /// Records that chunk `index` is hidden until `until`.
    pub fn extended(&self, index: usize, until: Instant) {
        if let Some(c) = self.log().chunks.get_mut(index) {
            c.visible_until = c.visible_until.max(until);
        }
    }

    /// The rows of this ticket: what is recorded, then what is recorded
    /// later, until the log is sealed.
    pub fn follow(self: Arc<Self>) -> impl Stream<Item = RecordBatch> + Send + 'static {
        let rx = self.changed.subscribe();
        futures::stream::unfold((self, 0usize, rx), |(ticket, next, mut rx)| async move {
            loop {
                rx.borrow_and_update();
                let (batch, sealed) = {
                    let log = ticket.log();
                    (log.batches.get(next).cloned(), log.phase == Phase::Sealed)
                };
                match batch {
                    Some(b) => return Some((b, (ticket, next + 1, rx))),
                    None if sealed => return None,
                    None => rx.changed().await.ok()?,
                }
            }
        })
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let log = self.log();
        self.usage.remove(log.messages, log.bytes);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::StreamExt;
    use sqs_flight_schemas::SqsMessage;
    use sqs_flight_schemas::message::messages_to_batch;

    use super::*;

    fn ticket() -> Arc<Ticket> {
        let id = TicketId {
            table: "t".into(),
            consumer: "c".into(),
            batch: 1,
            partition: 0,
            plan: 1,
        };
        Arc::new(Ticket::new(id, Arc::new(Usage::default())))
    }

    fn rows(n: usize) -> (RecordBatch, Vec<ReceiptHandle>) {
        let msgs: Vec<_> = (0..n)
            .map(|i| SqsMessage {
                message_id: format!("m{i}"),
                body: "b".into(),
                ..Default::default()
            })
            .collect();
        let receipts = (0..n)
            .map(|i| ReceiptHandle::new(format!("r{i}")))
            .collect();
        (messages_to_batch(&msgs, 1, 0).unwrap(), receipts)
    }

    #[tokio::test]
    async fn only_the_first_reader_receives_and_all_see_the_same_rows() {
        let t = ticket();
        assert!(t.begin());
        assert!(!t.begin());
        let live = tokio::spawn(Arc::clone(&t).follow().collect::<Vec<_>>());
        let (b, r) = rows(3);
        t.record(b, r, 3, Instant::now()).unwrap();
        let (b, r) = rows(2);
        t.record(b, r, 2, Instant::now()).unwrap();
        t.seal();
        let live = tokio::time::timeout(Duration::from_secs(5), live)
            .await
            .unwrap()
            .unwrap();
        let replay: Vec<_> = Arc::clone(&t).follow().collect().await;
        assert_eq!(live, replay);
        assert_eq!(replay.iter().map(|b| b.num_rows()).sum::<usize>(), 5);
        assert_eq!(t.usage.snapshot(), (5, 5));
    }

    #[tokio::test]
    async fn close_hands_over_receipts_and_refuses_more() {
        let t = ticket();
        t.begin();
        let (b, r) = rows(2);
        t.record(b, r, 2, Instant::now()).unwrap();
        let receipts = t.close();
        assert_eq!(receipts.len(), 2);
        assert_eq!(t.usage.snapshot(), (0, 0));
        let (b, r) = rows(1);
        assert_eq!(t.record(b, r.clone(), 1, Instant::now()), Err(Closed(r)));
        assert!(!t.begin());
        assert_eq!(Arc::clone(&t).follow().count().await, 0);
    }

    #[tokio::test]
    async fn due_chunks_and_extension() {
        let t = ticket();
        t.begin();
        let now = Instant::now();
        let (b, r) = rows(2);
        t.record(b, r, 2, now + Duration::from_secs(1)).unwrap();
        assert_eq!(t.due(now).len(), 0);
        let due = t.due(now + Duration::from_secs(2));
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].receipts.len(), 2);
        t.extended(0, now + Duration::from_secs(10));
        assert_eq!(t.due(now + Duration::from_secs(2)).len(), 0);
    }
}
