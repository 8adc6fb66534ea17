//! `[tables.NAME.large_payloads]`: the SQS Extended Client's format, read
//! and written (see [`crate::large_payload`] for what the server does).

use serde::{Deserialize, Serialize};

use super::{ConfigError, setting_error, value_error};

/// Bodies over this many bytes (with their attributes, as SQS counts them)
/// go to S3 on write, by default: the extended client libraries' threshold.
pub(crate) const DEFAULT_THRESHOLD_BYTES: u64 = 262_144;
/// The highest threshold: SQS's own limit on a message, 1 MiB.
pub(crate) const MAX_THRESHOLD_BYTES: u64 = 1 << 20;
/// The largest object a read fetches or a write offloads, by default.
pub(crate) const DEFAULT_MAX_OBJECT_BYTES: u64 = 32 << 20;
/// The highest `max_object_bytes`: a row must fit one Flight message on
/// its way to a reader (64 MiB, the server's `MAX_MESSAGE_SIZE`, as the
/// Rust client's), with its other columns.
pub(crate) const LIMIT_MAX_OBJECT_BYTES: u64 = 48 << 20;

/// The validated section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LargePayloadConfig {
    /// Reads fetch the object a pointer names into `body`.
    pub read: bool,
    /// Writes offload bodies over `threshold_bytes` to this bucket; `None`
    /// sends every body as it is.
    pub bucket: Option<String>,
    /// Prefix of the keys of offloaded objects (a random UUID follows).
    pub prefix: String,
    /// Bodies over this are offloaded; `0` offloads every body.
    pub threshold_bytes: u64,
    /// A commit that deleted a message whose payload was read from S3 also
    /// deletes the object.
    pub delete_after_commit: bool,
    /// The largest object fetched or offloaded.
    pub max_object_bytes: u64,
}

impl Default for LargePayloadConfig {
    fn default() -> Self {
        Self {
            read: false,
            bucket: None,
            prefix: String::new(),
            threshold_bytes: DEFAULT_THRESHOLD_BYTES,
            delete_after_commit: false,
            max_object_bytes: DEFAULT_MAX_OBJECT_BYTES,
        }
    }
}

/// The section as written in the TOML file and printed by
/// `--print-config` (every key, defaults included).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LargePayloadsToml {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bucket: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threshold_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delete_after_commit: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_object_bytes: Option<u64>,
}

impl LargePayloadsToml {
    /// `c` as the file would set it.
    pub(super) fn of(c: &LargePayloadConfig) -> Self {
        Self {
            read: Some(c.read),
            bucket: c.bucket.clone(),
            prefix: Some(c.prefix.clone()),
            threshold_bytes: Some(c.threshold_bytes),
            delete_after_commit: Some(c.delete_after_commit),
            max_object_bytes: Some(c.max_object_bytes),
        }
    }

    /// The section of table `table`, its keys within their bounds.
    pub(super) fn resolve(self, table: &str) -> Result<LargePayloadConfig, ConfigError> {
        let key = |k: &str| format!("tables.{table}.large_payloads.{k}");
        let d = LargePayloadConfig::default();
        let c = LargePayloadConfig {
            read: self.read.unwrap_or(d.read),
            bucket: self.bucket,
            prefix: self.prefix.unwrap_or(d.prefix),
            threshold_bytes: self.threshold_bytes.unwrap_or(d.threshold_bytes),
            delete_after_commit: self.delete_after_commit.unwrap_or(d.delete_after_commit),
            max_object_bytes: self.max_object_bytes.unwrap_or(d.max_object_bytes),
        };
        if let Some(b) = &c.bucket
            && (b.trim().is_empty() || b.contains('/'))
        {
            return Err(setting_error(
                &key("bucket"),
                "must be an S3 bucket's name (not empty, no `/`; put a key prefix in `prefix`)",
            ));
        }
        if c.threshold_bytes > MAX_THRESHOLD_BYTES {
            return Err(value_error(
                key("threshold_bytes"),
                c.threshold_bytes,
                &format!("must be 0 to {MAX_THRESHOLD_BYTES} (SQS's limit; 0 offloads every body)"),
            ));
        }
        if !(1..=LIMIT_MAX_OBJECT_BYTES).contains(&c.max_object_bytes) {
            return Err(value_error(
                key("max_object_bytes"),
                c.max_object_bytes,
                &format!("must be 1 to {LIMIT_MAX_OBJECT_BYTES}"),
            ));
        }
        if c.delete_after_commit && !c.read {
            return Err(setting_error(
                &key("delete_after_commit"),
                "needs `read = true`: only objects the server read are deleted after their \
                 message's commit",
            ));
        }
        Ok(c)
    }
}
