//! Tables: `[tables.NAME]` of the TOML file and `--table NAME=QUEUE_URL`,
//! and the validated [`TableConfig`].

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqs_flight_schemas::payload::{FieldSpec, PayloadDecoder, PayloadSpec, Unwrap};

use super::large_payloads::{LargePayloadConfig, LargePayloadsToml};
use super::plan::{OutOfBounds, PlanOverrides, PlanParams};
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
}

impl TableConfig {
    /// Its region, its keys within their bounds, and its defaults within
    /// `limits`.
    pub(super) fn check(&self, limits: PlanParams) -> Result<(), ConfigError> {
        check_region(self)?;
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
        }
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

    fn into_table(self, name: String) -> Result<TableConfig, ConfigError> {
        let backend = self.backend(&name)?;
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
        })
    }
}

fn parse_table_flag(flag: &str) -> Result<TableConfig, ConfigError> {
    let (name, url) = flag
        .split_once('=')
        .filter(|(n, u)| !n.is_empty() && !u.is_empty())
        .ok_or_else(|| ConfigError::TableSyntax(flag.to_string()))?;
    TableToml {
        queue_url: Some(url.to_string()),
        ..TableToml::default()
    }
    .into_table(name.to_string())
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
}
