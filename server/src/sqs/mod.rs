//! The queue client: the operations the server needs from SQS, behind a
//! trait with two implementations, [`aws::AwsQueue`] (any SQS-compatible
//! endpoint through aws-sdk-sqs) and [`memory::MemoryQueue`] (the embedded
//! demo backend, also used by unit tests).
//!
//! [`batching`] splits receipt lists into SQS's batches of ten and runs them
//! with bounded concurrency, counting each `Failed` entry.

pub mod aws;
pub(crate) mod batching;
pub(crate) mod congestion;
pub mod memory;
pub(crate) mod metered;
pub(crate) mod region;
pub mod role;

use std::fmt;
use std::time::Duration;

use futures::future::BoxFuture;
use sqs_flight_schemas::SqsMessage;

/// The most entries one SQS batch call takes, and the most messages one
/// ReceiveMessage returns.
pub(crate) const SQS_BATCH: usize = 10;
/// The longest long poll SQS allows.
pub(crate) const MAX_WAIT_SECONDS: u64 = 20;
/// The code SQS answers a ReceiveMessage with when the queue holds as many
/// messages in flight as it allows.
pub(crate) const OVER_LIMIT: &str = "OverLimit";

/// A receipt handle. It never leaves the server: its `Debug` shows a short
/// digest instead of the handle, so that logging one by mistake leaks nothing.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ReceiptHandle(String);

impl ReceiptHandle {
    pub(crate) fn new(handle: String) -> Self {
        Self(handle)
    }

    /// The handle itself, for the SQS call that needs it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ReceiptHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ReceiptHandle(<{} bytes>)", self.0.len())
    }
}

/// One received message with the handle of this receive.
#[derive(Debug, Clone)]
pub struct Received {
    pub message: SqsMessage,
    pub receipt: ReceiptHandle,
}

/// Parameters of one ReceiveMessage call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceiveRequest {
    /// 1 to 10.
    pub max_messages: usize,
    /// Long-poll time, 0 to 20 s.
    pub wait: Duration,
    /// Visibility timeout of the received messages.
    pub visibility_timeout: Duration,
}

/// The result of one batch call (delete or change visibility).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchOutcome {
    /// Indexes (into the request) of the entries that succeeded.
    pub succeeded: Vec<usize>,
    /// Entries SQS refused, with its error code; `sender_fault` false means
    /// a server-side fault worth retrying.
    pub failed: Vec<FailedEntry>,
}

/// One refused entry of a batch call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedEntry {
    pub index: usize,
    pub code: String,
    pub sender_fault: bool,
}

/// One message to send.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutgoingMessage {
    pub body: String,
    pub message_group_id: Option<String>,
    pub message_deduplication_id: Option<String>,
    pub delay_seconds: Option<i32>,
    /// String attributes, (name, value).
    pub attributes: Vec<(String, String)>,
    /// Set when the body is a large payload's pointer: the payload's size,
    /// sent as the Number attribute `ExtendedPayloadSize` (see
    /// [`crate::large_payload`]).
    pub payload_size: Option<u64>,
}

/// The data type SQS records for the attributes sqs-flight sends.
pub(crate) const STRING_ATTRIBUTE: &str = "String";

impl OutgoingMessage {
    /// Bytes SQS counts against its message and request size limits: the
    /// body plus each attribute's name, data type and value.
    pub(crate) fn sqs_size(&self) -> usize {
        let attributes: usize = self
            .attributes
            .iter()
            .map(|(k, v)| k.len() + STRING_ATTRIBUTE.len() + v.len())
            .sum();
        let pointer = self.payload_size.map_or(0, |n| {
            crate::large_payload::RESERVED_ATTRIBUTE.len()
                + crate::large_payload::NUMBER_ATTRIBUTE.len()
                + n.to_string().len()
        });
        self.body.len() + attributes + pointer
    }
}

/// Queue attributes the server reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueAttributes {
    /// ApproximateNumberOfMessages.
    pub visible: u64,
    /// ApproximateNumberOfMessagesNotVisible.
    pub in_flight: u64,
    /// VisibilityTimeout.
    pub visibility_timeout: Duration,
}

/// Why an SQS call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SqsError {
    /// The server has no usable AWS credentials or is not allowed to act.
    #[error("AWS credentials problem: {message}")]
    Credentials { message: String },
    /// The call's credentials could not be loaded, so it was not sent:
    /// the server's AWS chain has none, or the table's `role` could not be
    /// assumed (STS refused it, or could not be reached); `reason` is
    /// STS's answer or the SDK's.
    #[error("{}", identity_problem(role.as_ref(), reason))]
    Identity {
        role: Option<role::Assumed>,
        reason: String,
    },
    /// No AWS region to sign the queue's calls for, or not the queue's:
    /// the server's configuration, not the request, must change.
    #[error("AWS region problem: {message}")]
    Region { message: String },
    /// The queue does not exist at that URL.
    #[error("queue does not exist ({code}): {message}")]
    NoQueue { code: String, message: String },
    /// SQS answered with an error, or could not be reached, after retries.
    #[error("SQS call {operation} failed ({code}): {message}")]
    Service {
        operation: &'static str,
        code: String,
        message: String,
    },
    /// SQS refused the call itself as the sender's fault (a parameter, an
    /// attribute or a batch it will never accept): retrying cannot help.
    #[error("SQS refused {operation} ({code}): {message}")]
    Refused {
        operation: &'static str,
        code: String,
        message: String,
    },
    /// Not sent: another server took over this server's state log
    /// (`--state-url`), so this one changes nothing in SQS.
    #[error("{message}")]
    Fenced { message: String },
}

/// What an [`SqsError::Identity`] says: the role and session, with the
/// fix to look for; or, without a role, the chain's missing credentials.
fn identity_problem(role: Option<&role::Assumed>, reason: &str) -> String {
    match role {
        Some(role) => format!(
            "cannot assume {role}: {reason}; the role's trust policy must let this server's \
             AWS identity assume it (with the table's role_external_id, if it asks for one)"
        ),
        None => format!("AWS credentials problem: no credentials could be loaded: {reason}"),
    }
}

impl SqsError {
    /// The error code, for metrics.
    pub(crate) fn code(&self) -> &str {
        match self {
            SqsError::Credentials { .. } | SqsError::Identity { role: None, .. } => "Credentials",
            SqsError::Identity { role: Some(_), .. } => "AssumeRole",
            SqsError::Region { .. } => "Region",
            SqsError::Fenced { .. } => "Fenced",
            SqsError::NoQueue { code, .. }
            | SqsError::Service { code, .. }
            | SqsError::Refused { code, .. } => code,
        }
    }

    /// Whether SQS refused the call for the queue's in-flight cap
    /// (`OverLimit`: 120,000 messages in flight for a standard queue).
    pub(crate) fn is_over_limit(&self) -> bool {
        matches!(self, SqsError::Service { code, .. } if code == OVER_LIMIT)
    }

    /// Whether the endpoint pushed the call back rather than failed it:
    /// throttled it, answered 503 or 429 (`ServiceUnavailable`, or an
    /// emulator's bare `HTTP 503` at its connection capacity), or could not
    /// be reached (a refused, reset or timed-out connection). Such a call
    /// may well succeed later; see [`congestion`].
    pub(crate) fn is_push_back(&self) -> bool {
        match self {
            SqsError::Service { code, .. } => {
                congestion::THROTTLING_CODES.contains(&code.as_str())
                    || PUSH_BACK_CODES.contains(&code.as_str())
            }
            _ => false,
        }
    }
}

/// Codes (besides throttling ones) of calls the endpoint pushed back:
/// see [`SqsError::is_push_back`].
const PUSH_BACK_CODES: &[&str] = &[
    "ServiceUnavailable",
    "ServiceUnavailableException",
    "HTTP 503",
    "HTTP 429",
    "Unreachable",
];

/// The operations the server needs from one queue.
pub trait Queue: Send + Sync + 'static {
    /// One ReceiveMessage call.
    fn receive(&self, req: ReceiveRequest) -> BoxFuture<'_, Result<Vec<Received>, SqsError>>;
    /// One DeleteMessageBatch call of at most [`SQS_BATCH`] receipts.
    fn delete_batch(
        &self,
        receipts: Vec<ReceiptHandle>,
    ) -> BoxFuture<'_, Result<BatchOutcome, SqsError>>;
    /// One ChangeMessageVisibilityBatch call of at most [`SQS_BATCH`] receipts.
    fn change_visibility_batch(
        &self,
        receipts: Vec<ReceiptHandle>,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<BatchOutcome, SqsError>>;
    /// One SendMessageBatch call of at most [`SQS_BATCH`] messages.
    fn send_batch(
        &self,
        messages: Vec<OutgoingMessage>,
    ) -> BoxFuture<'_, Result<BatchOutcome, SqsError>>;
    /// True for a FIFO queue (messages need a group id; order matters).
    fn is_fifo(&self) -> bool;
    /// GetQueueAttributes.
    fn attributes(&self) -> BoxFuture<'_, Result<QueueAttributes, SqsError>>;
    /// The window of calls in flight of the queue's endpoint, if its calls
    /// are held to one (see [`congestion`]).
    fn congestion(&self) -> Option<&std::sync::Arc<congestion::Congestion>> {
        None
    }
}
