//! Bearer-token authentication of every RPC.

use tonic::{Request, Status};

/// Checks `authorization: Bearer TOKEN` on each request when a token is set.
#[derive(Clone)]
pub struct BearerAuth {
    expected: Option<Vec<u8>>,
}

impl BearerAuth {
    pub fn new(token: Option<&str>) -> Self {
        Self {
            expected: token.map(|t| format!("Bearer {t}").into_bytes()),
        }
    }

    /// The tonic interceptor.
    pub fn check(&self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(expected) = &self.expected else {
            return Ok(request);
        };
        match request.metadata().get("authorization") {
            Some(given) if constant_time_eq(given.as_bytes(), expected) => Ok(request),
            Some(_) => Err(Status::unauthenticated("invalid bearer token")),
            None => Err(Status::unauthenticated(
                "this server requires an `authorization: Bearer TOKEN` header",
            )),
        }
    }
}

/// Compares without leaking where the first difference is.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
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
    }
}
