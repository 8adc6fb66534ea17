//! Bearer-token authentication of every RPC.
//!
//! With a token configured, every call must carry `authorization: Bearer
//! TOKEN`, checked by [`BearerAuth::check`] before the request body is read.
//! The one exception is Flight's `Handshake`, which a client may also use to
//! present the token as the payload of its first message: [`MarkHandshake`]
//! marks those calls so that the interceptor lets them through to
//! [`crate::flight`], which checks the header or the payload itself. What
//! such a Handshake may send is bounded by [`crate::flight::envelope`]
//! (`max_handshake_bytes`); every other call without the token is refused
//! here, before its body is read.
//!
//! A call counts as activity for `--idle-exit` ([`crate::idle`]) only once
//! it is authenticated: a caller without the token cannot keep an idle
//! server up.

use std::task::{Context, Poll};

use tonic::codegen::{Service, http};
use tonic::metadata::MetadataMap;
use tonic::server::NamedService;
use tonic::{Request, Status};

use crate::idle::Activity;

/// The gRPC path of Flight's Handshake.
pub const HANDSHAKE_PATH: &str = "/arrow.flight.protocol.FlightService/Handshake";

/// Checks `authorization: Bearer TOKEN` on each request when a token is set.
#[derive(Clone, Default)]
pub struct BearerAuth {
    token: Option<String>,
    expected: Option<Vec<u8>>,
    /// Touched by each authenticated call.
    activity: Activity,
}

impl BearerAuth {
    pub fn new(token: Option<&str>) -> Self {
        Self {
            token: token.map(str::to_string),
            expected: token.map(|t| format!("Bearer {t}").into_bytes()),
            activity: Activity::default(),
        }
    }

    /// Records each authenticated call in `activity`.
    pub fn with_activity(mut self, activity: Activity) -> Self {
        self.activity = activity;
        self
    }

    /// The configured token, if any.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// The tonic interceptor. Handshake calls (marked by [`MarkHandshake`])
    /// pass, uncounted: the Handshake RPC checks the header or its payload
    /// itself.
    pub fn check(&self, request: Request<()>) -> Result<Request<()>, Status> {
        if request.extensions().get::<HandshakeCall>().is_some() {
            return Ok(request);
        }
        self.check_metadata(request.metadata())?;
        Ok(request)
    }

    /// Whether `metadata` carries the token (always, when none is set); a
    /// call that does counts as activity.
    pub fn check_metadata(&self, metadata: &MetadataMap) -> Result<(), Status> {
        self.verify_metadata(metadata)?;
        self.activity.touch();
        Ok(())
    }

    /// Whether `headers` carry the token (always, when none is set),
    /// without counting activity: the call layer marks the connections of
    /// authenticated clients with it.
    pub fn accepts_headers(&self, headers: &http::HeaderMap) -> bool {
        self.expected.as_ref().is_none_or(|expected| {
            headers
                .get("authorization")
                .is_some_and(|given| constant_time_eq(given.as_bytes(), expected))
        })
    }

    fn verify_metadata(&self, metadata: &MetadataMap) -> Result<(), Status> {
        let Some(expected) = &self.expected else {
            return Ok(());
        };
        match metadata.get("authorization") {
            Some(given) if constant_time_eq(given.as_bytes(), expected) => Ok(()),
            Some(_) => Err(crate::error::unauthenticated("invalid bearer token")),
            None => Err(crate::error::unauthenticated(
                "this server requires an `authorization: Bearer TOKEN` header",
            )),
        }
    }

    /// Whether a Handshake payload is the token (always, when none is set);
    /// a Handshake whose payload is counts as activity.
    pub fn payload_matches(&self, payload: &[u8]) -> bool {
        let matches = match &self.token {
            None => true,
            Some(token) => constant_time_eq(payload, token.as_bytes()),
        };
        if matches {
            self.activity.touch();
        }
        matches
    }
}

/// Compares without leaking where the first difference is.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Request extension put on Handshake calls by [`MarkHandshake`]; set by
/// the server only, never taken from the wire.
#[derive(Debug, Clone, Copy)]
struct HandshakeCall;

/// Wraps a gRPC service (the intercepted Flight service) and marks each
/// Handshake request, so that [`BearerAuth::check`] can tell it apart: an
/// interceptor sees metadata and extensions, not the path.
#[derive(Debug, Clone)]
pub struct MarkHandshake<S> {
    inner: S,
}

impl<S> MarkHandshake<S> {
    pub fn new(inner: S) -> Self {
        Self { inner }
    }
}

impl<S, B> Service<http::Request<B>> for MarkHandshake<S>
where
    S: Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        if request.uri().path() == HANDSHAKE_PATH {
            request.extensions_mut().insert(HandshakeCall);
        }
        self.inner.call(request)
    }
}

impl<S: NamedService> NamedService for MarkHandshake<S> {
    const NAME: &'static str = S::NAME;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_header(value: Option<&str>) -> Request<()> {
        let mut r = Request::new(());
        if let Some(v) = value {
            r.metadata_mut().insert("authorization", v.parse().unwrap());
        }
        r
    }

    #[test]
    fn tokens_are_checked_only_when_configured() {
        let open = BearerAuth::new(None);
        assert!(open.check(with_header(None)).is_ok());
        assert!(open.payload_matches(b""));
        let auth = BearerAuth::new(Some("s3cret"));
        assert!(auth.check(with_header(Some("Bearer s3cret"))).is_ok());
        let denied = [
            None,
            Some("Bearer s3cre"),
            Some("Bearer s3cret!"),
            Some("s3cret"),
        ];
        for header in denied {
            let err = auth.check(with_header(header)).unwrap_err();
            assert_eq!(err.code(), tonic::Code::Unauthenticated, "{header:?}");
        }
        assert!(auth.payload_matches(b"s3cret"));
        assert!(!auth.payload_matches(b"s3cre"));
        assert!(!auth.payload_matches(b""));
        let headers = |value: Option<&str>| {
            let mut h = http::HeaderMap::new();
            if let Some(v) = value {
                h.insert("authorization", v.parse().unwrap());
            }
            h
        };
        assert!(open.accepts_headers(&headers(None)));
        assert!(auth.accepts_headers(&headers(Some("Bearer s3cret"))));
        assert!(!auth.accepts_headers(&headers(Some("Bearer s3cre"))));
        assert!(!auth.accepts_headers(&headers(None)));
    }

    #[test]
    fn only_authenticated_calls_count_as_activity() {
        let start = std::time::Instant::now().checked_sub(std::time::Duration::from_secs(60));
        let activity = Activity::started_at(start.expect("the clock is older than a minute"));
        let auth = BearerAuth::new(Some("s3cret")).with_activity(activity.clone());
        let touched = || activity.idle_for().as_secs() < 30;
        let _ = auth.check(with_header(None));
        let _ = auth.check(with_header(Some("Bearer wrong")));
        assert!(!auth.payload_matches(b"wrong"));
        let mut handshake = with_header(None);
        handshake.extensions_mut().insert(HandshakeCall);
        assert!(auth.check(handshake).is_ok());
        assert!(
            !touched(),
            "refused calls and unchecked Handshakes are not activity"
        );
        assert!(auth.payload_matches(b"s3cret"));
        assert!(
            touched(),
            "a Handshake with the token as payload is activity"
        );

        let activity = Activity::started_at(start.expect("checked above"));
        let auth = BearerAuth::new(Some("s3cret")).with_activity(activity.clone());
        assert!(auth.check(with_header(Some("Bearer s3cret"))).is_ok());
        assert!(
            activity.idle_for().as_secs() < 30,
            "a call with the token is activity"
        );
    }

    #[tokio::test]
    async fn only_marked_handshakes_pass_the_interceptor_without_a_header() {
        let auth = BearerAuth::new(Some("s3cret"));
        let mut marked = with_header(None);
        marked.extensions_mut().insert(HandshakeCall);
        assert!(auth.check(marked).is_ok());

        let mut seen = Vec::new();
        let mut svc = MarkHandshake::new(tower_fn(|r: http::Request<()>| {
            r.extensions().get::<HandshakeCall>().is_some()
        }));
        for path in [HANDSHAKE_PATH, "/arrow.flight.protocol.FlightService/DoGet"] {
            let request = http::Request::builder().uri(path).body(()).unwrap();
            seen.push(svc.call(request).await.unwrap());
        }
        assert_eq!(seen, [true, false]);
    }

    /// A service answering with `f(request)`.
    fn tower_fn<F>(
        f: F,
    ) -> impl Service<
        http::Request<()>,
        Response = bool,
        Error = std::convert::Infallible,
        Future = std::future::Ready<Result<bool, std::convert::Infallible>>,
    >
    where
        F: FnMut(http::Request<()>) -> bool,
    {
        struct Fn<F>(F);
        impl<F: FnMut(http::Request<()>) -> bool> Service<http::Request<()>> for Fn<F> {
            type Response = bool;
            type Error = std::convert::Infallible;
            type Future = std::future::Ready<Result<bool, std::convert::Infallible>>;
            fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
                Poll::Ready(Ok(()))
            }
            fn call(&mut self, r: http::Request<()>) -> Self::Future {
                std::future::ready(Ok((self.0)(r)))
            }
        }
        Fn(f)
    }
}
