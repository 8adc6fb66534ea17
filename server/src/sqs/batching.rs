//! Batches of ten, run with bounded concurrency; for a commit's deletes,
//! retried while the endpoint pushes back, up to a bound in time.

use std::collections::HashSet;
use std::hash::{BuildHasher, RandomState};
use std::time::Duration;

use futures::{StreamExt, stream};

use super::{BatchOutcome, Queue, ReceiptHandle, SQS_BATCH, SqsError};

/// What happened to each receipt of a bulk operation.
#[derive(Debug, Default)]
pub(crate) struct BulkOutcome {
    /// Receipts the call applied to.
    pub succeeded: Vec<ReceiptHandle>,
    /// Receipts SQS refused as the sender's fault (for a delete: the message
    /// was received again or is gone), with the error code.
    pub rejected: Vec<(ReceiptHandle, String)>,
    /// Receipts whose call failed or that SQS refused as its own fault:
    /// nothing is known, so they must be retried.
    pub unresolved: Vec<ReceiptHandle>,
    /// The last call error, if any call failed.
    pub error: Option<SqsError>,
}

impl BulkOutcome {
    /// (done, refused) in messages, not receipts (a commit's `deleted` and
    /// `expired`, a release's `released`): a message sent with two receipts
    /// (`second`: a row's second receipt, then its own, as a registry's
    /// `RowReceipts` keeps them) counts once when both were answered, as
    /// done if SQS did either. One still unresolved is counted by the call
    /// that retries it.
    pub(crate) fn per_message(&self, second: &[(ReceiptHandle, ReceiptHandle)]) -> (u64, u64) {
        let done: HashSet<&ReceiptHandle> = self.succeeded.iter().collect();
        let refused: HashSet<&ReceiptHandle> = self.rejected.iter().map(|(r, _)| r).collect();
        let (mut did, mut not) = (done.len() as u64, refused.len() as u64);
        for (second, own) in second {
            let answered = |r| done.contains(r) || refused.contains(r);
            if !answered(second) || !answered(own) {
                continue;
            }
            if done.contains(second) && done.contains(own) {
                did -= 1;
            } else {
                not -= 1;
            }
        }
        (did, not)
    }
}

/// Which batch operation to run.
#[derive(Debug, Clone, Copy)]
pub(crate) enum BulkOp {
    Delete,
    ChangeVisibility(Duration),
}

/// Runs `op` over `receipts` in batches of ten, `concurrency` calls at a time.
pub(crate) async fn run(
    queue: &dyn Queue,
    op: BulkOp,
    receipts: Vec<ReceiptHandle>,
    concurrency: usize,
) -> BulkOutcome {
    let chunks: Vec<Vec<ReceiptHandle>> = receipts.chunks(SQS_BATCH).map(<[_]>::to_vec).collect();
    let calls = chunks.into_iter().map(|chunk| async move {
        let result = match op {
            BulkOp::Delete => queue.delete_batch(chunk.clone()).await,
            BulkOp::ChangeVisibility(t) => queue.change_visibility_batch(chunk.clone(), t).await,
        };
        (chunk, result)
    });
    let mut outcome = BulkOutcome::default();
    let mut results = stream::iter(calls).buffer_unordered(concurrency.max(1));
    while let Some((chunk, result)) = results.next().await {
        merge(&mut outcome, chunk, result);
    }
    outcome
}

/// How long a commit keeps retrying the deletes its endpoint pushed back
/// (throttled, answered 503 or 429, or refused the connection, past each
/// call's `sqs_max_attempts`): no new round starts after this. A spell of
/// throttling shorter than this costs the commit time, not its deletes.
pub(crate) const PUSH_BACK_PATIENCE: Duration = Duration::from_secs(60);
/// First pause before a round of retries after a push-back; it doubles
/// with each round, at most [`PATIENCE_MAX_PAUSE`], and each pause is
/// drawn between its half and its whole (jitter, so that commits pushed
/// back together do not come back together).
pub(crate) const PATIENCE_FIRST_PAUSE: Duration = Duration::from_millis(200);
/// Longest pause between two rounds of retries.
pub(crate) const PATIENCE_MAX_PAUSE: Duration = Duration::from_secs(5);

/// [`run`], then, while the calls that failed were pushed back by the
/// endpoint ([`SqsError::is_push_back`]), the receipts still unresolved
/// again, after a growing pause, until `patience` has passed. Any other
/// error ends it at once, as [`run`] does.
pub(crate) async fn run_patiently(
    queue: &dyn Queue,
    op: BulkOp,
    receipts: Vec<ReceiptHandle>,
    concurrency: usize,
    patience: Duration,
) -> BulkOutcome {
    let deadline = tokio::time::Instant::now() + patience;
    let mut total = run(queue, op, receipts, concurrency).await;
    let mut pause = PATIENCE_FIRST_PAUSE;
    while !total.unresolved.is_empty() && total.error.as_ref().is_some_and(SqsError::is_push_back) {
        let wait = jittered(pause);
        if tokio::time::Instant::now() + wait >= deadline {
            break;
        }
        if let Some(e) = &total.error {
            tracing::info!(error = %e, receipts = total.unresolved.len(), pause_ms = wait.as_millis() as u64,
                "SQS pushed back batch calls; retrying them after a pause");
        }
        tokio::time::sleep(wait).await;
        pause = (pause * 2).min(PATIENCE_MAX_PAUSE);
        let again = std::mem::take(&mut total.unresolved);
        let next = run(queue, op, again, concurrency).await;
        total.succeeded.extend(next.succeeded);
        total.rejected.extend(next.rejected);
        total.unresolved = next.unresolved;
        total.error = next.error;
    }
    total
}

/// A pause drawn between half of `pause` and `pause`.
fn jittered(pause: Duration) -> Duration {
    let random = RandomState::new().hash_one(std::time::Instant::now());
    let share = (random >> 11) as f64 / (1u64 << 53) as f64;
    pause.mul_f64(0.5 + share / 2.0)
}

fn merge(
    outcome: &mut BulkOutcome,
    chunk: Vec<ReceiptHandle>,
    result: Result<BatchOutcome, SqsError>,
) {
    let batch = match result {
        Ok(batch) => batch,
        // SQS refused the whole call as the sender's fault (say, a receipt
        // handle it cannot parse): retrying the same entries cannot help,
        // so they count as refused, like refused entries of a batch.
        Err(SqsError::Refused { code, .. }) => {
            outcome
                .rejected
                .extend(chunk.into_iter().map(|r| (r, code.clone())));
            return;
        }
        Err(e) => {
            outcome.unresolved.extend(chunk);
            outcome.error = Some(e);
            return;
        }
    };
    let mut slots: Vec<Option<ReceiptHandle>> = chunk.into_iter().map(Some).collect();
    for i in batch.succeeded {
        if let Some(r) = slots.get_mut(i).and_then(Option::take) {
            outcome.succeeded.push(r);
        }
    }
    for f in batch.failed {
        if let Some(r) = slots.get_mut(f.index).and_then(Option::take) {
            if f.sender_fault {
                outcome.rejected.push((r, f.code));
            } else {
                outcome.unresolved.push(r);
            }
        }
    }
    // An entry SQS did not mention at all is unknown: retry it.
    outcome.unresolved.extend(slots.into_iter().flatten());
}

#[cfg(test)]
mod tests {
    use futures::future::BoxFuture;

    use super::*;
    use crate::sqs::{OutgoingMessage, QueueAttributes, ReceiveRequest, Received};

    /// Refuses every delete call whose first receipt starts with `bad`.
    struct Refusing;

    impl Queue for Refusing {
        fn receive(&self, _: ReceiveRequest) -> BoxFuture<'_, Result<Vec<Received>, SqsError>> {
            Box::pin(async { Ok(Vec::new()) })
        }
        fn delete_batch(
            &self,
            receipts: Vec<ReceiptHandle>,
        ) -> BoxFuture<'_, Result<BatchOutcome, SqsError>> {
            Box::pin(async move {
                if receipts[0].expose().starts_with("bad") {
                    return Err(SqsError::Refused {
                        operation: "DeleteMessageBatch",
                        code: "ReceiptHandleIsInvalid".into(),
                        message: "no".into(),
                    });
                }
                Ok(BatchOutcome {
                    succeeded: (0..receipts.len()).collect(),
                    failed: Vec::new(),
                })
            })
        }
        fn change_visibility_batch(
            &self,
            r: Vec<ReceiptHandle>,
            _: Duration,
        ) -> BoxFuture<'_, Result<BatchOutcome, SqsError>> {
            self.delete_batch(r)
        }
        fn send_batch(
            &self,
            _: Vec<OutgoingMessage>,
        ) -> BoxFuture<'_, Result<BatchOutcome, SqsError>> {
            Box::pin(async { Ok(BatchOutcome::default()) })
        }
        fn is_fifo(&self) -> bool {
            false
        }
        fn attributes(&self) -> BoxFuture<'_, Result<QueueAttributes, SqsError>> {
            Box::pin(async { Ok(QueueAttributes::default()) })
        }
    }

    #[tokio::test]
    async fn a_refused_call_counts_its_receipts_as_refused_not_as_to_retry() {
        let receipts: Vec<ReceiptHandle> = (0..10)
            .map(|i| ReceiptHandle::new(format!("bad{i}")))
            .chain((0..5).map(|i| ReceiptHandle::new(format!("ok{i}"))))
            .collect();
        let out = run(&Refusing, BulkOp::Delete, receipts, 8).await;
        assert_eq!(out.succeeded.len(), 5);
        assert_eq!(out.rejected.len(), 10);
        assert!(
            out.rejected
                .iter()
                .all(|(_, c)| c == "ReceiptHandleIsInvalid")
        );
        assert!(out.unresolved.is_empty());
        assert!(out.error.is_none());
    }

    /// Pushes back every call (HTTP 503) until `open` calls were made,
    /// then deletes everything.
    struct Busy {
        calls: std::sync::atomic::AtomicUsize,
        open: usize,
        code: &'static str,
    }

    impl Queue for Busy {
        fn receive(&self, _: ReceiveRequest) -> BoxFuture<'_, Result<Vec<Received>, SqsError>> {
            Box::pin(async { Ok(Vec::new()) })
        }
        fn delete_batch(
            &self,
            receipts: Vec<ReceiptHandle>,
        ) -> BoxFuture<'_, Result<BatchOutcome, SqsError>> {
            Box::pin(async move {
                let n = self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if n < self.open {
                    return Err(SqsError::Service {
                        operation: "DeleteMessageBatch",
                        code: self.code.into(),
                        message: "busy".into(),
                    });
                }
                Ok(BatchOutcome {
                    succeeded: (0..receipts.len()).collect(),
                    failed: Vec::new(),
                })
            })
        }
        fn change_visibility_batch(
            &self,
            r: Vec<ReceiptHandle>,
            _: Duration,
        ) -> BoxFuture<'_, Result<BatchOutcome, SqsError>> {
            self.delete_batch(r)
        }
        fn send_batch(
            &self,
            _: Vec<OutgoingMessage>,
        ) -> BoxFuture<'_, Result<BatchOutcome, SqsError>> {
            Box::pin(async { Ok(BatchOutcome::default()) })
        }
        fn is_fifo(&self) -> bool {
            false
        }
        fn attributes(&self) -> BoxFuture<'_, Result<QueueAttributes, SqsError>> {
            Box::pin(async { Ok(QueueAttributes::default()) })
        }
    }

    fn busy(open: usize, code: &'static str) -> Busy {
        Busy {
            calls: std::sync::atomic::AtomicUsize::new(0),
            open,
            code,
        }
    }

    fn receipts(n: usize) -> Vec<ReceiptHandle> {
        (0..n)
            .map(|i| ReceiptHandle::new(format!("r{i}")))
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn pushed_back_deletes_are_retried_until_they_go_through() {
        let q = busy(12, "HTTP 503");
        let out = run_patiently(&q, BulkOp::Delete, receipts(25), 8, PUSH_BACK_PATIENCE).await;
        assert_eq!(out.succeeded.len(), 25);
        assert!(out.unresolved.is_empty() && out.error.is_none());
        let throttled = busy(5, "ThrottlingException");
        let out = run_patiently(
            &throttled,
            BulkOp::Delete,
            receipts(10),
            8,
            PUSH_BACK_PATIENCE,
        );
        assert_eq!(out.await.succeeded.len(), 10);
    }

    #[tokio::test(start_paused = true)]
    async fn patience_ends_and_other_errors_are_not_retried() {
        let start = tokio::time::Instant::now();
        let q = busy(usize::MAX, "Unreachable");
        let out = run_patiently(&q, BulkOp::Delete, receipts(20), 8, PUSH_BACK_PATIENCE).await;
        assert_eq!(out.unresolved.len(), 20);
        assert!(out.error.is_some_and(|e| e.is_push_back()));
        let waited = start.elapsed();
        assert!(waited <= PUSH_BACK_PATIENCE, "{waited:?}");
        assert!(
            waited >= PUSH_BACK_PATIENCE - PATIENCE_MAX_PAUSE,
            "{waited:?}"
        );

        let failing = busy(usize::MAX, "InternalError");
        let out = run_patiently(
            &failing,
            BulkOp::Delete,
            receipts(20),
            8,
            PUSH_BACK_PATIENCE,
        )
        .await;
        assert_eq!(out.unresolved.len(), 20);
        assert_eq!(
            failing.calls.load(std::sync::atomic::Ordering::SeqCst),
            2,
            "not a push-back: one round, as before"
        );
    }

    #[test]
    fn per_message_counts_a_message_with_two_receipts_once_when_both_are_answered() {
        let r = |s: &str| ReceiptHandle::new(s.into());
        let second = [
            (r("a2"), r("a1")),
            (r("b2"), r("b1")),
            (r("c2"), r("c1")),
            (r("d2"), r("d1")),
        ];
        let outcome = BulkOutcome {
            // a: both deleted; b: one deleted, one refused; c: both refused;
            // d: one deleted, one unresolved (the next commit retries it).
            succeeded: vec![r("a1"), r("a2"), r("b2"), r("d1"), r("e")],
            rejected: ["b1", "c1", "c2"]
                .map(|s| (r(s), "ReceiptHandleIsInvalid".into()))
                .into(),
            unresolved: vec![r("d2")],
            error: None,
        };
        assert_eq!(
            outcome.per_message(&second),
            (4, 1),
            "a, b, d, e deleted; c expired"
        );
        assert_eq!(outcome.per_message(&[]), (5, 3), "receipts, without pairs");
    }
}
