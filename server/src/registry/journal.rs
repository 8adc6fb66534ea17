//! Where the registry writes what it is about to act on: the durable store
//! of `--state-dir`, or nowhere.
//!
//! The registry's logic has one path: every plan, receive, seal, commit and
//! release hands its changes to the journal before it acts, and the journal
//! writes them or, in memory only, drops them. The changes are built only
//! when they are written, so a server without a store does not pay for them
//! (a commit's receipts are not copied).

use std::sync::Arc;

use super::store::{self, Op, Store};
use crate::error::Result;

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
        match self {
            Self::Memory => Ok(()),
            Self::Durable(store) => {
                let ops = ops()?;
                if ops.is_empty() {
                    return Ok(());
                }
                store::apply(store, ops).await
            }
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
