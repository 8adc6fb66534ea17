//! The server's error type and its one mapping to Flight statuses.

use sqs_flight_schemas::FieldError;
use tonic::Status;

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
    #[error("{0}")]
    ResourceExhausted(String),
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
    #[error("{0}")]
    Internal(String),
}

/// `1 row was sent`, `3 rows were sent`.
fn rows_sent(n: u64) -> String {
    match n {
        1 => "1 row was sent".into(),
        n => format!("{n} rows were sent"),
    }
}

impl Error {
    /// An SQS error on `table`.
    pub fn sqs(table: &str, source: SqsError) -> Self {
        Self::Sqs {
            table: table.to_string(),
            source,
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
        match err {
            Error::Field(_) | Error::InvalidArgument(_) => {
                tracing::debug!(%message, "refused invalid request");
                Status::invalid_argument(message)
            }
            Error::UnknownTable { .. } => {
                tracing::debug!(%message, "unknown table");
                Status::not_found(message)
            }
            Error::Committed { .. } | Error::NotPlanned { .. } => {
                tracing::debug!(%message, "refused request");
                Status::failed_precondition(message)
            }
            Error::ResourceExhausted(_) => {
                tracing::warn!(%message, "refused: a limit or the registry budget is reached");
                Status::resource_exhausted(message)
            }
            Error::DeadlineExceeded(_) => {
                tracing::warn!(%message, "stopped: a time limit ran out");
                Status::deadline_exceeded(message)
            }
            Error::ShuttingDown(_) => {
                tracing::debug!(%message, "cut by the shutdown");
                Status::unavailable(message)
            }
            Error::Sqs { source, .. } => sqs_status(source, message),
            Error::Write { source, .. } => match source {
                WriteError::Schema(_) | WriteError::Row { .. } => {
                    tracing::debug!(%message, "refused DoPut input");
                    Status::invalid_argument(message)
                }
                WriteError::Sqs(e) => sqs_status(e, message),
            },
            Error::Internal(_) => {
                tracing::error!(%message, "internal error");
                Status::internal(message)
            }
        }
    }
}

fn sqs_status(source: &SqsError, message: String) -> Status {
    match source {
        SqsError::Credentials { .. } | SqsError::Region { .. } | SqsError::NoQueue { .. } => {
            tracing::error!(%message, "SQS refused the server");
            Status::failed_precondition(message)
        }
        SqsError::Service { .. } => {
            tracing::warn!(%message, "SQS call failed");
            Status::unavailable(message)
        }
        SqsError::Refused { .. } => {
            tracing::debug!(%message, "SQS refused the request");
            Status::invalid_argument(message)
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
