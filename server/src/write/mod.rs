//! The write path: DoPut record batches become SQS messages.
//!
//! [`rows`] turns a record batch into messages, checking each row against
//! what SQS will accept, so that a row that can never be sent is named
//! before anything of it is sent; [`send`] packs messages into
//! SendMessageBatch calls within SQS's limits, runs them with bounded
//! concurrency, and retries the entries SQS failed on its side.

pub mod rows;
pub mod send;

/// Why a write stopped.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The input itself is wrong (missing `body`, wrong column type).
    #[error("{0}")]
    Schema(String),
    /// One row can never be sent.
    #[error("row {row}: {reason}")]
    Row { row: u64, reason: String },
    /// SQS could not be reached or failed past its retries.
    #[error(transparent)]
    Sqs(#[from] crate::sqs::SqsError),
    /// A large body could not be put into S3 (`large_payloads.bucket`).
    #[error("row {row}: {error}")]
    Offload {
        row: u64,
        error: Box<crate::large_payload::ObjectError>,
    },
}
