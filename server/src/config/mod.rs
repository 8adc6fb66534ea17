//! Configuration: command-line flags (each also an `SQSF_*` environment
//! variable), an optional TOML file, and the validated [`Config`] that the
//! rest of the server (and the tests) use.

mod print;
pub mod sql;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use serde::Deserialize;
use sqs_flight_schemas::payload::{FieldSpec, PayloadDecoder, PayloadSpec, Unwrap};

/// Where the server listens unless told otherwise.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:50051";
/// How long a consumer's uncommitted messages stay invisible after its last call.
pub const DEFAULT_CONSUMER_LEASE_SECS: u64 = 300;
/// Partitions (endpoints) per batch unless the command or table says otherwise.
pub const DEFAULT_PARTITIONS: u64 = 2;
/// Messages per partition of a batch.
pub const DEFAULT_MAX_MESSAGES: u64 = 1000;
/// Idle time without a message after which a partition's stream ends.
pub const DEFAULT_MAX_WAIT_MS: u64 = 1000;
/// Bytes per partition of a batch.
pub const DEFAULT_MAX_BYTES: u64 = 64 << 20;
/// Time after which a partition's stream ends however busy the queue is.
pub const DEFAULT_MAX_DURATION_MS: u64 = 30_000;
/// ReceiveMessage calls a partition keeps in flight at most. It grows to
/// this while receives come back full and shrinks while they do not, so an
/// idle queue costs one long poll per partition whatever this is. At SQS's
/// ~20 ms round trip one call at a time caps a partition near 500
/// messages/s; measured through a 20 ms proxy with 2 partitions
/// (benches/RESULTS.md, figure 3), receive + commit went from 3,900 msg/s
/// at 8 to 5,500-7,700 at 16 and 6,600-10,700 at 32, and 32 cost nothing
/// at 0 ms.
pub const DEFAULT_RECEIVERS: u64 = 32;
/// Upper limit of `receivers`.
pub const LIMIT_RECEIVERS: u64 = 128;
/// Upper limit of `partitions`.
pub const LIMIT_PARTITIONS: u64 = 64;
/// Upper limit of `max_messages`.
pub const LIMIT_MAX_MESSAGES: u64 = 100_000;
/// Upper limit of `max_bytes`.
pub const LIMIT_MAX_BYTES: u64 = 256 << 20;
/// Upper limit of `max_wait_ms`.
pub const LIMIT_MAX_WAIT_MS: u64 = 20_000;
/// Upper limit of `max_duration_ms`.
pub const LIMIT_MAX_DURATION_MS: u64 = 300_000;
/// Bytes of uncommitted messages the whole registry may hold.
pub const DEFAULT_REGISTRY_MAX_BYTES: u64 = 1 << 30;
/// Uncommitted messages the whole registry may hold.
pub const DEFAULT_REGISTRY_MAX_MESSAGES: u64 = 2_000_000;
/// Visibility timeout used when a queue's own is shorter than this (seconds):
/// a heartbeat cannot keep a message hidden with a shorter one.
pub const MIN_VISIBILITY_TIMEOUT_SECS: u64 = 2;
/// The longest visibility timeout SQS accepts (12 hours).
pub const MAX_VISIBILITY_TIMEOUT_SECS: u64 = 43_200;
/// Sample messages the embedded demo table starts with.
pub const DEFAULT_DEMO_MESSAGES: u64 = 20;
/// Open DoGet/DoPut streams per client IP address (a Spark job's executors
/// on one host open one DoGet per partition, up to 64 per batch).
pub const DEFAULT_MAX_STREAMS_PER_CLIENT: u32 = 256;
/// Largest gRPC message the server decodes (a DoPut record batch, a command).
pub const DEFAULT_MAX_REQUEST_BYTES: u64 = 64 << 20;
/// Smallest `max_request_bytes` accepted: commands and tickets must fit.
pub const MIN_MAX_REQUEST_BYTES: u64 = 4 << 10;
/// Upper limit of `max_request_bytes`.
pub const LIMIT_MAX_REQUEST_BYTES: u64 = 1 << 30;
/// Rows one DoPut call may send.
pub const DEFAULT_MAX_PUT_ROWS: u64 = 10_000_000;
/// Bytes (bodies and attributes) one DoPut call may send.
pub const DEFAULT_MAX_PUT_BYTES: u64 = 16 << 30;
/// Attempts per SQS call (throttling, 5xx and connection errors are retried).
pub const DEFAULT_SQS_MAX_ATTEMPTS: u32 = 5;
/// DeleteMessageBatch and ChangeMessageVisibilityBatch calls one commit,
/// release or heartbeat keeps in flight. At SQS's ~20 ms round trip a
/// commit of 100,000 messages (10,000 calls) takes about 20 ms x 10,000 /
/// this: 1.6 s at 128, 25 s at the 8 used before. Through a 20 ms proxy,
/// figure 3 with 2 partitions of 32 receivers read and committed 6,600
/// msg/s at 32, 8,900 at 64 and 10,700 at 128 (benches/RESULTS.md).
pub const DEFAULT_SQS_BATCH_CONCURRENCY: u32 = 128;
/// Upper limit of `sqs_batch_concurrency`.
pub const LIMIT_SQS_BATCH_CONCURRENCY: u32 = 512;
/// Upper limit of `sqs_max_attempts`.
pub const LIMIT_SQS_MAX_ATTEMPTS: u32 = 20;
/// Table name of the embedded demo backend.
pub const DEMO_TABLE: &str = "demo";
/// Seconds open streams may take to finish after SIGTERM/SIGINT.
pub const DEFAULT_SHUTDOWN_GRACE_SECS: u64 = 10;

/// `sqs-flight-server`: Amazon SQS queues as Arrow Flight tables.
///
/// With no `--table` and no `--config`, the server serves an embedded
/// in-memory demo table named `demo` filled with sample messages.
#[derive(Debug, Parser)]
#[command(name = "sqs-flight-server", version, about, long_about)]
pub struct Cli {
    /// Address to listen on.
    #[arg(long, env = "SQSF_LISTEN", default_value = DEFAULT_LISTEN)]
    pub listen: SocketAddr,
    /// A table as NAME=QUEUE_URL; repeatable (comma-separated in the env var).
    #[arg(long = "table", env = "SQSF_TABLE", value_delimiter = ',')]
    pub tables: Vec<String>,
    /// TOML file with the same settings plus per-table options.
    #[arg(long, env = "SQSF_CONFIG")]
    pub config: Option<PathBuf>,
    /// SQS endpoint URL (LocalStack, moto, rustack, ElasticMQ).
    #[arg(long, env = "SQSF_SQS_ENDPOINT")]
    pub sqs_endpoint: Option<String>,
    /// Attempts per SQS call: throttling, 5xx answers and connection errors
    /// are retried with capped exponential backoff and jitter [default: 5].
    #[arg(long, env = "SQSF_SQS_MAX_ATTEMPTS")]
    pub sqs_max_attempts: Option<u32>,
    /// DeleteMessageBatch / ChangeMessageVisibilityBatch calls one commit,
    /// release or heartbeat keeps in flight [default: 128].
    #[arg(long, env = "SQSF_SQS_BATCH_CONCURRENCY")]
    pub sqs_batch_concurrency: Option<u32>,
    /// Seconds a consumer's uncommitted messages stay invisible after its last call.
    #[arg(long, env = "SQSF_CONSUMER_LEASE")]
    pub consumer_lease: Option<u64>,
    /// Location URI put in endpoints (default: grpc://<listen address>).
    #[arg(long, env = "SQSF_ADVERTISE")]
    pub advertise: Option<String>,
    /// Require `authorization: Bearer TOKEN` on every RPC.
    #[arg(long, env = "SQSF_AUTH_TOKEN", hide_env_values = true)]
    pub auth_token: Option<String>,
    /// Like --auth-token, the token read from this file (one line; a
    /// trailing newline is dropped). Not both.
    #[arg(long, env = "SQSF_AUTH_TOKEN_FILE")]
    pub auth_token_file: Option<PathBuf>,
    /// Serve Flight over TLS with this PEM certificate (chain); needs --tls-key.
    #[arg(long, env = "SQSF_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "SQSF_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// Seconds open streams may take to finish after SIGTERM/SIGINT before
    /// they are cut [default: 10].
    #[arg(long, env = "SQSF_SHUTDOWN_GRACE")]
    pub shutdown_grace: Option<u64>,
    /// Serve /metrics, /healthz and /readyz on this address (off by default).
    #[arg(long, env = "SQSF_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// Exit after this many seconds without an RPC, once no stream is open
    /// and no consumer holds uncommitted batches within its lease (off by
    /// default; servers that the Spark source starts on the driver set it).
    #[arg(long, env = "SQSF_IDLE_EXIT")]
    pub idle_exit: Option<u64>,
    /// Log format on stderr.
    #[arg(long, env = "SQSF_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Print the effective configuration (secrets masked) as TOML and exit.
    #[arg(long)]
    pub print_config: bool,
    /// Sample messages in the embedded demo table (used without tables).
    #[arg(long, env = "SQSF_DEMO_MESSAGES", default_value_t = DEFAULT_DEMO_MESSAGES)]
    pub demo_messages: u64,
    /// Open DoGet/DoPut streams per client IP address [default: 256].
    #[arg(long, env = "SQSF_MAX_STREAMS_PER_CLIENT")]
    pub max_streams_per_client: Option<u32>,
    /// Largest gRPC message the server decodes, in bytes [default: 64 MiB].
    #[arg(long, env = "SQSF_MAX_REQUEST_BYTES")]
    pub max_request_bytes: Option<u64>,
    /// Rows one DoPut call may send [default: 10000000].
    #[arg(long, env = "SQSF_MAX_PUT_ROWS")]
    pub max_put_rows: Option<u64>,
    /// Bytes (bodies and attributes) one DoPut call may send [default: 16 GiB].
    #[arg(long, env = "SQSF_MAX_PUT_BYTES")]
    pub max_put_bytes: Option<u64>,
    /// Upper limit of `partitions` in a plan command (TOML: limits.partitions) [default: 64].
    #[arg(long, env = "SQSF_LIMIT_PARTITIONS")]
    pub limit_partitions: Option<u64>,
    /// Upper limit of `max_messages` (TOML: limits.max_messages) [default: 100000].
    #[arg(long, env = "SQSF_LIMIT_MAX_MESSAGES")]
    pub limit_max_messages: Option<u64>,
    /// Upper limit of `max_wait_ms` (TOML: limits.max_wait_ms) [default: 20000].
    #[arg(long, env = "SQSF_LIMIT_MAX_WAIT_MS")]
    pub limit_max_wait_ms: Option<u64>,
    /// Upper limit of `max_bytes` (TOML: limits.max_bytes) [default: 256 MiB].
    #[arg(long, env = "SQSF_LIMIT_MAX_BYTES")]
    pub limit_max_bytes: Option<u64>,
    /// Upper limit of `max_duration_ms` (TOML: limits.max_duration_ms) [default: 300000].
    #[arg(long, env = "SQSF_LIMIT_MAX_DURATION_MS")]
    pub limit_max_duration_ms: Option<u64>,
    /// Upper limit of `receivers` (TOML: limits.receivers) [default: 128].
    #[arg(long, env = "SQSF_LIMIT_RECEIVERS")]
    pub limit_receivers: Option<u64>,
    /// Keep the registry (plans, received rows and receipts, watermarks) in a
    /// crash-safe store in this directory, so a restarted server replays and
    /// commits what the previous process received. Without it the registry
    /// is in memory only.
    #[arg(long, env = "SQSF_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// Once listening, write {url, pid, instance_id, started_at, listen} as
    /// JSON to this file (atomically, mode 0600); removed at a clean exit.
    #[arg(long, env = "SQSF_READY_FILE")]
    pub ready_file: Option<PathBuf>,
    /// Serve TLS with a self-signed certificate kept in this directory:
    /// made at first start, reused while it covers the advertised host, this
    /// host's name, localhost and 127.0.0.1. Not with --tls-cert.
    #[arg(long, env = "SQSF_TLS_SELF_SIGNED")]
    pub tls_self_signed: Option<PathBuf>,
    #[command(flatten)]
    pub sql: sql::SqlCli,
}

/// How logs are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Per-table settings in the TOML file; absent fields take the defaults.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableToml {
    pub queue_url: String,
    /// AWS region of the queue; default: the region in an Amazon SQS
    /// queue URL, else the server's (AWS_REGION, the profile).
    pub region: Option<String>,
    pub partitions: Option<u64>,
    pub max_messages: Option<u64>,
    pub max_wait_ms: Option<u64>,
    pub max_bytes: Option<u64>,
    pub max_duration_ms: Option<u64>,
    pub receivers: Option<u64>,
    /// Seconds; default: the queue's own VisibilityTimeout attribute.
    pub visibility_timeout: Option<u64>,
    /// Decode JSON bodies into a `payload` column.
    pub payload: Option<PayloadToml>,
}

/// A table's payload declaration: inline `fields`, or a JSON `schema_file`
/// holding `{"fields": [...]}` (and optionally `"unwrap"`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PayloadToml {
    pub unwrap: Option<Unwrap>,
    pub fields: Option<Vec<FieldSpec>>,
    pub schema_file: Option<PathBuf>,
}

/// Upper limits of the plan parameters, in the TOML file's `[limits]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsToml {
    pub partitions: Option<u64>,
    pub max_messages: Option<u64>,
    pub max_wait_ms: Option<u64>,
    pub max_bytes: Option<u64>,
    pub max_duration_ms: Option<u64>,
    pub receivers: Option<u64>,
}

/// The TOML configuration file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileToml {
    pub listen: Option<SocketAddr>,
    pub sqs_endpoint: Option<String>,
    pub sqs_max_attempts: Option<u32>,
    pub sqs_batch_concurrency: Option<u32>,
    pub consumer_lease: Option<u64>,
    pub advertise: Option<String>,
    pub auth_token: Option<String>,
    pub auth_token_file: Option<PathBuf>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub shutdown_grace: Option<u64>,
    pub metrics_listen: Option<SocketAddr>,
    pub idle_exit: Option<u64>,
    pub registry_max_bytes: Option<u64>,
    pub registry_max_messages: Option<u64>,
    pub max_streams_per_client: Option<u32>,
    pub max_request_bytes: Option<u64>,
    pub max_put_rows: Option<u64>,
    pub max_put_bytes: Option<u64>,
    pub state_dir: Option<PathBuf>,
    #[serde(default)]
    pub sql: sql::SqlToml,
    #[serde(default)]
    pub limits: LimitsToml,
    #[serde(default)]
    pub tables: BTreeMap<String, TableToml>,
}

/// Plan parameters: a table's defaults, or the server's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanParams {
    pub partitions: u64,
    pub max_messages: u64,
    pub max_wait_ms: u64,
    pub max_bytes: u64,
    pub max_duration_ms: u64,
    pub receivers: u64,
}

impl PlanParams {
    /// The built-in defaults (docs/protocol.md, "Plan parameters: defaults and limits").
    pub const DEFAULTS: Self = Self {
        partitions: DEFAULT_PARTITIONS,
        max_messages: DEFAULT_MAX_MESSAGES,
        max_wait_ms: DEFAULT_MAX_WAIT_MS,
        max_bytes: DEFAULT_MAX_BYTES,
        max_duration_ms: DEFAULT_MAX_DURATION_MS,
        receivers: DEFAULT_RECEIVERS,
    };
    /// The built-in limits (docs/protocol.md, "Plan parameters: defaults and limits").
    pub const LIMITS: Self = Self {
        partitions: LIMIT_PARTITIONS,
        max_messages: LIMIT_MAX_MESSAGES,
        max_wait_ms: LIMIT_MAX_WAIT_MS,
        max_bytes: LIMIT_MAX_BYTES,
        max_duration_ms: LIMIT_MAX_DURATION_MS,
        receivers: LIMIT_RECEIVERS,
    };

    /// `(name, value)` pairs, for validation and messages.
    pub fn fields(&self) -> [(&'static str, u64); 6] {
        [
            ("partitions", self.partitions),
            ("max_messages", self.max_messages),
            ("max_wait_ms", self.max_wait_ms),
            ("max_bytes", self.max_bytes),
            ("max_duration_ms", self.max_duration_ms),
            ("receivers", self.receivers),
        ]
    }
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
    /// The embedded in-memory queue, seeded with sample messages.
    Memory { sample_messages: u64 },
}

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
    /// A table on the embedded queue seeded with `sample_messages` demo
    /// order events, with the default plan parameters.
    pub fn memory(name: impl Into<String>, sample_messages: u64) -> Self {
        Self {
            name: name.into(),
            backend: Backend::Memory { sample_messages },
            defaults: PlanParams::DEFAULTS,
            visibility_timeout: None,
            payload: None,
        }
    }
}

/// The validated configuration the server runs with.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub advertise: Option<String>,
    /// Bearer token every RPC must carry; `None` lets every caller in.
    pub auth_token: Option<String>,
    /// The file `auth_token` was read from, if it was (printed instead of it).
    pub auth_token_file: Option<PathBuf>,
    /// Serve Flight over TLS; `None`: plaintext.
    pub tls: Option<TlsFiles>,
    /// How long open streams may take to finish once shutdown begins.
    pub shutdown_grace: Duration,
    /// Where /metrics, /healthz and /readyz are served; `None`: nowhere.
    pub metrics_listen: Option<SocketAddr>,
    /// Exit after this long without an RPC, once nothing is open or held
    /// (`--idle-exit`); `None`: never.
    pub idle_exit: Option<Duration>,
    pub sqs_endpoint: Option<String>,
    /// Attempts per SQS call, retries included.
    pub sqs_max_attempts: u32,
    /// Batch calls (delete, change visibility) one operation keeps in flight.
    pub sqs_batch_concurrency: u32,
    pub consumer_lease: Duration,
    pub limits: PlanParams,
    pub registry_max_bytes: u64,
    pub registry_max_messages: u64,
    /// Open DoGet/DoPut streams per client IP address.
    pub max_streams_per_client: u32,
    /// Largest gRPC message the server decodes.
    pub max_request_bytes: u64,
    /// Rows one DoPut call may send.
    pub max_put_rows: u64,
    /// Bytes (bodies and attributes) one DoPut call may send.
    pub max_put_bytes: u64,
    /// Directory of the durable registry; `None`: in memory only.
    pub state_dir: Option<PathBuf>,
    /// Flight SQL: its threads, memory cap and time limit.
    pub sql: sql::SqlConfig,
    pub tables: Vec<TableConfig>,
    /// Files of the process's start: where it says it listens, its made certificate.
    pub startup: Startup,
}

/// Command-line-only settings of the process's start (not in the TOML file:
/// they belong to whoever starts this process, not to what it serves).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Startup {
    /// `--ready-file`: written once the server listens; `None`: none.
    pub ready_file: Option<PathBuf>,
    /// `--tls-self-signed`: the directory of a made certificate; `None`: none.
    pub tls_self_signed: Option<PathBuf>,
}

/// The PEM files of the server's TLS identity (read when the server starts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A configuration mistake, naming the setting.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Toml { path: PathBuf, message: String },
    #[error("--table {0:?}: expected NAME=QUEUE_URL")]
    TableSyntax(String),
    #[error("table {0:?} is defined twice")]
    DuplicateTable(String),
    #[error("table name {0:?}: use 1-256 characters of A-Z a-z 0-9 _ - .")]
    TableName(String),
    #[error("table {table:?}: payload: {problem}")]
    Payload { table: String, problem: String },
    #[error("{setting}: {problem}")]
    Setting { setting: String, problem: String },
    #[error("{setting} = {value}: {problem}")]
    Value {
        setting: String,
        value: u64,
        problem: String,
    },
}

impl Config {
    /// A configuration with built-in defaults and the given tables.
    pub fn new(listen: SocketAddr, tables: Vec<TableConfig>) -> Self {
        Self {
            listen,
            advertise: None,
            auth_token: None,
            auth_token_file: None,
            tls: None,
            shutdown_grace: Duration::from_secs(DEFAULT_SHUTDOWN_GRACE_SECS),
            metrics_listen: None,
            idle_exit: None,
            sqs_endpoint: None,
            sqs_max_attempts: DEFAULT_SQS_MAX_ATTEMPTS,
            sqs_batch_concurrency: DEFAULT_SQS_BATCH_CONCURRENCY,
            consumer_lease: Duration::from_secs(DEFAULT_CONSUMER_LEASE_SECS),
            limits: PlanParams::LIMITS,
            registry_max_bytes: DEFAULT_REGISTRY_MAX_BYTES,
            registry_max_messages: DEFAULT_REGISTRY_MAX_MESSAGES,
            max_streams_per_client: DEFAULT_MAX_STREAMS_PER_CLIENT,
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            max_put_rows: DEFAULT_MAX_PUT_ROWS,
            max_put_bytes: DEFAULT_MAX_PUT_BYTES,
            state_dir: None,
            sql: sql::SqlConfig::default(),
            tables,
            startup: Startup::default(),
        }
    }

    /// The table named `name`.
    pub fn table(&self, name: &str) -> Option<&TableConfig> {
        self.tables.iter().find(|t| t.name == name)
    }

    /// Checks every table's defaults against the limits.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=LIMIT_SQS_MAX_ATTEMPTS).contains(&self.sqs_max_attempts) {
            return Err(value_error(
                "sqs_max_attempts".into(),
                self.sqs_max_attempts.into(),
                &format!("must be 1 to {LIMIT_SQS_MAX_ATTEMPTS}"),
            ));
        }
        if !(1..=LIMIT_SQS_BATCH_CONCURRENCY).contains(&self.sqs_batch_concurrency) {
            return Err(value_error(
                "sqs_batch_concurrency".into(),
                self.sqs_batch_concurrency.into(),
                &format!("must be 1 to {LIMIT_SQS_BATCH_CONCURRENCY}"),
            ));
        }
        for (setting, value) in [
            (
                "max_streams_per_client",
                u64::from(self.max_streams_per_client),
            ),
            ("max_put_rows", self.max_put_rows),
            ("max_put_bytes", self.max_put_bytes),
        ] {
            if value == 0 {
                return Err(value_error(setting.into(), 0, "must be at least 1"));
            }
        }
        if !(MIN_MAX_REQUEST_BYTES..=LIMIT_MAX_REQUEST_BYTES).contains(&self.max_request_bytes) {
            return Err(value_error(
                "max_request_bytes".into(),
                self.max_request_bytes,
                &format!("must be {MIN_MAX_REQUEST_BYTES} to {LIMIT_MAX_REQUEST_BYTES}"),
            ));
        }
        for (name, value) in self.limits.fields() {
            if value == 0 {
                return Err(value_error(
                    format!("limits.{name}"),
                    0,
                    "must be at least 1",
                ));
            }
        }
        let mut seen = std::collections::HashSet::new();
        for t in &self.tables {
            if !valid_table_name(&t.name) {
                return Err(ConfigError::TableName(t.name.clone()));
            }
            if !seen.insert(&t.name) {
                return Err(ConfigError::DuplicateTable(t.name.clone()));
            }
            check_region(t)?;
            if let Some(vt) = t.visibility_timeout {
                let secs = vt.as_secs();
                let range = MIN_VISIBILITY_TIMEOUT_SECS..=MAX_VISIBILITY_TIMEOUT_SECS;
                if !range.contains(&secs) {
                    return Err(value_error(
                        format!("tables.{}.visibility_timeout", t.name),
                        secs,
                        &format!(
                            "must be {MIN_VISIBILITY_TIMEOUT_SECS} to {MAX_VISIBILITY_TIMEOUT_SECS} \
                             seconds (SQS allows at most 12 hours; a heartbeat needs at least 2 s)"
                        ),
                    ));
                }
            }
            let limits = self.limits.fields();
            for ((name, value), (_, limit)) in t.defaults.fields().into_iter().zip(limits) {
                let setting = format!("tables.{}.{name}", t.name);
                if value > limit {
                    return Err(value_error(
                        setting,
                        value,
                        &format!("the limit is {limit}"),
                    ));
                }
                if value == 0 && name != "max_wait_ms" {
                    return Err(value_error(setting, value, "must be at least 1"));
                }
            }
        }
        Ok(())
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

fn value_error(setting: String, value: u64, problem: &str) -> ConfigError {
    ConfigError::Value {
        setting,
        value,
        problem: problem.to_string(),
    }
}

fn setting_error(setting: &str, problem: &str) -> ConfigError {
    ConfigError::Setting {
        setting: setting.to_string(),
        problem: problem.to_string(),
    }
}

/// The token of `--auth-token-file`: the file's text without its trailing
/// line break; an empty or unreadable file is an error naming it.
fn read_token_file(path: &PathBuf) -> Result<String, ConfigError> {
    let problem = |p: String| setting_error("auth_token_file", &p);
    let text = std::fs::read_to_string(path)
        .map_err(|e| problem(format!("cannot read {}: {e}", path.display())))?;
    let token = text.trim_end_matches(['\n', '\r']);
    if token.is_empty() {
        return Err(problem(format!("{} is empty", path.display())));
    }
    if token.contains(['\n', '\r']) {
        return Err(problem(format!(
            "{} holds more than one line; put only the token in it",
            path.display()
        )));
    }
    Ok(token.to_string())
}

fn valid_table_name(name: &str) -> bool {
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
    fn into_table(self, name: String) -> Result<TableConfig, ConfigError> {
        let d = PlanParams::DEFAULTS;
        let payload = self.payload.map(|p| p.resolve(&name)).transpose()?;
        Ok(TableConfig {
            name,
            backend: Backend::Sqs {
                queue_url: self.queue_url,
                region: self.region,
            },
            defaults: PlanParams {
                partitions: self.partitions.unwrap_or(d.partitions),
                max_messages: self.max_messages.unwrap_or(d.max_messages),
                max_wait_ms: self.max_wait_ms.unwrap_or(d.max_wait_ms),
                max_bytes: self.max_bytes.unwrap_or(d.max_bytes),
                max_duration_ms: self.max_duration_ms.unwrap_or(d.max_duration_ms),
                receivers: self.receivers.unwrap_or(d.receivers),
            },
            visibility_timeout: self.visibility_timeout.map(Duration::from_secs),
            payload,
        })
    }
}

impl LimitsToml {
    fn apply(&self, base: PlanParams) -> PlanParams {
        PlanParams {
            partitions: self.partitions.unwrap_or(base.partitions),
            max_messages: self.max_messages.unwrap_or(base.max_messages),
            max_wait_ms: self.max_wait_ms.unwrap_or(base.max_wait_ms),
            max_bytes: self.max_bytes.unwrap_or(base.max_bytes),
            max_duration_ms: self.max_duration_ms.unwrap_or(base.max_duration_ms),
            receivers: self.receivers.unwrap_or(base.receivers),
        }
    }
}

fn read_file(path: &PathBuf) -> Result<FileToml, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.clone(),
        source,
    })?;
    toml::from_str(&text).map_err(|e| ConfigError::Toml {
        path: path.clone(),
        message: e.to_string(),
    })
}

fn parse_table_flag(flag: &str) -> Result<TableConfig, ConfigError> {
    let (name, url) = flag
        .split_once('=')
        .filter(|(n, u)| !n.is_empty() && !u.is_empty())
        .ok_or_else(|| ConfigError::TableSyntax(flag.to_string()))?;
    TableToml {
        queue_url: url.to_string(),
        ..TableToml::default()
    }
    .into_table(name.to_string())
}

impl TryFrom<Cli> for Config {
    type Error = ConfigError;

    fn try_from(cli: Cli) -> Result<Self, ConfigError> {
        let file = match &cli.config {
            Some(path) => read_file(path)?,
            None => FileToml::default(),
        };
        let mut tables: Vec<TableConfig> = file
            .tables
            .into_iter()
            .map(|(name, t)| t.into_table(name))
            .collect::<Result<_, _>>()?;
        for flag in &cli.tables {
            tables.push(parse_table_flag(flag)?);
        }
        if tables.is_empty() {
            tables.push(TableConfig::memory(DEMO_TABLE, cli.demo_messages));
        }
        let listen_flag_given = cli.listen.to_string() != DEFAULT_LISTEN;
        let listen = match (listen_flag_given, file.listen) {
            (false, Some(l)) => l,
            _ => cli.listen,
        };
        let auth_token_file = cli.auth_token_file.or(file.auth_token_file);
        let auth_token = match (cli.auth_token.or(file.auth_token), &auth_token_file) {
            (Some(_), Some(_)) => {
                return Err(setting_error(
                    "auth_token",
                    "give --auth-token or --auth-token-file, not both",
                ));
            }
            (token, None) => token.filter(|t| !t.is_empty()),
            (None, Some(path)) => Some(read_token_file(path)?),
        };
        let tls = match (cli.tls_cert.or(file.tls_cert), cli.tls_key.or(file.tls_key)) {
            (Some(cert), Some(key)) => Some(TlsFiles { cert, key }),
            (None, None) => None,
            (Some(_), None) => {
                return Err(setting_error(
                    "tls_key",
                    "--tls-cert needs --tls-key (the certificate's PEM private key)",
                ));
            }
            (None, Some(_)) => {
                return Err(setting_error(
                    "tls_cert",
                    "--tls-key needs --tls-cert (the PEM certificate)",
                ));
            }
        };
        let config = Config {
            listen,
            advertise: cli.advertise.or(file.advertise),
            auth_token,
            auth_token_file,
            tls,
            shutdown_grace: Duration::from_secs(
                cli.shutdown_grace
                    .or(file.shutdown_grace)
                    .unwrap_or(DEFAULT_SHUTDOWN_GRACE_SECS),
            ),
            metrics_listen: cli.metrics_listen.or(file.metrics_listen),
            idle_exit: cli.idle_exit.or(file.idle_exit).map(Duration::from_secs),
            sqs_endpoint: cli.sqs_endpoint.or(file.sqs_endpoint),
            sqs_max_attempts: cli
                .sqs_max_attempts
                .or(file.sqs_max_attempts)
                .unwrap_or(DEFAULT_SQS_MAX_ATTEMPTS),
            sqs_batch_concurrency: cli
                .sqs_batch_concurrency
                .or(file.sqs_batch_concurrency)
                .unwrap_or(DEFAULT_SQS_BATCH_CONCURRENCY),
            consumer_lease: Duration::from_secs(
                cli.consumer_lease
                    .or(file.consumer_lease)
                    .unwrap_or(DEFAULT_CONSUMER_LEASE_SECS),
            ),
            limits: LimitsToml {
                partitions: cli.limit_partitions,
                max_messages: cli.limit_max_messages,
                max_wait_ms: cli.limit_max_wait_ms,
                max_bytes: cli.limit_max_bytes,
                max_duration_ms: cli.limit_max_duration_ms,
                receivers: cli.limit_receivers,
            }
            .apply(file.limits.apply(PlanParams::LIMITS)),
            registry_max_bytes: file
                .registry_max_bytes
                .unwrap_or(DEFAULT_REGISTRY_MAX_BYTES),
            registry_max_messages: file
                .registry_max_messages
                .unwrap_or(DEFAULT_REGISTRY_MAX_MESSAGES),
            max_streams_per_client: cli
                .max_streams_per_client
                .or(file.max_streams_per_client)
                .unwrap_or(DEFAULT_MAX_STREAMS_PER_CLIENT),
            max_request_bytes: cli
                .max_request_bytes
                .or(file.max_request_bytes)
                .unwrap_or(DEFAULT_MAX_REQUEST_BYTES),
            max_put_rows: cli
                .max_put_rows
                .or(file.max_put_rows)
                .unwrap_or(DEFAULT_MAX_PUT_ROWS),
            max_put_bytes: cli
                .max_put_bytes
                .or(file.max_put_bytes)
                .unwrap_or(DEFAULT_MAX_PUT_BYTES),
            state_dir: cli.state_dir.or(file.state_dir),
            sql: sql::SqlConfig::resolve(cli.sql, file.sql)?,
            tables,
            startup: Startup {
                ready_file: cli.ready_file,
                tls_self_signed: cli.tls_self_signed,
            },
        };
        if config.tls.is_some() && config.startup.tls_self_signed.is_some() {
            return Err(setting_error(
                "tls_self_signed",
                "--tls-self-signed makes a certificate; --tls-cert brings one: give one of them",
            ));
        }
        if config.consumer_lease.is_zero() {
            return Err(value_error(
                "consumer_lease".into(),
                0,
                "must be at least 1 second",
            ));
        }
        if config.idle_exit.is_some_and(|d| d.is_zero()) {
            return Err(value_error(
                "idle_exit".into(),
                0,
                "must be at least 1 second (leave it out to never exit when idle)",
            ));
        }
        config.validate()?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cli(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once("sqs-flight-server").chain(args.iter().copied()))
            .unwrap()
    }

    #[test]
    fn client_limits_come_from_flags_and_toml() {
        let c = Config::try_from(cli(&[])).unwrap();
        assert_eq!(c.max_streams_per_client, DEFAULT_MAX_STREAMS_PER_CLIENT);
        assert_eq!(c.max_request_bytes, DEFAULT_MAX_REQUEST_BYTES);
        let c = Config::try_from(cli(&[
            "--max-streams-per-client",
            "3",
            "--max-request-bytes",
            "65536",
            "--max-put-rows",
            "7",
            "--max-put-bytes",
            "9",
            "--limit-partitions",
            "4",
        ]))
        .unwrap();
        assert_eq!(
            (
                c.max_streams_per_client,
                c.max_request_bytes,
                c.max_put_rows,
                c.max_put_bytes
            ),
            (3, 65536, 7, 9)
        );
        assert_eq!(c.limits.partitions, 4);
        assert_eq!(c.limits.max_messages, LIMIT_MAX_MESSAGES);
        let err = Config::try_from(cli(&["--max-streams-per-client", "0"])).unwrap_err();
        assert!(err.to_string().contains("max_streams_per_client"), "{err}");
        let err = Config::try_from(cli(&["--max-request-bytes", "10"])).unwrap_err();
        assert!(err.to_string().contains("max_request_bytes"), "{err}");
        let err = Config::try_from(cli(&["--limit-partitions", "1"])).unwrap_err();
        assert!(err.to_string().contains("tables.demo.partitions"), "{err}");

        let dir = std::env::temp_dir().join(format!("sqsf-limits-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.toml");
        std::fs::write(
            &path,
            "max_streams_per_client = 5\nmax_put_rows = 11\n[limits]\npartitions = 8\n",
        )
        .unwrap();
        let p = path.to_str().unwrap();
        let c = Config::try_from(cli(&["--config", p])).unwrap();
        assert_eq!((c.max_streams_per_client, c.max_put_rows), (5, 11));
        assert_eq!(c.limits.partitions, 8);
        let c = Config::try_from(cli(&["--config", p, "--limit-partitions", "6"])).unwrap();
        assert_eq!(c.limits.partitions, 6, "a flag wins over the file");
    }

    #[test]
    fn idle_exit_is_off_unless_set_and_never_zero() {
        assert_eq!(Config::try_from(cli(&[])).unwrap().idle_exit, None);
        let c = Config::try_from(cli(&["--idle-exit", "90"])).unwrap();
        assert_eq!(c.idle_exit, Some(Duration::from_secs(90)));
        assert!(c.to_toml().contains("idle_exit = 90"), "{}", c.to_toml());
        let err = Config::try_from(cli(&["--idle-exit", "0"])).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("idle_exit") && msg.contains("at least 1 second"),
            "{msg}"
        );
    }

    #[test]
    fn no_tables_means_the_demo_table() {
        let c = Config::try_from(cli(&[])).unwrap();
        assert_eq!(c.tables.len(), 1);
        assert_eq!(c.tables[0].name, DEMO_TABLE);
        assert!(matches!(c.tables[0].backend, Backend::Memory { .. }));
        assert_eq!(c.consumer_lease, Duration::from_secs(300));
        assert_eq!(c.listen.to_string(), DEFAULT_LISTEN);
    }

    #[test]
    fn table_flags_are_parsed_and_checked() {
        let c = Config::try_from(cli(&["--table", "orders=http://q/1", "--table", "b=u"])).unwrap();
        assert_eq!(c.tables.len(), 2);
        assert_eq!(
            c.tables[0].backend,
            Backend::Sqs {
                queue_url: "http://q/1".into(),
                region: None,
            }
        );
        let err = Config::try_from(cli(&["--table", "orders"])).unwrap_err();
        assert!(err.to_string().contains("NAME=QUEUE_URL"));
        let err = Config::try_from(cli(&["--table", "a=x", "--table", "a=y"])).unwrap_err();
        assert!(err.to_string().contains("twice"));
        let err = Config::try_from(cli(&["--table", "a b=x"])).unwrap_err();
        assert!(err.to_string().contains("table name"));
    }

    #[test]
    fn toml_tables_and_limits() {
        let dir = std::env::temp_dir().join(format!("sqsf-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.toml");
        std::fs::write(
            &path,
            "consumer_lease = 10\n[limits]\npartitions = 8\n\
             [tables.orders]\nqueue_url = \"u\"\npartitions = 4\nvisibility_timeout = 60\n",
        )
        .unwrap();
        let c = Config::try_from(cli(&["--config", path.to_str().unwrap()])).unwrap();
        assert_eq!(c.consumer_lease, Duration::from_secs(10));
        assert_eq!(c.limits.partitions, 8);
        let t = c.table("orders").unwrap();
        assert_eq!(t.defaults.partitions, 4);
        assert_eq!(t.defaults.max_messages, DEFAULT_MAX_MESSAGES);
        assert_eq!(t.visibility_timeout, Some(Duration::from_secs(60)));

        for bad in [0, 1, 43_201] {
            let text = format!("[tables.orders]\nqueue_url = \"u\"\nvisibility_timeout = {bad}\n");
            std::fs::write(&path, text).unwrap();
            let err = Config::try_from(cli(&["--config", path.to_str().unwrap()])).unwrap_err();
            assert!(
                err.to_string().contains("tables.orders.visibility_timeout"),
                "{bad}: {err}"
            );
        }

        std::fs::write(
            &path,
            "[tables.orders]\nqueue_url = \"u\"\npartitions = 9\n[limits]\npartitions = 8\n",
        )
        .unwrap();
        let err = Config::try_from(cli(&["--config", path.to_str().unwrap()])).unwrap_err();
        assert!(
            err.to_string().contains("tables.orders.partitions"),
            "{err}"
        );

        std::fs::write(
            &path,
            "[tables.orders]\nqueue_url = \"u\"\n[tables.orders.payload]\nunwrap = \"sns\"\n\
             fields = [{ name = \"id\", type = \"int64\" }]\n",
        )
        .unwrap();
        let c = Config::try_from(cli(&["--config", path.to_str().unwrap()])).unwrap();
        let p = c.table("orders").unwrap().payload.as_ref().unwrap();
        assert_eq!(p.unwrap, Unwrap::Sns);
        assert_eq!(p.fields[0].name, "id");
        std::fs::write(
            &path,
            "[tables.orders]\nqueue_url = \"u\"\n[tables.orders.payload]\n\
             fields = [{ name = \"id\", type = \"money\" }]\n",
        )
        .unwrap();
        let err = Config::try_from(cli(&["--config", path.to_str().unwrap()])).unwrap_err();
        assert!(
            err.to_string()
                .contains("table \"orders\": payload: id: unknown type"),
            "{err}"
        );

        std::fs::write(&path, "[tables.orders]\nqueue_url = \"u\"\nbogus = 1\n").unwrap();
        let err = Config::try_from(cli(&["--config", path.to_str().unwrap()])).unwrap_err();
        assert!(err.to_string().contains("bogus"), "{err}");
    }

    #[test]
    fn tls_files_come_in_pairs_and_token_sources_exclude_each_other() {
        let err = Config::try_from(cli(&["--tls-cert", "c.pem"])).unwrap_err();
        assert!(
            err.to_string().contains("--tls-cert needs --tls-key"),
            "{err}"
        );
        let err = Config::try_from(cli(&["--tls-key", "k.pem"])).unwrap_err();
        assert!(
            err.to_string().contains("--tls-key needs --tls-cert"),
            "{err}"
        );
        let c = Config::try_from(cli(&["--tls-cert", "c.pem", "--tls-key", "k.pem"])).unwrap();
        assert_eq!(c.tls.unwrap().key, PathBuf::from("k.pem"));
        let err = Config::try_from(cli(&[
            "--tls-cert",
            "c.pem",
            "--tls-key",
            "k.pem",
            "--tls-self-signed",
            "d",
        ]))
        .unwrap_err();
        assert!(err.to_string().contains("give one of them"), "{err}");
        assert_eq!(
            c.shutdown_grace,
            Duration::from_secs(DEFAULT_SHUTDOWN_GRACE_SECS)
        );

        let dir = std::env::temp_dir().join(format!("sqsf-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        let file_arg = file.to_str().unwrap();
        std::fs::write(&file, "tok-1\r\n").unwrap();
        let c = Config::try_from(cli(&["--auth-token-file", file_arg])).unwrap();
        assert_eq!(c.auth_token.as_deref(), Some("tok-1"));
        let err = Config::try_from(cli(&["--auth-token-file", file_arg, "--auth-token", "x"]))
            .unwrap_err();
        assert!(err.to_string().contains("not both"), "{err}");
        std::fs::write(&file, "\n").unwrap();
        let err = Config::try_from(cli(&["--auth-token-file", file_arg])).unwrap_err();
        assert!(err.to_string().contains("is empty"), "{err}");
        let missing = dir.join("missing");
        let err =
            Config::try_from(cli(&["--auth-token-file", missing.to_str().unwrap()])).unwrap_err();
        assert!(err.to_string().contains("cannot read"), "{err}");
        assert!(err.to_string().contains("missing"), "{err}");
    }

    #[test]
    fn sqs_max_attempts_come_from_flag_or_toml_within_limits() {
        let c = Config::try_from(cli(&[])).unwrap();
        assert_eq!(c.sqs_max_attempts, DEFAULT_SQS_MAX_ATTEMPTS);
        let c = Config::try_from(cli(&["--sqs-max-attempts", "8"])).unwrap();
        assert_eq!(c.sqs_max_attempts, 8);
        for bad in ["0", "21"] {
            let err = Config::try_from(cli(&["--sqs-max-attempts", bad])).unwrap_err();
            assert!(
                err.to_string()
                    .contains(&format!("sqs_max_attempts = {bad}")),
                "{err}"
            );
        }
    }

    #[test]
    fn sqs_batch_concurrency_comes_from_flag_or_toml_within_limits() {
        let c = Config::try_from(cli(&[])).unwrap();
        assert_eq!(c.sqs_batch_concurrency, DEFAULT_SQS_BATCH_CONCURRENCY);
        let c = Config::try_from(cli(&["--sqs-batch-concurrency", "64"])).unwrap();
        assert_eq!(c.sqs_batch_concurrency, 64);
        for bad in ["0", "513"] {
            let err = Config::try_from(cli(&["--sqs-batch-concurrency", bad])).unwrap_err();
            assert!(
                err.to_string()
                    .contains(&format!("sqs_batch_concurrency = {bad}")),
                "{err}"
            );
        }
    }

    #[test]
    fn receivers_have_a_table_default_and_a_limit() {
        let c = Config::try_from(cli(&["--table", "t=http://q"])).unwrap();
        assert_eq!(c.tables[0].defaults.receivers, DEFAULT_RECEIVERS);
        assert_eq!(c.limits.receivers, LIMIT_RECEIVERS);
        let c = Config::try_from(cli(&["--table", "t=http://q", "--limit-receivers", "4"]));
        let err = c.unwrap_err().to_string();
        assert!(err.contains("tables.t.receivers"), "{err}");
        assert!(err.contains("the limit is 4"), "{err}");
    }

    #[test]
    fn a_table_region_must_agree_with_its_queue_url() {
        let dir = std::env::temp_dir().join(format!("sqsf-region-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.toml");
        let load = |table: &str| {
            std::fs::write(&path, format!("[tables.orders]\n{table}")).unwrap();
            Config::try_from(cli(&["--config", path.to_str().unwrap()]))
        };
        let aws = "queue_url = \"https://sqs.eu-west-1.amazonaws.com/123/q\"\n";
        let c = load(&format!("{aws}region = \"eu-west-1\"\n")).unwrap();
        assert!(
            c.to_toml().contains("region = \"eu-west-1\""),
            "{}",
            c.to_toml()
        );
        let c = load("queue_url = \"http://127.0.0.1:4566/000000000000/q\"\nregion = \"local\"\n")
            .unwrap();
        assert!(
            matches!(&c.tables[0].backend, Backend::Sqs { region: Some(r), .. } if r == "local")
        );
        let err = load(&format!("{aws}region = \"us-east-1\"\n"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("tables.orders.region")
                && err.contains("us-east-1")
                && err.contains("eu-west-1"),
            "{err}"
        );
        let err = load(&format!("{aws}region = \"\"\n"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("tables.orders.region") && err.contains("empty"),
            "{err}"
        );
    }
}
