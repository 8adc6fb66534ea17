//! The connections of the operations port, from `accept` until hyper has
//! served them: the same hygiene as the Flight port's
//! ([`crate::server::incoming`]), for plain HTTP/1.1.
//!
//! - **Caps.** At most [`Limits::max_connections`] connections are open at
//!   once (`metrics_max_connections`, lowered to 1/16 of the process's
//!   file-descriptor limit: [`crate::fd_reserve`]), at most
//!   [`Limits::per_client`] per client (`metrics_max_connections_per_client`;
//!   a client is an IPv4 address or an IPv6 /64 prefix).
//! - **Who gives way.** A new connection over a cap takes the place of the
//!   connection of the same scope (all clients, or that client) that has
//!   sent or received nothing for the longest time. An answer takes a
//!   millisecond once its request has arrived, so a client that asks is
//!   not the one closed. When `accept` fails for want of file descriptors,
//!   the longest-idle connection is closed too.
//! - **Header deadline.** A request must send its whole header within
//!   [`Limits::header_timeout`] (`metrics_header_timeout`), counted from
//!   the connection's start or, on a keep-alive connection, from the
//!   previous answer: this also bounds how long an idle connection stays.
//! - **Header size.** At most [`MAX_HEADER_BYTES`] of request line and
//!   headers, [`MAX_HEADERS`] headers: past them, `431 Request Header
//!   Fields Too Large` and the connection is closed. hyper's buffers are
//!   capped at [`MAX_BUF_BYTES`].
//! - **Stall.** A connection that moves no byte either way for
//!   [`STALL_TIMEOUT`] (a client that does not read its answers) is
//!   closed.
//!
//! Every accepted socket gets TCP_NODELAY and TCP keepalive.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Bytes of request line and headers one request may send.
pub(crate) const MAX_HEADER_BYTES: usize = 8 << 10;
/// Headers one request may send.
pub(crate) const MAX_HEADERS: usize = 64;
/// hyper's read and write buffers, each (its least is 8 KiB).
pub(crate) const MAX_BUF_BYTES: usize = 16 << 10;
/// A connection that moves no byte for this long is closed (longer than
/// `/readyz` waits for the first check, [`super::FIRST_CHECK_WAIT`]).
pub(crate) const STALL_TIMEOUT: Duration = Duration::from_secs(30);
/// At shutdown, how long a request being answered may take to finish.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(1);
/// Pause after a failed `accept`, so that a lack of file descriptors does
/// not spin the loop.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(10);
/// At most one warning per this long about closed connections.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// The bounds of [`serve`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub max_connections: usize,
    pub per_client: u32,
    pub header_timeout: Duration,
}

impl Limits {
    /// The limits of `config`, `max_connections` lowered to the metrics
    /// port's share of the file-descriptor limit.
    pub(crate) fn of(config: &crate::Config) -> Self {
        Self {
            max_connections: crate::fd_reserve::http_connections(
                config.metrics_max_connections as usize,
            ),
            per_client: config.metrics_max_connections_per_client,
            header_timeout: config.metrics_header_timeout,
        }
    }
}

/// Serves `app` over HTTP/1.1 on the connections of `listener`, within
/// `limits`, until `shutdown`; then each connection finishes the request
/// it is answering (up to [`SHUTDOWN_WAIT`]) and is closed.
pub(super) async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    shutdown: CancellationToken,
) -> io::Result<()> {
    tracing::info!(
        metrics_max_connections = limits.max_connections,
        metrics_max_connections_per_client = limits.per_client,
        metrics_header_timeout_s = limits.header_timeout.as_secs_f64(),
        "metrics port connection limits"
    );
    let mut acceptor = Acceptor {
        table: Table::new(limits),
        tasks: JoinSet::new(),
        warned: None,
    };
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => acceptor.admit(stream, peer, &app, &shutdown),
                Err(e) => acceptor.accept_failed(e).await,
            },
            Some(_) = acceptor.tasks.join_next(), if !acceptor.tasks.is_empty() => {}
        }
    }
    drop(listener);
    let tasks = &mut acceptor.tasks;
    let _ = tokio::time::timeout(SHUTDOWN_WAIT * 2, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    Ok(())
}

/// The key a client's connections are counted under: its IPv4 address, or
/// the /64 prefix of its IPv6 address (one host commonly has a whole /64).
fn client_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        },
    }
}

/// When a connection last moved a byte, in milliseconds since its
/// table's epoch.
#[derive(Debug)]
struct Activity {
    epoch: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn new(epoch: Instant) -> Arc<Self> {
        let activity = Arc::new(Self {
            epoch,
            last_ms: AtomicU64::new(0),
        });
        activity.touch();
        activity
    }

    /// Records that a byte moved now.
    fn touch(&self) {
        let now = self.epoch.elapsed().as_millis() as u64;
        self.last_ms.fetch_max(now, Ordering::Relaxed);
    }

    fn last_ms(&self) -> u64 {
        self.last_ms.load(Ordering::Relaxed)
    }

    fn last(&self) -> Instant {
        self.epoch + Duration::from_millis(self.last_ms())
    }
}

/// One open connection, as the table knows it.
struct Entry {
    client: IpAddr,
    activity: Arc<Activity>,
    /// Cancelled to close the connection.
    close: CancellationToken,
}

/// The open connections, in total and per client.
struct Inner {
    next_id: u64,
    entries: HashMap<u64, Entry>,
    per_client: HashMap<IpAddr, u32>,
}

impl Inner {
    /// Forgets connection `id`; false if it was already forgotten.
    fn remove(&mut self, id: u64) -> Option<Entry> {
        let entry = self.entries.remove(&id)?;
        if let Some(n) = self.per_client.get_mut(&entry.client) {
            *n -= 1;
            if *n == 0 {
                self.per_client.remove(&entry.client);
            }
        }
        Some(entry)
    }

    /// The connection (of `client` only, if given) that has been idle the
    /// longest.
    fn longest_idle(&self, client: Option<IpAddr>) -> Option<u64> {
        self.entries
            .iter()
            .filter(|(_, e)| client.is_none_or(|c| e.client == c))
            .min_by_key(|(id, e)| (e.activity.last_ms(), **id))
            .map(|(id, _)| *id)
    }
}

/// The connection table, shared by the acceptor and the connections' slots.
#[derive(Clone)]
struct Table {
    limits: Limits,
    epoch: Instant,
    inner: Arc<Mutex<Inner>>,
}

impl Table {
    fn new(limits: Limits) -> Self {
        Self {
            limits,
            epoch: Instant::now(),
            inner: Arc::new(Mutex::new(Inner {
                next_id: 0,
                entries: HashMap::new(),
                per_client: HashMap::new(),
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Counts in a new connection of `client`, first closing the
    /// longest-idle connection of each cap it would go over; the closed
    /// connections' count.
    fn admit(&self, client: IpAddr) -> (Slot, usize) {
        let mut inner = self.lock();
        let mut evicted = 0;
        while inner.per_client.get(&client).copied().unwrap_or(0) >= self.limits.per_client
            && Self::close(&mut inner, Some(client))
        {
            evicted += 1;
        }
        while inner.entries.len() >= self.limits.max_connections && Self::close(&mut inner, None) {
            evicted += 1;
        }
        let id = inner.next_id;
        inner.next_id += 1;
        let activity = Activity::new(self.epoch);
        let close = CancellationToken::new();
        inner.entries.insert(
            id,
            Entry {
                client,
                activity: Arc::clone(&activity),
                close: close.clone(),
            },
        );
        *inner.per_client.entry(client).or_default() += 1;
        let slot = Slot {
            table: self.clone(),
            id,
            activity,
            close,
        };
        (slot, evicted)
    }

    /// Closes the longest-idle connection (of `client` only, if given):
    /// counted out now, its socket closed by its task.
    fn close(inner: &mut Inner, client: Option<IpAddr>) -> bool {
        let Some(id) = inner.longest_idle(client) else {
            return false;
        };
        if let Some(entry) = inner.remove(id) {
            entry.close.cancel();
        }
        true
    }

    fn open(&self) -> usize {
        self.lock().entries.len()
    }
}

/// A connection's place in the table, given back when dropped.
struct Slot {
    table: Table,
    id: u64,
    activity: Arc<Activity>,
    close: CancellationToken,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.table.lock().remove(self.id);
    }
}

struct Acceptor {
    table: Table,
    tasks: JoinSet<()>,
    /// When connections closed to make room were last logged.
    warned: Option<Instant>,
}

impl Acceptor {
    /// Counts `stream` in (closing the longest-idle connection of a full
    /// cap) and serves it in a task of its own.
    fn admit(
        &mut self,
        stream: TcpStream,
        peer: SocketAddr,
        app: &Router,
        stop: &CancellationToken,
    ) {
        let client = client_key(peer.ip());
        let (slot, evicted) = self.table.admit(client);
        if evicted > 0 {
            self.warn_evicted(evicted, client);
        }
        crate::server::incoming::configure(&stream, peer);
        let conn = serve_one(
            stream,
            peer,
            slot,
            app.clone(),
            self.table.limits,
            stop.clone(),
        );
        self.tasks.spawn(conn);
    }

    /// Warns at most every [`WARN_EVERY`] that connections were closed to
    /// make room.
    fn warn_evicted(&mut self, evicted: usize, client: IpAddr) {
        if self.warned.is_some_and(|t| t.elapsed() < WARN_EVERY) {
            return;
        }
        tracing::warn!(closed = evicted, %client, open = self.table.open(),
            "metrics port: the longest-idle connection closed to make room \
             (metrics_max_connections, metrics_max_connections_per_client)");
        self.warned = Some(Instant::now());
    }

    /// After a failed `accept`: without file descriptors, the longest-idle
    /// connection makes room; then a short pause.
    async fn accept_failed(&mut self, e: io::Error) {
        let out_of_fds = matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE));
        if out_of_fds && Table::close(&mut self.table.lock(), None) {
            tracing::debug!(error = %e, "metrics port: no file descriptor left; the longest-idle connection closed");
        } else {
            tracing::debug!(error = %e, "metrics port: accept failed");
        }
        tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
    }
}

/// hyper's HTTP/1.1 server with the bounds of this module.
fn http1_builder(header_timeout: Duration) -> http1::Builder {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .max_header_size(MAX_HEADER_BYTES)
        .max_headers(MAX_HEADERS)
        .max_buf_size(MAX_BUF_BYTES)
        .keep_alive(true);
    builder
}

/// Serves one connection until it ends, is closed to make room, stalls,
/// or the server stops; its slot is given back when this returns.
async fn serve_one(
    stream: TcpStream,
    peer: SocketAddr,
    slot: Slot,
    app: Router,
    limits: Limits,
    stop: CancellationToken,
) {
    let io = TokioIo::new(Tracked {
        stream,
        activity: Arc::clone(&slot.activity),
    });
    let builder = http1_builder(limits.header_timeout);
    let conn = builder.serve_connection(io, TowerToHyperService::new(app));
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        done = conn.as_mut() => {
            if let Err(e) = done {
                tracing::debug!(%peer, error = %e, "metrics port: connection ended");
            }
        }
        _ = slot.close.cancelled() => {
            tracing::debug!(%peer, "metrics port: connection closed to make room");
        }
        _ = stalled(&slot.activity, STALL_TIMEOUT) => {
            tracing::debug!(%peer, stall_timeout_s = STALL_TIMEOUT.as_secs(),
                "metrics port: connection moved no byte: closed");
        }
        _ = stop.cancelled() => {
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(SHUTDOWN_WAIT, conn).await;
        }
    }
}

/// Returns once `activity` shows no byte moved for `limit`.
async fn stalled(activity: &Activity, limit: Duration) {
    loop {
        let deadline = activity.last() + limit;
        if Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep_until(deadline).await;
    }
}

/// A socket that records in its [`Activity`] when a byte moved.
struct Tracked {
    stream: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_connections: usize, per_client: u32) -> Limits {
        Limits {
            max_connections,
            per_client,
            header_timeout: Duration::from_secs(10),
        }
    }

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2));

    #[tokio::test(start_paused = true)]
    async fn over_the_total_cap_the_longest_idle_connection_gives_way() {
        let table = Table::new(limits(3, 10));
        let (first, _) = table.admit(A);
        tokio::time::advance(Duration::from_secs(1)).await;
        let (second, _) = table.admit(B);
        tokio::time::advance(Duration::from_secs(1)).await;
        let (third, _) = table.admit(A);
        tokio::time::advance(Duration::from_secs(1)).await;
        // The first moves a byte: the second is now the longest idle.
        first.activity.touch();
        let (_fourth, evicted) = table.admit(A);
        assert_eq!(evicted, 1);
        assert!(second.close.is_cancelled());
        assert!(!first.close.is_cancelled() && !third.close.is_cancelled());
        assert_eq!(table.open(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn over_the_per_client_cap_only_that_clients_connections_give_way() {
        let table = Table::new(limits(10, 2));
        let (other, _) = table.admit(B);
        tokio::time::advance(Duration::from_secs(1)).await;
        let (a1, _) = table.admit(A);
        tokio::time::advance(Duration::from_secs(1)).await;
        let (a2, _) = table.admit(A);
        let (_a3, evicted) = table.admit(A);
        assert_eq!(evicted, 1);
        assert!(a1.close.is_cancelled());
        assert!(!a2.close.is_cancelled() && !other.close.is_cancelled());
        assert_eq!(table.lock().per_client.get(&A).copied(), Some(2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_slot_is_given_back_once_even_after_eviction() {
        let table = Table::new(limits(1, 1));
        let (first, _) = table.admit(A);
        let (second, evicted) = table.admit(A);
        assert_eq!(evicted, 1);
        drop(first);
        assert_eq!(
            table.open(),
            1,
            "the evicted slot's drop frees nothing more"
        );
        drop(second);
        assert_eq!(table.open(), 0);
        assert!(table.lock().per_client.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_moves_nothing_stalls_after_the_limit() {
        let activity = Activity::new(Instant::now());
        let start = Instant::now();
        tokio::time::advance(Duration::from_secs(5)).await;
        activity.touch();
        stalled(&activity, Duration::from_secs(30)).await;
        assert_eq!(start.elapsed(), Duration::from_secs(35));
    }
}
