//! Rejects at commit: the messages a commit gives back to SQS instead of
//! deleting (docs/protocol.md, "commit").
//!
//! A commit names message ids (`reject`) and may ask for every message
//! whose typed payload did not decode (`reject_payload_errors`). Both are
//! looked up in the consumer's open batches up to the committed one before
//! anything changes ([`Registry::pick_rejects`]): an id that is not there
//! refuses the whole commit. The rows found are kept as indexes into their
//! ticket's log, which are also the indexes of their receipts, so the
//! commit splits each ticket's receipts into deletes and rejects
//! ([`Rejects::split`]).
//!
//! A rejected receipt never reaches `DeleteMessageBatch` nor the pending
//! deletes. With `--state-dir` the commit journals it among the consumer's
//! pending rejects in the same write as the new watermark, and keeps it on
//! the consumer's list while the give-back runs (so a plan that writes the
//! consumer meanwhile writes it too); after the give-back the list is
//! written again without it. A server that finds
//! pending rejects at its start gives them back once, from the heartbeat
//! ([`Registry::give_back_restored`]). A give-back SQS fails or refuses is
//! logged (and counted by `sqsf_sqs_errors_total` when the call failed) and
//! never retried: the message is not deleted, and comes back when its
//! visibility timeout ends.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use sqs_flight_schemas::CommitCommand;
use sqs_flight_schemas::command::shown_list;
use sqs_flight_schemas::json::quote_cut;

use super::ticket::Ticket;
use super::{ConsumerKey, Registry, Table};
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::sqs::ReceiptHandle;

/// The rows a commit gives back, per ticket, and how long they stay hidden.
#[derive(Default)]
pub(super) struct Rejects {
    rows: Vec<(Arc<Ticket>, std::collections::BTreeSet<usize>)>,
    delay_seconds: u32,
}

impl Rejects {
    pub(super) fn delay_seconds(&self) -> u32 {
        self.delay_seconds
    }

    /// The receipts in `second` (row, second receipt, the row's own) whose
    /// rows of `ticket` are not rejected, as (second receipt, the row's
    /// own): the commit deletes them too.
    pub(super) fn not_rejected(
        &self,
        ticket: &Arc<Ticket>,
        second: Vec<(usize, ReceiptHandle, ReceiptHandle)>,
    ) -> impl Iterator<Item = (ReceiptHandle, ReceiptHandle)> {
        let rows = self
            .rows
            .iter()
            .find(|(t, _)| Arc::ptr_eq(t, ticket))
            .map(|(_, rows)| rows.clone())
            .unwrap_or_default();
        second
            .into_iter()
            .filter(move |(row, _, _)| !rows.contains(row))
            .map(|(_, second, own)| (second, own))
    }

    /// `receipts` of `ticket`, in the order of its log, split into those to
    /// delete and those to give back.
    pub(super) fn split<T>(&self, ticket: &Arc<Ticket>, receipts: Vec<T>) -> (Vec<T>, Vec<T>) {
        let Some((_, rows)) = self.rows.iter().find(|(t, _)| Arc::ptr_eq(t, ticket)) else {
            return (receipts, Vec::new());
        };
        let mut delete = Vec::with_capacity(receipts.len());
        let mut reject = Vec::with_capacity(rows.len());
        for (i, r) in receipts.into_iter().enumerate() {
            if rows.contains(&i) {
                reject.push(r);
            } else {
                delete.push(r);
            }
        }
        (delete, reject)
    }
}

impl Registry {
    /// The rows `cmd` rejects in the consumer's open batches up to its
    /// batch. Every id must be found there; otherwise the commit is refused
    /// with INVALID_ARGUMENT naming the ids, and nothing has changed.
    pub(super) fn pick_rejects(&self, key: &ConsumerKey, cmd: &CommitCommand) -> Result<Rejects> {
        if !cmd.rejects() {
            return Ok(Rejects::default());
        }
        let ids: HashSet<&str> = cmd.reject.iter().map(String::as_str).collect();
        let mut found = HashSet::new();
        let mut rows = Vec::new();
        for t in self.open_tickets(key, ..=cmd.batch) {
            let picked = t.pick(&ids, cmd.reject_payload_errors)?;
            found.extend(picked.ids);
            if !picked.rows.is_empty() {
                rows.push((t, picked.rows));
            }
        }
        let missing: Vec<&str> = cmd
            .reject
            .iter()
            .map(String::as_str)
            .filter(|id| !found.contains(*id))
            .collect();
        if !missing.is_empty() {
            return Err(self.not_rejectable(key, cmd.batch, &missing));
        }
        Ok(Rejects {
            rows,
            delay_seconds: cmd.reject_delay_seconds.unwrap_or(0),
        })
    }

    /// The tickets of the consumer's open batches in `range`.
    fn open_tickets(
        &self,
        key: &ConsumerKey,
        range: impl std::ops::RangeBounds<u64>,
    ) -> Vec<Arc<Ticket>> {
        self.consumers
            .with(key, |c| c.tickets(range))
            .unwrap_or_default()
    }

    /// The error for ids not among the consumer's open batches up to
    /// `batch`: those in a later open batch say which.
    fn not_rejectable(&self, key: &ConsumerKey, batch: u64, missing: &[&str]) -> Error {
        let wanted: HashSet<&str> = missing.iter().copied().collect();
        let mut later = std::collections::HashMap::new();
        if batch < u64::MAX {
            for t in self.open_tickets(key, batch + 1..) {
                if let Ok(picked) = t.pick(&wanted, false) {
                    for id in picked.ids {
                        later.entry(id).or_insert(t.id().batch);
                    }
                }
            }
        }
        let named: Vec<String> = missing
            .iter()
            .map(|id| match later.get(*id) {
                Some(b) => format!("{:?} (in open batch {b}, above {batch})", quote_cut(id)),
                None => format!("{:?}", quote_cut(id)),
            })
            .collect();
        let (table, consumer) = key;
        Error::InvalidArgument(format!(
            "commit command: field `reject`: {} of {consumer:?} on table {table:?} \
             up to batch {batch}: {}; ids of messages unknown, of another consumer or of a \
             committed batch cannot be rejected. Nothing was committed, deleted or rejected",
            match missing.len() {
                1 => "1 id is not a message of the open batches".to_string(),
                n => format!("{n} ids are not messages of the open batches"),
            },
            shown_list(&named),
        ))
    }

    /// Gives back, once, the rejects a previous process journaled but may
    /// not have given back (it stopped between its commit's write and the
    /// give-back), then writes the consumers without them. Called by the
    /// heartbeat; nothing to do after the first call.
    pub(super) async fn give_back_restored(&self) {
        if !self
            .restored_rejects
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            return;
        }
        for (key, groups) in self.consumers.take_restored_rejects() {
            let Ok(table) = self.table(&key.0) else {
                continue;
            };
            let (mut rejected, mut ahead) = (0, 0);
            for g in groups {
                let read_ahead = g.is_read_ahead();
                let (receipts, delay_seconds) = g.into_parts();
                let given = give_back_rejected(table, &key.1, receipts, delay_seconds).await;
                if read_ahead {
                    ahead += given;
                } else {
                    rejected += given;
                }
            }
            self.count_rejected(&key, rejected);
            if rejected > 0 {
                tracing::info!(table = %key.0, consumer = %key.1, rejected,
                    "gave back the messages a commit of the previous process rejected");
            }
            if ahead > 0 {
                tracing::info!(table = %key.0, consumer = %key.1, messages = ahead,
                    "gave back the batch the previous process received ahead");
            }
            self.write_consumer(&key, "pending rejects");
        }
    }

    /// Counts messages given back for a consumer (status and metrics).
    pub(super) fn count_rejected(&self, key: &ConsumerKey, n: u64) {
        if n == 0 {
            return;
        }
        self.consumers.with(key, |c| c.count_rejected(n));
        Metrics::count(&self.metrics.rejected, &key.0, &key.1, n);
    }
}

/// Gives rejected messages back to SQS, hidden for `delay_seconds`, and
/// returns how many SQS took back. Receipts SQS refuses (the message is
/// visible again already) or a call that fails are logged and not retried:
/// those messages come back when their visibility timeout ends.
pub(super) async fn give_back_rejected(
    table: &Table,
    consumer: &str,
    receipts: Vec<ReceiptHandle>,
    delay_seconds: u32,
) -> u64 {
    if receipts.is_empty() {
        return 0;
    }
    let delay = Duration::from_secs(u64::from(delay_seconds));
    let out = table.change_visibility(delay, || receipts).await;
    let (refused, failed) = (out.rejected.len(), out.unresolved.len());
    if refused + failed > 0 {
        tracing::warn!(table = %table.name(), %consumer, refused, failed,
            error = out.error.as_ref().map(ToString::to_string),
            "could not give back some rejected messages; they are not deleted and return when \
             their visibility timeout ends");
    }
    out.succeeded.len() as u64
}
