//! [`ObjectStore`] over aws-sdk-s3, for Amazon S3 and compatible servers.

use aws_sdk_s3::Client;
use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::operation::get_object::GetObjectOutput;
use aws_sdk_s3::primitives::ByteStream;
use futures::FutureExt;
use futures::future::BoxFuture;

use super::{ObjectError, ObjectStore, S3Object};
use crate::sqs::aws::{Retries, error_chain};

/// Codes of an object or bucket that is not there.
const MISSING_CODES: &[&str] = &["NoSuchKey", "NoSuchBucket", "NotFound"];

/// S3 through one client (one region).
#[derive(Clone)]
pub struct AwsObjectStore {
    client: Client,
}

impl AwsObjectStore {
    /// A client from the standard AWS chain (the one SQS uses) signing for
    /// `region`, at `endpoint` if given (path-style, as S3-compatible
    /// servers need) and else at S3's own, retrying as SQS calls do
    /// (`retries`).
    pub fn new(
        shared: &aws_config::SdkConfig,
        region: Option<&str>,
        endpoint: Option<&str>,
        retries: Retries,
    ) -> Self {
        Self {
            client: client(shared, region, endpoint, retries),
        }
    }
}

/// An S3 client from the standard AWS chain `shared`, signing for
/// `region`, at `endpoint` if given (path-style, as S3-compatible servers
/// need) and else at S3's own, retrying as SQS calls do (`retries`).
pub(crate) fn client(
    shared: &aws_config::SdkConfig,
    region: Option<&str>,
    endpoint: Option<&str>,
    retries: Retries,
) -> Client {
    let mut builder = aws_sdk_s3::config::Builder::from(shared);
    if let Some(r) = region {
        builder.set_region(Some(aws_sdk_s3::config::Region::new(r.to_string())));
    } else if shared.region().is_none() && endpoint.is_some() {
        // A custom endpoint signs for any region; S3's own needs one.
        builder.set_region(Some(aws_sdk_s3::config::Region::from_static("us-east-1")));
    }
    if let Some(e) = endpoint {
        builder.set_endpoint_url(Some(e.to_string()));
        builder.set_force_path_style(Some(true));
    }
    let (retry, partition, timeouts) = retries.settings();
    let builder = builder
        .retry_config(retry)
        .retry_partition(partition)
        .timeout_config(timeouts);
    Client::from_conf(builder.build())
}

/// Why a GetObject body was not read whole.
pub(crate) enum BodyError {
    /// Its length (or what arrived of it) is above the cap.
    TooLarge(u64),
    /// The body broke off.
    Failed(String),
}

/// The body of `out`, refused as soon as its declared length or what
/// arrived of it passes `max_bytes`, before reading past it.
pub(crate) async fn read_capped(
    out: GetObjectOutput,
    max_bytes: u64,
) -> Result<Vec<u8>, BodyError> {
    let length = out.content_length.and_then(|n| u64::try_from(n).ok());
    if let Some(n) = length.filter(|&n| n > max_bytes) {
        return Err(BodyError::TooLarge(n));
    }
    let mut body: ByteStream = out.body;
    let mut bytes = Vec::with_capacity(length.unwrap_or(0) as usize);
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| BodyError::Failed(error_chain(&e)))?;
        let size = (bytes.len() + chunk.len()) as u64;
        if size > max_bytes {
            return Err(BodyError::TooLarge(size));
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}

/// A failed S3 call's HTTP status (none if S3 was not reached), error code
/// (else `HTTP {status}` or `Unreachable`) and message.
/// The code of an S3 call whose credentials could not be loaded, as
/// `sqsf_sqs_errors_total` names an SQS call's.
pub(crate) const CREDENTIALS: &str = "Credentials";

pub(crate) fn error_parts<E>(err: &SdkError<E, HttpResponse>) -> (Option<u16>, String, String)
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    // Signed with credentials that could not be loaded (a role STS did
    // not grant): no S3 answer to show.
    if let Some(reason) = crate::sqs::aws::credentials_not_loaded(err) {
        let message = format!("the AWS credentials could not be loaded: {reason}");
        return (None, CREDENTIALS.to_string(), message);
    }
    let status = err.raw_response().map(|r| r.status().as_u16());
    let code = err
        .code()
        .map(str::to_string)
        .unwrap_or_else(|| match status {
            Some(s) => format!("HTTP {s}"),
            None => "Unreachable".to_string(),
        });
    let message = err
        .message()
        .map(str::to_string)
        .unwrap_or_else(|| error_chain(err));
    (status, code, message)
}

/// The error of a failed call on `object`.
fn object_error<E>(
    operation: &'static str,
    object: &S3Object,
    err: SdkError<E, HttpResponse>,
) -> ObjectError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    let (status, code, message) = error_parts(&err);
    let object = object.to_string();
    if MISSING_CODES.contains(&code.as_str()) || status == Some(404) {
        return ObjectError::Missing { object, code };
    }
    match status {
        Some(s) if (400..500).contains(&s) && s != 408 && s != 429 => ObjectError::Refused {
            operation,
            object,
            code,
            message,
        },
        _ => ObjectError::Failed {
            operation,
            object,
            code,
            message,
        },
    }
}

impl ObjectStore for AwsObjectStore {
    fn get(
        &self,
        object: &S3Object,
        max_bytes: u64,
    ) -> BoxFuture<'_, Result<Vec<u8>, ObjectError>> {
        let object = object.clone();
        async move {
            let out = self
                .client
                .get_object()
                .bucket(&object.bucket)
                .key(&object.key)
                .send()
                .await
                .map_err(|e| object_error("GetObject", &object, e))?;
            read_capped(out, max_bytes).await.map_err(|e| match e {
                BodyError::TooLarge(size) => ObjectError::TooLarge {
                    object: object.to_string(),
                    size,
                    max: max_bytes,
                },
                BodyError::Failed(message) => ObjectError::Failed {
                    operation: "GetObject",
                    object: object.to_string(),
                    code: "Body".into(),
                    message,
                },
            })
        }
        .boxed()
    }

    fn put(&self, object: &S3Object, bytes: Vec<u8>) -> BoxFuture<'_, Result<(), ObjectError>> {
        let object = object.clone();
        async move {
            self.client
                .put_object()
                .bucket(&object.bucket)
                .key(&object.key)
                .body(ByteStream::from(bytes))
                .send()
                .await
                .map(|_| ())
                .map_err(|e| object_error("PutObject", &object, e))
        }
        .boxed()
    }

    fn delete(&self, object: &S3Object) -> BoxFuture<'_, Result<(), ObjectError>> {
        let object = object.clone();
        async move {
            self.client
                .delete_object()
                .bucket(&object.bucket)
                .key(&object.key)
                .send()
                .await
                .map(|_| ())
                .map_err(|e| object_error("DeleteObject", &object, e))
        }
        .boxed()
    }
}
