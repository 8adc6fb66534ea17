//! Raw TCP connections a test holds open and watches for the server to
//! close (connection caps and deadlines).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::task::JoinSet;

use crate::poll::poll;

/// Reads `conn` until the server closes it (EOF or a reset).
pub async fn until_closed(conn: &mut TcpStream) {
    let mut buf = [0u8; 1024];
    while let Ok(n) = conn.read(&mut buf).await {
        if n == 0 {
            return;
        }
    }
}

/// How many of a set of connections the server has closed, counted by a
/// task per connection for as long as this lives.
pub struct ClosedConnections {
    closed: Arc<AtomicUsize>,
    _watchers: JoinSet<()>,
}

impl ClosedConnections {
    /// Watches each of `conns` until the server closes it.
    pub fn watch(conns: Vec<TcpStream>) -> Self {
        let closed = Arc::new(AtomicUsize::new(0));
        let mut watchers = JoinSet::new();
        for mut conn in conns {
            let closed = Arc::clone(&closed);
            watchers.spawn(async move {
                until_closed(&mut conn).await;
                closed.fetch_add(1, Ordering::SeqCst);
            });
        }
        Self {
            closed,
            _watchers: watchers,
        }
    }

    /// How many the server has closed so far.
    pub fn count(&self) -> usize {
        self.closed.load(Ordering::SeqCst)
    }

    /// Waits up to `within` until the server has closed at least `n`;
    /// panics saying `what` was awaited otherwise.
    pub async fn at_least(&self, n: usize, within: Duration, what: &str) {
        let count = poll(within, async || self.count(), |&c| c >= n).await;
        assert!(count.is_ok(), "{what}: {count:?} closed, {n} expected");
    }
}
