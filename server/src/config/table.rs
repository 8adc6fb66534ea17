//! Tables: `[tables.NAME]` of the TOML file and `--table NAME=QUEUE_URL`,
//! and the validated [`TableConfig`].

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use sqs_flight_schemas::payload::{FieldSpec, PayloadDecoder, PayloadSpec, Unwrap};

use super::plan::{OutOfBounds, PlanOverrides, PlanParams};
use super::setting::{Bounded, check_bound};
use super::{
    ConfigError, MAX_VISIBILITY_TIMEOUT_SECS, MIN_VISIBILITY_TIMEOUT_SECS, setting_error,
    value_error,
};

/// Makes [`TableToml`], whose keys are those below and the plan
/// parameters of `plan_params!`.
macro_rules! table_toml {
    (
        $(
            $(#[doc = $doc:literal])*
            $name:ident {
                default: $default_name:ident = $default:expr,
                limit: $limit_name:ident = $limit:expr,
                zero: $zero:literal,
                limit_flag: $flag:literal, $env:literal, $value_name:literal {
                    $(#[doc = $flag_doc:literal])*
                },
                spark: $spark:literal,
                client: $client:ident: $client_ty:ty,
                cli: [$({ $(#[doc = $cli_doc:literal])* })?],
                older_stores: [$($older:literal)?],
            }
        )*
    ) => {
        /// Per-table settings in the TOML file; absent fields take the defaults.
        #[derive(Debug, Clone, Default, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct TableToml {
            /// The SQS queue; a table without one is on the embedded
            /// in-memory queue and needs `sample_messages`.
            pub queue_url: Option<String>,
            /// Messages the embedded in-memory queue starts with (sample
            /// order events): makes the table an in-memory one.
            pub sample_messages: Option<u64>,
            /// Milliseconds each call of the in-memory queue takes longer
            /// (a simulated round trip); in-memory tables only.
            pub rtt_ms: Option<u64>,
            /// AWS region of the queue; default: the region in an Amazon SQS
            /// queue URL, else the server's (AWS_REGION, the profile).
            pub region: Option<String>,
            $(
                /// A plan parameter (its default here, [`plan`](super::plan)), as in a plan command.
                pub $name: Option<u64>,
            )*
            /// Seconds; default: the queue's own VisibilityTimeout attribute.
            pub visibility_timeout: Option<u64>,
            /// Decode JSON bodies into a `payload` column.
            pub payload: Option<PayloadToml>,
        }

        impl TableToml {
            /// The plan parameters set here.
            fn plan(&self) -> PlanOverrides {
                PlanOverrides { $( $name: self.$name, )* }
            }
        }
    };
}

sqs_flight_schemas::plan_params!(table_toml);

/// A table's payload declaration: inline `fields`, or a JSON `schema_file`
/// holding `{"fields": [...]}` (and optionally `"unwrap"`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PayloadToml {
    pub unwrap: Option<Unwrap>,
    pub fields: Option<Vec<FieldSpec>>,
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

/// The simulated round trip of an in-memory table, by default.
pub const DEFAULT_RTT_MS: u64 = 0;
/// The longest simulated round trip an in-memory table may have.
pub const MAX_RTT_MS: u64 = 10_000;

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
}

impl TableConfig {
    /// Its region, its visibility timeout, and its defaults within `limits`.
    pub(super) fn check(&self, limits: PlanParams) -> Result<(), ConfigError> {
        check_region(self)?;
        if let Backend::Memory { rtt, .. } = &self.backend {
            check_bound(
                &format!("tables.{}.rtt_ms", self.name),
                Some(rtt.as_millis().try_into().unwrap_or(u64::MAX)),
                (0, Some(MAX_RTT_MS)),
                " milliseconds",
                |n| n.to_string(),
            )?;
        }
        check_bound(
            &format!("tables.{}.visibility_timeout", self.name),
            self.visibility_timeout.bounded(),
            (
                MIN_VISIBILITY_TIMEOUT_SECS,
                Some(MAX_VISIBILITY_TIMEOUT_SECS),
            ),
            " seconds (SQS allows at most 12 hours; a heartbeat needs at least 2 s)",
            |n| n.to_string(),
        )?;
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
        Ok(TableConfig {
            name,
            backend,
            defaults: set.over(PlanParams::DEFAULTS),
            visibility_timeout: self.visibility_timeout.map(Duration::from_secs),
            payload,
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
