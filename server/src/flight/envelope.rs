//! The gRPC envelope of every Flight call, before and after tonic decodes
//! it.
//!
//! Before: the bytes a call may send are bounded by what its RPC needs,
//! not by `max_request_bytes`. A Handshake, which anyone may send (it is how
//! a client presents the token), holds at most `max_handshake_bytes`; a
//! unary call (a command, a ticket, an action) at most `max_command_bytes`
//! and [`UNARY_SLACK`] for the fields around it. The count runs over the
//! body as it arrives, so a call is refused (RESOURCE_EXHAUSTED naming the
//! setting) before more than that is buffered. Every other call without
//! the token is refused by the interceptor before its body is read.
//!
//! After: tonic answers a request message that is not valid protobuf with
//! INTERNAL ("failed to decode Protobuf message"), as if the server were at
//! fault; [`Envelope`] tells the client INVALID_ARGUMENT instead, in the
//! response headers and in trailers alike.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::TryFutureExt;
use futures::future::MapOk;
use http_body::Frame;
use tonic::Status;
use tonic::codegen::{Body, Service, StdError, http};
use tonic::server::NamedService;

use crate::auth::HANDSHAKE_PATH;

/// Bytes a unary request may hold beyond `max_command_bytes`: the gRPC
/// frame's prefix, an action's type, a descriptor's type and path.
pub(crate) const UNARY_SLACK: u64 = 64 << 10;

/// What tonic's protobuf decoder says of a message it cannot decode.
const DECODE_FAILURE: &str = "failed to decode Protobuf message";

/// The unary RPCs of the Flight service, by gRPC path.
const UNARY_PATHS: &[&str] = &[
    "/arrow.flight.protocol.FlightService/GetFlightInfo",
    "/arrow.flight.protocol.FlightService/PollFlightInfo",
    "/arrow.flight.protocol.FlightService/GetSchema",
    "/arrow.flight.protocol.FlightService/DoGet",
    "/arrow.flight.protocol.FlightService/DoAction",
    "/arrow.flight.protocol.FlightService/ListFlights",
    "/arrow.flight.protocol.FlightService/ListActions",
];

/// The request bounds of [`Envelope`], from the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EnvelopeLimits {
    /// `max_handshake_bytes`.
    pub handshake: u64,
    /// `max_command_bytes`.
    pub command: u64,
}

impl From<&crate::config::Config> for EnvelopeLimits {
    fn from(c: &crate::config::Config) -> Self {
        Self {
            handshake: c.max_handshake_bytes,
            command: c.max_command_bytes,
        }
    }
}

impl EnvelopeLimits {
    /// The bytes a call to `path` may send, and the setting that says so.
    fn for_path(&self, path: &str) -> Option<(u64, &'static str)> {
        if path == HANDSHAKE_PATH {
            Some((self.handshake, "max_handshake_bytes"))
        } else if UNARY_PATHS.contains(&path) {
            Some((
                self.command.saturating_add(UNARY_SLACK),
                "max_command_bytes",
            ))
        } else {
            None
        }
    }
}

/// Wraps the (intercepted) Flight service; see the module docs.
#[derive(Debug, Clone)]
pub(crate) struct Envelope<S> {
    inner: S,
    limits: EnvelopeLimits,
}

impl<S> Envelope<S> {
    pub(crate) fn new(inner: S, limits: EnvelopeLimits) -> Self {
        Self { inner, limits }
    }
}

type Fix<B> = fn(http::Response<B>) -> http::Response<Answer<B>>;

impl<S, B> Service<http::Request<tonic::body::Body>> for Envelope<S>
where
    S: Service<http::Request<tonic::body::Body>, Response = http::Response<B>, Error = Infallible>,
{
    type Response = http::Response<Answer<B>>;
    type Error = Infallible;
    type Future = MapOk<S::Future, Fix<B>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let request = match self.limits.for_path(request.uri().path()) {
            Some((limit, setting)) => request.map(|body| {
                tonic::body::Body::new(Limited {
                    inner: body,
                    remaining: limit,
                    limit,
                    setting,
                })
            }),
            None => request,
        };
        self.inner.call(request).map_ok(answer as Fix<B>)
    }
}

impl<S: NamedService> NamedService for Envelope<S> {
    const NAME: &'static str = S::NAME;
}

/// A request body that fails once more than `limit` bytes have come.
struct Limited<B> {
    inner: B,
    remaining: u64,
    limit: u64,
    setting: &'static str,
}

impl<B> Body for Limited<B>
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
        let frame = match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => return Poll::Pending,
        };
        let len = frame.data_ref().map_or(0, |d| d.len() as u64);
        match self.remaining.checked_sub(len) {
            Some(left) => {
                self.remaining = left;
                Poll::Ready(Some(Ok(frame)))
            }
            None => Poll::Ready(Some(Err(Box::new(self.refusal())))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
}

impl<B> Limited<B> {
    fn refusal(&self) -> Status {
        tracing::debug!(
            limit = self.limit,
            setting = self.setting,
            "request body over its limit"
        );
        crate::error::over_limit(
            self.setting,
            format!(
                "the request is larger than this call may send: at most {} bytes ({}{})",
                self.limit,
                self.setting,
                if self.setting == "max_command_bytes" {
                    " plus 64 KiB for the fields around the command"
                } else {
                    ""
                }
            ),
        )
    }
}

/// A response whose decode-failure status, if any, says INVALID_ARGUMENT.
fn answer<B>(response: http::Response<B>) -> http::Response<Answer<B>> {
    let (mut parts, body) = response.into_parts();
    fix_status(&mut parts.headers);
    http::Response::from_parts(parts, Answer { inner: body })
}

/// A response body whose trailers are fixed like the headers.
pub(crate) struct Answer<B> {
    inner: B,
}

impl<B> Body for Answer<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        Pin::new(&mut self.inner)
            .poll_frame(cx)
            .map_ok(|mut frame| {
                if let Some(trailers) = frame.trailers_mut() {
                    fix_status(trailers);
                }
                frame
            })
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Turns tonic's INTERNAL for an undecodable request message into
/// INVALID_ARGUMENT; leaves every other status alone.
fn fix_status(headers: &mut http::HeaderMap) {
    if headers.get(Status::GRPC_STATUS).map(|v| v.as_bytes()) != Some(b"13") {
        return;
    }
    let mut only = http::HeaderMap::new();
    for name in [Status::GRPC_STATUS, Status::GRPC_MESSAGE] {
        if let Some(value) = headers.get(&name) {
            only.insert(name, value.clone());
        }
    }
    let Some(status) = Status::from_header_map(&only) else {
        return;
    };
    if !status.message().starts_with(DECODE_FAILURE) {
        return;
    }
    let fixed = crate::error::invalid_argument(format!(
        "the request message is not valid protobuf for this RPC ({})",
        status.message()
    ));
    headers.remove(Status::GRPC_MESSAGE);
    if fixed.add_header(headers).is_err() {
        headers.insert(Status::GRPC_STATUS, http::HeaderValue::from_static("3"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(status: &Status) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        status.add_header(&mut h).unwrap();
        h
    }

    #[test]
    fn decode_failures_become_invalid_argument_and_nothing_else_changes() {
        let mut h = headers(&Status::internal(
            "failed to decode Protobuf message: invalid wire type",
        ));
        fix_status(&mut h);
        let fixed = Status::from_header_map(&h).unwrap();
        assert_eq!(fixed.code(), tonic::Code::InvalidArgument);
        assert!(fixed.message().contains("invalid wire type"), "{fixed:?}");

        for kept in [
            Status::internal("registry: disk full"),
            Status::not_found("failed to decode Protobuf message"),
            Status::ok(""),
        ] {
            let mut h = headers(&kept);
            fix_status(&mut h);
            let after = Status::from_header_map(&h).unwrap();
            assert_eq!(
                (after.code(), after.message()),
                (kept.code(), kept.message())
            );
        }
    }

    #[tokio::test]
    async fn a_body_over_its_limit_fails_with_the_setting_named() {
        use http_body_util::BodyExt;
        let chunks = [Bytes::from(vec![0; 3000]), Bytes::from(vec![0; 3000])];
        let stream = futures::stream::iter(chunks.map(|c| Ok::<_, Status>(Frame::data(c))));
        let body = tonic::body::Body::new(http_body_util::StreamBody::new(stream));
        let limited = Limited {
            inner: body,
            remaining: 4096,
            limit: 4096,
            setting: "max_handshake_bytes",
        };
        let e = limited.collect().await.expect_err("refused");
        let status = Status::from_error(e);
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert!(status.message().contains("max_handshake_bytes"), "{status}");
    }
}
