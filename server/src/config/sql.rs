//! Flight SQL settings: the threads queries run on, DataFusion's memory
//! cap and a query's time limit (flags `--sql-*`, TOML table `[sql]`).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// Seconds a Flight SQL query may take, from its DoGet to its last batch
/// (and a statement's planning).
pub const DEFAULT_SQL_QUERY_TIMEOUT_SECS: u64 = 120;
/// Upper limit of `sql.query_timeout` (a day).
pub const LIMIT_SQL_QUERY_TIMEOUT_SECS: u64 = 86_400;
/// The SQL memory cap is the machine's memory (or the cgroup's limit) over this.
pub const SQL_MEMORY_SHARE: u64 = 4;
/// The SQL memory cap when the machine's memory cannot be read.
pub const FALLBACK_SQL_MEMORY_LIMIT: u64 = 1 << 30;
/// Smallest `sql.memory_limit` accepted.
pub const MIN_SQL_MEMORY_LIMIT: u64 = 1 << 20;
/// Upper limit of `sql.threads`.
pub const LIMIT_SQL_THREADS: u64 = 256;
/// Flight SQL statements (worker processes) at once, all clients together.
pub const DEFAULT_SQL_MAX_STATEMENTS: u64 = 8;
/// Upper limit of `sql.max_statements`.
pub const LIMIT_SQL_MAX_STATEMENTS: u64 = 1024;
/// Data memory a SQL worker process may map beyond its query's memory
/// pool (`RLIMIT_DATA` = `sql.memory_limit` + this): its threads' stacks,
/// the peeked rows, values that functions build outside the pool. A query
/// that needs more ends its worker with `RESOURCE_EXHAUSTED`.
pub const SQL_WORKER_HEADROOM: u64 = 1 << 30;

/// The Flight SQL settings: flags `--sql-*`, TOML table `[sql]`.
#[derive(Debug, Clone, Default, clap::Args, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[command(next_help_heading = "Flight SQL")]
pub struct SqlSettings {
    /// Threads of each query's worker process (queries are planned and
    /// run apart from the server that serves the queues); also
    /// DataFusion's `target_partitions`. 1 to 256 (`LIMIT_SQL_THREADS`).
    #[arg(long = "sql-threads", env = "SQSF_SQL_THREADS", value_name = "N")]
    pub threads: Option<u64>,
    /// Memory the operators (sorts, joins, aggregates) of one query may
    /// use. Bytes, or a number with a unit: `B`, `KiB`, `MiB`, `GiB`, `TiB`
    /// (powers of 1024) or `KB`, `MB`, `GB`, `TB` (powers of 1000), e.g.
    /// `2GiB`; in TOML a number or such a string. At least 1 MiB. Each
    /// query runs in a process of its own that may map this plus 1 GiB
    /// (`SQL_WORKER_HEADROOM`) of data memory. A query that needs more
    /// fails with `RESOURCE_EXHAUSTED`; the server runs on.
    #[arg(
        long = "sql-memory-limit",
        env = "SQSF_SQL_MEMORY_LIMIT",
        value_name = "SIZE"
    )]
    pub memory_limit: Option<MemoryToml>,
    /// How long one statement may take: its planning, and its DoGet until
    /// the last batch. Then it is stopped with `DEADLINE_EXCEEDED`. 1 to
    /// 86400.
    #[arg(
        long = "sql-query-timeout",
        env = "SQSF_SQL_QUERY_TIMEOUT",
        value_name = "SECONDS"
    )]
    pub query_timeout: Option<u64>,
    /// Statements planned or run at once, all clients together: each is a
    /// worker process of its own, with up to `memory_limit` plus 1 GiB of
    /// data memory and a frame of at most 64 MiB in the server. One more is
    /// refused with `RESOURCE_EXHAUSTED`. 1 to 1024.
    #[arg(
        long = "sql-max-statements",
        env = "SQSF_SQL_MAX_STATEMENTS",
        value_name = "N"
    )]
    pub max_statements: Option<u64>,
}

impl SqlSettings {
    /// These settings where set, `other`'s elsewhere.
    pub fn or(self, other: Self) -> Self {
        Self {
            threads: self.threads.or(other.threads),
            memory_limit: self.memory_limit.or(other.memory_limit),
            query_timeout: self.query_timeout.or(other.query_timeout),
            max_statements: self.max_statements.or(other.max_statements),
        }
    }

    /// The settings of `config`, as the file would set them.
    pub fn of(config: &SqlConfig) -> Self {
        Self {
            threads: Some(config.threads as u64),
            memory_limit: Some(MemoryToml::Bytes(config.memory_limit)),
            query_timeout: Some(config.query_timeout.as_secs()),
            max_statements: Some(config.max_statements as u64),
        }
    }

    /// The default of `key` as docs/configuration.md shows it (these
    /// depend on the machine, so they are told, not computed).
    pub(crate) fn default_shown(key: &str) -> Option<String> {
        Some(match key {
            "threads" => "half the CPUs, at least 1".into(),
            "memory_limit" => "a quarter (`SQL_MEMORY_SHARE`) of `MemTotal` in `/proc/meminfo`, \
                or of the cgroup's `memory.max` when lower; 1 GiB \
                (`FALLBACK_SQL_MEMORY_LIMIT`) where neither can be read"
                .into(),
            "query_timeout" => {
                format!("`{DEFAULT_SQL_QUERY_TIMEOUT_SECS}` (`DEFAULT_SQL_QUERY_TIMEOUT_SECS`)")
            }
            "max_statements" => {
                format!("`{DEFAULT_SQL_MAX_STATEMENTS}` (`DEFAULT_SQL_MAX_STATEMENTS`)")
            }
            _ => return None,
        })
    }
}

/// A byte count: `1073741824` or `"1GiB"` in TOML, any text on the command line.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum MemoryToml {
    Bytes(u64),
    Text(String),
}

/// A flag's text, parsed (and refused, naming the setting) when the
/// configuration is checked.
impl std::str::FromStr for MemoryToml {
    type Err = std::convert::Infallible;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Ok(Self::Text(text.to_string()))
    }
}

/// The validated Flight SQL settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqlConfig {
    pub threads: usize,
    /// Bytes the DataFusion memory pool of one query holds.
    pub memory_limit: u64,
    pub query_timeout: Duration,
    /// Statements (worker processes) at once.
    pub max_statements: usize,
    /// The binary a statement's worker process runs (`sqs-flight-server`,
    /// started with its hidden worker argument); `None`: this process's
    /// own executable. Not a setting: a program that serves in process
    /// (the integration tests) points it at the server's binary.
    pub worker: Option<PathBuf>,
}

impl Default for SqlConfig {
    fn default() -> Self {
        Self {
            threads: default_threads(),
            memory_limit: default_memory_limit(),
            query_timeout: Duration::from_secs(DEFAULT_SQL_QUERY_TIMEOUT_SECS),
            max_statements: DEFAULT_SQL_MAX_STATEMENTS as usize,
            worker: None,
        }
    }
}

impl SqlConfig {
    /// The settings (flags over the file), checked, over the defaults.
    pub fn resolve(settings: SqlSettings) -> Result<Self, ConfigError> {
        let defaults = Self::default();
        let threads = settings.threads;
        if let Some(n) = threads.filter(|n| !(1..=LIMIT_SQL_THREADS).contains(n)) {
            return Err(value(
                "sql_threads",
                n,
                &format!("must be 1 to {LIMIT_SQL_THREADS}"),
            ));
        }
        let memory_limit = match settings.memory_limit {
            Some(MemoryToml::Text(text)) => Some(parse_bytes(&text)?),
            Some(MemoryToml::Bytes(n)) => Some(n),
            None => None,
        };
        if let Some(n) = memory_limit.filter(|n| *n < MIN_SQL_MEMORY_LIMIT) {
            return Err(value("sql_memory_limit", n, "must be at least 1MiB"));
        }
        let timeout = settings.query_timeout;
        if let Some(n) = timeout.filter(|n| !(1..=LIMIT_SQL_QUERY_TIMEOUT_SECS).contains(n)) {
            let range = format!("must be 1 to {LIMIT_SQL_QUERY_TIMEOUT_SECS} seconds");
            return Err(value("sql_query_timeout", n, &range));
        }
        let statements = settings.max_statements;
        if let Some(n) = statements.filter(|n| !(1..=LIMIT_SQL_MAX_STATEMENTS).contains(n)) {
            let range = format!("must be 1 to {LIMIT_SQL_MAX_STATEMENTS}");
            return Err(value("sql_max_statements", n, &range));
        }
        Ok(Self {
            max_statements: statements.map_or(defaults.max_statements, |n| n as usize),
            threads: threads.map_or(defaults.threads, |n| n as usize),
            memory_limit: memory_limit.unwrap_or(defaults.memory_limit),
            query_timeout: timeout.map_or(defaults.query_timeout, Duration::from_secs),
            worker: None,
        })
    }

    /// Bytes of data memory (`RLIMIT_DATA`) a worker process may map: the
    /// pool and [`SQL_WORKER_HEADROOM`].
    pub fn worker_data_limit(&self) -> u64 {
        self.memory_limit.saturating_add(SQL_WORKER_HEADROOM)
    }
}

fn value(setting: &str, value: u64, problem: &str) -> ConfigError {
    ConfigError::Value {
        setting: setting.to_string(),
        value,
        problem: problem.to_string(),
    }
}

/// Half the CPUs the process may use, at least 1: the other half stays
/// with the threads that serve the queues.
fn default_threads() -> usize {
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    (cpus / 2).max(1)
}

/// [`SQL_MEMORY_SHARE`] of the memory the process may use: the smaller of
/// the machine's (`/proc/meminfo`) and its cgroup's limit; a fixed
/// fallback where neither can be read (not Linux).
pub fn default_memory_limit() -> u64 {
    let machine = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| mem_total(&text));
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|text| text.trim().parse::<u64>().ok());
    match machine.into_iter().chain(cgroup).min() {
        Some(bytes) => (bytes / SQL_MEMORY_SHARE).max(MIN_SQL_MEMORY_LIMIT),
        None => FALLBACK_SQL_MEMORY_LIMIT,
    }
}

/// `MemTotal` of `/proc/meminfo`, in bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// `1048576`, `512KiB`, `64MiB`, `2GiB`, `1TiB` (powers of 1024) or
/// `500KB`, `500MB`, `2GB`, `1TB` (powers of 1000); `B` is bytes.
pub fn parse_bytes(text: &str) -> Result<u64, ConfigError> {
    let problem = || ConfigError::Setting {
        setting: "sql_memory_limit".into(),
        problem: format!(
            "{:?} is not a size: use bytes or a number with B, KB, MB, GB, TB, KiB, MiB, \
             GiB or TiB (e.g. 2GiB)",
            sqs_flight_schemas::json::quote_cut(text)
        ),
    };
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().map_err(|_| problem())?;
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        _ => return Err(problem()),
    };
    number.checked_mul(scale).ok_or_else(problem)
}

/// `1.5 GiB`, `512.0 MiB`, `900 B`: a byte count for messages.
pub fn show_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = "B";
    for u in UNITS {
        if value < 1024.0 {
            break;
        }
        value /= 1024.0;
        unit = u;
    }
    if unit == "B" {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {unit}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_and_without_units() {
        assert_eq!(parse_bytes("1048576").unwrap(), 1 << 20);
        assert_eq!(parse_bytes("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_bytes("2 GiB").unwrap(), 2 << 30);
        assert_eq!(parse_bytes("500MB").unwrap(), 500_000_000);
        assert_eq!(parse_bytes("3gb").unwrap(), 3_000_000_000);
        for bad in ["", "MiB", "1.5GiB", "12 parsecs", "-1", "99999999999TiB"] {
            let err = parse_bytes(bad).unwrap_err().to_string();
            assert!(err.contains("sql_memory_limit"), "{bad}: {err}");
        }
        assert_eq!(show_bytes(900), "900 B");
        assert_eq!(show_bytes(3 << 29), "1.5 GiB");
    }

    #[test]
    fn the_default_memory_limit_is_a_quarter_of_mem_total() {
        let meminfo = "MemTotal:       16384 kB\nMemFree:  1 kB\n";
        assert_eq!(mem_total(meminfo), Some(16 << 20));
        assert_eq!(mem_total("nothing"), None);
        let limit = default_memory_limit();
        assert!(limit >= MIN_SQL_MEMORY_LIMIT, "{limit}");
    }

    #[test]
    fn flags_win_over_the_file_and_values_are_checked() {
        let file = SqlSettings {
            threads: Some(3),
            memory_limit: Some(MemoryToml::Text("64MiB".into())),
            query_timeout: Some(30),
            max_statements: Some(4),
        };
        let c = SqlConfig::resolve(SqlSettings::default().or(file.clone())).unwrap();
        assert_eq!((c.threads, c.memory_limit), (3, 64 << 20));
        assert_eq!(c.query_timeout, Duration::from_secs(30));
        assert_eq!(c.max_statements, 4);
        let cli = SqlSettings {
            threads: Some(1),
            memory_limit: Some("2MiB".parse().unwrap()),
            query_timeout: Some(5),
            max_statements: None,
        };
        let c = SqlConfig::resolve(cli.or(file)).unwrap();
        assert_eq!((c.threads, c.memory_limit), (1, 2 << 20));
        assert_eq!(c.query_timeout, Duration::from_secs(5));
        let bad = |cli: SqlSettings| SqlConfig::resolve(cli).unwrap_err();
        let err = bad(SqlSettings {
            threads: Some(0),
            ..SqlSettings::default()
        });
        assert!(err.to_string().contains("sql_threads = 0"), "{err}");
        let err = bad(SqlSettings {
            query_timeout: Some(0),
            ..SqlSettings::default()
        });
        assert!(err.to_string().contains("sql_query_timeout = 0"), "{err}");
        let err = bad(SqlSettings {
            max_statements: Some(0),
            ..SqlSettings::default()
        });
        assert!(err.to_string().contains("sql_max_statements = 0"), "{err}");
        let err = bad(SqlSettings {
            query_timeout: Some(0),
            ..SqlSettings::default()
        });
        assert!(err.to_string().contains("sql_query_timeout = 0"), "{err}");
        let err = bad(SqlSettings {
            memory_limit: Some("1KiB".parse().unwrap()),
            ..SqlSettings::default()
        });
        assert!(err.to_string().contains("sql_memory_limit = 1024"), "{err}");
        let d = SqlConfig::default();
        assert!(d.query_timeout <= Duration::from_secs(120) && d.threads >= 1);
    }
}
