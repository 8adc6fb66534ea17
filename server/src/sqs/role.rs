//! A table's IAM role: an AWS configuration whose credentials come from STS
//! AssumeRole (aws-config's [`AssumeRoleProvider`]), STS being called with
//! the server's own AWS chain. Each SDK client caches them and loads new
//! ones shortly before they expire (its identity cache), so a stream of
//! any length never signs with expired credentials.
//!
//! STS is reached at the SDK's own `AWS_ENDPOINT_URL_STS` (else
//! `AWS_ENDPOINT_URL`, else AWS's endpoint of the region): never at
//! `sqs_endpoint` or `s3_endpoint`, which are set on the SQS and S3
//! clients only. [`assume`] serves any AWS configuration (the S3 calls of
//! large payloads, the state log's).

use std::fmt;

use aws_config::SdkConfig;
use aws_config::sts::AssumeRoleProvider;
use aws_sdk_sqs::config::{Region, SharedCredentialsProvider};

use super::aws::Retries;
use crate::config::RoleConfig;

/// The AWS SDKs' variable for the STS endpoint.
pub(crate) const STS_ENDPOINT_ENV: &str = "AWS_ENDPOINT_URL_STS";

/// The role and session a client's credentials come from: what an error
/// about them names (never the external id).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Assumed {
    pub arn: String,
    pub session_name: String,
}

impl fmt::Display for Assumed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "role {} (session {})", self.arn, self.session_name)
    }
}

/// A table's role: what [`assume`] and the SQS clients take.
#[derive(Clone, Copy)]
pub struct TableRole<'a> {
    /// The table, whose name makes the default session name.
    pub table: &'a str,
    pub role: &'a RoleConfig,
}

impl Assumed {
    /// What table `table`'s `role` assumes.
    pub(crate) fn of(role: &RoleConfig, table: &str) -> Self {
        Self {
            arn: role.arn.clone(),
            session_name: role.session_name(table),
        }
    }
}

/// `base` with the credentials of `role`: AssumeRole with the role's ARN,
/// external id and session name, called with `base`'s credentials in
/// `region` (else `base`'s region), retried as SQS calls are (`retries`).
/// `base` must not carry an endpoint set in code (it would be STS's too):
/// the SQS and S3 clients set theirs.
pub async fn assume(
    base: &SdkConfig,
    TableRole { table, role }: TableRole<'_>,
    region: Option<&str>,
    retries: Retries,
) -> SdkConfig {
    let (retry, _, timeouts) = retries.settings();
    let sts = base
        .to_builder()
        .retry_config(retry)
        .timeout_config(timeouts)
        .build();
    let assumed = Assumed::of(role, table);
    let mut builder = AssumeRoleProvider::builder(&role.arn)
        .session_name(&assumed.session_name)
        .configure(&sts);
    if let Some(region) = region {
        builder = builder.region(Region::new(region.to_string()));
    }
    if let Some(id) = &role.external_id {
        builder = builder.external_id(id);
    }
    let provider = builder.build().await;
    tracing::info!(table, role = %assumed.arn, session = %assumed.session_name,
        sts = %sts_endpoint(), "the table's AWS calls are made as this role");
    base.to_builder()
        .credentials_provider(SharedCredentialsProvider::new(provider))
        .build()
}

/// Where STS calls go, for the log.
fn sts_endpoint() -> String {
    std::env::var(STS_ENDPOINT_ENV)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| "the SDK's (AWS_ENDPOINT_URL, else AWS's of the region)".to_string())
}

/// What STS said (or why it could not be asked) when a client's
/// credentials could not be loaded: the code and message of its answer,
/// else the SDK's error chain without the SDK's own wrapping words.
pub(crate) fn sts_reason(err: &(dyn std::error::Error + 'static)) -> String {
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(meta) = e.downcast_ref::<aws_sdk_sqs::error::ErrorMetadata>() {
            let code = meta.code().unwrap_or("an error without a code");
            return match meta.message() {
                Some(message) => format!("STS answered {code}: {message}"),
                None => format!("STS answered {code}"),
            };
        }
        next = e.source();
    }
    let chain = super::aws::error_chain(err);
    let mut reason = chain.as_str();
    for wrapper in SDK_WRAPPERS {
        reason = reason.strip_prefix(wrapper).unwrap_or(reason);
    }
    reason.to_string()
}

/// The words the SDK puts before a credentials provider's error.
const SDK_WRAPPERS: [&str; 3] = [
    "dispatch failure: ",
    "other: ",
    "an error occurred while loading credentials: ",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_sts_answer_is_its_code_and_message() {
        let meta = aws_sdk_sqs::error::ErrorMetadata::builder()
            .code("AccessDenied")
            .message("not authorized to perform sts:AssumeRole")
            .build();
        #[derive(Debug, thiserror::Error)]
        #[error("an error occurred while loading credentials")]
        struct Wrapped(#[source] aws_sdk_sqs::error::ErrorMetadata);
        assert_eq!(
            sts_reason(&Wrapped(meta)),
            "STS answered AccessDenied: not authorized to perform sts:AssumeRole"
        );
    }

    #[test]
    fn no_answer_is_the_chain_without_the_sdk_wrapping() {
        #[derive(Debug, thiserror::Error)]
        #[error("dispatch failure")]
        struct Dispatch(#[source] Other);
        #[derive(Debug, thiserror::Error)]
        #[error("other")]
        struct Other(#[source] std::io::Error);
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert_eq!(sts_reason(&Dispatch(Other(refused))), "refused");
    }
}
