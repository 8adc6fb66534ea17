//! `--print-config`: the effective configuration as TOML, secrets masked.

use std::collections::BTreeMap;

use serde::Serialize;
use sqs_flight_schemas::payload::PayloadSpec;

use super::{Backend, Config, PlanParams};

/// What a masked secret prints as.
pub const MASK: &str = "********";

#[derive(Serialize)]
struct Printed<'a> {
    listen: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    advertise: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    auth_token: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    auth_token_file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tls_cert: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tls_key: Option<String>,
    shutdown_grace: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    metrics_listen: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    idle_exit: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sqs_endpoint: Option<&'a str>,
    sqs_max_attempts: u32,
    sqs_batch_concurrency: u32,
    consumer_lease: u64,
    registry_max_bytes: u64,
    registry_max_messages: u64,
    max_streams_per_client: u32,
    max_request_bytes: u64,
    max_put_rows: u64,
    max_put_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    state_dir: Option<String>,
    sql: PrintedSql,
    limits: Params,
    tables: BTreeMap<&'a str, PrintedTable<'a>>,
}

/// `[sql]`, every value explicit (the defaults depend on the machine).
#[derive(Serialize)]
struct PrintedSql {
    threads: usize,
    memory_limit: u64,
    query_timeout: u64,
}

#[derive(Serialize)]
struct Params {
    partitions: u64,
    max_messages: u64,
    max_wait_ms: u64,
    max_bytes: u64,
    max_duration_ms: u64,
    receivers: u64,
}

impl From<PlanParams> for Params {
    fn from(p: PlanParams) -> Self {
        Self {
            partitions: p.partitions,
            max_messages: p.max_messages,
            max_wait_ms: p.max_wait_ms,
            max_bytes: p.max_bytes,
            max_duration_ms: p.max_duration_ms,
            receivers: p.receivers,
        }
    }
}

#[derive(Serialize)]
struct PrintedTable<'a> {
    queue_url: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    region: Option<&'a str>,
    #[serde(flatten)]
    defaults: Params,
    #[serde(skip_serializing_if = "Option::is_none")]
    visibility_timeout: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload: Option<&'a PayloadSpec>,
}

impl Config {
    /// The configuration as TOML that `--config` reads back (the embedded
    /// demo table is shown as a comment: it has no queue URL).
    pub fn to_toml(&self) -> String {
        let mut demo = Vec::new();
        let tables = self
            .tables
            .iter()
            .filter_map(|t| match &t.backend {
                Backend::Sqs { queue_url, region } => Some((
                    t.name.as_str(),
                    PrintedTable {
                        queue_url,
                        region: region.as_deref(),
                        defaults: t.defaults.into(),
                        visibility_timeout: t.visibility_timeout.map(|d| d.as_secs()),
                        payload: t.payload.as_ref(),
                    },
                )),
                Backend::Memory { sample_messages } => {
                    demo.push(format!(
                        "# table {:?}: embedded in-memory demo queue with {sample_messages} sample messages\n",
                        t.name
                    ));
                    None
                }
            })
            .collect();
        let printed = Printed {
            listen: self.listen.to_string(),
            advertise: self.advertise.as_deref(),
            // A token read from a file prints as that file's path.
            auth_token: (self.auth_token_file.is_none())
                .then(|| self.auth_token.as_ref().map(|_| MASK))
                .flatten(),
            auth_token_file: self
                .auth_token_file
                .as_ref()
                .map(|p| p.display().to_string()),
            tls_cert: self.tls.as_ref().map(|t| t.cert.display().to_string()),
            tls_key: self.tls.as_ref().map(|t| t.key.display().to_string()),
            shutdown_grace: self.shutdown_grace.as_secs(),
            metrics_listen: self.metrics_listen.map(|a| a.to_string()),
            idle_exit: self.idle_exit.map(|d| d.as_secs()),
            sqs_endpoint: self.sqs_endpoint.as_deref(),
            sqs_max_attempts: self.sqs_max_attempts,
            sqs_batch_concurrency: self.sqs_batch_concurrency,
            consumer_lease: self.consumer_lease.as_secs(),
            registry_max_bytes: self.registry_max_bytes,
            registry_max_messages: self.registry_max_messages,
            max_streams_per_client: self.max_streams_per_client,
            max_request_bytes: self.max_request_bytes,
            max_put_rows: self.max_put_rows,
            max_put_bytes: self.max_put_bytes,
            state_dir: self.state_dir.as_ref().map(|d| d.display().to_string()),
            sql: PrintedSql {
                threads: self.sql.threads,
                memory_limit: self.sql.memory_limit,
                query_timeout: self.sql.query_timeout.as_secs(),
            },
            limits: self.limits.into(),
            tables,
        };
        let body = toml::to_string(&printed).expect("plain structs serialize to TOML");
        demo.concat() + &body
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Cli, ConfigError};
    use clap::Parser;

    #[test]
    fn printed_config_masks_the_token_and_reads_back() -> Result<(), ConfigError> {
        let cli = Cli::try_parse_from([
            "sqs-flight-server",
            "--table",
            "orders=http://q/1",
            "--auth-token",
            "hunter2",
        ])
        .unwrap();
        let config = Config::try_from(cli)?;
        let text = config.to_toml();
        assert!(!text.contains("hunter2"), "{text}");
        assert!(text.contains(MASK), "{text}");
        let dir = std::env::temp_dir().join(format!("sqsf-print-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("printed.toml");
        std::fs::write(&path, &text).unwrap();
        let cli =
            Cli::try_parse_from(["sqs-flight-server", "--config", path.to_str().unwrap()]).unwrap();
        let back = Config::try_from(cli)?;
        assert_eq!(back.tables, config.tables);
        assert_eq!(back.limits, config.limits);
        assert!(text.contains("max_streams_per_client = 256"), "{text}");
        assert_eq!(back.max_request_bytes, config.max_request_bytes);
        assert_eq!(back.max_put_bytes, config.max_put_bytes);
        assert!(text.contains("[sql]"), "{text}");
        assert_eq!(back.sql, config.sql);
        Ok(())
    }

    #[test]
    fn printed_config_names_the_token_file_and_tls_files_not_the_token() -> Result<(), ConfigError>
    {
        let dir = std::env::temp_dir().join(format!("sqsf-print-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let token = dir.join("token");
        std::fs::write(&token, "s3cret-from-file\n").unwrap();
        let cli = Cli::try_parse_from([
            "sqs-flight-server",
            "--auth-token-file",
            token.to_str().unwrap(),
            "--tls-cert",
            "/etc/sqsf/cert.pem",
            "--tls-key",
            "/etc/sqsf/key.pem",
            "--shutdown-grace",
            "3",
        ])
        .unwrap();
        let config = Config::try_from(cli)?;
        assert_eq!(config.auth_token.as_deref(), Some("s3cret-from-file"));
        let text = config.to_toml();
        assert!(!text.contains("s3cret"), "{text}");
        assert!(!text.contains(MASK), "{text}");
        assert!(text.contains(token.to_str().unwrap()), "{text}");
        assert!(text.contains("tls_key = \"/etc/sqsf/key.pem\""), "{text}");
        let path = dir.join("printed.toml");
        std::fs::write(&path, &text).unwrap();
        let cli =
            Cli::try_parse_from(["sqs-flight-server", "--config", path.to_str().unwrap()]).unwrap();
        let back = Config::try_from(cli)?;
        assert_eq!(back.auth_token, config.auth_token);
        assert_eq!(back.tls, config.tls);
        assert_eq!(back.shutdown_grace, std::time::Duration::from_secs(3));
        Ok(())
    }
}
