//! SendMessageBatch calls within SQS's limits, with retries.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt, stream};

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
            Err(SqsError::Refused { code, message, .. }) => {
                return match call.as_slice() {
                    [(row, _)] => {
                        let reason = format!("SQS refused the message ({code}): {message}");
                        (sent, Some(WriteError::Row { row: *row, reason }))
                    }
                    _ => {
                        let (n, error) = one_by_one(queue, call).await;
                        (sent + n, error)
                    }
                };
            }
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

/// SQS refused a whole SendMessageBatch for the sender's fault: sends its
/// messages one call each, in order, so that the refused row is named (the
/// rows before it are sent, as before any refused row). If each is taken on
/// its own, the refusal was about the batch, and everything is sent.
fn one_by_one(queue: &dyn Queue, call: Call) -> BoxFuture<'_, (u64, Option<WriteError>)> {
    async move {
        let mut sent = 0;
        for entry in call {
            let (n, error) = send_call(queue, vec![entry]).await;
            sent += n;
            if error.is_some() {
                return (sent, error);
            }
        }
        (sent, None)
    }
    .boxed()
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

    /// Refuses, as SQS does a bad parameter, every SendMessageBatch that
    /// holds a message with the body `poison`.
    struct Picky(crate::sqs::memory::MemoryQueue);

    impl Queue for Picky {
        fn receive(
            &self,
            req: crate::sqs::ReceiveRequest,
        ) -> BoxFuture<'_, Result<Vec<crate::sqs::Received>, SqsError>> {
            self.0.receive(req)
        }
        fn delete_batch(
            &self,
            receipts: Vec<crate::sqs::ReceiptHandle>,
        ) -> BoxFuture<'_, Result<crate::sqs::BatchOutcome, SqsError>> {
            self.0.delete_batch(receipts)
        }
        fn change_visibility_batch(
            &self,
            receipts: Vec<crate::sqs::ReceiptHandle>,
            timeout: Duration,
        ) -> BoxFuture<'_, Result<crate::sqs::BatchOutcome, SqsError>> {
            self.0.change_visibility_batch(receipts, timeout)
        }
        fn send_batch(
            &self,
            messages: Vec<OutgoingMessage>,
        ) -> BoxFuture<'_, Result<crate::sqs::BatchOutcome, SqsError>> {
            if messages.iter().any(|m| m.body == "poison") {
                let refused = SqsError::Refused {
                    operation: "SendMessageBatch",
                    code: "InvalidParameterValue".into(),
                    message: "no poison".into(),
                };
                return futures::future::ready(Err(refused)).boxed();
            }
            self.0.send_batch(messages)
        }
        fn is_fifo(&self) -> bool {
            false
        }
        fn attributes(&self) -> BoxFuture<'_, Result<crate::sqs::QueueAttributes, SqsError>> {
            self.0.attributes()
        }
    }

    #[tokio::test]
    async fn a_refused_call_names_its_row_and_sends_the_rows_before_it() {
        let q = Picky(crate::sqs::memory::MemoryQueue::new("w"));
        let mut messages: Vec<_> = (0..15).map(|_| msg(3)).collect();
        messages[12].body = "poison".into();
        let (sent, err) = send_all(&q, messages, 100).await;
        let err = err.expect("the poison row is refused");
        assert_eq!(
            err.to_string(),
            "row 112: SQS refused the message (InvalidParameterValue): no poison"
        );
        assert!(matches!(err, WriteError::Row { row: 112, .. }));
        assert_eq!(sent, 12, "rows 100-111 are sent, 113-114 are not");
        assert_eq!(q.attributes().await.unwrap().visible, 12);
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
