//! Server URLs: the Flight forms `grpc://` and `grpc+tls://`, plus the
//! `http(s)://` and bare `host:port` forms people type. The Python package
//! follows the same rule; `url_forms.txt` holds the cases both test.

use std::fmt;

use crate::error::{Error, Result};

/// The port of an sqs-flight server when the URL names none.
pub const DEFAULT_PORT: u16 = 50051;

/// A parsed server URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerUrl {
    /// `host:port`, the host in brackets when it is an IPv6 address.
    pub authority: String,
    pub tls: bool,
}

impl ServerUrl {
    /// Parses `grpc://`, `grpc+tcp://`, `http://` (plain), `grpc+tls://`,
    /// `https://` (TLS) or `host[:port]` (plain).
    pub fn parse(url: &str) -> Result<Self> {
        let invalid = |reason: &str| Error::InvalidUrl {
            url: url.to_string(),
            reason: reason.to_string(),
        };
        let (tls, rest) = match url.split_once("://") {
            None => (false, url),
            Some(("grpc" | "grpc+tcp" | "http", rest)) => (false, rest),
            Some(("grpc+tls" | "https", rest)) => (true, rest),
            Some((scheme, _)) => {
                return Err(invalid(&format!(
                    "unsupported scheme {scheme:?}; use grpc://HOST:PORT or grpc+tls://HOST:PORT"
                )));
            }
        };
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if authority.is_empty() || authority.contains(['/', '?', '#', '@', ' ']) {
            return Err(invalid(
                "expected HOST:PORT after the scheme, e.g. grpc://127.0.0.1:50051",
            ));
        }
        Ok(Self {
            authority: with_port(authority).ok_or_else(|| invalid("the port is not a number"))?,
            tls,
        })
    }

    /// The URI tonic connects to.
    pub fn http_uri(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.authority)
    }
}

/// `authority` with [`DEFAULT_PORT`] added when it has no port; `None` when
/// the port is not a number.
fn with_port(authority: &str) -> Option<String> {
    let port = match authority.rsplit_once(':') {
        // An IPv6 address without a port: `[::1]`.
        Some((host, _)) if authority.ends_with(']') && host.starts_with('[') => None,
        Some((_, port)) => Some(port),
        None => None,
    };
    match port {
        Some(p) => p.parse::<u16>().ok().map(|_| authority.to_string()),
        None => Some(format!("{authority}:{DEFAULT_PORT}")),
    }
}

impl fmt::Display for ServerUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.tls { "grpc+tls" } else { "grpc" };
        write!(f, "{scheme}://{}", self.authority)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(url: &str) -> (String, bool) {
        let u = ServerUrl::parse(url).unwrap();
        (u.to_string(), u.tls)
    }

    #[test]
    fn accepted_forms() {
        assert_eq!(
            ok("grpc://127.0.0.1:50051"),
            ("grpc://127.0.0.1:50051".into(), false)
        );
        assert_eq!(ok("grpc+tcp://h:1"), ("grpc://h:1".into(), false));
        assert_eq!(ok("http://h:1/"), ("grpc://h:1".into(), false));
        assert_eq!(ok("grpc+tls://h:443"), ("grpc+tls://h:443".into(), true));
        assert_eq!(ok("https://h"), ("grpc+tls://h:50051".into(), true));
        assert_eq!(ok("localhost:7"), ("grpc://localhost:7".into(), false));
        assert_eq!(ok("grpc://[::1]"), ("grpc://[::1]:50051".into(), false));
        assert_eq!(ok("grpc://[::1]:9"), ("grpc://[::1]:9".into(), false));
        assert_eq!(
            ServerUrl::parse("grpc+tls://h:1").unwrap().http_uri(),
            "https://h:1"
        );
    }

    /// The forms shared with the Python package, which reads the same file.
    #[test]
    fn the_forms_shared_with_python() {
        let forms = include_str!("url_forms.txt");
        let cases = forms
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty());
        for line in cases {
            if let Some((input, dialled)) = line.split_once(" => ") {
                assert_eq!(
                    ServerUrl::parse(input).unwrap().to_string(),
                    dialled,
                    "{line}"
                );
            } else {
                let (input, fragment) = line.split_once(" !! ").expect("INPUT => or INPUT !!");
                let e = ServerUrl::parse(input).unwrap_err().to_string();
                assert!(e.contains(fragment), "{line}: {e}");
            }
        }
    }

    #[test]
    fn refused_forms_say_why() {
        let err = |url: &str| ServerUrl::parse(url).unwrap_err().to_string();
        assert!(err("ftp://h:1").contains("unsupported scheme \"ftp\""));
        assert!(err("grpc://").contains("HOST:PORT"));
        assert!(err("grpc://h:1/path").contains("HOST:PORT"));
        assert!(err("grpc://h:port").contains("port is not a number"));
        assert!(err("grpc://h:99999").contains("port is not a number"));
    }
}
