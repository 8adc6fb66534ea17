//! Which AWS region a table's SQS client signs for.
//!
//! An Amazon SQS queue URL names its region (`https://sqs.eu-west-1.
//! amazonaws.com/123456789012/orders`), and a request for that queue must
//! be signed for, and sent to, that region. Drivers often have no
//! `AWS_REGION` (Databricks, say), so each table takes, in this order: its
//! own `region` setting, the region in its queue URL, the region of the
//! standard AWS chain (`AWS_REGION`, the profile). A custom endpoint's URL
//! (moto, LocalStack, rustack) names none and takes the last.

use std::fmt;

/// Where a table's region comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RegionSource {
    /// The table's `region` setting.
    Table,
    /// The queue URL's host.
    QueueUrl,
    /// The standard AWS chain (`AWS_REGION`, `AWS_DEFAULT_REGION`, profile).
    Environment,
}

impl fmt::Display for RegionSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RegionSource::Table => "the table's region setting",
            RegionSource::QueueUrl => "the queue URL",
            RegionSource::Environment => "AWS_REGION or the AWS profile",
        })
    }
}

/// Domains of Amazon's SQS endpoints (commercial, China, dual-stack).
const AWS_DOMAINS: [&str; 3] = [".amazonaws.com", ".amazonaws.com.cn", ".api.aws"];

/// The region an Amazon SQS queue URL names, if it is one:
/// `https://sqs.REGION.amazonaws.com/ACCOUNT/NAME` (also `sqs-fips.`, the
/// `.amazonaws.com.cn` and `.api.aws` domains), the legacy
/// `https://REGION.queue.amazonaws.com/...` and `https://queue.amazonaws.com/...`
/// (us-east-1), and VPC endpoints `https://vpce-ID.sqs.REGION.vpce.amazonaws.com/...`.
/// Any other host (a custom endpoint) names none.
pub(crate) fn region_in_url(queue_url: &str) -> Option<String> {
    let rest = queue_url
        .strip_prefix("https://")
        .or_else(|| queue_url.strip_prefix("http://"))?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let host = authority.rsplit('@').next()?;
    let host = host.split(':').next()?.to_ascii_lowercase();
    let labels = AWS_DOMAINS
        .iter()
        .find_map(|d| host.strip_suffix(d))?
        .split('.')
        .collect::<Vec<_>>();
    let region = match labels.as_slice() {
        ["queue"] => "us-east-1",
        [region, "queue"] => region,
        [.., "sqs" | "sqs-fips", region] => region,
        [.., "sqs", region, "vpce"] => region,
        _ => return None,
    };
    is_region(region).then(|| region.to_string())
}

/// Whether `name` looks like an AWS region: lowercase words joined by `-`,
/// the last a number (`us-east-1`, `cn-north-1`, `us-gov-west-1`).
pub(crate) fn is_region(name: &str) -> bool {
    let parts: Vec<&str> = name.split('-').collect();
    let Some((last, words)) = parts.split_last() else {
        return false;
    };
    words.len() >= 2
        && words
            .iter()
            .all(|w| !w.is_empty() && w.bytes().all(|b| b.is_ascii_lowercase()))
        && !last.is_empty()
        && last.bytes().all(|b| b.is_ascii_digit())
}

/// A table's region when its configuration or queue URL decides it, and
/// from where; `None`: the standard AWS chain's applies. An explicit
/// region that differs from the URL's is refused with both named.
pub(crate) fn table_region(
    explicit: Option<&str>,
    queue_url: &str,
) -> Result<Option<(String, RegionSource)>, String> {
    let in_url = region_in_url(queue_url);
    match (explicit, in_url) {
        (Some(r), Some(u)) if r != u => Err(format!(
            "region = {r:?} conflicts with the queue URL {queue_url}, which is in {u}; \
             remove `region` or fix the URL"
        )),
        (Some(r), _) => Ok(Some((r.to_string(), RegionSource::Table))),
        (None, Some(u)) => Ok(Some((u, RegionSource::QueueUrl))),
        (None, None) => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aws_queue_urls_name_their_region() {
        let cases = [
            (
                "https://sqs.eu-west-1.amazonaws.com/123456789012/q",
                "eu-west-1",
            ),
            (
                "https://sqs.us-gov-west-1.amazonaws.com/123/q.fifo",
                "us-gov-west-1",
            ),
            (
                "https://sqs-fips.us-east-2.amazonaws.com/123/q",
                "us-east-2",
            ),
            (
                "https://sqs.cn-north-1.amazonaws.com.cn/123/q",
                "cn-north-1",
            ),
            (
                "https://ap-southeast-2.queue.amazonaws.com/123/q",
                "ap-southeast-2",
            ),
            (
                "https://cn-northwest-1.queue.amazonaws.com.cn/123/q",
                "cn-northwest-1",
            ),
            ("https://queue.amazonaws.com/123/q", "us-east-1"),
            ("https://sqs.eu-central-1.api.aws/123/q", "eu-central-1"),
            (
                "https://vpce-0a1b2c3d4e5f-abcdefgh.sqs.eu-north-1.vpce.amazonaws.com/123/q",
                "eu-north-1",
            ),
            (
                "HTTPS://SQS.EU-WEST-3.AMAZONAWS.COM/123/q"
                    .to_lowercase()
                    .leak(),
                "eu-west-3",
            ),
            ("http://sqs.sa-east-1.amazonaws.com:443/123/q", "sa-east-1"),
        ];
        for (url, region) in cases {
            assert_eq!(region_in_url(url).as_deref(), Some(region), "{url}");
        }
    }

    #[test]
    fn other_urls_name_none() {
        for url in [
            "http://127.0.0.1:4566/000000000000/q",
            "http://localhost:5000/123456789012/q",
            "https://sqs.example.com/123/q",
            "https://sqs.eu-west-1.amazonaws.com.evil.example/123/q",
            "https://evil-amazonaws.com/123/q",
            "https://sqs.amazonaws.com/123/q",
            "https://sqs.not_a_region.amazonaws.com/123/q",
            "sqs.eu-west-1.amazonaws.com/123/q",
            "",
        ] {
            assert_eq!(region_in_url(url), None, "{url}");
        }
    }

    #[test]
    fn region_names_are_checked_for_shape() {
        assert!(is_region("us-east-1"));
        assert!(is_region("us-gov-west-1"));
        for bad in ["", "us", "us-1", "east-1", "US-EAST-1", "us-east-", "us--1"] {
            assert!(!is_region(bad), "{bad}");
        }
    }

    #[test]
    fn an_explicit_region_wins_only_where_it_agrees_with_the_url() {
        let aws = "https://sqs.eu-west-1.amazonaws.com/123/q";
        let moto = "http://127.0.0.1:5000/123/q";
        assert_eq!(
            table_region(None, aws).unwrap(),
            Some(("eu-west-1".into(), RegionSource::QueueUrl))
        );
        assert_eq!(
            table_region(Some("eu-west-1"), aws).unwrap(),
            Some(("eu-west-1".into(), RegionSource::Table))
        );
        assert_eq!(
            table_region(Some("ap-south-1"), moto).unwrap(),
            Some(("ap-south-1".into(), RegionSource::Table))
        );
        assert_eq!(table_region(None, moto).unwrap(), None);
        let err = table_region(Some("us-east-1"), aws).unwrap_err();
        assert!(
            err.contains("us-east-1") && err.contains("eu-west-1"),
            "{err}"
        );
    }
}
