//! The state log under an S3 prefix. An object is created with PutObject
//! `If-None-Match: *`, which S3 (and compatible servers that implement
//! conditional writes) refuses with 412 when the key exists.

use aws_sdk_s3::Client;
use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{Delete, ObjectIdentifier};
use futures::FutureExt;
use futures::future::BoxFuture;

use super::objects::{Created, LogObjects, ObjectsError};
use crate::large_payload::s3::{BodyError, CREDENTIALS, error_parts, read_capped};

/// Codes of an object that is not there.
const MISSING_CODES: &[&str] = &["NoSuchKey", "NotFound"];

/// A log at `s3://bucket/prefix`.
pub struct S3Objects {
    client: Client,
    bucket: String,
    /// Empty, or ends with `/`.
    prefix: String,
    /// The role its calls are made as (`state_url_role_arn`), named when
    /// its credentials cannot be had.
    role: Option<crate::sqs::role::Assumed>,
}

impl S3Objects {
    pub fn new(client: Client, bucket: String, prefix: &str) -> Self {
        let prefix = prefix.trim_matches('/');
        let prefix = match prefix.is_empty() {
            true => String::new(),
            false => format!("{prefix}/"),
        };
        Self {
            client,
            bucket,
            prefix,
            role: None,
        }
    }

    /// Calls made as `role`: a credentials error names it.
    pub fn with_role(mut self, role: crate::sqs::role::Assumed) -> Self {
        self.role = Some(role);
        self
    }

    fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    fn error<E>(
        &self,
        operation: &'static str,
        key: &str,
        err: SdkError<E, HttpResponse>,
    ) -> ObjectsError
    where
        E: ProvideErrorMetadata + std::error::Error + 'static,
    {
        let (status, code, mut message) = error_parts(&err);
        if let Some(role) = self.role.as_ref().filter(|_| code == CREDENTIALS) {
            message = format!("cannot assume {role}: {message}");
        }
        // 409: a conditional write raced another on the same key; retried.
        let refused =
            matches!(status, Some(s) if (400..500).contains(&s) && ![408, 409, 429].contains(&s));
        ObjectsError {
            operation,
            name: format!("s3://{}/{key}", self.bucket),
            code,
            message,
            refused,
        }
    }

    /// GetObject of `name` (its `range` if given), refusing a body over
    /// `max_bytes`; `None` if there is no such object.
    async fn read(
        &self,
        name: &str,
        range: Option<String>,
        max_bytes: u64,
    ) -> Result<Option<Vec<u8>>, ObjectsError> {
        let key = self.key(name);
        let sent = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(&key)
            .set_range(range)
            .send()
            .await;
        let out = match sent {
            Ok(out) => out,
            Err(e) if Self::missing(&e) => return Ok(None),
            Err(e) => return Err(self.error("GetObject", &key, e)),
        };
        let failed = |code: &str, message: String, refused: bool| ObjectsError {
            operation: "GetObject",
            name: format!("s3://{}/{key}", self.bucket),
            code: code.into(),
            message,
            refused,
        };
        match read_capped(out, max_bytes).await {
            Ok(bytes) => Ok(Some(bytes)),
            Err(BodyError::TooLarge(size)) => Err(failed(
                "TooLarge",
                format!("{size} bytes, above {max_bytes}"),
                true,
            )),
            Err(BodyError::Failed(message)) => Err(failed("Body", message, false)),
        }
    }

    fn missing<E>(err: &SdkError<E, HttpResponse>) -> bool
    where
        E: ProvideErrorMetadata,
    {
        let status = err.raw_response().map(|r| r.status().as_u16());
        status == Some(404) || err.code().is_some_and(|c| MISSING_CODES.contains(&c))
    }
}

impl LogObjects for S3Objects {
    fn create(&self, name: &str, bytes: Vec<u8>) -> BoxFuture<'_, Result<Created, ObjectsError>> {
        let key = self.key(name);
        async move {
            let sent = self
                .client
                .put_object()
                .bucket(&self.bucket)
                .key(&key)
                .if_none_match("*")
                .body(ByteStream::from(bytes))
                .send()
                .await;
            match sent {
                Ok(_) => Ok(Created::Created),
                Err(e) if e.raw_response().is_some_and(|r| r.status().as_u16() == 412) => {
                    Ok(Created::Exists)
                }
                Err(e) => Err(self.error("PutObject", &key, e)),
            }
        }
        .boxed()
    }

    fn get(
        &self,
        name: &str,
        max_bytes: u64,
    ) -> BoxFuture<'_, Result<Option<Vec<u8>>, ObjectsError>> {
        let name = name.to_string();
        async move { self.read(&name, None, max_bytes).await }.boxed()
    }

    fn get_start(
        &self,
        name: &str,
        n: u64,
    ) -> BoxFuture<'_, Result<Option<Vec<u8>>, ObjectsError>> {
        let name = name.to_string();
        let range = Some(format!("bytes=0-{}", n.saturating_sub(1)));
        async move { self.read(&name, range, n).await }.boxed()
    }

    fn exists(&self, name: &str) -> BoxFuture<'_, Result<bool, ObjectsError>> {
        let key = self.key(name);
        async move {
            match self
                .client
                .head_object()
                .bucket(&self.bucket)
                .key(&key)
                .send()
                .await
            {
                Ok(_) => Ok(true),
                Err(e) if Self::missing(&e) => Ok(false),
                Err(e) => Err(self.error("HeadObject", &key, e)),
            }
        }
        .boxed()
    }

    fn list(&self, dir: &str) -> BoxFuture<'_, Result<Vec<String>, ObjectsError>> {
        let prefix = self.key(&format!("{dir}/"));
        async move {
            let mut names = Vec::new();
            let mut pages = self
                .client
                .list_objects_v2()
                .bucket(&self.bucket)
                .prefix(&prefix)
                .into_paginator()
                .send();
            while let Some(page) = pages.next().await {
                let page = page.map_err(|e| self.error("ListObjectsV2", &prefix, e))?;
                for object in page.contents() {
                    if let Some(key) = object.key() {
                        let name = key.strip_prefix(&self.prefix).unwrap_or(key);
                        names.push(name.to_string());
                    }
                }
            }
            names.sort();
            Ok(names)
        }
        .boxed()
    }

    fn delete(&self, name: &str) -> BoxFuture<'_, Result<(), ObjectsError>> {
        let key = self.key(name);
        async move {
            match self
                .client
                .delete_object()
                .bucket(&self.bucket)
                .key(&key)
                .send()
                .await
            {
                Ok(_) => Ok(()),
                Err(e) if Self::missing(&e) => Ok(()),
                Err(e) => Err(self.error("DeleteObject", &key, e)),
            }
        }
        .boxed()
    }

    fn delete_many(&self, names: Vec<String>) -> BoxFuture<'_, Result<(), ObjectsError>> {
        async move {
            for chunk in names.chunks(1000) {
                let keys = chunk
                    .iter()
                    .map(|n| ObjectIdentifier::builder().key(self.key(n)).build())
                    .collect::<Result<Vec<_>, _>>()
                    .expect("a key is set");
                let delete = Delete::builder()
                    .set_objects(Some(keys))
                    .quiet(true)
                    .build()
                    .expect("objects are set");
                let out = self
                    .client
                    .delete_objects()
                    .bucket(&self.bucket)
                    .delete(delete)
                    .send()
                    .await
                    .map_err(|e| self.error("DeleteObjects", &self.prefix, e))?;
                if let Some(failed) = out.errors().first() {
                    return Err(ObjectsError {
                        operation: "DeleteObjects",
                        name: format!("s3://{}/{}", self.bucket, failed.key().unwrap_or("")),
                        code: failed.code().unwrap_or("").to_string(),
                        message: failed.message().unwrap_or("").to_string(),
                        refused: false,
                    });
                }
            }
            Ok(())
        }
        .boxed()
    }

    fn url(&self) -> String {
        format!("s3://{}/{}", self.bucket, self.prefix.trim_end_matches('/'))
    }
}
