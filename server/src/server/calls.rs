//! Every call on the Flight port is counted, whatever its RPC, and one
//! that has a single request message must send it whole in time.
//!
//! [`Calls`] wraps each gRPC service the server adds (Flight, health). For
//! each request it finds the connection's handle in the connect
//! info ([`super::incoming::ConnHandle`]) and:
//!
//! - counts the call on its connection, per client and in all until its
//!   answer ends or the client goes away ([`super::incoming::ConnHandle::open_call`]); one
//!   over `max_calls_per_connection`, `max_calls_per_client` or
//!   `max_calls` is refused with RESOURCE_EXHAUSTED naming the setting,
//!   before the service sees it. Unary calls still waiting for their body,
//!   DoGet and DoPut streams, health Watch streams (which need no token)
//!   all count, so no client holds more than these caps, however it calls;
//! - gives a call whose RPC takes one request message (every RPC but
//!   Handshake, DoPut and DoExchange) [`CallLimits::body_timeout`]
//!   (`request_body_timeout`) to send its request to the end; past it the
//!   call ends with DEADLINE_EXCEEDED naming the setting;
//! - marks the connection as authenticated when a Flight call carries the
//!   token (any Flight call, when the server has none), so that it gives
//!   way after the unauthenticated ones when a new connection needs room.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tonic::codegen::{Service, StdError, http};
use tonic::server::NamedService;
use tonic::transport::server::TcpConnectInfo;
use tonic::{Code, Status};

use super::incoming::{CallGuard, CallLimits, ConnInfo};
use crate::auth::{BearerAuth, HANDSHAKE_PATH};

/// The RPCs whose request is a stream of messages: no body deadline.
const STREAMING_REQUEST_PATHS: &[&str] = &[
    HANDSHAKE_PATH,
    "/arrow.flight.protocol.FlightService/DoPut",
    "/arrow.flight.protocol.FlightService/DoExchange",
];

/// What [`Calls`] applies, from the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CallSettings {
    pub limits: CallLimits,
    /// `request_body_timeout`.
    pub body_timeout: Duration,
}

impl CallSettings {
    pub(crate) fn of(config: &crate::Config) -> Self {
        Self {
            limits: CallLimits::of(config),
            body_timeout: config.request_body_timeout,
        }
    }
}

/// Wraps a gRPC service; see the module docs.
#[derive(Clone)]
pub(crate) struct Calls<S> {
    inner: S,
    settings: CallSettings,
    /// The token check that marks a connection authenticated; `None` for
    /// a service that takes no token (health).
    auth: Option<BearerAuth>,
}

impl<S> Calls<S> {
    /// `inner`, whose calls carry the token `auth` checks (`None`: calls
    /// of this service never mark their connection authenticated).
    pub(crate) fn new(inner: S, settings: CallSettings, auth: Option<BearerAuth>) -> Self {
        Self {
            inner,
            settings,
            auth,
        }
    }

    /// Whether `request` carries what the token check lets through.
    fn authenticated<B>(&self, request: &http::Request<B>) -> bool {
        self.auth
            .as_ref()
            .is_some_and(|auth| auth.accepts_headers(request.headers()))
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> Service<http::Request<tonic::body::Body>> for Calls<S>
where
    S: Service<http::Request<tonic::body::Body>, Response = http::Response<B>, Error = Infallible>,
    S::Future: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<StdError>,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<tonic::body::Body>) -> Self::Future {
        let Some(info) = request.extensions().get::<ConnInfo>().cloned() else {
            // Not over the Flight port's listener (in-process tests).
            let answer = self.inner.call(request);
            return Box::pin(async move { Ok(answer.await?.map(tonic::body::Body::new)) });
        };
        request.extensions_mut().insert::<TcpConnectInfo>(info.tcp);
        let guard = match info.handle.open_call(&self.settings.limits) {
            Ok(guard) => guard,
            Err(status) => return Box::pin(std::future::ready(Ok(status.into_http()))),
        };
        if self.authenticated(&request) {
            info.handle.mark_authenticated();
        }
        if !STREAMING_REQUEST_PATHS.contains(&request.uri().path()) {
            let timeout = self.settings.body_timeout;
            request = request.map(|body| tonic::body::Body::new(Deadline::new(body, timeout)));
        }
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            Ok(response.map(|body| {
                tonic::body::Body::new(Held {
                    inner: Box::pin(body),
                    _guard: guard,
                })
            }))
        })
    }
}

impl<S: NamedService> NamedService for Calls<S> {
    const NAME: &'static str = S::NAME;
}

/// An answer's body, holding its call's place in the counts until it ends
/// or is dropped.
struct Held<B> {
    inner: Pin<Box<B>>,
    _guard: CallGuard,
}

impl<B> Body for Held<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.inner.as_mut().poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A request body that must end within a time: past it, it fails with
/// DEADLINE_EXCEEDED naming `request_body_timeout`, and then ends.
struct Deadline<B> {
    inner: B,
    timeout: Duration,
    sleep: Pin<Box<tokio::time::Sleep>>,
    /// The body ended, or failed at the deadline: no timer any more.
    over: bool,
}

impl<B> Deadline<B> {
    fn new(inner: B, timeout: Duration) -> Self {
        Self {
            inner,
            timeout,
            sleep: Box::pin(tokio::time::sleep(timeout)),
            over: false,
        }
    }

    fn expired(&self) -> Status {
        crate::error::status(
            Code::DeadlineExceeded,
            format!(
                "the request message did not arrive whole within {} s \
                 (request_body_timeout): send a call's request at once",
                self.timeout.as_secs()
            ),
            sqs_flight_schemas::Reason::limit("request_body_timeout"),
        )
    }
}

impl<B> Body for Deadline<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<StdError>,
{
    type Data = Bytes;
    type Error = StdError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, StdError>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if this.over {
            return polled.map_err(Into::into);
        }
        match polled {
            Poll::Ready(None) => {
                this.over = true;
                Poll::Ready(None)
            }
            Poll::Ready(Some(frame)) => Poll::Ready(Some(frame.map_err(Into::into))),
            Poll::Pending => {
                if this.sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                this.over = true;
                let status = this.expired();
                tracing::debug!(%status, "request body over its deadline");
                Poll::Ready(Some(Err(Box::new(status))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, StreamBody};

    type Chunks = StreamBody<
        futures::stream::BoxStream<'static, Result<Frame<Bytes>, std::convert::Infallible>>,
    >;

    /// A body that sends `first` and then neither more nor its end.
    fn stalled(first: &'static [u8]) -> Chunks {
        use futures::StreamExt;
        let first = futures::stream::iter([Ok(Frame::data(Bytes::from_static(first)))]);
        StreamBody::new(first.chain(futures::stream::pending()).boxed())
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_does_not_end_in_time_fails_naming_the_setting() {
        let mut body = Deadline::new(stalled(b"\0\0\0\0\x10"), Duration::from_secs(30));
        body.frame().await.unwrap().expect("the first bytes pass");
        let started = tokio::time::Instant::now();
        let err = body.frame().await.unwrap().unwrap_err();
        assert_eq!(started.elapsed(), Duration::from_secs(30));
        let status = err.downcast::<Status>().expect("a Status");
        assert_eq!(status.code(), Code::DeadlineExceeded);
        assert!(
            status.message().contains("request_body_timeout"),
            "{status}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_ends_in_time_passes_whole() {
        use futures::StreamExt;
        let frames = futures::stream::iter([Ok(Frame::data(Bytes::from_static(b"abc")))]);
        let body: Chunks = StreamBody::new(frames.boxed());
        let got = Deadline::new(body, Duration::from_secs(1))
            .collect()
            .await
            .expect("no error");
        assert_eq!(got.to_bytes(), Bytes::from_static(b"abc"));
    }
}
