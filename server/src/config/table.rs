//! Tables: `[tables.NAME]` of the TOML file and `--table NAME=QUEUE_URL`,
//! and the validated [`TableConfig`].

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqs_flight_schemas::payload::{FieldSpec, PayloadDecoder, PayloadSpec, Unwrap};

use super::large_payloads::{LargePayloadConfig, LargePayloadsToml};
use super::plan::{OutOfBounds, PlanOverrides, PlanParams};
use super::role::RoleConfig;
use super::table_key::table_toml;
use super::{
    ConfigError, MAX_VISIBILITY_TIMEOUT_SECS, MIN_VISIBILITY_TIMEOUT_SECS, setting_error,
    value_error,
};

/// The keys of `[tables.NAME]`, each defined once (see [`table_toml!`]
/// for what an entry makes), with the plan parameters of `plan_params!`
/// in the place of `@plan_parameters`. The keys that make the backend
/// (`queue_url`, `region`, `sample_messages`, `rtt_ms`) are read in
/// [`TableToml::backend`], `payload` in [`PayloadToml::resolve`].
macro_rules! table_keys {
    ($( $(#[$plan_meta:meta])* $plan:ident { $($plan_entry:tt)* } )*) => {
        table_toml! {
            { $($plan)* }

            /// The queue's URL. For DoPut, a URL ending in `.fifo` is a FIFO
            /// queue: each row needs a `message_group_id`, `delay_seconds` is
            /// refused, and SendMessageBatch calls run one at a time.
            queue_url: String => "required, unless `sample_messages`",
                of |t| t.backend.sqs().map(|(queue_url, _)| queue_url.to_string());
            /// Makes the table an in-memory queue, as `demo` (no AWS calls),
            /// starting with this many sample JSON order events (`0`: empty;
            /// DoPut fills it); its messages live as long as the process.
            sample_messages: u64,
                of |t| t.backend.memory().map(|(sample_messages, _)| sample_messages);
            /// In-memory tables only (refused with a `queue_url`): a simulated
            /// round trip added to every call, in milliseconds (half before it
            /// acts, half after; a long poll takes its wait plus one), for
            /// benchmarks. `0` to `10000` (`MAX_RTT_MS`).
            rtt_ms: u64 = DEFAULT_RTT_MS, min 0 max MAX_RTT_MS " milliseconds",
                of |t| t.backend.memory().map(|(_, rtt)| {
                    rtt.as_millis().try_into().unwrap_or(u64::MAX)
                });
            /// The AWS region the table's calls are signed for, needed only for
            /// a custom endpoint's URL without `AWS_REGION`; one other than an
            /// Amazon SQS `queue_url`'s is refused at start.
            region: String => "the region in `queue_url`, else `AWS_REGION` / the profile's",
                of |t| t.backend.sqs().and_then(|(_, region)| region.map(str::to_string));
            /// An IAM role (`arn:aws:iam::ACCOUNT:role/NAME`) the table's SQS and
            /// S3 calls are made as, for a queue of another account: credentials
            /// from STS AssumeRole, called with the server's own AWS chain, cached
            /// and renewed before they expire. STS is `AWS_ENDPOINT_URL_STS` if
            /// set, else AWS's, in the table's region
            /// ([cross-account queues](#queues-of-another-account-role_arn)).
            role_arn: String => "none: the server's own AWS chain",
                of |t| t.role.as_ref().map(|r| r.arn.clone());
            /// The external id the role's trust policy asks for
            /// (`sts:ExternalId`), 2 to 1224 characters of `A-Z a-z 0-9 _ + = , . @ : / -`;
            /// needs `role_arn`. Never logged.
            role_external_id: String,
                of |t| t.role.as_ref().and_then(|r| r.external_id.clone());
            /// The name of the role's sessions, as the queue's account sees it in
            /// CloudTrail, 2 to 64 characters of `A-Z a-z 0-9 _ + = , . @ -`;
            /// needs `role_arn`.
            role_session_name: String => "`sqs-flight-<table>` (cut to 64 characters)",
                of |t| t.role.as_ref().and_then(|r| r.session_name.clone());

            @plan_parameters;

            /// The visibility timeout of each receive and the heartbeat's
            /// extension, in seconds, 2 to 43200 (others are refused at start).
            /// A queue attribute below 2 s is used as 2 s.
            visibility_timeout: u64 => "the queue's `VisibilityTimeout` attribute, read once",
                min MIN_VISIBILITY_TIMEOUT_SECS max MAX_VISIBILITY_TIMEOUT_SECS
                " seconds (SQS allows at most 12 hours; a heartbeat needs at least 2 s)",
                of |t| t.visibility_timeout.map(|d| d.as_secs());
            /// Decode JSON bodies into typed columns (below).
            payload: PayloadToml, of |t| t.payload.as_ref().map(PayloadToml::of);
            /// Messages of the SQS Extended Client format, whose body is in S3
            /// (below).
            large_payloads: LargePayloadsToml,
                of |t| t.large_payloads.as_ref().map(LargePayloadsToml::of);
        }
    };
}

sqs_flight_schemas::plan_params!(table_keys);

/// A table's payload declaration: inline `fields`, or a JSON `schema_file`
/// holding `{"fields": [...]}` (and optionally `"unwrap"`).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PayloadToml {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unwrap: Option<Unwrap>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fields: Option<Vec<FieldSpec>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schema_file: Option<PathBuf>,
}

/// Where a table's messages live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// An SQS queue, by URL, and the region set for it (see
    /// [`crate::sqs::region`] for the one it gets without).
    Sqs {
        queue_url: String,
        region: Option<String>,
    },
    /// The embedded in-memory queue, seeded with sample messages, each of
    /// its calls taking `rtt` longer (a simulated round trip).
    Memory { sample_messages: u64, rtt: Duration },
}

impl Backend {
    /// The queue's URL and region, on an SQS queue.
    fn sqs(&self) -> Option<(&str, Option<&str>)> {
        match self {
            Backend::Sqs { queue_url, region } => Some((queue_url, region.as_deref())),
            Backend::Memory { .. } => None,
        }
    }

    /// The sample messages and the simulated round trip, in memory.
    fn memory(&self) -> Option<(u64, Duration)> {
        match self {
            Backend::Memory {
                sample_messages,
                rtt,
            } => Some((*sample_messages, *rtt)),
            Backend::Sqs { .. } => None,
        }
    }
}

/// The simulated round trip of an in-memory table, by default.
pub(crate) const DEFAULT_RTT_MS: u64 = 0;
/// The longest simulated round trip an in-memory table may have.
pub(crate) const MAX_RTT_MS: u64 = 10_000;

/// One validated table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableConfig {
    pub name: String,
    pub backend: Backend,
    /// Defaults of the plan parameters, within the server's limits.
    pub defaults: PlanParams,
    /// Fixed visibility timeout; `None` reads the queue's attribute.
    pub visibility_timeout: Option<Duration>,
    /// JSON bodies decoded into `payload` / `payload_error` columns.
    pub payload: Option<PayloadSpec>,
    /// Bodies in S3, as the SQS Extended Client puts them there.
    pub large_payloads: Option<LargePayloadConfig>,
    /// The IAM role its SQS and S3 calls are made as; `None`: the
    /// server's own AWS chain.
    pub role: Option<RoleConfig>,
}

impl TableConfig {
    /// Its region, its keys within their bounds, and its defaults within
    /// `limits`.
    pub(super) fn check(&self, limits: PlanParams) -> Result<(), ConfigError> {
        check_region(self)?;
        check_role(self)?;
        TableToml::check_bounds(self)?;
        self.defaults.check(limits).map_err(|e| match e {
            OutOfBounds::AboveLimit {
                field,
                value,
                limit,
            } => value_error(
                format!("tables.{}.{field}", self.name),
                value,
                &format!("the limit is {limit}"),
            ),
            OutOfBounds::Zero { field } => value_error(
                format!("tables.{}.{field}", self.name),
                0,
                "must be at least 1",
            ),
        })
    }

    /// A table on the embedded queue seeded with `sample_messages` demo
    /// order events, with the default plan parameters and no simulated
    /// round trip.
    pub fn memory(name: impl Into<String>, sample_messages: u64) -> Self {
        Self {
            name: name.into(),
            backend: Backend::Memory {
                sample_messages,
                rtt: Duration::from_millis(DEFAULT_RTT_MS),
            },
            defaults: PlanParams::DEFAULTS,
            visibility_timeout: None,
            payload: None,
            large_payloads: None,
            role: None,
        }
    }
}

/// A table's role keys within what STS accepts.
fn check_role(t: &TableConfig) -> Result<(), ConfigError> {
    match &t.role {
        Some(role) => role
            .check()
            .map_err(|(key, problem)| setting_error(&format!("tables.{}.{key}", t.name), &problem)),
        None => Ok(()),
    }
}

/// A table's `region`: not empty, and the one its queue URL names if that
/// names one.
fn check_region(t: &TableConfig) -> Result<(), ConfigError> {
    let Backend::Sqs { queue_url, region } = &t.backend else {
        return Ok(());
    };
    let setting = || format!("tables.{}.region", t.name);
    if region.as_deref().is_some_and(|r| r.trim().is_empty()) {
        return Err(setting_error(
            &setting(),
            "is empty; name the queue's region (e.g. \"eu-west-1\") or leave it out",
        ));
    }
    crate::sqs::region::table_region(region.as_deref(), queue_url)
        .map(|_| ())
        .map_err(|problem| setting_error(&setting(), &problem))
}

pub(super) fn valid_table_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 256
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
}

impl PayloadToml {
    /// `spec` as the file would declare it inline.
    fn of(spec: &PayloadSpec) -> Self {
        Self {
            unwrap: Some(spec.unwrap),
            fields: Some(spec.fields.clone()),
            schema_file: None,
        }
    }

    fn resolve(self, table: &str) -> Result<PayloadSpec, ConfigError> {
        let problem = |problem: String| ConfigError::Payload {
            table: table.to_string(),
            problem,
        };
        let mut spec = match (self.fields, self.schema_file) {
            (Some(fields), None) => PayloadSpec {
                unwrap: Unwrap::None,
                fields,
            },
            (None, Some(path)) => {
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| problem(format!("cannot read {}: {e}", path.display())))?;
                serde_json::from_str(&text)
                    .map_err(|e| problem(format!("{}: {e}", path.display())))?
            }
            _ => {
                return Err(problem(
                    "give exactly one of `fields` and `schema_file`".into(),
                ));
            }
        };
        if let Some(u) = self.unwrap {
            spec.unwrap = u;
        }
        PayloadDecoder::new(&spec, &sqs_flight_schemas::table_schema()).map_err(problem)?;
        Ok(spec)
    }
}

impl TableToml {
    /// An SQS queue with `queue_url`, the in-memory one with
    /// `sample_messages`; each backend's own keys only on it.
    fn backend(&self, name: &str) -> Result<Backend, ConfigError> {
        let key = |k: &str| format!("tables.{name}.{k}");
        match (&self.queue_url, self.sample_messages) {
            (Some(queue_url), None) => {
                if self.rtt_ms.is_some() {
                    return Err(setting_error(
                        &key("rtt_ms"),
                        "rtt_ms applies to the in-memory backend only (a table with \
                         sample_messages), not to a table with a queue_url",
                    ));
                }
                Ok(Backend::Sqs {
                    queue_url: queue_url.clone(),
                    region: self.region.clone(),
                })
            }
            (None, Some(sample_messages)) => {
                if self.region.is_some() {
                    return Err(setting_error(
                        &key("region"),
                        "region applies to SQS tables only, not to an in-memory table",
                    ));
                }
                let rtt_ms = self.rtt_ms.unwrap_or(DEFAULT_RTT_MS);
                Ok(Backend::Memory {
                    sample_messages,
                    rtt: Duration::from_millis(rtt_ms),
                })
            }
            (Some(_), Some(_)) => Err(setting_error(
                &format!("tables.{name}"),
                "give queue_url (an SQS queue) or sample_messages (the embedded in-memory \
                 queue), not both",
            )),
            (None, None) => Err(setting_error(
                &key("queue_url"),
                "missing: give the queue's URL, or sample_messages for a table on the \
                 embedded in-memory queue",
            )),
        }
    }

    /// The role of `role_arn` with its two companions; each of those
    /// without `role_arn`, or any of them on an in-memory table, refused.
    fn role(&self, name: &str) -> Result<Option<RoleConfig>, ConfigError> {
        let key = |k: &str| format!("tables.{name}.{k}");
        let companion = [
            ("role_external_id", self.role_external_id.is_some()),
            ("role_session_name", self.role_session_name.is_some()),
        ];
        let Some(arn) = &self.role_arn else {
            return match companion.iter().find(|(_, set)| *set) {
                Some((k, _)) => Err(setting_error(
                    &key(k),
                    "needs role_arn (the role it goes with)",
                )),
                None => Ok(None),
            };
        };
        if self.sample_messages.is_some() {
            return Err(setting_error(
                &key("role_arn"),
                "role_arn applies to SQS tables only, not to an in-memory table",
            ));
        }
        Ok(Some(RoleConfig {
            arn: arn.clone(),
            external_id: self.role_external_id.clone(),
            session_name: self.role_session_name.clone(),
        }))
    }

    fn into_table(self, name: String) -> Result<TableConfig, ConfigError> {
        let backend = self.backend(&name)?;
        let role = self.role(&name)?;
        let set = self.plan();
        let payload = self.payload.map(|p| p.resolve(&name)).transpose()?;
        let large_payloads = self.large_payloads.map(|l| l.resolve(&name)).transpose()?;
        Ok(TableConfig {
            name,
            backend,
            defaults: set.over(PlanParams::DEFAULTS),
            visibility_timeout: self.visibility_timeout.map(Duration::from_secs),
            payload,
            large_payloads,
            role,
        })
    }
}

/// Keys `--table` takes after the queue URL (`;KEY=VALUE`), each a string
/// as in `[tables.NAME]`; the others are the TOML file's only.
const FLAG_KEYS: [&str; 4] = [
    "region",
    "role_arn",
    "role_external_id",
    "role_session_name",
];

/// `NAME=QUEUE_URL[;KEY=VALUE]...`: the table of one `--table` flag, its
/// keys read as the TOML file's are.
fn parse_table_flag(flag: &str) -> Result<TableConfig, ConfigError> {
    let mut parts = flag.split(';');
    let first = parts.next().unwrap_or_default();
    let (name, url) = first
        .split_once('=')
        .filter(|(n, u)| !n.is_empty() && !u.is_empty())
        // The keys after it are not quoted back: one may be an external id.
        .ok_or_else(|| ConfigError::TableSyntax(first.to_string()))?;
    let mut keys = toml::Table::new();
    keys.insert("queue_url".into(), url.into());
    for part in parts.filter(|p| !p.is_empty()) {
        let (key, value) = part.split_once('=').ok_or_else(|| {
            setting_error(
                &format!("--table {name}"),
                "a part after the queue URL has no `=`: give KEY=VALUE, each after a `;`",
            )
        })?;
        if !FLAG_KEYS.contains(&key) {
            return Err(setting_error(
                &format!("--table {name}"),
                &format!(
                    "unknown key {key:?} after the queue URL: it takes {}; the other keys of \
                     [tables.NAME] are the TOML file's (--config)",
                    FLAG_KEYS.join(", ")
                ),
            ));
        }
        if keys.insert(key.into(), value.into()).is_some() {
            return Err(setting_error(
                &format!("--table {name}"),
                &format!("{key} is given twice"),
            ));
        }
    }
    let table: TableToml = toml::Value::Table(keys)
        .try_into()
        .expect("string keys of TableToml take strings");
    table.into_table(name.to_string())
}

/// The file's tables, then those of `--table` / `SQSF_TABLE`.
pub(super) fn tables(
    file: BTreeMap<String, TableToml>,
    flags: &[String],
) -> Result<Vec<TableConfig>, ConfigError> {
    let mut tables: Vec<TableConfig> = file
        .into_iter()
        .map(|(name, t)| t.into_table(name))
        .collect::<Result<_, _>>()?;
    for flag in flags {
        tables.push(parse_table_flag(flag)?);
    }
    Ok(tables)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tables with every key of the list given.
    fn every_key() -> [TableConfig; 2] {
        let sqs = TableConfig {
            backend: Backend::Sqs {
                queue_url: "http://localhost:4566/000000000000/orders".into(),
                region: Some("local".into()),
            },
            visibility_timeout: Some(Duration::from_secs(60)),
            payload: Some(PayloadSpec {
                unwrap: Unwrap::Sns,
                fields: serde_json::from_str(r#"[{"name": "id", "type": "int64"}]"#).unwrap(),
            }),
            large_payloads: Some(LargePayloadConfig {
                read: true,
                bucket: Some("payloads".into()),
                prefix: "orders/".into(),
                threshold_bytes: 0,
                delete_after_commit: true,
                max_object_bytes: 1 << 20,
            }),
            defaults: PlanParams {
                partitions: 3,
                ..PlanParams::DEFAULTS
            },
            role: Some(RoleConfig {
                arn: "arn:aws:iam::210987654321:role/orders-reader".into(),
                external_id: Some("ext-42".into()),
                session_name: Some("audit-orders".into()),
            }),
            ..TableConfig::memory("orders", 0)
        };
        let memory = TableConfig {
            backend: Backend::Memory {
                sample_messages: 7,
                rtt: Duration::from_millis(20),
            },
            ..TableConfig::memory("sim", 0)
        };
        [sqs, memory]
    }

    #[test]
    fn each_key_prints_as_the_file_sets_it() {
        for table in every_key() {
            let printed = TableToml::of(&table);
            let text = toml::to_string(&printed).unwrap();
            let read: TableToml = toml::from_str(&text).unwrap();
            let back = read.into_table(table.name.clone()).unwrap();
            assert_eq!(back, table, "{text}");
        }
    }

    const ARN: &str = "arn:aws:iam::210987654321:role/orders-reader";

    fn from_toml(text: &str) -> Result<TableConfig, ConfigError> {
        let t: TableToml = toml::from_str(text).unwrap();
        let table = t.into_table("orders".into())?;
        table.check(PlanParams::LIMITS)?;
        Ok(table)
    }

    #[test]
    fn a_role_is_read_from_its_three_keys() {
        let t = from_toml(&format!(
            "queue_url = \"http://q/1\"\nrole_arn = \"{ARN}\"\nrole_external_id = \"ext-42\""
        ))
        .unwrap();
        let role = t.role.unwrap();
        assert_eq!(role.arn, ARN);
        assert_eq!(role.external_id.as_deref(), Some("ext-42"));
        assert_eq!(role.session_name("orders"), "sqs-flight-orders");
    }

    #[test]
    fn role_keys_without_a_role_or_on_memory_or_malformed_are_refused_by_name() {
        let cases = [
            (
                "queue_url = \"http://q/1\"\nrole_external_id = \"ext-42\"".to_string(),
                "tables.orders.role_external_id: needs role_arn",
            ),
            (
                "queue_url = \"http://q/1\"\nrole_session_name = \"s1\"".to_string(),
                "tables.orders.role_session_name: needs role_arn",
            ),
            (
                format!("sample_messages = 1\nrole_arn = \"{ARN}\""),
                "tables.orders.role_arn: role_arn applies to SQS tables only",
            ),
            (
                "queue_url = \"http://q/1\"\nrole_arn = \"arn:aws:iam::1:role/r\"".to_string(),
                "tables.orders.role_arn: \"arn:aws:iam::1:role/r\" is not a role ARN",
            ),
            (
                format!(
                    "queue_url = \"http://q/1\"\nrole_arn = \"{ARN}\"\nrole_session_name = \"a b\""
                ),
                "tables.orders.role_session_name: \"a b\" holds ' '",
            ),
            (
                format!(
                    "queue_url = \"http://q/1\"\nrole_arn = \"{ARN}\"\nrole_external_id = \"x\""
                ),
                "tables.orders.role_external_id: the external id is 1 characters long",
            ),
        ];
        for (text, says) in cases {
            let e = from_toml(&text).unwrap_err().to_string();
            assert!(e.starts_with(says), "{text}: {e}");
        }
    }

    #[test]
    fn the_table_flag_takes_the_role_keys_after_the_url() {
        let flag = format!(
            "orders=http://q/1;role_arn={ARN};role_external_id=a:b/c;role_session_name=s-1;region=eu-west-1"
        );
        let t = parse_table_flag(&flag).unwrap();
        assert_eq!(
            t.role,
            Some(RoleConfig {
                arn: ARN.into(),
                external_id: Some("a:b/c".into()),
                session_name: Some("s-1".into()),
            })
        );
        assert_eq!(
            t.backend,
            Backend::Sqs {
                queue_url: "http://q/1".into(),
                region: Some("eu-west-1".into()),
            }
        );
        assert_eq!(parse_table_flag("orders=http://q/1").unwrap().role, None);
    }

    #[test]
    fn the_table_flag_refuses_other_keys_and_never_quotes_what_follows_the_url() {
        let cases = [
            (
                "orders=http://q/1;partitions=4",
                "unknown key \"partitions\"",
            ),
            ("orders=http://q/1;hush-hush", "has no `=`"),
            (
                "orders=http://q/1;region=a;region=b",
                "region is given twice",
            ),
            (
                "=http://q/1;role_external_id=hush-hush",
                "expected NAME=QUEUE_URL",
            ),
            (
                "orders=http://q/1;role_external_id=hush-hush",
                "needs role_arn",
            ),
        ];
        for (flag, says) in cases {
            let e = parse_table_flag(flag).unwrap_err().to_string();
            assert!(e.contains(says), "{flag}: {e}");
            assert!(!e.contains("hush"), "{flag}: {e}");
        }
    }
}
