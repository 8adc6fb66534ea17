//! The client's connector: TCP (with `TCP_NODELAY`) that keeps track of its
//! connections, so that a call never waits on a connection that is gone.
//!
//! Two things go wrong without it, both seen against a TLS port reached with
//! `grpc://` (the port closes a plaintext connection as soon as it reads the
//! HTTP/2 preface):
//!
//! - tonic's channel reconnects whenever it finds its connection closed
//!   before a request goes out, so a call could connect, find the connection
//!   closed, connect again, and so on, for as long as the timing held;
//! - a call was seen waiting for ever on a connection that had closed, with
//!   no other made (once, in a test against a peer that closes at once; the
//!   cause inside tonic/hyper is not known). In CI a call hung for a
//!   minute.
//!
//! So: [`Client::connect`](crate::client::Client::connect) on a plaintext URL
//! waits for the server's first HTTP/2 frame and fails with [`NOT_HTTP2`]
//! if something else comes; a reconnect after a connection on which the
//! peer never sent an HTTP/2 frame is refused once (the next call connects
//! again, so a restarted server is still reached); and [`Links::cut`] ends
//! when the client has had no open connection for [`CUT_GRACE`], which the
//! client races against each call's answer.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tonic::transport::Uri;

/// The message of a plaintext connection whose peer did not answer in
/// HTTP/2 (a TLS port, another service).
pub const NOT_HTTP2: &str = "the server closed the connection without an HTTP/2 answer";

/// How long a call may wait with no connection open (nor being opened)
/// before it is ended as UNAVAILABLE.
pub(crate) const CUT_GRACE: Duration = Duration::from_secs(2);

/// What the peer of one connection sent first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    NothingYet,
    /// An HTTP/2 frame header of type SETTINGS: an HTTP/2 server.
    Http2,
    /// Other bytes (a TLS alert, an HTTP/1 answer).
    Other,
    /// End of stream or an error before any byte.
    Closed,
}

/// The connections of one client, shared by the connector, its streams and
/// the client.
#[derive(Debug, Clone)]
pub(crate) struct Links {
    /// Connections being opened or open and not yet seen closed.
    live: Arc<watch::Sender<usize>>,
    /// The first answer on the first connection made.
    first: Arc<OnceLock<watch::Receiver<Answer>>>,
    /// The last connection made.
    last: Arc<Mutex<Last>>,
    /// Whether the bytes on the wire are HTTP/2 (not TLS records).
    plaintext: bool,
}

impl Links {
    pub(crate) fn new(plaintext: bool) -> Self {
        Self {
            live: Arc::new(watch::Sender::new(0)),
            first: Arc::new(OnceLock::new()),
            last: Arc::new(Mutex::new(Last::default())),
            plaintext,
        }
    }

    /// The connector for a tonic endpoint.
    pub(crate) fn connector(&self) -> Connector {
        Connector(self.clone())
    }

    /// Waits up to `timeout` for the first answer on the first connection:
    /// `Ok` once it is HTTP/2 (or at once over TLS, whose handshake already
    /// answered), the reason otherwise.
    pub(crate) async fn first_answer(&self, timeout: Duration) -> Result<(), String> {
        if !self.plaintext {
            return Ok(());
        }
        let Some(mut answer) = self.first.get().cloned() else {
            return Err("no connection was made".into());
        };
        let answered = tokio::time::timeout(timeout, answer.wait_for(|a| *a != Answer::NothingYet));
        match answered.await {
            Ok(Ok(a)) if *a == Answer::Http2 => Ok(()),
            Ok(_) => Err(format!(
                "{NOT_HTTP2} (a server started with --tls-cert needs grpc+tls://)"
            )),
            Err(_) => Err(format!(
                "the server sent nothing within {timeout:?} of connecting; is it an sqs-flight \
                 server (a server started with --tls-cert needs grpc+tls://)?"
            )),
        }
    }

    /// Ends once no connection has been open or opening for [`CUT_GRACE`].
    pub(crate) async fn cut(&self) {
        let mut live = self.live.subscribe();
        loop {
            if live.wait_for(|n| *n == 0).await.is_err() {
                return std::future::pending().await;
            }
            let reopened = tokio::time::timeout(CUT_GRACE, live.wait_for(|n| *n > 0));
            if reopened.await.is_err() {
                return;
            }
        }
    }

    /// One connection fewer.
    fn closed(&self) {
        self.live.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// The last connection a [`Connector`] made.
#[derive(Debug, Default)]
struct Last {
    /// Its peer's first answer.
    answer: Option<watch::Receiver<Answer>>,
    /// Whether a reconnect after it was refused.
    refused: bool,
}

/// The tonic connector of [`Links`].
#[derive(Debug, Clone)]
pub(crate) struct Connector(Links);

impl tower_service::Service<Uri> for Connector {
    type Response = TokioIo<Watched>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let links = self.0.clone();
        Box::pin(async move {
            if links.plaintext {
                let mut last = links.last.lock().unwrap_or_else(|p| p.into_inner());
                let unanswered = last.answer.as_ref().map(|a| *a.borrow() != Answer::Http2);
                if unanswered == Some(true) && !last.refused {
                    // Refuse once; the next call starts afresh.
                    last.refused = true;
                    return Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        format!("{NOT_HTTP2} (a server started with --tls-cert needs grpc+tls://)"),
                    ));
                }
            }
            let host = uri.host().unwrap_or("localhost");
            // `[::1]` in a URI is `::1` to the resolver.
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let port = uri.port_u16().unwrap_or(crate::url::DEFAULT_PORT);
            links.live.send_modify(|n| *n += 1);
            let stream = match TcpStream::connect((host, port)).await {
                Ok(stream) => stream,
                Err(e) => {
                    links.closed();
                    return Err(e);
                }
            };
            stream.set_nodelay(true)?;
            let (answer, first) = watch::channel(Answer::NothingYet);
            let _ = links.first.set(first.clone());
            *links.last.lock().unwrap_or_else(|p| p.into_inner()) = Last {
                answer: Some(first),
                refused: false,
            };
            Ok(TokioIo::new(Watched {
                stream,
                links,
                answer,
                head: Vec::new(),
                open: true,
            }))
        })
    }
}

/// A TCP stream that notes the peer's first frame header and its end.
#[derive(Debug)]
pub(crate) struct Watched {
    stream: TcpStream,
    links: Links,
    answer: watch::Sender<Answer>,
    /// The peer's first bytes, until there are enough to judge.
    head: Vec<u8>,
    /// Counted in `links.live`.
    open: bool,
}

impl Watched {
    fn look(&mut self, bytes: &[u8]) {
        if bytes.is_empty() || *self.answer.borrow() != Answer::NothingYet {
            return;
        }
        // An HTTP/2 server's first frame is SETTINGS (RFC 9113, 3.4): a
        // 3-byte length, then the type 0x4.
        self.head
            .extend_from_slice(&bytes[..bytes.len().min(4 - self.head.len())]);
        if self.head.len() == 4 {
            let answer = if self.head[3] == 0x4 {
                Answer::Http2
            } else {
                Answer::Other
            };
            self.answer.send_replace(answer);
            self.head = Vec::new();
        }
    }

    /// The connection is over: end of stream, an error, or dropped.
    fn end(&mut self) {
        self.answer.send_if_modified(|a| {
            let first = *a == Answer::NothingYet;
            if first {
                *a = Answer::Closed;
            }
            first
        });
        if std::mem::take(&mut self.open) {
            self.links.closed();
        }
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.end();
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.stream).poll_read(cx, buf);
        match &polled {
            Poll::Ready(Ok(())) if buf.filled().len() == before && buf.remaining() > 0 => {
                this.end();
            }
            Poll::Ready(Ok(())) => {
                if this.links.plaintext {
                    this.look(&buf.filled()[before..]);
                }
            }
            Poll::Ready(Err(_)) => this.end(),
            Poll::Pending => {}
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;
    use crate::client::Client;
    use crate::error::Error;

    /// A TLS server's answer to a plaintext client: an alert record.
    const TLS_ALERT: &[u8] = &[0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x32];
    /// An empty SETTINGS frame: the first frame of an HTTP/2 server.
    const SETTINGS: &[u8] = &[0, 0, 0, 4, 0, 0, 0, 0, 0];
    /// Bound on any one step of these tests.
    const STEP: Duration = Duration::from_secs(20);

    /// How a test peer treats a connection.
    #[derive(Clone, Copy)]
    enum Peer {
        /// Reads the client's first bytes, writes these, closes.
        Answers(&'static [u8]),
        /// Closes at once.
        Closes,
        /// Keeps the connection open and says nothing.
        Silent,
    }

    /// A TCP peer that treats its first connection as `first` and the
    /// others as `then`. Returns its URL and the count of connections taken.
    async fn peer(first: Peer, then: Peer) -> (String, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("grpc://{}", listener.local_addr().unwrap());
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        tokio::spawn(async move {
            let mut silent = Vec::new();
            while let Ok((mut socket, _)) = listener.accept().await {
                let how = if count.fetch_add(1, Ordering::SeqCst) == 0 {
                    first
                } else {
                    then
                };
                match how {
                    Peer::Answers(bytes) => {
                        let mut preface = [0u8; 24];
                        let _ = socket.read(&mut preface).await;
                        let _ = socket.write_all(bytes).await;
                    }
                    Peer::Closes => {}
                    Peer::Silent => silent.push(socket),
                }
            }
        });
        (url, accepted)
    }

    /// Connects to a fresh `peer(how, how)` 20 times; each must be refused
    /// at connect, with one connection, naming `expected`.
    async fn connect_is_refused(how: Peer, expected: &str) {
        for round in 0..20 {
            let (url, accepted) = peer(how, how).await;
            let connected = tokio::time::timeout(STEP, Client::connect(url))
                .await
                .unwrap_or_else(|_| panic!("round {round}: connect did not end"));
            match connected {
                Err(Error::Connect { reason, .. }) => {
                    assert!(reason.contains(expected), "round {round}: {reason}");
                    assert!(reason.contains("grpc+tls://"), "round {round}: {reason}");
                }
                other => panic!("round {round}: expected a Connect error, got {other:?}"),
            }
            assert_eq!(accepted.load(Ordering::SeqCst), 1, "round {round}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn connect_refuses_a_tls_port_on_a_plaintext_url() {
        connect_is_refused(Peer::Answers(TLS_ALERT), NOT_HTTP2).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn connect_refuses_a_peer_that_closes_at_once() {
        connect_is_refused(Peer::Closes, NOT_HTTP2).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn connect_gives_up_on_a_peer_that_says_nothing() {
        let (url, _) = peer(Peer::Silent, Peer::Silent).await;
        let connected = Client::builder(url)
            .connect_timeout(Duration::from_secs(2))
            .connect();
        match tokio::time::timeout(STEP, connected)
            .await
            .expect("connect ends")
        {
            Err(Error::Connect { reason, .. }) => {
                assert!(reason.contains("sent nothing within 2s"), "{reason}")
            }
            other => panic!("expected a Connect error, got {other:?}"),
        }
    }

    /// A server that answered once, then closes every connection: each call
    /// ends with a retryable error, and a call opens at most one
    /// connection (no reconnect loop).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn calls_end_when_connections_close_under_them() {
        let (url, accepted) = peer(Peer::Answers(SETTINGS), Peer::Closes).await;
        let client = tokio::time::timeout(STEP, Client::connect(url))
            .await
            .expect("connect ends")
            .expect("the first connection answers in HTTP/2");
        let calls = 30;
        for call in 0..calls {
            let answer = tokio::time::timeout(STEP, client.tables())
                .await
                .unwrap_or_else(|_| panic!("call {call} did not end"));
            let error = answer.expect_err("the peer closes every connection");
            assert!(error.is_retryable(), "call {call}: {error}");
        }
        let connections = accepted.load(Ordering::SeqCst);
        assert!(
            connections <= 1 + calls,
            "{connections} connections for {calls} calls"
        );
        // A refused reconnect is not remembered: later calls connect again.
        assert!(
            connections > 2,
            "{connections} connections for {calls} calls"
        );
    }

    #[tokio::test]
    async fn cut_ends_after_the_grace_with_no_connection_and_waits_for_a_reopened_one() {
        let links = Links::new(true);
        // No connection yet: cut after the grace.
        let started = std::time::Instant::now();
        tokio::time::timeout(STEP, links.cut())
            .await
            .expect("cut ends");
        assert!(started.elapsed() >= CUT_GRACE, "{:?}", started.elapsed());
        // A connection that stays open holds the cut off.
        links.live.send_modify(|n| *n += 1);
        let held = tokio::time::timeout(CUT_GRACE * 2, links.cut()).await;
        assert!(held.is_err(), "cut ended with a connection open");
        // It closes, and another opens within the grace: still held off,
        // until that one closes too.
        let reopen = links.clone();
        tokio::spawn(async move {
            reopen.closed();
            tokio::time::sleep(CUT_GRACE / 4).await;
            reopen.live.send_modify(|n| *n += 1);
            tokio::time::sleep(CUT_GRACE * 2).await;
            reopen.closed();
        });
        let started = std::time::Instant::now();
        tokio::time::timeout(STEP, links.cut())
            .await
            .expect("cut ends");
        assert!(
            started.elapsed() >= CUT_GRACE * 2 + CUT_GRACE,
            "cut ended while a reopened connection was live: {:?}",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn the_first_frame_decides_http2_or_not() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let judge = async |chunks: &[&[u8]]| {
            let (stream, _) = tokio::join!(TcpStream::connect(addr), listener.accept());
            let (answer, first) = watch::channel(Answer::NothingYet);
            let mut watched = Watched {
                stream: stream.unwrap(),
                links: Links::new(true),
                answer,
                head: Vec::new(),
                open: false,
            };
            for chunk in chunks {
                watched.look(chunk);
            }
            let judged = *first.borrow();
            drop(watched);
            (judged, *first.borrow())
        };
        use Answer::*;
        assert_eq!(judge(&[SETTINGS]).await, (Http2, Http2));
        assert_eq!(judge(&[&[0, 0], &[0], &[4, 1]]).await, (Http2, Http2));
        assert_eq!(judge(&[TLS_ALERT]).await, (Other, Other));
        assert_eq!(
            judge(&[b"HTTP/1.1 400 Bad Request\r\n"]).await,
            (Other, Other)
        );
        assert_eq!(judge(&[&[0, 0, 0]]).await, (NothingYet, Closed));
    }
}
