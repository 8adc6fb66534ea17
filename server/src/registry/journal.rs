//! Where the registry writes what it is about to act on: the durable store
//! of `--state-dir`, or nowhere.
//!
//! The registry's logic has one path: every plan, receive, seal, commit and
//! release hands its changes to the journal before it acts, and the journal
//! writes them or, in memory only, drops them. The changes are built only
//! when they are written, so a server without a store does not pay for them
//! (a commit's receipts are not copied).

use std::sync::Arc;
use std::time::Duration;

use super::store::{self, Op, Store};
use crate::error::Result;

/// How long a receive may wait to be written with later ones when the
/// state is in object storage (`--state-url`): a receive of ten messages
/// each would cost a PUT per ten messages. Rows are streamed once written,
/// so this is also how much later a reader may see them.
pub(crate) const STATE_LOG_LINGER: Duration = Duration::from_millis(200);

/// A write handed to the journal: landed, or waiting for the writer.
pub(crate) enum Written {
    Landed(Result<()>),
    Waiting(tokio::sync::oneshot::Receiver<Result<()>>),
}

impl Written {
    /// The write's outcome, once it has landed (cancel-safe: a `select!`
    /// may drop it and call again).
    pub(crate) async fn outcome(&mut self) -> Result<()> {
        match self {
            Self::Landed(outcome) => take(outcome),
            Self::Waiting(answer) => answer.await.unwrap_or_else(|_| Err(store::stopped())),
        }
    }

    /// The outcome without waiting, if the write has landed.
    pub(crate) fn landed(&mut self) -> Option<Result<()>> {
        match self {
            Self::Landed(outcome) => Some(take(outcome)),
            Self::Waiting(answer) => match answer.try_recv() {
                Ok(outcome) => Some(outcome),
                Err(tokio::sync::oneshot::error::TryRecvError::Empty) => None,
                Err(tokio::sync::oneshot::error::TryRecvError::Closed) => {
                    Some(Err(store::stopped()))
                }
            },
        }
    }
}

/// A landed write's outcome, once: asked again, the writer is gone.
fn take(outcome: &mut Result<()>) -> Result<()> {
    std::mem::replace(outcome, Err(store::stopped()))
}

/// The registry's journal.
pub(crate) enum Journal {
    /// No `--state-dir`: nothing is written and every write succeeds.
    Memory,
    /// Every write is on disk before it returns.
    Durable(Arc<Store>),
}

impl Journal {
    /// Writes the changes `ops` builds (built only if they are kept); no
    /// changes write nothing.
    pub(crate) async fn write(&self, ops: impl FnOnce() -> Result<Vec<Op>>) -> Result<()> {
        self.submit(ops)?.outcome().await
    }

    /// Waits until every write handed over so far has landed (they land
    /// in order); a failure is logged.
    pub(crate) async fn settle(&self) {
        if let Self::Durable(store) = self
            && let Err(e) = store::apply(store, Vec::new()).await
        {
            tracing::warn!(error = %e, "state store: the last writes before the stop failed");
        }
    }

    /// Hands the changes `ops` builds to the writer without waiting for
    /// them: writes handed over one after the other land in that order.
    /// In memory nothing is built, and in memory or with no changes the
    /// write has landed already.
    pub(crate) fn submit(&self, ops: impl FnOnce() -> Result<Vec<Op>>) -> Result<Written> {
        let Self::Durable(store) = self else {
            return Ok(Written::Landed(Ok(())));
        };
        let ops = ops()?;
        if ops.is_empty() {
            return Ok(Written::Landed(Ok(())));
        }
        Ok(Written::Waiting(store::submit(store, ops)?))
    }

    /// How long a receive may wait to be written together with later ones
    /// (see [`crate::registry::receive`]): [`STATE_LOG_LINGER`] when the
    /// state is in object storage, where each write is a billed request
    /// with a round trip of its own; none for a local store, whose writes
    /// are grouped by the writer thread as they queue.
    pub(crate) fn linger(&self) -> Duration {
        match self {
            Self::Durable(store) if store.replica().is_some() => STATE_LOG_LINGER,
            _ => Duration::ZERO,
        }
    }

    /// Whether the state log (`--state-url`) is still this server's: a
    /// probe without writing; fenced once another server took it over.
    pub(crate) async fn check_state_log(&self) -> Result<()> {
        match self {
            Self::Durable(store) => match store.replica() {
                Some(replica) => replica.probe().await,
                None => Ok(()),
            },
            Self::Memory => Ok(()),
        }
    }

    /// The store, for the unit tests that make its writes fail.
    #[cfg(test)]
    pub(crate) fn store(&self) -> Option<&Arc<Store>> {
        match self {
            Self::Memory => None,
            Self::Durable(store) => Some(store),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;
    use crate::error::Error;

    #[tokio::test]
    async fn a_memory_journal_builds_no_changes_and_a_durable_one_reports_their_failure() {
        let built = AtomicBool::new(false);
        let ops = || {
            built.store(true, Ordering::SeqCst);
            Err(Error::Internal("cannot build".into()))
        };
        Journal::Memory.write(ops).await.unwrap();
        assert!(!built.load(Ordering::SeqCst), "nothing built in memory");

        let scratch = crate::scratch::dir("journal");
        let dir = scratch.path().join("state");
        let durable = Journal::Durable(Arc::new(Store::open(&dir).unwrap()));
        let err = durable.write(ops).await.unwrap_err().to_string();
        assert!(built.load(Ordering::SeqCst));
        assert_eq!(err, "cannot build");
        durable.write(|| Ok(Vec::new())).await.unwrap();
        drop(durable);
    }
}
