//! Commit: the consumer's watermark raised to a batch, the receipts of the
//! batches up to it deleted, and the rejected ones given back (rule 2 of
//! docs/protocol.md#the-rules; rejects in [`super::reject`]).

use std::collections::HashSet;
use std::sync::Arc;

use serde::Serialize;
use sqs_flight_schemas::CommitCommand;

use super::consumer::{Commit, Taken};
use super::reject;
use super::store::Op;
use super::{Consumer, ConsumerKey, Registry, Table};
use crate::error::{Error, Result};
use crate::large_payload::S3Object;
use crate::metrics::Metrics;
use crate::sqs::ReceiptHandle;

/// The answer of a commit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CommitOutcome {
    pub(super) committed_batch: u64,
    pub(super) deleted: u64,
    pub(super) expired: u64,
    /// Messages given back to SQS by this commit.
    pub(super) rejected: u64,
    /// `"behind"` when the deletes run after the answer
    /// (`--deletes-behind`): `deleted` counts those decided.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) deletes: Option<DeletesRun>,
}

/// The deletes of a commit that run behind its answer.
struct Deletes {
    /// Every receipt: each message's, then the second receipts of some.
    receipts: Vec<ReceiptHandle>,
    /// The second receipts among them, each with its row's own.
    second: Vec<(ReceiptHandle, ReceiptHandle)>,
    /// The objects of the large payloads to delete with the messages.
    objects: Vec<(ReceiptHandle, S3Object)>,
}

/// What a commit acts on, taken from the consumer once the journal holds
/// the commit.
struct CommitWork {
    /// The messages it deletes.
    deletes: Deletes,
    /// The receipts of the messages it gives back.
    reject: Vec<ReceiptHandle>,
    /// The consumer's watermark after it.
    committed: u64,
    /// How many receipts it sends to SQS: deletes and give-backs.
    sent: usize,
}

/// How a commit's deletes ran, when not before its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum DeletesRun {
    /// After the answer: the answer counts the deletes decided.
    Behind,
}

impl Registry {
    /// Deletes every message recorded for the consumer in batches <= N and
    /// raises its watermark to N (rule 2 of docs/protocol.md#the-rules);
    /// the messages the command rejects are given back to SQS instead
    /// (see [`reject`]).
    ///
    /// A consumer the registry does not know (it never planned a batch, or
    /// it was released and forgotten) has nothing to delete: the commit
    /// succeeds, deletes nothing and records nothing, so that `status` does
    /// not list a consumer that never read (a typo in its name, a commit
    /// sent before the first read). Ids to reject are refused there, as
    /// everywhere they are not found.
    pub async fn commit(self: &Arc<Self>, cmd: &CommitCommand) -> Result<CommitOutcome> {
        let table = Arc::clone(self.table(&cmd.table)?);
        let key = (cmd.table.clone(), cmd.consumer.clone());
        let Some(lock) = self.consumers.with(&key, Consumer::commit_lock) else {
            return self.commit_unknown_consumer(&key, cmd);
        };
        // Owned: a commit whose deletes run behind its answer keeps the
        // consumer's turn until they are done.
        let serial = lock.lock_owned().await;
        let commit = self.journal_commit(&key, cmd).await?;
        let mut work = self.take_work(&table, &key, &commit);
        let reject = std::mem::take(&mut work.reject);
        let rejected =
            reject::give_back_rejected(&table, &cmd.consumer, reject, commit.delay_seconds());
        if self.deletes_behind {
            let rejected = rejected.await;
            let committed = work.committed;
            return Ok(self.delete_behind(
                table,
                key,
                work.deletes,
                work.sent,
                serial,
                |deleted| CommitOutcome {
                    committed_batch: committed,
                    deleted,
                    expired: 0,
                    rejected,
                    deletes: Some(DeletesRun::Behind),
                },
            ));
        }
        self.delete_now(&table, &key, cmd.batch, work, rejected)
            .await
    }

    /// The commit of a consumer the registry does not know: it deletes
    /// nothing and records nothing, and names no id to reject (it would
    /// find none).
    fn commit_unknown_consumer(
        &self,
        key: &ConsumerKey,
        cmd: &CommitCommand,
    ) -> Result<CommitOutcome> {
        // Finds no id: refuses the commit if it names any.
        self.pick_rejects(key, cmd)?;
        tracing::info!(table = %cmd.table, consumer = %cmd.consumer, batch = cmd.batch,
            "commit for a consumer that has read nothing: nothing to delete");
        Ok(CommitOutcome {
            committed_batch: cmd.batch,
            deleted: 0,
            expired: 0,
            rejected: 0,
            deletes: None,
        })
    }

    /// Decides the commit on the consumer and writes it to the journal.
    /// An id that cannot be rejected refuses the whole commit, before
    /// anything changes.
    async fn journal_commit(&self, key: &ConsumerKey, cmd: &CommitCommand) -> Result<Commit> {
        let rejects = self.pick_rejects(key, cmd)?;
        let commit = self.with_consumer(key, |c| c.commit(cmd.batch, rejects));
        // The watermark, the receipts to delete and those to give back are
        // in the journal before anything changes: a crash after this
        // retries the delete at the restart and gives the rejects back, and
        // a failed write leaves the commit undone.
        let ops = || Ok(self.commit_ops(key, &commit));
        if let Err(e) = self.journal.write(ops).await {
            return Err(e.with_context(|e| {
                format!(
                    "commit of batch {} not done: {e}; nothing was deleted, commit again",
                    cmd.batch
                )
            }));
        }
        Ok(commit)
    }

    /// Takes the journaled `commit` into the consumer and closes the
    /// tickets it covers: what it deletes (with the objects of their large
    /// payloads, when the table deletes those) and what it gives back.
    fn take_work(&self, table: &Table, key: &ConsumerKey, commit: &Commit) -> CommitWork {
        // Before the tickets close, which drops what they hold.
        let objects = match table.large_payloads() {
            Some(large) if large.deletes_after_commit() => commit.objects(),
            _ => Vec::new(),
        };
        let Taken {
            delete: mut receipts,
            second,
            reject,
            committed,
        } = self.take_committed(key, commit);
        // Each message's receipt, then the second receipts of some.
        receipts.extend(second.iter().map(|(receipt, _)| receipt.clone()));
        let sent = receipts.len() + reject.len();
        CommitWork {
            deletes: Deletes {
                receipts,
                second,
                objects,
            },
            reject,
            committed,
            sent,
        }
    }

    /// Deletes the commit's messages (`work`) while its rejects are given
    /// back (`rejected`, how many SQS took back), and answers once SQS has:
    /// what it neither did nor refused stays for the next commit, and a
    /// failed call fails the commit after that.
    async fn delete_now(
        &self,
        table: &Table,
        key: &ConsumerKey,
        batch: u64,
        work: CommitWork,
        rejected: impl Future<Output = u64>,
    ) -> Result<CommitOutcome> {
        let Deletes {
            receipts,
            second,
            objects,
        } = work.deletes;
        let (outcome, rejected) = tokio::join!(table.delete_committed(receipts), rejected);
        delete_objects(&self.metrics, table, objects, &outcome.succeeded).await;
        let (deleted, expired) = outcome.per_message(&second);
        let result = CommitOutcome {
            committed_batch: work.committed,
            deleted,
            expired,
            rejected,
            deletes: None,
        };
        self.keep_unresolved(key, outcome.unresolved, work.sent)
            .await;
        let (name, consumer) = key;
        tracing::info!(table = %name, %consumer, batch, committed = result.committed_batch,
            deleted = result.deleted, expired = result.expired, rejected = result.rejected, "commit");
        self.count_commit(key, &result);
        match outcome.error {
            Some(e) => Err(Error::sqs(name, e)),
            None => Ok(result),
        }
    }

    /// Deletes `receipts` in a task the registry tracks, holding the
    /// consumer's commit turn (`serial`) until SQS answers, and returns
    /// the answer `answer` makes of the count of deletes decided at once
    /// (`--deletes-behind`). Meanwhile the consumer holds work and counts
    /// them in flight; when the task ends, what SQS neither did nor
    /// refused is kept for the next commit and the metrics count the rest,
    /// as a commit that waits does. A failed call is logged: the next
    /// commit retries.
    fn delete_behind(
        self: &Arc<Self>,
        table: Arc<Table>,
        key: ConsumerKey,
        Deletes {
            receipts,
            second,
            objects,
        }: Deletes,
        sent: usize,
        serial: tokio::sync::OwnedMutexGuard<()>,
        answer: impl FnOnce(u64) -> CommitOutcome,
    ) -> CommitOutcome {
        let result = answer((receipts.len() - second.len()) as u64);
        self.with_consumer(&key, |c| c.delete_behind(&receipts));
        let committed = result.committed_batch;
        tracing::info!(table = %key.0, consumer = %key.1, committed, deleted = result.deleted,
            rejected = result.rejected, "commit; its deletes run behind the answer");
        self.count_rejected(&key, result.rejected);
        let registry = Arc::clone(self);
        self.background.deleting().spawn(async move {
            let outcome = table.delete_committed(receipts).await;
            delete_objects(&registry.metrics, &table, objects, &outcome.succeeded).await;
            let (deleted, expired) = outcome.per_message(&second);
            registry.keep_unresolved(&key, outcome.unresolved, sent).await;
            let (t, consumer) = &key;
            Metrics::count(&registry.metrics.deleted, t, consumer, deleted);
            Metrics::count(&registry.metrics.expired, t, consumer, expired);
            match outcome.error {
                Some(e) => tracing::warn!(table = %t, %consumer, committed, deleted, expired,
                    error = %e, "deletes of a commit that answered failed; its next commit retries them"),
                None => tracing::info!(table = %t, %consumer, committed, deleted, expired,
                    "deletes of a commit that answered done"),
            }
            drop(serial);
        });
        result
    }

    /// Counts what a commit did in the metrics (and its rejects in status).
    fn count_commit(&self, key: &ConsumerKey, result: &CommitOutcome) {
        let (table, consumer) = key;
        Metrics::count(&self.metrics.deleted, table, consumer, result.deleted);
        Metrics::count(&self.metrics.expired, table, consumer, result.expired);
        self.count_rejected(key, result.rejected);
    }

    /// Runs `f` on the consumer `key`, made if it was forgotten meanwhile (released
    /// while the commit waited for its turn).
    fn with_consumer<T>(&self, key: &ConsumerKey, f: impl FnOnce(&mut Consumer) -> T) -> T {
        self.consumers.with_or_new(key, f)
    }

    /// What a commit writes before it acts: the committed batches
    /// forgotten, and the consumer as the commit leaves it
    /// ([`Commit::state_after`]).
    fn commit_ops(&self, key: &ConsumerKey, commit: &Commit) -> Vec<Op> {
        let before = self.with_consumer(key, |c| c.stored());
        // Outside the consumers' lock, as everywhere a ticket's log is read.
        let state = commit.state_after(before);
        let (table, consumer) = key;
        let mut ops: Vec<Op> = commit
            .forgotten()
            .map(|batch| Op::Forget {
                table: table.clone(),
                consumer: consumer.clone(),
                batch,
            })
            .collect();
        ops.push(Op::Consumer {
            table: table.clone(),
            consumer: consumer.clone(),
            state,
        });
        // The ids it deletes, for the committed window after a restart.
        if let Ok(t) = self.table(table)
            && let Some(window) = t.dedup().window()
        {
            let keys = commit.deleted_keys();
            if !keys.is_empty() {
                let now_ms = super::status::unix_now_ms().max(0) as u64;
                ops.push(Op::Committed {
                    table: table.clone(),
                    until_ms: now_ms.saturating_add(window.as_millis() as u64),
                    keys,
                });
            }
        }
        ops
    }

    /// Takes `commit` into the consumer, then closes the tickets of the
    /// batches up to it (outside the consumers' lock): what the commit
    /// deletes, what it gives back, and the watermark. The rejects stay on
    /// the consumer's list while they are given back.
    fn take_committed(&self, key: &ConsumerKey, commit: &Commit) -> Taken {
        let taking = self.with_consumer(key, |c| c.commit_through(commit, &self.usage));
        let taken = commit.close(taking);
        if !taken.reject.is_empty() {
            self.consumers
                .with(key, |c| c.hold_rejects(commit, taken.reject.clone()));
        }
        taken
    }

    /// Keeps the receipts whose delete SQS neither did nor refused, for the
    /// next commit to retry. The journal holds the `sent` receipts as
    /// pending deletes or rejects: now only the unresolved deletes are, and
    /// the commit's rejects are off the list (nothing to rewrite when none
    /// were sent).
    async fn keep_unresolved(
        &self,
        key: &ConsumerKey,
        unresolved: Vec<ReceiptHandle>,
        sent: usize,
    ) {
        self.consumers.with(key, |c| c.commit_done(unresolved));
        if sent > 0 {
            self.write_consumer(key, "pending deletes");
        }
    }

    /// Hands the consumer's state as it is now to the journal, without
    /// waiting for the write: it lands after every write handed over
    /// before it and before any handed over after, so no later state is
    /// overwritten. It only narrows what a restart would redo (deletes or
    /// give-backs SQS has done already), so the call answers without it: a
    /// round trip less per commit with `--state-url`. A failure is logged
    /// (`what` says what the write was for).
    pub(super) fn write_consumer(&self, key: &ConsumerKey, what: &'static str) {
        let Some(state) = self.consumers.with(key, |c| c.stored()) else {
            return;
        };
        let (table, consumer) = key.clone();
        let op = Op::Consumer {
            table: table.clone(),
            consumer: consumer.clone(),
            state,
        };
        let failed = move |e: Error| {
            tracing::warn!(error = %e, %table, %consumer, "could not write {what} to the state store");
        };
        match self.journal.submit(|| Ok(vec![op])) {
            Ok(mut written) => match written.landed() {
                Some(Ok(())) => {}
                Some(Err(e)) => failed(e),
                None => {
                    tokio::spawn(async move {
                        if let Err(e) = written.outcome().await {
                            failed(e);
                        }
                    });
                }
            },
            Err(e) => failed(e),
        }
    }
}

/// Deletes the objects of the messages whose delete succeeded
/// (`delete_after_commit`), never another's: a message SQS did not delete
/// may come back, and its payload with it.
async fn delete_objects(
    metrics: &Metrics,
    table: &Table,
    objects: Vec<(ReceiptHandle, S3Object)>,
    deleted: &[ReceiptHandle],
) {
    let Some(large) = table.large_payloads().filter(|_| !objects.is_empty()) else {
        return;
    };
    let deleted: HashSet<&ReceiptHandle> = deleted.iter().collect();
    let gone: Vec<S3Object> = objects
        .into_iter()
        .filter(|(r, _)| deleted.contains(r))
        .map(|(_, o)| o)
        .collect();
    let outcome = large.delete(gone, "its message's commit deleted").await;
    metrics.large_payloads(table.name(), "deleted", outcome.deleted);
    metrics.large_payloads(table.name(), "delete_failed", outcome.failed);
    tracing::debug!(table = %table.name(), deleted = outcome.deleted, failed = outcome.failed,
        "large payloads' objects deleted after their messages' commit");
}

#[cfg(test)]
mod tests {
    use crate::registry::ticket::ReceivedRows;
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use sqs_flight_schemas::PlanCommand;
    use sqs_flight_schemas::message::messages_to_batch;
    use tokio::time::Instant;

    use super::*;
    use crate::config::{Config, TableConfig};
    use crate::registry::PlannedBatch;
    use crate::sqs::ReceiveRequest;

    /// A registry on a 30-message demo queue with its store in `dir`.
    async fn durable(dir: &std::path::Path) -> Arc<Registry> {
        let table = TableConfig::memory("t", 30);
        let mut config = Config::new("127.0.0.1:0".parse().unwrap(), vec![table]);
        config.state_dir = Some(dir.to_path_buf());
        Registry::build(&config, None).await.unwrap()
    }

    /// Receives up to ten messages into partition 0 of `batch`, as a first
    /// read does.
    async fn read_some(r: &Registry, batch: &PlannedBatch) -> usize {
        let table = r.table("t").unwrap();
        let req = ReceiveRequest {
            max_messages: 10,
            wait: Duration::ZERO,
            visibility_timeout: Duration::from_secs(30),
        };
        let got = table.receive(req).await.unwrap();
        let messages: Vec<_> = got.iter().map(|g| g.message.clone()).collect();
        let rows = messages_to_batch(&messages, batch.batch as i64, 0).unwrap();
        let receipts = got.into_iter().map(|g| g.receipt).collect();
        let until = Instant::now() + Duration::from_secs(30);
        batch.tickets[0]
            .append(ReceivedRows::new(rows, receipts, 0, until))
            .unwrap();
        messages.len()
    }

    /// Batch 1 of consumer `c` on `t`, one partition, the table's defaults.
    fn batch_one() -> PlanCommand {
        let mut cmd = PlanCommand::new("t", "c");
        cmd.batch = Some(1);
        cmd.partitions = Some(1);
        cmd
    }

    async fn in_flight(r: &Registry) -> u64 {
        r.table("t").unwrap().attributes().await.unwrap().in_flight
    }

    /// A registry on a 10-message demo queue whose batch 1 of consumer `c`
    /// holds ten rows, each with a second receipt of its message (two
    /// overlapping calls brought it, see `dedup::offer`). The in-memory
    /// queue acts on the latest receipt only, as SQS does: the rows' own
    /// are stale, the second ones are not.
    async fn rows_with_second_receipts() -> (Arc<Registry>, Arc<PlannedBatch>) {
        let config = Config::new(
            "127.0.0.1:0".parse().unwrap(),
            vec![TableConfig::memory("t", 10)],
        );
        let r = Registry::build(&config, None).await.unwrap();
        let batch = r.plan(&batch_one()).await.unwrap();
        let table = r.table("t").unwrap();
        let receive = |vt| ReceiveRequest {
            max_messages: 10,
            wait: Duration::ZERO,
            visibility_timeout: vt,
        };
        let first = table.receive(receive(Duration::ZERO)).await.unwrap();
        let again = table
            .receive(receive(Duration::from_secs(30)))
            .await
            .unwrap();
        let ids = |got: &[crate::sqs::Received]| -> Vec<String> {
            got.iter().map(|g| g.message.message_id.clone()).collect()
        };
        assert_eq!(ids(&first), ids(&again));
        let messages: Vec<_> = first.iter().map(|g| g.message.clone()).collect();
        let rows = messages_to_batch(&messages, 1, 0).unwrap();
        let own = first.into_iter().map(|g| g.receipt).collect();
        let until = Instant::now() + Duration::from_secs(30);
        let ticket = &batch.tickets[0];
        ticket
            .append(ReceivedRows::new(rows, own, 0, until))
            .unwrap();
        for (row, g) in again.into_iter().enumerate() {
            ticket.add_second_receipt(row, g.receipt).unwrap();
        }
        (r, batch)
    }

    /// The commit deletes with both receipts and counts each message once.
    #[tokio::test]
    async fn a_message_deleted_with_two_receipts_counts_once() {
        let (r, _batch) = rows_with_second_receipts().await;
        let done = r.commit(&CommitCommand::new("t", "c", 1)).await.unwrap();
        assert_eq!((done.deleted, done.expired), (10, 0));
        assert_eq!(in_flight(&r).await, 0);
    }

    /// A release gives back with both receipts: every message is visible
    /// again at once, each counted once.
    #[tokio::test]
    async fn a_message_released_with_two_receipts_is_visible_again_and_counts_once() {
        let (r, _batch) = rows_with_second_receipts().await;
        let cmd = sqs_flight_schemas::ReleaseCommand {
            table: "t".into(),
            consumer: "c".into(),
            read_ahead_only: false,
        };
        let done = r.release(&cmd).await.unwrap();
        assert_eq!(done.released, 10);
        let counts = r.table("t").unwrap().attributes().await.unwrap();
        assert_eq!((counts.visible, counts.in_flight), (10, 0));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_ids_a_commit_deleted_are_still_committed_after_a_restart() {
        let scratch = crate::scratch::dir("window");
        let dir = scratch.path().join("state");
        let r = durable(&dir).await;
        let batch = r.plan(&batch_one()).await.unwrap();
        assert_eq!(read_some(&r, &batch).await, 10);
        r.commit(&CommitCommand::new("t", "c", 1)).await.unwrap();
        let window = |r: &Registry| r.table("t").unwrap().dedup().sizes().1;
        assert_eq!(window(&r), 10);
        // Stopped as a server stops: the writes it handed over land first.
        r.settle().await;
        drop((r, batch));
        let again = durable(&dir).await;
        assert_eq!(window(&again), 10, "the window came back from the store");
        drop(again);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_commit_the_store_cannot_write_deletes_nothing_and_can_be_made_again() {
        let scratch = crate::scratch::dir("commit");
        let dir = scratch.path().join("state");
        let r = durable(&dir).await;
        let batch = r.plan(&batch_one()).await.unwrap();
        let read = read_some(&r, &batch).await;
        assert_eq!(read, 10);
        assert_eq!(in_flight(&r).await, 10);

        let commit = CommitCommand::new("t", "c", 1);
        let store = Arc::clone(r.journal.store().unwrap());
        store.fail_writes.store(true, Ordering::SeqCst);
        let err = r.commit(&commit).await.unwrap_err().to_string();
        assert!(err.contains("nothing was deleted"), "{err}");
        assert_eq!(in_flight(&r).await, 10, "no message was deleted");
        let status = &r.consumer_status("t")["c"];
        assert_eq!(status.committed_batch, None, "the watermark did not move");
        assert_eq!(batch.tickets[0].in_flight(), 10, "the rows are still held");

        store.fail_writes.store(false, Ordering::SeqCst);
        let done = r.commit(&commit).await.unwrap();
        assert_eq!(
            (done.committed_batch, done.deleted, done.expired),
            (1, 10, 0)
        );
        assert_eq!(in_flight(&r).await, 0);
        drop((r, store, batch));
    }
}
