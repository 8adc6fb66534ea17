//! The registry's background work, and how a stopping server waits for it.
//!
//! Receive loops (and the ReceiveMessage calls they leave in flight) and
//! the deletes of commits that answered before them (`--deletes-behind`)
//! run as tasks the registry tracks here, so that [`Background::settle`]
//! waits for them when the server stops; receives of batches read ahead
//! take a child of the token that stops them.

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::MAX_SETTLE;

/// The registry's tracked tasks and its stop signal.
pub(super) struct Background {
    /// Receive loops, and the calls they left in flight, until what those
    /// calls bring is handed back.
    receiving: TaskTracker,
    /// The deletes of commits that answered before them.
    deleting: TaskTracker,
    /// Cancelled when the server stops: ends the receives of batches read
    /// ahead (see [`super::ahead`]).
    stopping: CancellationToken,
    /// How long [`Background::settle`] waits (`--shutdown-grace`).
    shutdown_grace: Duration,
}

impl Background {
    pub(super) fn new(shutdown_grace: Duration) -> Self {
        Self {
            receiving: TaskTracker::new(),
            deleting: TaskTracker::new(),
            stopping: CancellationToken::new(),
            shutdown_grace,
        }
    }

    /// The tracker of receive loops and the calls they left in flight.
    pub(super) fn receiving(&self) -> &TaskTracker {
        &self.receiving
    }

    /// The tracker of deletes that run behind their commit's answer.
    pub(super) fn deleting(&self) -> &TaskTracker {
        &self.deleting
    }

    /// A token cancelled when the server stops.
    pub(super) fn stop_token(&self) -> CancellationToken {
        self.stopping.child_token()
    }

    /// Stops the receives of batches read ahead, then waits, up to the
    /// shutdown grace period but no more than [`MAX_SETTLE`], for the
    /// tracked tasks to end; logs what is still in flight after that.
    pub(super) async fn settle(&self) {
        self.stopping.cancel();
        self.receiving.close();
        self.deleting.close();
        let limit = self.shutdown_grace.min(MAX_SETTLE);
        let both = async { tokio::join!(self.receiving.wait(), self.deleting.wait()) };
        if tokio::time::timeout(limit, both).await.is_err() {
            tracing::warn!(
                waited_s = limit.as_secs_f64(),
                receiving = self.receiving.len(),
                deleting = self.deleting.len(),
                "receive or delete calls still in flight after the shutdown grace period; what \
                 a receive brings, or a delete leaves, reappears after its visibility timeout"
            );
        }
    }
}
