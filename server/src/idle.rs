//! `--idle-exit`: what keeps a server up, and the task that stops it.
//!
//! Only callers that proved the token count as activity: [`Activity`] is
//! touched by [`crate::auth::BearerAuth`] once a call is authenticated, so
//! anyone who can reach the port but has no token cannot keep the server
//! alive. Every DoGet (plain Flight or Flight SQL) and DoPut stream holds
//! an [`OpenStream`] from [`crate::flight::limits::StreamCounter`] while it
//! is open, however slowly its client reads; the idle period counts from
//! the later of the last authenticated call and the end of the last stream.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::registry::Registry;

/// How often the idle check looks at most and at least (a quarter of the
/// period in between).
const FASTEST_TICK: Duration = Duration::from_millis(100);
const SLOWEST_TICK: Duration = Duration::from_secs(5);

/// When the server last served an authenticated call or ended a stream,
/// and how many streams are open. Clones share the same state.
#[derive(Clone, Debug)]
pub struct Activity {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    start: Instant,
    /// Milliseconds from `start` to the last activity.
    last_ms: AtomicU64,
    open_streams: AtomicU64,
}

impl Default for Activity {
    fn default() -> Self {
        Self::new()
    }
}

impl Activity {
    pub fn new() -> Self {
        Self::started_at(Instant::now())
    }

    /// An activity whose clock started at `start` (tests start it in the past).
    pub fn started_at(start: Instant) -> Self {
        Self {
            shared: Arc::new(Shared {
                start,
                last_ms: AtomicU64::new(0),
                open_streams: AtomicU64::new(0),
            }),
        }
    }

    /// Records activity now.
    pub fn touch(&self) {
        let ms = u64::try_from(self.shared.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.shared.last_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// Counts one open stream until the returned guard is dropped, which is
    /// activity (opening one is not: the call that opened it was).
    pub fn open_stream(&self) -> OpenStream {
        self.shared.open_streams.fetch_add(1, Ordering::Relaxed);
        OpenStream {
            activity: self.clone(),
        }
    }

    /// Streams open now.
    pub fn open_streams(&self) -> u64 {
        self.shared.open_streams.load(Ordering::Relaxed)
    }

    /// How long since the last activity (or the start).
    pub fn idle_for(&self) -> Duration {
        let last = Duration::from_millis(self.shared.last_ms.load(Ordering::Relaxed));
        self.shared.start.elapsed().saturating_sub(last)
    }
}

/// One open stream of an [`Activity`]; dropping it ends the stream.
#[derive(Debug)]
pub struct OpenStream {
    activity: Activity,
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.activity
            .shared
            .open_streams
            .fetch_sub(1, Ordering::Relaxed);
        self.activity.touch();
    }
}

/// Cancels `shutdown` once `activity` has been idle for `idle` with no
/// stream open, and no consumer of `registry` holds open batches (until
/// their lease runs out and releases them) or deletes to retry.
pub async fn exit_when_idle(
    registry: Arc<Registry>,
    activity: Activity,
    idle: Duration,
    shutdown: CancellationToken,
) {
    let tick = (idle / 4).clamp(FASTEST_TICK, SLOWEST_TICK);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(tick) => {}
        }
        if activity.idle_for() < idle || activity.open_streams() > 0 || registry.holds_work() {
            continue;
        }
        tracing::info!(
            idle_exit_s = idle.as_secs(),
            "no authenticated RPC and no open stream for the --idle-exit period, nothing held: exiting"
        );
        shutdown.cancel();
        return;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An activity whose clock started a minute ago, untouched since.
    fn a_minute_old() -> Activity {
        let start = Instant::now().checked_sub(Duration::from_secs(60));
        Activity::started_at(start.expect("the clock is older than a minute"))
    }

    #[test]
    fn a_touch_restarts_the_idle_time() {
        let a = a_minute_old();
        assert!(
            a.idle_for() >= Duration::from_secs(59),
            "{:?}",
            a.idle_for()
        );
        a.clone().touch();
        assert!(a.idle_for() < Duration::from_secs(30), "{:?}", a.idle_for());
    }

    #[test]
    fn open_streams_are_counted_and_their_end_is_activity() {
        let a = a_minute_old();
        let (s1, s2) = (a.open_stream(), a.open_stream());
        assert_eq!(a.open_streams(), 2);
        assert!(
            a.idle_for() >= Duration::from_secs(59),
            "opening is not activity"
        );
        drop(s1);
        assert_eq!(a.open_streams(), 1);
        assert!(
            a.idle_for() < Duration::from_secs(30),
            "the end of a stream is activity"
        );
        drop(s2);
        assert_eq!(a.open_streams(), 0);
    }
}
