//! moto's S3 (the same `moto_server` as SQS), for the large payloads of
//! the SQS Extended Client format.

use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_sdk_sqs::config::{Credentials, SharedCredentialsProvider};

/// The credentials and region the in-process servers sign S3 calls with
/// (the `AWS_ENV` of a server process on moto).
pub fn sdk_config() -> SdkConfig {
    SdkConfig::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(SharedCredentialsProvider::new(Credentials::new(
            "test",
            "test",
            None,
            None,
            "sqs-flight-tests",
        )))
        .build()
}

/// An S3 client for the S3-compatible server at `endpoint`, path-style.
pub fn s3_client(endpoint: &str) -> aws_sdk_s3::Client {
    let conf = aws_sdk_s3::config::Builder::from(&sdk_config())
        .endpoint_url(endpoint)
        .force_path_style(true)
        .build();
    aws_sdk_s3::Client::from_conf(conf)
}

/// A fresh bucket (S3 names: lowercase, digits, `-`).
pub async fn create_bucket(s3: &aws_sdk_s3::Client, prefix: &str) -> String {
    let name = crate::sqs::unique_queue_name(prefix, false)
        .to_ascii_lowercase()
        .replace('_', "-");
    s3.create_bucket()
        .bucket(&name)
        .send()
        .await
        .unwrap_or_else(|e| panic!("CreateBucket {name}: {e:?}"));
    name
}

/// Puts `body` at `key`.
pub async fn put(s3: &aws_sdk_s3::Client, bucket: &str, key: &str, body: &[u8]) {
    s3.put_object()
        .bucket(bucket)
        .key(key)
        .body(body.to_vec().into())
        .send()
        .await
        .unwrap_or_else(|e| panic!("PutObject {bucket}/{key}: {e:?}"));
}

/// The keys in `bucket`, sorted.
pub async fn keys(s3: &aws_sdk_s3::Client, bucket: &str) -> Vec<String> {
    let out = s3
        .list_objects_v2()
        .bucket(bucket)
        .send()
        .await
        .unwrap_or_else(|e| panic!("ListObjectsV2 {bucket}: {e:?}"));
    let mut keys: Vec<String> = out
        .contents()
        .iter()
        .filter_map(|o| o.key.clone())
        .collect();
    keys.sort();
    keys
}

/// The object at `key`, if there is one.
pub async fn get(s3: &aws_sdk_s3::Client, bucket: &str, key: &str) -> Option<Vec<u8>> {
    let out = s3.get_object().bucket(bucket).key(key).send().await.ok()?;
    Some(out.body.collect().await.ok()?.into_bytes().to_vec())
}
