//! Large payloads: messages in the SQS Extended Client's format, whose body
//! is an object in S3 and whose message carries a pointer to it.
//!
//! The format, the same in the Java library and its Python port:
//! - the message attribute `ExtendedPayloadSize` (type Number, the
//!   payload's length in bytes; `SQSLargePayloadSize` in older versions);
//! - the body `["software.amazon.payloadoffloading.PayloadS3Pointer",
//!   {"s3BucketName": "...", "s3Key": "..."}]` (the class once was
//!   `com.amazon.sqs.javamessaging.MessageS3Pointer`), read as JSON.
//!
//! A table's `[tables.NAME.large_payloads]` turns on what this module does:
//! - [`LargePayloads::resolve`] (`read`): the server fetches each pointed-to
//!   object when it records the receive, before a row is streamed, so a
//!   replay serves the same bytes without a second fetch. A pointer that
//!   cannot be fetched keeps its pointer body and gets a `payload_error`:
//!   never a dropped row, never a failed read;
//! - [`LargePayloads::offload`] (`bucket`): DoPut puts each body over
//!   `threshold_bytes` into the bucket and sends the pointer instead;
//! - [`LargePayloads::delete`] (`delete_after_commit`): a commit that
//!   deleted a message also deletes the object its payload was read from.
//!
//! Bounds: an object over `max_object_bytes` is never read (its declared
//! size, then its `Content-Length`, then the bytes as they arrive are
//! checked), and at most [`FETCH_CONCURRENCY`] fetches per table run at
//! once, so fetches hold at most that many times `max_object_bytes`
//! before the registry's budget counts what they brought.

pub mod s3;

use std::fmt;
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::stream::{self, StreamExt};
use serde::{Deserialize, Serialize};
use sqs_flight_schemas::SqsMessage;
use tokio::sync::Semaphore;

use crate::config::LargePayloadConfig;
use crate::sqs::OutgoingMessage;

/// The message attribute of a pointer message: the payload's size.
pub const RESERVED_ATTRIBUTE: &str = "ExtendedPayloadSize";
/// Its name in the libraries' older versions.
pub const LEGACY_RESERVED_ATTRIBUTE: &str = "SQSLargePayloadSize";
/// The first element of a pointer body.
pub const POINTER_CLASS: &str = "software.amazon.payloadoffloading.PayloadS3Pointer";
/// Its value in the libraries' older versions.
pub const LEGACY_POINTER_CLASS: &str = "com.amazon.sqs.javamessaging.MessageS3Pointer";
/// Fetches (and offloads) of one table in flight at once.
pub const FETCH_CONCURRENCY: usize = 16;
/// The data type of [`RESERVED_ATTRIBUTE`].
pub const NUMBER_ATTRIBUTE: &str = "Number";

/// One object in S3.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct S3Object {
    pub bucket: String,
    pub key: String,
}

impl fmt::Display for S3Object {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s3://{}/{}", self.bucket, self.key)
    }
}

/// Why an object could not be read or written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ObjectError {
    /// No such object or bucket.
    #[error("large payload {object} does not exist ({code})")]
    Missing { object: String, code: String },
    /// S3 refused the call for good (access denied, a bad request).
    #[error("S3 refused {operation} of {object} ({code}): {message}")]
    Refused {
        operation: &'static str,
        object: String,
        code: String,
        message: String,
    },
    /// The object is larger than the table's `max_object_bytes`.
    #[error(
        "large payload {object} is {size} bytes, above the table's max_object_bytes ({max}); not read"
    )]
    TooLarge { object: String, size: u64, max: u64 },
    /// The object is not UTF-8 text, which a body must be.
    #[error("large payload {object} is not UTF-8 text")]
    NotText { object: String },
    /// S3 failed or could not be reached, past the call's retries.
    #[error("S3 call {operation} of {object} failed ({code}): {message}")]
    Failed {
        operation: &'static str,
        object: String,
        code: String,
        message: String,
    },
}

/// The S3 calls large payloads need.
pub trait ObjectStore: Send + Sync + 'static {
    /// GetObject, refusing an object over `max_bytes` before reading past it.
    fn get(&self, object: &S3Object, max_bytes: u64)
    -> BoxFuture<'_, Result<Vec<u8>, ObjectError>>;
    /// PutObject.
    fn put(&self, object: &S3Object, bytes: Vec<u8>) -> BoxFuture<'_, Result<(), ObjectError>>;
    /// DeleteObject.
    fn delete(&self, object: &S3Object) -> BoxFuture<'_, Result<(), ObjectError>>;
}

/// The reserved attribute's value, if `m` carries it: the message is a
/// pointer.
pub fn declared_size(m: &SqsMessage) -> Option<&str> {
    m.message_attributes
        .iter()
        .find(|(k, _)| k == RESERVED_ATTRIBUTE || k == LEGACY_RESERVED_ATTRIBUTE)
        .map(|(_, v)| v.as_str())
}

/// The object a pointer body names.
pub fn parse_pointer(body: &str) -> Result<S3Object, String> {
    #[derive(Deserialize)]
    struct Target {
        #[serde(rename = "s3BucketName")]
        bucket: String,
        #[serde(rename = "s3Key")]
        key: String,
    }
    let bad = |why: &str| format!("the body is not a large-payload pointer: {why}");
    let (class, target): (String, Target) =
        serde_json::from_str(body).map_err(|e| bad(&e.to_string()))?;
    if class != POINTER_CLASS && class != LEGACY_POINTER_CLASS {
        return Err(bad(&format!("unknown pointer class {class:?}")));
    }
    if target.bucket.is_empty() || target.key.is_empty() {
        return Err(bad("empty s3BucketName or s3Key"));
    }
    Ok(S3Object {
        bucket: target.bucket,
        key: target.key,
    })
}

/// The pointer body of `object`, as the extended client writes it.
pub fn pointer_body(object: &S3Object) -> String {
    serde_json::json!([
        POINTER_CLASS,
        {"s3BucketName": object.bucket, "s3Key": object.key}
    ])
    .to_string()
}

/// What became of one received message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved {
    /// Not a pointer: its body is the payload.
    Plain,
    /// Its body is now the object's text.
    Read(S3Object),
    /// A pointer that could not be read: its body is still the pointer.
    Failed(String),
}

/// A table's large payloads: its settings and the S3 calls.
pub struct LargePayloads {
    config: LargePayloadConfig,
    store: Arc<dyn ObjectStore>,
    calls: Semaphore,
}

impl fmt::Debug for LargePayloads {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LargePayloads")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl LargePayloads {
    pub fn new(config: LargePayloadConfig, store: Arc<dyn ObjectStore>) -> Self {
        Self {
            config,
            store,
            calls: Semaphore::new(FETCH_CONCURRENCY),
        }
    }

    /// Whether reads fetch pointed-to objects.
    pub fn reads(&self) -> bool {
        self.config.read
    }

    /// Whether a commit deletes the objects it read.
    pub fn deletes_after_commit(&self) -> bool {
        self.config.delete_after_commit
    }

    /// Whether writes offload large bodies.
    pub fn writes(&self) -> bool {
        self.config.bucket.is_some()
    }

    /// The largest body a write may take: an offloaded one up to
    /// `max_object_bytes`.
    pub fn max_object_bytes(&self) -> u64 {
        self.config.max_object_bytes
    }

    /// Replaces the body of each pointer message by its object's text and
    /// drops the reserved attribute; one [`Resolved`] per message, in
    /// order. Fetches run concurrently, at most [`FETCH_CONCURRENCY`] per
    /// table; messages without the attribute cost nothing.
    pub async fn resolve(&self, messages: &mut [&mut SqsMessage]) -> Vec<Resolved> {
        let wanted: Vec<(usize, Result<S3Object, String>)> = messages
            .iter()
            .enumerate()
            .filter_map(|(i, m)| {
                let declared = declared_size(m)?;
                Some((i, self.wanted(declared, &m.body)))
            })
            .collect();
        let mut out = vec![Resolved::Plain; messages.len()];
        if wanted.is_empty() {
            return out;
        }
        let fetched: Vec<_> = stream::iter(wanted)
            .map(|(i, object)| async move {
                let got = match object {
                    Ok(o) => self.fetch(&o).await.map(|text| (o, text)),
                    Err(why) => return (i, Err(why)),
                };
                (i, got.map_err(|e| e.to_string()))
            })
            .buffer_unordered(FETCH_CONCURRENCY)
            .collect()
            .await;
        for (i, got) in fetched {
            out[i] = match got {
                Ok((object, text)) => {
                    let m = &mut messages[i];
                    m.body = text;
                    m.message_attributes
                        .retain(|(k, _)| k != RESERVED_ATTRIBUTE && k != LEGACY_RESERVED_ATTRIBUTE);
                    Resolved::Read(object)
                }
                Err(why) => Resolved::Failed(why),
            };
        }
        out
    }

    /// The object a pointer names, unless its declared size is already
    /// over the bound.
    fn wanted(&self, declared: &str, body: &str) -> Result<S3Object, String> {
        let object = parse_pointer(body)?;
        let max = self.config.max_object_bytes;
        match declared.trim().parse::<u64>() {
            Ok(size) if size > max => Err(ObjectError::TooLarge {
                object: object.to_string(),
                size,
                max,
            }
            .to_string()),
            _ => Ok(object),
        }
    }

    async fn fetch(&self, object: &S3Object) -> Result<String, ObjectError> {
        let _turn = self.calls.acquire().await.expect("never closed");
        let bytes = self.store.get(object, self.config.max_object_bytes).await?;
        String::from_utf8(bytes).map_err(|_| ObjectError::NotText {
            object: object.to_string(),
        })
    }

    /// Puts each body over the threshold into the bucket and sends its
    /// pointer instead (with the reserved attribute), as the extended
    /// client does. On a failed put, the messages before the first failed
    /// one (in order) and that message's index and error; the objects put
    /// for later messages (the puts run concurrently) are deleted, since
    /// nothing will send their pointers.
    pub async fn offload(
        &self,
        messages: Vec<OutgoingMessage>,
    ) -> (Vec<OutgoingMessage>, Option<(usize, ObjectError)>) {
        let Some(bucket) = self.config.bucket.clone() else {
            return (messages, None);
        };
        let threshold = self.config.threshold_bytes as usize;
        let bucket = &bucket;
        let results: Vec<Result<(OutgoingMessage, Option<S3Object>), ObjectError>> =
            stream::iter(messages)
                .map(|m| async move {
                    if threshold != 0 && m.sqs_size() <= threshold {
                        return Ok((m, None));
                    }
                    let object = S3Object {
                        bucket: bucket.clone(),
                        key: format!("{}{}", self.config.prefix, uuid_v4()),
                    };
                    let _turn = self.calls.acquire().await.expect("never closed");
                    let size = m.body.len();
                    let body = m.body.into_bytes();
                    self.store.put(&object, body).await?;
                    let pointer = OutgoingMessage {
                        body: pointer_body(&object),
                        payload_size: Some(size as u64),
                        ..m
                    };
                    Ok((pointer, Some(object)))
                })
                .buffered(FETCH_CONCURRENCY)
                .collect()
                .await;
        let mut out = Vec::with_capacity(results.len());
        let mut failed = None;
        let mut unsent = Vec::new();
        for (i, r) in results.into_iter().enumerate() {
            match (r, failed.is_some()) {
                (Ok((m, _)), false) => out.push(m),
                (Err(e), false) => failed = Some((i, e)),
                (Ok((_, object)), true) => unsent.extend(object),
                (Err(_), true) => {}
            }
        }
        if !unsent.is_empty() {
            let outcome = self
                .delete(unsent, "put for a row after one whose put failed")
                .await;
            tracing::debug!(
                deleted = outcome.deleted,
                failed = outcome.failed,
                "objects put for rows after a failed put deleted"
            );
        }
        (out, failed)
    }

    /// Deletes `objects`: those whose messages a commit deleted, or those
    /// no message will point to (`which` says which, in the log). A failure
    /// is logged and counted, never retried past the call's own retries:
    /// no message needs the object, which only costs storage.
    pub async fn delete(&self, objects: Vec<S3Object>, which: &str) -> DeleteOutcome {
        let results: Vec<Result<(), ObjectError>> = stream::iter(objects)
            .map(|o| async move {
                let _turn = self.calls.acquire().await.expect("never closed");
                self.store.delete(&o).await
            })
            .buffer_unordered(FETCH_CONCURRENCY)
            .collect()
            .await;
        let mut outcome = DeleteOutcome::default();
        for r in results {
            match r {
                Ok(()) => outcome.deleted += 1,
                Err(e) => {
                    tracing::warn!(error = %e, which, "could not delete a large payload's object; it stays in S3");
                    outcome.failed += 1;
                }
            }
        }
        outcome
    }
}

/// What [`LargePayloads::delete`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeleteOutcome {
    pub deleted: u64,
    pub failed: u64,
}

/// A random (version 4) UUID, as the extended client names its objects.
fn uuid_v4() -> String {
    uuid::Uuid::new_v4().to_string()
}

#[cfg(test)]
pub mod memory;

#[cfg(test)]
mod tests;
