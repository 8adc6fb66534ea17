//! The connections of the Flight port, from `accept` until tonic serves them.
//!
//! A connection that sends nothing must cost little and not for long, and
//! a flood of them must not lock out a client that speaks:
//!
//! - **Caps.** At most [`Limits::max_connections`] connections are open at
//!   once (`max_connections`, lowered to 3/4 of the process's
//!   file-descriptor limit), at most [`Limits::per_client`] per client
//!   (`max_connections_per_client`; a client is an IPv4 address or an IPv6
//!   /64 prefix).
//! - **Preface deadline.** A new connection must send its first
//!   [`PREFACE_LEN`] bytes within [`Limits::preface_timeout`]: the HTTP/2
//!   client preface (checked), or with TLS the start of its ClientHello
//!   (tonic then gives the handshake its own timeout). Else it is closed.
//! - **Who gives way.** A new connection over a cap takes the place of one
//!   connection of the same scope (all clients, or that client), whatever
//!   it has sent: the first by [`Conn::eviction_rank`], that is a
//!   connection with no call open before one with a call open, then one
//!   that has made no call with the token (an unauthenticated one, or one
//!   still waiting for its preface) before one that has, then the one idle
//!   (or, with calls open, unchanged) for the longest time. No client can
//!   hold its places by sending pings or prefaces alone. When `accept`
//!   fails for want of file descriptors, the first connection by the same
//!   order is closed.
//! - **Calls.** Each accepted connection carries a [`ConnHandle`] in its
//!   connect info: [`super::calls`] counts the calls (HTTP/2 streams) open
//!   on it and per client with it, which is what "idle" means above.
//! - **Narrow connections.** A client's first [`ROOMY_CONNECTIONS`]
//!   connections open at once may each carry `max_calls_per_connection`
//!   calls (their HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS); the ones it opens
//!   beside them are [`Conn::narrow`] and carry at most
//!   [`NARROW_CALLS_PER_CONNECTION`]. HTTP/2 refuses a stream over that in
//!   its frame decoder (RST_STREAM REFUSED_STREAM: no request is built, no
//!   task spawned), so a client that opens hundreds of connections and
//!   hundreds of streams on each costs the server a few calls per
//!   connection, not hundreds; a client that respects the setting queues
//!   its calls instead.
//!
//! Every accepted socket gets TCP_NODELAY (small gRPC frames must not wait
//! for the peer's delayed ACK, ~40 ms) and TCP keepalive.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::task::AtomicWaker;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{AbortHandle, JoinSet};
use tonic::transport::server::{Connected, TcpConnectInfo};

/// Bytes a connection must send before it is served: the length of the
/// HTTP/2 client preface (a TLS ClientHello is longer).
pub(crate) const PREFACE_LEN: usize = 24;
/// The HTTP/2 client preface (RFC 9113, 3.4).
const PREFACE: &[u8; PREFACE_LEN] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Idle time before the first TCP keepalive probe.
const TCP_KEEPALIVE_TIME: Duration = Duration::from_secs(60);
/// Time between TCP keepalive probes.
const TCP_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// Unanswered probes after which the kernel drops the connection.
const TCP_KEEPALIVE_RETRIES: u32 = 6;
/// Pause after a failed `accept`, so that a lack of file descriptors does
/// not spin the loop.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(10);
/// At most one warning per this long about refused connections.
const WARN_EVERY: Duration = Duration::from_secs(10);
/// Connections a client (an address) may have open at once that each
/// carry `max_calls_per_connection` calls: room for a client that
/// multiplexes its calls on one connection, or a few.
pub const ROOMY_CONNECTIONS: u32 = 4;
/// Calls (HTTP/2 streams) a client's connections past the first
/// [`ROOMY_CONNECTIONS`] carry at once each (`max_calls_per_connection`
/// when that is lower): a Spark host's Python workers open a connection
/// each and one or two calls on it.
pub const NARROW_CALLS_PER_CONNECTION: u32 = 16;
/// Share of the soft file-descriptor limit that connections may use; the
/// rest is for SQS connections, the registry and the SQL threads' files.
const FD_SHARE_NUM: u64 = 3;
const FD_SHARE_DEN: u64 = 4;

/// The bounds of [`incoming`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub max_connections: usize,
    pub per_client: u32,
    pub preface_timeout: Duration,
    /// TLS on: the first bytes are a ClientHello, not the HTTP/2 preface.
    pub tls: bool,
}

impl Limits {
    /// The limits of `config`, `max_connections` lowered to fit the
    /// process's file-descriptor limit.
    pub(crate) fn of(config: &crate::Config) -> Self {
        let wanted = config.max_connections as usize;
        let max_connections = match fd_limit() {
            Some(soft) => wanted.min((soft / FD_SHARE_DEN * FD_SHARE_NUM).max(1) as usize),
            None => wanted,
        };
        if max_connections < wanted {
            tracing::warn!(
                max_connections = wanted,
                used = max_connections,
                fd_limit = fd_limit(),
                "max_connections lowered to 3/4 of the file-descriptor limit"
            );
        }
        Self {
            max_connections,
            per_client: config.max_connections_per_client,
            preface_timeout: config.preface_timeout,
            tls: config.tls.is_some(),
        }
    }
}

/// The connections accepted on `listener` that passed the caps and sent
/// their preface in time, for tonic's `serve_with_incoming_shutdown`.
/// Never yields an error (tonic would stop serving); dropping the stream
/// closes the listener and every connection still waiting.
pub(crate) fn incoming(
    listener: TcpListener,
    limits: Limits,
) -> impl futures::Stream<Item = Result<Conn, io::Error>> {
    let acceptor = Acceptor {
        listener,
        limits,
        counts: Arc::new(Mutex::new(Counts::default())),
        epoch: tokio::time::Instant::now(),
        waiting: JoinSet::new(),
        refused: Refusals::default(),
    };
    futures::stream::unfold(acceptor, |mut a| async move {
        let conn = a.next().await;
        Some((Ok(conn), a))
    })
}

/// A stream of served connections, as tonic takes them.
pub(crate) type ConnStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<Conn, io::Error>> + Send>>;

/// The connections of `incoming` in two streams, the roomy ones and the
/// [`Conn::narrow`] ones, each for a tonic server of its own
/// SETTINGS_MAX_CONCURRENT_STREAMS. Accepting stops (and `incoming` is
/// dropped, closing the listener) once either stream is dropped: tonic
/// drops its stream when it stops serving.
pub(crate) fn split(
    incoming: impl futures::Stream<Item = Result<Conn, io::Error>> + Send + 'static,
) -> (ConnStream, ConnStream) {
    use futures::StreamExt;
    let (roomy_tx, roomy_rx) = tokio::sync::mpsc::channel(SPLIT_QUEUE);
    let (narrow_tx, narrow_rx) = tokio::sync::mpsc::channel(SPLIT_QUEUE);
    tokio::spawn(async move {
        let mut incoming = std::pin::pin!(incoming);
        loop {
            let next = tokio::select! {
                _ = roomy_tx.closed() => break,
                _ = narrow_tx.closed() => break,
                next = incoming.next() => next,
            };
            let Some(next) = next else { break };
            let to = match &next {
                Ok(conn) if conn.narrow() => &narrow_tx,
                _ => &roomy_tx,
            };
            if to.send(next).await.is_err() {
                break;
            }
        }
    });
    let stream = |rx| -> ConnStream { Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)) };
    (stream(roomy_rx), stream(narrow_rx))
}

/// Connections [`split`] holds for a server that has not taken them yet.
const SPLIT_QUEUE: usize = 16;

/// The soft `RLIMIT_NOFILE`, if it can be read and is finite.
pub(crate) fn fd_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given and nothing else.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return None;
    }
    // rlim_t is u64 on Linux, but not everywhere.
    #[allow(clippy::unnecessary_cast)]
    let soft = lim.rlim_cur as u64;
    (lim.rlim_cur != libc::RLIM_INFINITY).then_some(soft)
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (each connection
/// takes a descriptor) and logs both.
pub fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given and nothing else.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        tracing::warn!(error = %io::Error::last_os_error(), "cannot read RLIMIT_NOFILE");
        return;
    }
    let before = lim.rlim_cur;
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit reads the struct it is given.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            tracing::warn!(soft = before, hard = lim.rlim_max, error = %io::Error::last_os_error(),
                "cannot raise RLIMIT_NOFILE to its hard limit");
            return;
        }
    }
    tracing::info!(
        before,
        now = fd_limit(),
        hard = lim.rlim_max,
        "file-descriptor limit (RLIMIT_NOFILE) raised to its hard limit"
    );
}

/// The key a client's connections are counted under: its IPv4 address, or
/// the /64 prefix of its IPv6 address (one host commonly has a whole /64).
pub(crate) fn client_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        },
    }
}

/// Open connections, in total and per client; calls open per client and
/// in total; and every open connection, for eviction.
#[derive(Debug, Default)]
struct Counts {
    total: usize,
    per_client: HashMap<IpAddr, u32>,
    calls: u32,
    calls_per_client: HashMap<IpAddr, u32>,
    /// The connections holding a place, by id.
    open: HashMap<u64, Arc<Place>>,
    next_id: u64,
}

type SharedCounts = Arc<Mutex<Counts>>;

fn lock(counts: &SharedCounts) -> std::sync::MutexGuard<'_, Counts> {
    counts
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Milliseconds since `epoch`, for the atomic clocks of [`Place`].
fn millis_since(epoch: tokio::time::Instant) -> u64 {
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// One connection's place in the counts, given back once, and what the
/// eviction order needs to know of it.
#[derive(Debug)]
struct Place {
    id: u64,
    counts: SharedCounts,
    client: IpAddr,
    /// When the counts were made: the origin of `changed_ms` (tokio's
    /// clock, which tests can pause).
    epoch: tokio::time::Instant,
    given_back: AtomicBool,
    /// Calls open on this connection.
    calls: AtomicU32,
    /// When a call last opened or closed (or the connection was
    /// accepted), in milliseconds since `epoch`.
    changed_ms: AtomicU64,
    /// Whether a call on it has passed the token check.
    authenticated: AtomicBool,
    /// Calls refused for a cap since the last one let in: at
    /// [`REFUSED_CALLS_BEFORE_CLOSE`] the connection is closed.
    refused_in_a_row: AtomicU32,
    /// Woken when the place is taken away, so that the connection's reads
    /// and writes fail and tonic drops it.
    read_waker: AtomicWaker,
    write_waker: AtomicWaker,
    /// The task still waiting for the connection's preface, if any.
    preface_task: Mutex<Option<AbortHandle>>,
    /// Whether its client had [`ROOMY_CONNECTIONS`] open when it came.
    narrow: bool,
}

impl Place {
    fn take(counts: &SharedCounts, client: IpAddr, epoch: tokio::time::Instant) -> Arc<Self> {
        let mut c = lock(counts);
        c.total += 1;
        let mine = c.per_client.entry(client).or_default();
        *mine += 1;
        let narrow = *mine > ROOMY_CONNECTIONS;
        c.next_id += 1;
        let place = Arc::new(Self {
            id: c.next_id,
            counts: Arc::clone(counts),
            client,
            epoch,
            given_back: AtomicBool::new(false),
            calls: AtomicU32::new(0),
            changed_ms: AtomicU64::new(millis_since(epoch)),
            authenticated: AtomicBool::new(false),
            refused_in_a_row: AtomicU32::new(0),
            read_waker: AtomicWaker::new(),
            write_waker: AtomicWaker::new(),
            preface_task: Mutex::new(None),
            narrow,
        });
        c.open.insert(place.id, Arc::clone(&place));
        place
    }

    /// Gives the place back (the first call only).
    fn give_back(&self) {
        if self.given_back.swap(true, Ordering::AcqRel) {
            return;
        }
        let mut c = lock(&self.counts);
        c.total = c.total.saturating_sub(1);
        c.open.remove(&self.id);
        if let Some(n) = c.per_client.get_mut(&self.client) {
            *n -= 1;
            if *n == 0 {
                c.per_client.remove(&self.client);
            }
        }
    }

    /// Takes the place away: gives it back, then closes the connection
    /// (its preface task ends; a served connection's next read fails).
    fn evict(&self) {
        self.give_back();
        let task = self
            .preface_task
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        if let Some(task) = task {
            task.abort();
        }
        self.read_waker.wake();
        self.write_waker.wake();
    }

    fn given_back(&self) -> bool {
        self.given_back.load(Ordering::Acquire)
    }

    fn touch(&self) {
        self.changed_ms
            .store(millis_since(self.epoch), Ordering::Release);
    }

    /// The order in which connections give way, smallest first: no call
    /// open before a call open, unauthenticated before authenticated, then
    /// the longest unchanged.
    fn eviction_rank(&self) -> (bool, bool, u64) {
        (
            self.calls.load(Ordering::Acquire) > 0,
            self.authenticated.load(Ordering::Acquire),
            self.changed_ms.load(Ordering::Acquire),
        )
    }
}

/// Calls each connection may have open whatever its client's count
/// (`max_calls_per_client`; `max_calls` and `max_calls_per_connection`
/// still apply): all local clients share the address 127.0.0.1, and one of
/// them holding the whole allowance must not keep another's new connection
/// from making its calls. A client thus holds at most this many more calls
/// per connection it keeps open (8 x 512 with the defaults).
pub(crate) const CALLS_EVERY_CONNECTION_MAY_OPEN: u32 = 8;

/// Calls refused in a row for a cap (none let in between) after which the
/// connection is closed. Each refusal is an answer the server makes, so a
/// client that opens stream after stream past its allowance (hundreds per
/// connection, on hundreds of connections) would otherwise keep the
/// runtime busy answering them while other clients wait; a client that
/// backs off when refused never comes near this.
pub(crate) const REFUSED_CALLS_BEFORE_CLOSE: u32 = 64;

/// The caps on calls (HTTP/2 streams of any RPC) that
/// [`ConnHandle::open_call`] applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CallLimits {
    /// `max_calls_per_client`.
    pub per_client: u32,
    /// `max_calls_per_connection`.
    pub per_connection: u32,
    /// `max_calls`.
    pub total: u32,
}

impl CallLimits {
    pub(crate) fn of(config: &crate::Config) -> Self {
        Self {
            per_client: config.max_calls_per_client,
            per_connection: config.max_calls_per_connection,
            total: config.max_calls,
        }
    }
}

/// The shared handle of one accepted connection, in its connect info: what
/// the call layer ([`super::calls`]) counts calls on and marks.
#[derive(Debug, Clone)]
pub(crate) struct ConnHandle(Arc<Place>);

impl ConnHandle {
    /// Counts one more call on this connection, or refuses it with
    /// RESOURCE_EXHAUSTED naming the cap it would go over. The call counts
    /// until the returned guard is dropped.
    pub(crate) fn open_call(&self, limits: &CallLimits) -> Result<CallGuard, tonic::Status> {
        let place = &self.0;
        let mut c = lock(&place.counts);
        let mine = c.calls_per_client.get(&place.client).copied().unwrap_or(0);
        let here = place.calls.load(Ordering::Acquire);
        let over = if mine >= limits.per_client && here >= CALLS_EVERY_CONNECTION_MAY_OPEN {
            Some((
                "max_calls_per_client",
                format!(
                    "{} has {mine} calls open, the limit per client is {} (max_calls_per_client): \
                     finish or cancel one first",
                    place.client, limits.per_client
                ),
            ))
        } else if here >= limits.per_connection {
            Some((
                "max_calls_per_connection",
                format!(
                    "this connection has {here} calls open, the limit per connection is {} \
                     (max_calls_per_connection): finish or cancel one first",
                    limits.per_connection
                ),
            ))
        } else if c.calls >= limits.total {
            Some((
                "max_calls",
                format!(
                    "the server has {} calls open, its limit (max_calls): retry later",
                    c.calls
                ),
            ))
        } else {
            None
        };
        if let Some((setting, message)) = over {
            drop(c);
            tracing::debug!(client = %place.client, %message, "call refused");
            let refused = place.refused_in_a_row.fetch_add(1, Ordering::AcqRel) + 1;
            if refused == REFUSED_CALLS_BEFORE_CLOSE {
                tracing::warn!(
                    client = %place.client,
                    refused,
                    "closing a connection whose calls keep being refused for {setting}"
                );
                place.evict();
            }
            return Err(crate::error::over_limit(setting, message));
        }
        place.refused_in_a_row.store(0, Ordering::Release);
        c.calls += 1;
        *c.calls_per_client.entry(place.client).or_default() += 1;
        place.calls.fetch_add(1, Ordering::AcqRel);
        place.touch();
        Ok(CallGuard(Arc::clone(place)))
    }

    /// Marks the connection as a client's that has passed the token check:
    /// it gives way after the unauthenticated ones.
    pub(crate) fn mark_authenticated(&self) {
        self.0.authenticated.store(true, Ordering::Release);
    }

    /// Calls open on this connection now.
    #[cfg(test)]
    fn open_calls(&self) -> u32 {
        self.0.calls.load(Ordering::Acquire)
    }
}

/// One open call; dropping it uncounts the call.
#[derive(Debug)]
pub(crate) struct CallGuard(Arc<Place>);

impl Drop for CallGuard {
    fn drop(&mut self) {
        let place = &self.0;
        let mut c = lock(&place.counts);
        c.calls = c.calls.saturating_sub(1);
        if let Some(n) = c.calls_per_client.get_mut(&place.client) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.calls_per_client.remove(&place.client);
            }
        }
        place.calls.fetch_sub(1, Ordering::AcqRel);
        place.touch();
    }
}

/// Holds a [`Place`] for as long as its connection is open.
#[derive(Debug)]
struct Slot(Arc<Place>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.give_back();
    }
}

/// Why connections were closed, counted between two warnings.
#[derive(Default)]
struct Refusals {
    over_cap: u64,
    evicted: u64,
    last_warning: Option<Instant>,
}

impl Refusals {
    /// Counts one refusal; warns at most every [`WARN_EVERY`].
    fn count(&mut self, evicted: bool, client: IpAddr) {
        if evicted {
            self.evicted += 1;
        } else {
            self.over_cap += 1;
        }
        if self.last_warning.is_some_and(|t| t.elapsed() < WARN_EVERY) {
            return;
        }
        tracing::warn!(
            closed_over_cap = self.over_cap,
            closed_to_make_room = self.evicted,
            %client,
            "connections over max_connections or max_connections_per_client closed (counts since the last warning)"
        );
        (self.over_cap, self.evicted) = (0, 0);
        self.last_warning = Some(Instant::now());
    }
}

struct Acceptor {
    listener: TcpListener,
    limits: Limits,
    counts: SharedCounts,
    /// The origin of the connections' clocks.
    epoch: tokio::time::Instant,
    /// Tasks waiting for a connection's preface.
    waiting: JoinSet<Option<Conn>>,
    refused: Refusals,
}

impl Acceptor {
    /// The next connection ready to be served.
    async fn next(&mut self) -> Conn {
        loop {
            tokio::select! {
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, peer)) => self.admit(stream, peer),
                    Err(e) => self.accept_failed(e).await,
                },
                Some(done) = self.waiting.join_next(), if !self.waiting.is_empty() => {
                    // A connection whose place was taken just as it sent
                    // its preface is closed all the same.
                    if let Ok(Some(conn)) = done
                        && !conn.slot.0.given_back()
                    {
                        return conn;
                    }
                }
            }
        }
    }

    /// Counts `stream` in, or closes it (dropped) when over a cap and no
    /// connection gives way; then waits for its preface.
    fn admit(&mut self, stream: TcpStream, peer: SocketAddr) {
        let client = client_key(peer.ip());
        if !self.make_room(client) {
            tracing::debug!(%peer, "connection over the caps closed");
            self.refused.count(false, client);
            return;
        }
        configure(&stream, peer);
        let slot = Slot(Place::take(&self.counts, client, self.epoch));
        let place = Arc::clone(&slot.0);
        let (timeout, tls) = (self.limits.preface_timeout, self.limits.tls);
        let task = self
            .waiting
            .spawn(wait_for_preface(stream, slot, peer, timeout, tls));
        *place
            .preface_task
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(task);
    }

    /// Whether one more connection of `client` fits, after closing a
    /// connection of the cap it would go over.
    fn make_room(&mut self, client: IpAddr) -> bool {
        let (total, mine) = {
            let c = lock(&self.counts);
            (c.total, c.per_client.get(&client).copied().unwrap_or(0))
        };
        let evicted = if mine >= self.limits.per_client {
            self.evict(Some(client))
        } else if total >= self.limits.max_connections {
            self.evict(None)
        } else {
            return true;
        };
        if evicted {
            self.refused.count(true, client);
        }
        evicted
    }

    /// Closes the first connection by [`Place::eviction_rank`] (of
    /// `client` only, if given); false if there is none.
    fn evict(&mut self, client: Option<IpAddr>) -> bool {
        let chosen = {
            let c = lock(&self.counts);
            c.open
                .values()
                .filter(|p| !p.given_back() && client.is_none_or(|k| p.client == k))
                // Accepted in the same millisecond: the older one first.
                .min_by_key(|p| (p.eviction_rank(), p.id))
                .cloned()
        };
        let Some(place) = chosen else {
            return false;
        };
        tracing::debug!(client = %place.client, rank = ?place.eviction_rank(),
            "connection closed to make room for a new one");
        place.evict();
        true
    }

    /// After a failed `accept`: without file descriptors, a connection
    /// makes room; then a short pause.
    async fn accept_failed(&mut self, e: io::Error) {
        let out_of_fds = matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE));
        if out_of_fds && self.evict(None) {
            tracing::debug!(error = %e, "accept: no file descriptor left; a connection closed to make room");
        } else if out_of_fds {
            if self
                .refused
                .last_warning
                .is_none_or(|t| t.elapsed() >= WARN_EVERY)
            {
                tracing::warn!(error = %e, "accept: no file descriptor left (raise the limit or lower max_connections)");
                self.refused.last_warning = Some(Instant::now());
            }
        } else {
            tracing::debug!(error = %e, "accept failed");
        }
        tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
    }
}

/// TCP_NODELAY and keepalive, for the Flight port's connections and the
/// metrics port's; a failure is only logged.
pub(crate) fn configure(stream: &TcpStream, peer: SocketAddr) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(%peer, error = %e, "cannot set TCP_NODELAY");
    }
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(TCP_KEEPALIVE_TIME)
        .with_interval(TCP_KEEPALIVE_INTERVAL)
        .with_retries(TCP_KEEPALIVE_RETRIES);
    if let Err(e) = socket2::SockRef::from(stream).set_tcp_keepalive(&keepalive) {
        tracing::debug!(%peer, error = %e, "cannot set TCP keepalive");
    }
}

/// Reads the first [`PREFACE_LEN`] bytes of `stream` within `timeout`;
/// `None` (the connection is closed) when they do not come or, without
/// TLS, are not the HTTP/2 preface.
async fn wait_for_preface(
    mut stream: TcpStream,
    slot: Slot,
    peer: SocketAddr,
    timeout: Duration,
    tls: bool,
) -> Option<Conn> {
    let mut first = [0u8; PREFACE_LEN];
    match tokio::time::timeout(timeout, stream.read_exact(&mut first)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "connection ended before its first bytes");
            return None;
        }
        Err(_) => {
            tracing::debug!(%peer, preface_timeout_s = timeout.as_secs_f64(),
                "connection sent no preface within preface_timeout: closed");
            return None;
        }
    }
    if !tls && &first != PREFACE {
        tracing::debug!(%peer, "connection did not start with the HTTP/2 preface: closed");
        return None;
    }
    Some(Conn {
        first,
        pos: 0,
        stream,
        slot,
    })
}

/// An accepted connection: its first bytes, already read, then the socket.
/// Holds its place in the caps until dropped; once the place is taken away
/// (see [`Place::evict`]), its reads and writes fail, and tonic drops it.
#[derive(Debug)]
pub(crate) struct Conn {
    first: [u8; PREFACE_LEN],
    /// How much of `first` has been read again.
    pos: usize,
    stream: TcpStream,
    slot: Slot,
}

impl Conn {
    /// Whether its client had [`ROOMY_CONNECTIONS`] open beside it when it
    /// was accepted: it is to carry at most [`NARROW_CALLS_PER_CONNECTION`]
    /// calls.
    pub(crate) fn narrow(&self) -> bool {
        self.slot.0.narrow
    }

    /// The error of a connection whose place was taken away, if it was.
    fn evicted(&self, waker: &AtomicWaker, cx: &Context<'_>) -> Option<io::Error> {
        waker.register(cx.waker());
        self.slot.0.given_back().then(|| {
            io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "closed to make room for a new connection (max_connections_per_client or max_connections)",
            )
        })
    }
}

/// What tonic puts in each request's extensions for a [`Conn`]: its
/// addresses and its [`ConnHandle`]. The call layer puts the
/// [`TcpConnectInfo`] there too, so that `Request::remote_addr` works.
#[derive(Debug, Clone)]
pub(crate) struct ConnInfo {
    pub tcp: TcpConnectInfo,
    pub handle: ConnHandle,
}

impl Connected for Conn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        ConnInfo {
            tcp: TcpConnectInfo {
                local_addr: self.stream.local_addr().ok(),
                remote_addr: self.stream.peer_addr().ok(),
            },
            handle: ConnHandle(Arc::clone(&self.slot.0)),
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if let Some(e) = this.evicted(&this.slot.0.read_waker, cx) {
            return Poll::Ready(Err(e));
        }
        if this.pos < PREFACE_LEN {
            let n = buf.remaining().min(PREFACE_LEN - this.pos);
            buf.put_slice(&this.first[this.pos..this.pos + n]);
            this.pos += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if let Some(e) = self.evicted(&self.slot.0.write_waker, cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if let Some(e) = self.evicted(&self.slot.0.write_waker, cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some(e) = self.evicted(&self.slot.0.write_waker, cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_clients_are_counted_per_64_prefix_and_mapped_ipv4_as_ipv4() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::2".parse().unwrap();
        let other: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(client_key(a), client_key(b));
        assert_ne!(client_key(a), client_key(other));
        let mapped: IpAddr = "::ffff:10.0.0.7".parse().unwrap();
        assert_eq!(client_key(mapped), "10.0.0.7".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn a_place_is_given_back_once() {
        let counts = SharedCounts::default();
        let client: IpAddr = "10.0.0.1".parse().unwrap();
        let slot = Slot(Place::take(&counts, client, tokio::time::Instant::now()));
        let _other = Slot(Place::take(&counts, client, tokio::time::Instant::now()));
        slot.0.give_back();
        drop(slot);
        let c = lock(&counts);
        assert_eq!((c.total, c.per_client.get(&client).copied()), (1, Some(1)));
    }

    #[tokio::test]
    async fn a_connection_that_sends_nothing_is_closed_at_the_preface_deadline() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = tokio::spawn(async move { TcpStream::connect(addr).await.unwrap() });
        let (stream, peer) = listener.accept().await.unwrap();
        let _client = client.await.unwrap();
        let counts = SharedCounts::default();
        let slot = Slot(Place::take(&counts, peer.ip(), tokio::time::Instant::now()));
        let got = wait_for_preface(stream, slot, peer, Duration::from_millis(200), false).await;
        assert!(got.is_none());
        assert_eq!(lock(&counts).total, 0, "its place is given back");
    }

    const LIMITS: CallLimits = CallLimits {
        per_client: 3,
        per_connection: 2,
        total: 4,
    };

    #[test]
    fn calls_are_capped_per_connection_per_client_and_in_all() {
        let counts = SharedCounts::default();
        let (a, b) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let now = tokio::time::Instant::now();
        let [a1, a2, b1] = [a, a, b].map(|ip| ConnHandle(Place::take(&counts, ip, now)));
        let refused = |r: Result<CallGuard, tonic::Status>, setting: &str| {
            let e = r.expect_err("refused");
            assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e}");
            assert!(e.message().contains(setting), "{e}");
        };
        let held: Vec<_> = [&a1, &a1].map(|h| h.open_call(&LIMITS).unwrap()).into();
        refused(a1.open_call(&LIMITS), "max_calls_per_connection");
        let third = a2.open_call(&LIMITS).unwrap();
        let fourth = b1.open_call(&LIMITS).unwrap();
        refused(b1.open_call(&LIMITS), "max_calls");
        drop((held, third, fourth));
        assert_eq!((a1.open_calls(), a2.open_calls()), (0, 0));

        // Past the client's allowance, a connection still opens its first
        // few calls, no more.
        let wide = CallLimits {
            per_client: 3,
            per_connection: 100,
            total: 100,
        };
        let held: Vec<_> = (0..3).map(|_| a1.open_call(&wide).unwrap()).collect();
        let few: Vec<_> = (0..CALLS_EVERY_CONNECTION_MAY_OPEN)
            .map(|_| {
                a2.open_call(&wide)
                    .expect("within the connection's own few")
            })
            .collect();
        refused(a2.open_call(&wide), "max_calls_per_client");
        assert!(!a2.0.given_back(), "one refusal leaves the connection open");
        drop((held, few));
        assert_eq!((a1.open_calls(), a2.open_calls()), (0, 0));
        let c = lock(&counts);
        assert_eq!((c.calls, c.calls_per_client.len()), (0, 0));
    }

    #[test]
    fn a_connection_whose_calls_keep_being_refused_is_closed() {
        let counts = SharedCounts::default();
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let conn = ConnHandle(Place::take(&counts, ip, tokio::time::Instant::now()));
        let _held: Vec<_> = (0..2).map(|_| conn.open_call(&LIMITS).unwrap()).collect();
        for _ in 1..REFUSED_CALLS_BEFORE_CLOSE {
            assert!(conn.open_call(&LIMITS).is_err());
        }
        assert!(!conn.0.given_back(), "open until the last refusal in a row");
        assert!(conn.open_call(&LIMITS).is_err());
        assert!(conn.0.given_back(), "closed: its place is given back");
        assert_eq!(lock(&counts).total, 0);

        // A call let in between starts the count again.
        let other = ConnHandle(Place::take(&counts, ip, tokio::time::Instant::now()));
        let first = other.open_call(&LIMITS).unwrap();
        let _second = other.open_call(&LIMITS).unwrap();
        for _ in 1..REFUSED_CALLS_BEFORE_CLOSE {
            assert!(other.open_call(&LIMITS).is_err());
        }
        drop(first);
        let _again = other.open_call(&LIMITS).unwrap();
        assert!(other.open_call(&LIMITS).is_err());
        assert!(!other.0.given_back());
    }

    #[tokio::test(start_paused = true)]
    async fn idle_unauthenticated_and_long_unchanged_connections_give_way_first() {
        let counts = SharedCounts::default();
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let epoch = tokio::time::Instant::now();
        let take = async || {
            tokio::time::advance(Duration::from_secs(1)).await;
            ConnHandle(Place::take(&counts, ip, epoch))
        };
        let busy_anon = take().await;
        let _call = busy_anon.open_call(&LIMITS).unwrap();
        let idle_authed = take().await;
        idle_authed.mark_authenticated();
        let idle_anon_old = take().await;
        let idle_anon_new = take().await;
        let mut order: Vec<_> = [&busy_anon, &idle_authed, &idle_anon_new, &idle_anon_old]
            .into_iter()
            .map(|h| (h.0.eviction_rank(), h.0.id))
            .collect();
        order.sort();
        let ids: Vec<_> = order.into_iter().map(|(_, id)| id).collect();
        let want = [&idle_anon_old, &idle_anon_new, &idle_authed, &busy_anon].map(|h| h.0.id);
        assert_eq!(ids, want);
    }
}
