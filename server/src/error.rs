//! The server's error type and its one mapping to Flight statuses.
//!
//! Every status the server answers with is built by [`status`]: its code,
//! its message for people and its [`Reason`] for programs, carried in the
//! `sqsf-reason` trailer (docs/protocol.md, "Error reasons").

use sqs_flight_schemas::{FieldError, Reason, reason};
use tonic::metadata::MetadataValue;
use tonic::{Code, Status};

use crate::config::plan::OutOfBounds;
use crate::sqs::SqsError;
use crate::write::WriteError;

/// Everything an RPC can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Malformed JSON, ticket or descriptor; unknown field or action; bad type.
    #[error(transparent)]
    Field(#[from] FieldError),
    /// A well-formed request with a value the server refuses.
    #[error("{0}")]
    InvalidArgument(String),
    #[error("unknown table {table:?} (known tables: {known})")]
    UnknownTable { table: String, known: String },
    #[error(
        "batch {batch} of consumer {consumer:?} on table {table:?} is already committed \
         (committed watermark: {committed}); plan a batch above it"
    )]
    Committed {
        table: String,
        consumer: String,
        batch: u64,
        committed: u64,
    },
    #[error(
        "batch {batch} of consumer {consumer:?} on table {table:?} is not planned \
         (it was released, its lease expired, or the server restarted); plan it again"
    )]
    NotPlanned {
        table: String,
        consumer: String,
        batch: u64,
    },
    /// A plan command's field out of its bounds: above the server's limit,
    /// or 0.
    #[error("{}", out_of_bounds(.0))]
    PlanField(OutOfBounds),
    /// A statement or a write the read-only Flight SQL surface refuses.
    #[error("{0}")]
    ReadOnly(String),
    /// The registry's budget or one of its caps is reached (messages,
    /// bytes, tickets, consumers, a consumer's open batches).
    #[error("{0}")]
    ResourceExhausted(String),
    /// Above the server's limit `limit` (a setting's name).
    #[error("{message}")]
    Limit { limit: String, message: String },
    /// A time limit ran out (a Flight SQL query's `--sql-query-timeout`).
    #[error("{0}")]
    DeadlineExceeded(String),
    /// The server is stopping and cut the call.
    #[error("{0}")]
    ShuttingDown(String),
    #[error("table {table:?}: {source}")]
    Sqs {
        table: String,
        #[source]
        source: SqsError,
    },
    #[error("table {table:?}: {source}; {} before it", rows_sent(*.sent))]
    Write {
        table: String,
        sent: u64,
        #[source]
        source: crate::write::WriteError,
    },
    /// Another server took over the state log: this one changes nothing.
    #[error("{0}")]
    Fenced(String),
    /// The state log could not be written or read.
    #[error("{0}")]
    StateUnavailable(String),
    #[error("{0}")]
    Internal(String),
}

/// What is wrong with a plan command's field.
fn out_of_bounds(bounds: &OutOfBounds) -> String {
    match *bounds {
        OutOfBounds::AboveLimit {
            field,
            value,
            limit,
        } => format!("plan command: field `{field}` is {value}, above the limit {limit}"),
        OutOfBounds::Zero { field } => format!("plan command: field `{field}` must be at least 1"),
    }
}

/// `1 row was sent`, `3 rows were sent`.
fn rows_sent(n: u64) -> String {
    match n {
        1 => "1 row was sent".into(),
        n => format!("{n} rows were sent"),
    }
}

impl Error {
    /// Above the server's limit `limit`.
    pub fn limit(limit: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Limit {
            limit: limit.into(),
            message: message.into(),
        }
    }

    /// An SQS error on `table`.
    pub fn sqs(table: &str, source: SqsError) -> Self {
        Self::Sqs {
            table: table.to_string(),
            source,
        }
    }

    /// A copy of a journal write's failure for each of its waiters: fenced
    /// and state-log failures keep their status, the rest is the server's.
    pub fn copy_journal_error(&self) -> Self {
        match self {
            Self::Fenced(m) => Self::Fenced(m.clone()),
            Self::StateUnavailable(m) => Self::StateUnavailable(m.clone()),
            e => Self::Internal(e.to_string()),
        }
    }

    /// Whether SQS refused a call for the queue's in-flight cap.
    pub fn is_over_limit(&self) -> bool {
        matches!(self, Self::Sqs { source, .. } if source.is_over_limit())
    }

    /// A journal write's failure as the message `context` words it: its
    /// status stays when the state log fenced this server or could not be
    /// reached; any other failure is the server's.
    pub fn with_context(self, context: impl FnOnce(&Self) -> String) -> Self {
        let message = context(&self);
        match self {
            Self::Fenced(_) => Self::Fenced(message),
            Self::StateUnavailable(_) => Self::StateUnavailable(message),
            _ => Self::Internal(message),
        }
    }
}

impl From<Error> for Status {
    fn from(err: Error) -> Self {
        Status::from(&err)
    }
}

impl From<&Error> for Status {
    fn from(err: &Error) -> Self {
        let message = err.to_string();
        let (code, reason) = match err {
            Error::Field(_) | Error::InvalidArgument(_) => {
                tracing::debug!(%message, "refused invalid request");
                (Code::InvalidArgument, Reason::InvalidArgument)
            }
            Error::UnknownTable { .. } => {
                tracing::debug!(%message, "unknown table");
                (Code::NotFound, Reason::UnknownTable)
            }
            Error::Committed { .. } => {
                tracing::debug!(%message, "refused request");
                (Code::FailedPrecondition, Reason::Committed)
            }
            Error::NotPlanned { .. } => {
                tracing::debug!(%message, "refused request");
                (Code::FailedPrecondition, Reason::NotPlanned)
            }
            Error::PlanField(bounds) => {
                tracing::debug!(%message, "refused invalid request");
                let reason = match *bounds {
                    OutOfBounds::AboveLimit { field, .. } => Reason::limit(field),
                    OutOfBounds::Zero { field } => Reason::InvalidField(field.into()),
                };
                (Code::InvalidArgument, reason)
            }
            Error::ReadOnly(_) => {
                tracing::debug!(%message, "refused a write through SQL");
                (Code::InvalidArgument, Reason::ReadOnly)
            }
            Error::ResourceExhausted(_) => {
                tracing::warn!(%message, "refused: the registry budget is reached");
                (Code::ResourceExhausted, Reason::Budget)
            }
            Error::Limit { limit, .. } => {
                tracing::warn!(%message, "refused: a limit is reached");
                (Code::ResourceExhausted, Reason::limit(limit.as_str()))
            }
            Error::DeadlineExceeded(_) => {
                tracing::warn!(%message, "stopped: a time limit ran out");
                (Code::DeadlineExceeded, Reason::limit(SQL_QUERY_TIMEOUT))
            }
            Error::ShuttingDown(_) => {
                tracing::debug!(%message, "cut by the shutdown");
                (Code::Unavailable, Reason::ShuttingDown)
            }
            Error::Fenced(_) => {
                tracing::debug!(%message, "refused: fenced");
                (Code::FailedPrecondition, Reason::Fenced)
            }
            Error::StateUnavailable(_) => {
                tracing::warn!(%message, "refused: the state log could not be written");
                (Code::Unavailable, Reason::StateUnavailable)
            }
            Error::Sqs { source, .. } => sqs_status(source, &message),
            Error::Write { source, .. } => match source {
                WriteError::Schema(_) | WriteError::Row { .. } => {
                    tracing::debug!(%message, "refused DoPut input");
                    (Code::InvalidArgument, Reason::InvalidRows)
                }
                WriteError::Sqs(e) => sqs_status(e, &message),
                WriteError::Offload { error, .. } => {
                    use crate::large_payload::ObjectError;
                    tracing::warn!(%message, "a large payload could not be put into S3");
                    match error.as_ref() {
                        ObjectError::Missing { .. } | ObjectError::Refused { .. } => {
                            (Code::FailedPrecondition, Reason::S3Refused)
                        }
                        ObjectError::Failed { .. } => (Code::Unavailable, Reason::S3Unavailable),
                        ObjectError::TooLarge { .. } | ObjectError::NotText { .. } => {
                            (Code::InvalidArgument, Reason::InvalidRows)
                        }
                    }
                }
            },
            Error::Internal(_) => {
                tracing::error!(%message, "internal error");
                (Code::Internal, Reason::Internal)
            }
        };
        status(code, message, reason)
    }
}

/// The limit a [`Error::DeadlineExceeded`] names.
const SQL_QUERY_TIMEOUT: &str = "sql.query_timeout";

fn sqs_status(source: &SqsError, message: &str) -> (Code, Reason) {
    let (code, reason) = match source {
        SqsError::Credentials { .. } | SqsError::Identity { .. } => {
            (Code::FailedPrecondition, Reason::SqsCredentials)
        }
        SqsError::Region { .. } => (Code::FailedPrecondition, Reason::SqsRegion),
        SqsError::NoQueue { .. } => (Code::FailedPrecondition, Reason::QueueNotFound),
        SqsError::Service { .. } => (Code::Unavailable, Reason::SqsUnavailable),
        SqsError::Refused { .. } => (Code::InvalidArgument, Reason::SqsRefused),
        SqsError::Fenced { .. } => return (Code::FailedPrecondition, Reason::Fenced),
    };
    match code {
        Code::FailedPrecondition => tracing::error!(%message, "SQS refused the server"),
        Code::Unavailable => tracing::warn!(%message, "SQS call failed"),
        _ => tracing::debug!(%message, "SQS refused the request"),
    }
    (code, reason)
}

/// A status with `reason` beside `message`, in the `sqsf-reason` trailer:
/// how every status the server answers with is built.
pub fn status(code: Code, message: impl Into<String>, reason: Reason) -> Status {
    let mut status = Status::new(code, message);
    // Every reason is ASCII (lowercase words and setting names).
    if let Ok(value) = MetadataValue::try_from(reason.to_string()) {
        status.metadata_mut().insert(reason::HEADER, value);
    }
    status
}

/// The reason `status` carries, if it has one.
pub fn reason_of(status: &Status) -> Option<Reason> {
    let value = status.metadata().get(reason::HEADER)?;
    value.to_str().ok().map(Reason::parse)
}

/// A status relayed from a Flight SQL worker process, with the reason it
/// was sent with (its word; none from a worker that gave none).
pub fn relayed(code: i32, message: String, reason: Option<&str>) -> Status {
    let code = Code::from_i32(code);
    match reason {
        Some(word) => status(code, message, Reason::parse(word)),
        None => Status::new(code, message),
    }
}

/// INTERNAL, reason `internal`.
pub fn internal(message: impl Into<String>) -> Status {
    status(Code::Internal, message, Reason::Internal)
}

/// INVALID_ARGUMENT, reason `invalid_argument`.
pub fn invalid_argument(message: impl Into<String>) -> Status {
    status(Code::InvalidArgument, message, Reason::InvalidArgument)
}

/// UNAUTHENTICATED, reason `unauthenticated`.
pub fn unauthenticated(message: impl Into<String>) -> Status {
    status(Code::Unauthenticated, message, Reason::Unauthenticated)
}

/// UNIMPLEMENTED, reason `unimplemented`.
pub fn unimplemented(message: impl Into<String>) -> Status {
    status(Code::Unimplemented, message, Reason::Unimplemented)
}

/// CANCELLED, reason `cancelled`.
pub fn cancelled(message: impl Into<String>) -> Status {
    status(Code::Cancelled, message, Reason::Cancelled)
}

/// RESOURCE_EXHAUSTED, reason `limit:LIMIT`, for the limits checked
/// outside an RPC's own code (the request body's size, the streams per
/// client); not logged here.
pub fn over_limit(limit: &str, message: impl Into<String>) -> Status {
    status(Code::ResourceExhausted, message, Reason::limit(limit))
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
