//! Flight SQL settings: the threads queries run on, DataFusion's memory
//! cap and a query's time limit (flags `--sql-*`, TOML table `[sql]`).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::ConfigError;
use super::setting::{Form, settings};

/// Seconds a Flight SQL query may take, from its DoGet to its last batch
/// (and a statement's planning).
pub(crate) const DEFAULT_SQL_QUERY_TIMEOUT_SECS: u64 = 120;
/// Upper limit of `sql.query_timeout` (a day).
pub(crate) const LIMIT_SQL_QUERY_TIMEOUT_SECS: u64 = 86_400;
/// The SQL memory cap is the machine's memory (or the cgroup's limit) over this.
pub(crate) const SQL_MEMORY_SHARE: u64 = 4;
/// The SQL memory cap when the machine's memory cannot be read.
pub(crate) const FALLBACK_SQL_MEMORY_LIMIT: u64 = 1 << 30;
/// Smallest `sql.memory_limit` accepted.
pub(crate) const MIN_SQL_MEMORY_LIMIT: u64 = 1 << 20;
/// Upper limit of `sql.threads`.
pub(crate) const LIMIT_SQL_THREADS: u64 = 256;
/// Flight SQL statements (worker processes) at once, all clients together.
pub(crate) const DEFAULT_SQL_MAX_STATEMENTS: u64 = 8;
/// Upper limit of `sql.max_statements`.
pub(crate) const LIMIT_SQL_MAX_STATEMENTS: u64 = 1024;
/// Data memory a SQL worker process may map beyond its query's memory
/// pool (`RLIMIT_DATA` = `sql.memory_limit` + this): its threads' stacks,
/// the peeked rows, values that functions build outside the pool. A query
/// that needs more ends its worker with `RESOURCE_EXHAUSTED`.
pub(crate) const SQL_WORKER_HEADROOM: u64 = 1 << 30;

settings! {
    /// The Flight SQL settings: flags `--sql-*`, TOML table `[sql]`.
    #[derive(Clone)]
    #[command(next_help_heading = "Flight SQL")]
    pub struct SqlSettings;
    /// The validated Flight SQL settings.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct SqlConfig;
    names "sql_";

    /// Threads of each query's worker process, and DataFusion's
    /// `target_partitions`; 1 to 256 (`LIMIT_SQL_THREADS`).
    threads: usize = default_threads() => "half the CPUs, at least 1",
        min 1 max LIMIT_SQL_THREADS, "SQSF_SQL_THREADS", long = "sql-threads",
        value_name = "N";
    /// Memory the operators (sorts, joins, aggregates) of one query may use, at
    /// least 1 MiB: bytes, or a number with a unit (`B`; `KiB`, `MiB`, `GiB`,
    /// `TiB` of 1024; `KB`, `MB`, `GB`, `TB` of 1000; e.g. `2GiB`, in TOML a
    /// string).
    ///
    /// A query that needs more, or more than its worker may map (this plus 1
    /// GiB, `SQL_WORKER_HEADROOM`), fails with `RESOURCE_EXHAUSTED`.
    memory_limit: u64 as Size = default_memory_limit()
        => "a quarter (`SQL_MEMORY_SHARE`) of `MemTotal` in `/proc/meminfo`, \
            or of the cgroup's `memory.max` when lower; 1 GiB \
            (`FALLBACK_SQL_MEMORY_LIMIT`) where neither can be read",
        min MIN_SQL_MEMORY_LIMIT, "SQSF_SQL_MEMORY_LIMIT", long = "sql-memory-limit",
        value_name = "SIZE";
    /// Seconds one statement may take (its planning; its DoGet to the last
    /// batch), 1 to 86400; then it is stopped with `DEADLINE_EXCEEDED`.
    query_timeout: Duration = Duration::from_secs(DEFAULT_SQL_QUERY_TIMEOUT_SECS),
        min 1 max LIMIT_SQL_QUERY_TIMEOUT_SECS " seconds", "SQSF_SQL_QUERY_TIMEOUT",
        long = "sql-query-timeout", value_name = "SECONDS";
    /// Statements (worker processes) planned or run at once, all clients, 1 to
    /// 1024; one more gets `RESOURCE_EXHAUSTED`.
    max_statements: usize = DEFAULT_SQL_MAX_STATEMENTS as usize,
        min 1 max LIMIT_SQL_MAX_STATEMENTS, "SQSF_SQL_MAX_STATEMENTS",
        long = "sql-max-statements", value_name = "N";

    @only_in_settings {}
    @only_in_config {
        /// The binary a statement's worker process runs (`sqs-flight-server`,
        /// started with its hidden worker argument); `None`: this process's
        /// own executable. Not a setting: a program that serves in process
        /// (the integration tests) points it at the server's binary.
        pub worker: Option<PathBuf> = None,
    }
}

/// A size in bytes, written as a number or as text with a unit
/// ([`MemoryToml`]); its bounds are shown in the largest unit that divides
/// them (`1MiB`).
pub struct Size;

impl Form<u64> for Size {
    type Raw = MemoryToml;
    fn read(setting: &str, raw: MemoryToml) -> Result<u64, ConfigError> {
        match raw {
            MemoryToml::Text(text) => parse_size(setting, &text),
            MemoryToml::Bytes(n) => Ok(n),
        }
    }
    fn write(value: &u64) -> Option<MemoryToml> {
        Some(MemoryToml::Bytes(*value))
    }
    fn show(bound: u64) -> String {
        let unit = ["TiB", "GiB", "MiB", "KiB"]
            .into_iter()
            .zip([40, 30, 20, 10])
            .find(|(_, shift)| bound != 0 && bound.is_multiple_of(1 << shift));
        match unit {
            Some((unit, shift)) => format!("{}{unit}", bound >> shift),
            None => bound.to_string(),
        }
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

impl Default for SqlConfig {
    fn default() -> Self {
        Self::defaults()
    }
}

impl SqlConfig {
    /// The settings (flags over the file) over the defaults; each one
    /// given is checked (not the defaults: they are the machine's, not the
    /// operator's).
    pub(crate) fn resolve(mut settings: SqlSettings) -> Result<Self, ConfigError> {
        settings.check_bounds()?;
        let mut config = Self::defaults();
        settings.apply(&mut SqlSettings::default(), &mut config)?;
        Ok(config)
    }

    /// Bytes of data memory (`RLIMIT_DATA`) a worker process may map: the
    /// pool and [`SQL_WORKER_HEADROOM`].
    pub(crate) fn worker_data_limit(&self) -> u64 {
        self.memory_limit.saturating_add(SQL_WORKER_HEADROOM)
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
pub(crate) fn default_memory_limit() -> u64 {
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

/// A size: `1048576`, `512KiB`, `64MiB`, `2GiB`, `1TiB` (powers of 1024) or
/// `500KB`, `500MB`, `2GB`, `1TB` (powers of 1000); `B` is bytes. An error
/// names `setting`.
fn parse_size(setting: &str, text: &str) -> Result<u64, ConfigError> {
    let problem = || ConfigError::Setting {
        setting: setting.into(),
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
pub(crate) fn show_bytes(bytes: u64) -> String {
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
    use clap::Parser;

    /// A size of `sql_memory_limit`.
    fn parse_bytes(text: &str) -> Result<u64, ConfigError> {
        parse_size("sql_memory_limit", text)
    }

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
    fn each_bound_error_reads_as_before_the_entries_made_it() {
        let cases = [
            ("--sql-threads", "0", "sql_threads = 0: must be 1 to 256"),
            (
                "--sql-threads",
                "257",
                "sql_threads = 257: must be 1 to 256",
            ),
            (
                "--sql-memory-limit",
                "1048575",
                "sql_memory_limit = 1048575: must be at least 1MiB",
            ),
            (
                "--sql-query-timeout",
                "86401",
                "sql_query_timeout = 86401: must be 1 to 86400 seconds",
            ),
            (
                "--sql-max-statements",
                "1025",
                "sql_max_statements = 1025: must be 1 to 1024",
            ),
        ];
        for (flag, value, message) in cases {
            let cli = crate::config::Cli::try_parse_from(["sqs-flight-server", flag, value]);
            let err = crate::config::Config::try_from(cli.unwrap()).unwrap_err();
            assert_eq!(err.to_string(), message);
        }
        let c = SqlConfig::resolve(SqlSettings {
            threads: Some(256),
            memory_limit: Some("1MiB".parse().unwrap()),
            query_timeout: Some(86_400),
            max_statements: Some(1024),
        })
        .unwrap();
        assert_eq!((c.threads, c.memory_limit), (256, 1 << 20));
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
