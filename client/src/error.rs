//! The client's error type, and which errors are worth retrying.

use arrow_flight::error::FlightError;
pub use sqs_flight_schemas::Reason;
use tonic::Code;

/// Everything a [`Client`](crate::Client) call can fail with.
///
/// The variants follow what a caller can do about the error:
/// [`is_retryable`](Self::is_retryable) says whether the same call may
/// succeed later (the server or SQS was unreachable or busy); the other
/// errors need a different request (fix the argument, plan again, provide a
/// token). Retrying a read is always safe: a ticket replays the same rows.
///
/// An error the server answered with carries its [`Reason`]
/// ([`reason`](Self::reason), docs/protocol.md "Error reasons"): branch on
/// it, never on the message, whose words may change.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The URL cannot name an sqs-flight server.
    #[error("invalid server URL {url:?}: {reason}")]
    InvalidUrl { url: String, reason: String },
    /// A client setting is unusable (a token that is not a valid header).
    #[error("invalid {what}: {reason}")]
    InvalidConfig { what: &'static str, reason: String },
    /// The server could not be reached (connection refused, DNS, TLS,
    /// timeout). Retryable.
    #[error("cannot reach the sqs-flight server at {url}: {reason}")]
    Connect { url: String, reason: String },
    /// The server (or SQS behind it) is unavailable, overloaded or timed out:
    /// UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, ABORTED,
    /// CANCELLED. Retryable.
    #[error("server unavailable ({code:?}): {message}")]
    Unavailable {
        code: Code,
        message: String,
        reason: Option<Reason>,
    },
    /// The server refused the request as it is: INVALID_ARGUMENT,
    /// FAILED_PRECONDITION (a committed batch, a released plan, missing AWS
    /// credentials), OUT_OF_RANGE, ALREADY_EXISTS, UNIMPLEMENTED. The
    /// message names what to change.
    #[error("request refused ({code:?}): {message}")]
    Refused {
        code: Code,
        message: String,
        reason: Option<Reason>,
    },
    /// NOT_FOUND: an unknown table; the message lists the known ones.
    #[error("not found: {message}")]
    NotFound {
        message: String,
        reason: Option<Reason>,
    },
    /// UNAUTHENTICATED or PERMISSION_DENIED: the token is missing or wrong.
    #[error("not authorized ({code:?}): {message}")]
    Unauthenticated {
        code: Code,
        message: String,
        reason: Option<Reason>,
    },
    /// The server failed: INTERNAL, UNKNOWN, DATA_LOSS.
    #[error("server error ({code:?}): {message}")]
    Server {
        code: Code,
        message: String,
        reason: Option<Reason>,
    },
    /// The server's answer does not follow the sqs-flight protocol.
    #[error("malformed answer to {what}: {reason}")]
    Protocol { what: &'static str, reason: String },
}

/// The client's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Whether the same call may succeed if made again later.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Connect { .. } | Self::Unavailable { .. })
    }

    /// The gRPC status code, for errors the server answered with.
    pub fn code(&self) -> Option<Code> {
        match self {
            Self::Unavailable { code, .. }
            | Self::Refused { code, .. }
            | Self::Unauthenticated { code, .. }
            | Self::Server { code, .. } => Some(*code),
            Self::NotFound { .. } => Some(Code::NotFound),
            Self::InvalidUrl { .. }
            | Self::InvalidConfig { .. }
            | Self::Connect { .. }
            | Self::Protocol { .. } => None,
        }
    }

    /// Why the server refused the call, for errors it answered with a
    /// reason (a server older than reasons, or a call that failed in the
    /// transport, has none).
    pub fn reason(&self) -> Option<&Reason> {
        match self {
            Self::Unavailable { reason, .. }
            | Self::Refused { reason, .. }
            | Self::NotFound { reason, .. }
            | Self::Unauthenticated { reason, .. }
            | Self::Server { reason, .. } => reason.as_ref(),
            Self::InvalidUrl { .. }
            | Self::InvalidConfig { .. }
            | Self::Connect { .. }
            | Self::Protocol { .. } => None,
        }
    }

    /// A malformed answer to `what`.
    pub(crate) fn protocol(what: &'static str, reason: impl ToString) -> Self {
        Self::Protocol {
            what,
            reason: reason.to_string(),
        }
    }
}

impl From<tonic::Status> for Error {
    fn from(status: tonic::Status) -> Self {
        let message = status.message().to_string();
        let code = status.code();
        let reason = status
            .metadata()
            .get(sqs_flight_schemas::reason::HEADER)
            .and_then(|v| v.to_str().ok())
            .map(Reason::parse);
        // A call that failed in the transport (the connection broke, or the
        // port speaks TLS to a grpc:// client) carries its cause as a source
        // (UNKNOWN "transport error", INTERNAL "h2 protocol error" or
        // CANCELLED, depending on timing); a status the server answered
        // with never has one.
        if let Some(source) = std::error::Error::source(&status) {
            return Self::Unavailable {
                code,
                message: chain(source),
                reason: None,
            };
        }
        match code {
            Code::Unavailable
            | Code::DeadlineExceeded
            | Code::ResourceExhausted
            | Code::Aborted
            | Code::Cancelled => Self::Unavailable {
                code,
                message,
                reason,
            },
            Code::InvalidArgument
            | Code::FailedPrecondition
            | Code::OutOfRange
            | Code::AlreadyExists
            | Code::Unimplemented => Self::Refused {
                code,
                message,
                reason,
            },
            Code::NotFound => Self::NotFound { message, reason },
            Code::Unauthenticated | Code::PermissionDenied => Self::Unauthenticated {
                code,
                message,
                reason,
            },
            Code::Ok | Code::Unknown | Code::Internal | Code::DataLoss => Self::Server {
                code,
                message,
                reason,
            },
        }
    }
}

impl From<FlightError> for Error {
    fn from(e: FlightError) -> Self {
        match e {
            FlightError::Tonic(status) => Self::from(*status),
            FlightError::Arrow(e) => Self::protocol("DoGet", e),
            FlightError::NotYetImplemented(m)
            | FlightError::ProtocolError(m)
            | FlightError::DecodeError(m) => Self::protocol("a Flight call", m),
            FlightError::ExternalError(e) => Self::protocol("a Flight call", e),
        }
    }
}

/// The error and its sources, joined: tonic's transport errors say only
/// "transport error" at the top and hide the cause (connection refused,
/// certificate rejected) in the chain.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Status;

    #[test]
    fn statuses_map_to_what_the_caller_can_do() {
        let e = Error::from(Status::unavailable("SQS throttled"));
        assert!(e.is_retryable());
        assert_eq!(e.code(), Some(Code::Unavailable));
        let e = Error::from(Status::invalid_argument("field `partitions` is 99"));
        assert!(matches!(e, Error::Refused { .. }) && !e.is_retryable());
        assert!(e.to_string().contains("`partitions`"));
        let e = Error::from(Status::not_found("unknown table \"x\""));
        assert!(matches!(e, Error::NotFound { .. }) && !e.is_retryable());
        let e = Error::from(Status::unauthenticated("no token"));
        assert!(matches!(e, Error::Unauthenticated { .. }));
        let e = Error::from(Status::internal("boom"));
        assert!(matches!(e, Error::Server { .. }) && !e.is_retryable());
        let e = Error::from(Status::failed_precondition("committed"));
        assert!(matches!(
            e,
            Error::Refused {
                code: Code::FailedPrecondition,
                ..
            }
        ));
    }

    #[test]
    fn the_reason_comes_from_the_trailer_unknown_words_kept() {
        let mut status = Status::failed_precondition("queue does not exist (X): y");
        let header = sqs_flight_schemas::reason::HEADER;
        status
            .metadata_mut()
            .insert(header, "queue_not_found".parse().unwrap());
        let e = Error::from(status);
        assert_eq!(e.reason(), Some(&Reason::QueueNotFound));
        let mut status = Status::resource_exhausted("too many");
        status
            .metadata_mut()
            .insert(header, "limit:max_put_rows".parse().unwrap());
        assert_eq!(
            Error::from(status).reason(),
            Some(&Reason::Limit("max_put_rows".into()))
        );
        let mut status = Status::unavailable("x");
        status
            .metadata_mut()
            .insert(header, "a_later_one".parse().unwrap());
        assert_eq!(
            Error::from(status).reason(),
            Some(&Reason::Other("a_later_one".into()))
        );
        assert_eq!(Error::from(Status::internal("no trailer")).reason(), None);
    }

    #[test]
    fn flight_errors_keep_the_status() {
        let e = Error::from(FlightError::Tonic(Box::new(Status::deadline_exceeded(
            "slow",
        ))));
        assert!(e.is_retryable());
        let e = Error::from(FlightError::protocol("no schema"));
        assert!(matches!(e, Error::Protocol { .. }) && !e.is_retryable());
        let connect = Error::Connect {
            url: "grpc://x".into(),
            reason: "refused".into(),
        };
        assert!(connect.is_retryable() && connect.code().is_none());
    }

    #[test]
    fn chain_joins_sources_once() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let outer = std::io::Error::other(io);
        assert_eq!(chain(&outer), "refused");
    }
}
