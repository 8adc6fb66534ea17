//! SendMessageBatch calls within SQS's limits, with retries.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::{StreamExt, stream};

use super::WriteError;
use super::rows::MAX_MESSAGE_BYTES;
use crate::sqs::{OutgoingMessage, Queue, SQS_BATCH, SqsError};

/// Concurrent SendMessageBatch calls on a standard queue (FIFO queues send
/// one call at a time to keep each group's order).
pub const SEND_CONCURRENCY: usize = 8;
/// Attempts for entries SQS failed on its own side.
pub const SEND_ATTEMPTS: u32 = 5;
/// First retry pause; it doubles each attempt.
const RETRY_BASE: Duration = Duration::from_millis(100);

/// Messages with their row numbers, packed for one call.
type Call = Vec<(u64, OutgoingMessage)>;

/// Packs messages into calls of at most ten entries and 1 MiB.
fn pack(messages: Vec<OutgoingMessage>, first_row: u64) -> Vec<Call> {
    let mut calls = Vec::new();
    let mut current: Call = Vec::new();
    let mut bytes = 0;
    for (i, m) in messages.into_iter().enumerate() {
        let size = m.sqs_size();
        if current.len() == SQS_BATCH || (!current.is_empty() && bytes + size > MAX_MESSAGE_BYTES) {
            calls.push(std::mem::take(&mut current));
            bytes = 0;
        }
        bytes += size;
        current.push((first_row + i as u64, m));
    }
    if !current.is_empty() {
        calls.push(current);
    }
    calls
}

/// Sends `messages` (rows numbered from `first_row`); returns how many were
/// sent and the first error, if any. After an error no new call starts, but
/// calls in flight finish, so the count is exact.
pub async fn send_all(
    queue: &dyn Queue,
    messages: Vec<OutgoingMessage>,
    first_row: u64,
) -> (u64, Option<WriteError>) {
    let concurrency = if queue.is_fifo() { 1 } else { SEND_CONCURRENCY };
    let stop = AtomicBool::new(false);
    let stop = &stop;
    let calls = pack(messages, first_row)
        .into_iter()
        .map(|call| async move {
            if stop.load(Ordering::Relaxed) {
                return (0, None);
            }
            let result = send_call(queue, call).await;
            if result.1.is_some() {
                stop.store(true, Ordering::Relaxed);
            }
            result
        });
    let mut results = stream::iter(calls).buffered(concurrency);
    let (mut sent, mut first_error): (u64, Option<WriteError>) = (0, None);
    while let Some((n, err)) = results.next().await {
        sent += n;
        if first_error.is_none() {
            first_error = err;
        }
    }
    (sent, first_error)
}

/// One call, retrying entries SQS failed on its side.
async fn send_call(queue: &dyn Queue, mut call: Call) -> (u64, Option<WriteError>) {
    let mut sent = 0;
    for attempt in 0..SEND_ATTEMPTS {
        if attempt > 0 {
            tokio::time::sleep(RETRY_BASE * 2u32.pow(attempt - 1)).await;
        }
        let messages = call.iter().map(|(_, m)| m.clone()).collect();
        let outcome = match queue.send_batch(messages).await {
            Ok(o) => o,
            Err(e) => return (sent, Some(WriteError::Sqs(e))),
        };
        sent += outcome.succeeded.len() as u64;
        if let Some(f) = outcome
            .failed
            .iter()
            .filter(|f| f.sender_fault)
            .min_by_key(|f| f.index)
        {
            let row = call.get(f.index).map_or(0, |(row, _)| *row);
            let reason = format!("SQS refused the message ({})", f.code);
            return (sent, Some(WriteError::Row { row, reason }));
        }
        let retry: Vec<usize> = outcome.failed.iter().map(|f| f.index).collect();
        if retry.is_empty() {
            return (sent, None);
        }
        call = call
            .into_iter()
            .enumerate()
            .filter(|(i, _)| retry.contains(i))
            .map(|(_, entry)| entry)
            .collect();
    }
    let error = SqsError::Service {
        operation: "SendMessageBatch",
        code: "RetriesExhausted".into(),
        message: format!(
            "{} entries still failing after {SEND_ATTEMPTS} attempts",
            call.len()
        ),
    };
    (sent, Some(WriteError::Sqs(error)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(bytes: usize) -> OutgoingMessage {
        OutgoingMessage {
            body: "x".repeat(bytes),
            ..Default::default()
        }
    }

    #[test]
    fn packing_respects_ten_entries_and_one_mebibyte() {
        let calls = pack((0..25).map(|_| msg(10)).collect(), 7);
        assert_eq!(calls.iter().map(Vec::len).collect::<Vec<_>>(), [10, 10, 5]);
        assert_eq!(calls[1][0].0, 17, "row numbers carry over");
        let calls = pack((0..5).map(|_| msg(400 << 10)).collect(), 0);
        assert_eq!(calls.iter().map(Vec::len).collect::<Vec<_>>(), [2, 2, 1]);
    }

    #[tokio::test]
    async fn every_message_reaches_the_memory_queue() {
        let q = crate::sqs::memory::MemoryQueue::new("w");
        let (sent, err) = send_all(&q, (0..23).map(|_| msg(3)).collect(), 0).await;
        assert!(err.is_none());
        assert_eq!(sent, 23);
        assert_eq!(q.attributes().await.unwrap().visible, 23);
    }
}
