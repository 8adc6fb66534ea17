//! Why the server refused a call, in words a program may branch on.
//!
//! Every status the server answers with carries a [`Reason`] beside its
//! message (docs/protocol.md, "Error reasons"): the message is for people
//! and its wording may change; the reason is the contract. It travels as
//! the ASCII trailer [`HEADER`] (`sqsf-reason: queue_not_found`), which
//! every gRPC client can read: tonic as `Status::metadata()`, pyarrow
//! through a client middleware's `received_headers`, grpcurl and the other
//! Flight clients as the call's trailers. (The rich-error trailer
//! `grpc-status-details-bin` is not used: pyarrow drops it from the
//! exceptions it raises for INVALID_ARGUMENT and NOT_FOUND.)

use std::fmt;

/// The trailer that carries the reason.
pub const HEADER: &str = "sqsf-reason";

/// The trailer of a failed DoPut that carries how many of its rows were
/// sent (accepted by SQS) before the failure, over the whole call, in
/// decimal: the rows before them are in the queue, the rest are not.
pub const ROWS_SENT_HEADER: &str = "sqsf-rows-sent";

/// The trailer of a failed DoPut that names the row that was the reason
/// (counted from 0 over the whole call), in decimal, when one row was.
pub const ROW_HEADER: &str = "sqsf-row";

/// Why a call was refused. On the wire it is a short lowercase word; those
/// of a limit and of a field name it after a colon (`limit:max_bytes`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Reason {
    /// `invalid_argument`: a malformed or refused request; the message names
    /// what to change.
    InvalidArgument,
    /// `invalid_argument:FIELD`: a plan command's field has a value no
    /// server takes (0 where at least 1 is needed).
    InvalidField(String),
    /// `invalid_rows`: DoPut rows or a DoPut schema that cannot be sent.
    InvalidRows,
    /// `read_only`: a Flight SQL statement or DoPut that would change data
    /// through the read-only SQL surface.
    ReadOnly,
    /// `unknown_table`: no table of that name.
    UnknownTable,
    /// `committed`: the batch is at or below the committed watermark.
    Committed,
    /// `not_planned`: the batch is not planned (released, lease expired,
    /// server restarted).
    NotPlanned,
    /// `limit:NAME`: above the server's limit `NAME` (a setting, or a plan
    /// command field above its `--limit-*`).
    Limit(String),
    /// `budget`: the registry's budget or one of its caps is reached (its
    /// messages, bytes, tickets, consumers, or a consumer's open batches):
    /// commit or release batches first.
    Budget,
    /// `shutting_down`: the server is stopping.
    ShuttingDown,
    /// `queue_not_found`: the table's queue does not exist.
    QueueNotFound,
    /// `sqs_credentials`: the server has no usable AWS credentials.
    SqsCredentials,
    /// `sqs_region`: no AWS region, or not the queue's.
    SqsRegion,
    /// `sqs_unavailable`: SQS failed, could not be reached or throttled the
    /// server, after its retries.
    SqsUnavailable,
    /// `sqs_refused`: SQS refused the call as the sender's fault.
    SqsRefused,
    /// `s3_refused`: S3 refused a large payload's object for good (no such
    /// bucket, access denied).
    S3Refused,
    /// `s3_unavailable`: S3 failed or could not be reached, after the
    /// server's retries.
    S3Unavailable,
    /// `fenced`: another server took over this server's state log
    /// (`--state-url`); this one changes nothing any more: send the call
    /// to the new one.
    Fenced,
    /// `state_unavailable`: the state log (`--state-url`) could not be
    /// written or read, after the server's retries; nothing was changed.
    StateUnavailable,
    /// `unauthenticated`: the bearer token is missing or wrong.
    Unauthenticated,
    /// `unimplemented`: an RPC or command the server does not offer.
    Unimplemented,
    /// `cancelled`: the call's other side went away.
    Cancelled,
    /// `internal`: the server failed.
    Internal,
    /// A reason this version does not know, as sent.
    Other(String),
}

impl Reason {
    /// The reason of `wire`, its word on the wire; an unknown word is
    /// [`Reason::Other`].
    pub fn parse(wire: &str) -> Self {
        if let Some(name) = wire.strip_prefix("limit:") {
            return Self::Limit(name.to_string());
        }
        if let Some(field) = wire.strip_prefix("invalid_argument:") {
            return Self::InvalidField(field.to_string());
        }
        match wire {
            "invalid_argument" => Self::InvalidArgument,
            "invalid_rows" => Self::InvalidRows,
            "read_only" => Self::ReadOnly,
            "unknown_table" => Self::UnknownTable,
            "committed" => Self::Committed,
            "not_planned" => Self::NotPlanned,
            "budget" => Self::Budget,
            "shutting_down" => Self::ShuttingDown,
            "queue_not_found" => Self::QueueNotFound,
            "sqs_credentials" => Self::SqsCredentials,
            "sqs_region" => Self::SqsRegion,
            "sqs_unavailable" => Self::SqsUnavailable,
            "sqs_refused" => Self::SqsRefused,
            "s3_refused" => Self::S3Refused,
            "s3_unavailable" => Self::S3Unavailable,
            "fenced" => Self::Fenced,
            "state_unavailable" => Self::StateUnavailable,
            "unauthenticated" => Self::Unauthenticated,
            "unimplemented" => Self::Unimplemented,
            "cancelled" => Self::Cancelled,
            "internal" => Self::Internal,
            other => Self::Other(other.to_string()),
        }
    }

    /// `limit:NAME`.
    pub fn limit(name: impl Into<String>) -> Self {
        Self::Limit(name.into())
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let word = match self {
            Self::InvalidField(field) => return write!(f, "invalid_argument:{field}"),
            Self::Limit(name) => return write!(f, "limit:{name}"),
            Self::Other(word) => return f.write_str(word),
            Self::InvalidArgument => "invalid_argument",
            Self::InvalidRows => "invalid_rows",
            Self::ReadOnly => "read_only",
            Self::UnknownTable => "unknown_table",
            Self::Committed => "committed",
            Self::NotPlanned => "not_planned",
            Self::Budget => "budget",
            Self::ShuttingDown => "shutting_down",
            Self::QueueNotFound => "queue_not_found",
            Self::SqsCredentials => "sqs_credentials",
            Self::SqsRegion => "sqs_region",
            Self::SqsUnavailable => "sqs_unavailable",
            Self::SqsRefused => "sqs_refused",
            Self::S3Refused => "s3_refused",
            Self::S3Unavailable => "s3_unavailable",
            Self::Fenced => "fenced",
            Self::StateUnavailable => "state_unavailable",
            Self::Unauthenticated => "unauthenticated",
            Self::Unimplemented => "unimplemented",
            Self::Cancelled => "cancelled",
            Self::Internal => "internal",
        };
        f.write_str(word)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every reason but `Other`, one of each shape.
    fn all() -> Vec<Reason> {
        vec![
            Reason::InvalidArgument,
            Reason::InvalidField("max_bytes".into()),
            Reason::InvalidRows,
            Reason::ReadOnly,
            Reason::UnknownTable,
            Reason::Committed,
            Reason::NotPlanned,
            Reason::limit("max_bytes"),
            Reason::Budget,
            Reason::ShuttingDown,
            Reason::QueueNotFound,
            Reason::SqsCredentials,
            Reason::SqsRegion,
            Reason::SqsUnavailable,
            Reason::SqsRefused,
            Reason::S3Refused,
            Reason::S3Unavailable,
            Reason::Fenced,
            Reason::StateUnavailable,
            Reason::Unauthenticated,
            Reason::Unimplemented,
            Reason::Cancelled,
            Reason::Internal,
        ]
    }

    #[test]
    fn every_reason_reads_back_from_its_word() {
        for r in all() {
            assert_eq!(Reason::parse(&r.to_string()), r);
        }
        assert_eq!(Reason::limit("max_bytes").to_string(), "limit:max_bytes");
        assert_eq!(
            Reason::parse("invalid_argument:max_bytes"),
            Reason::InvalidField("max_bytes".into())
        );
        assert_eq!(Reason::parse("new_one"), Reason::Other("new_one".into()));
    }
}
