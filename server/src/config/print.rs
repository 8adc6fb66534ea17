//! `--print-config`: the effective configuration as TOML, secrets masked.

use std::collections::BTreeMap;

use serde::Serialize;

use super::sql::SqlSettings;
use super::{Config, PlanParams, Settings, TableToml};

/// What a masked secret prints as.
pub(super) const MASK: &str = "********";

#[derive(Serialize)]
struct Printed<'a> {
    #[serde(flatten)]
    settings: Settings,
    sql: SqlSettings,
    limits: PlanParams,
    tables: BTreeMap<&'a str, TableToml>,
}

impl Config {
    /// The configuration as TOML that `--config` reads back (an in-memory
    /// table, the `demo` one too, with its `sample_messages` and `rtt_ms`).
    pub fn to_toml(&self) -> String {
        let tables = self
            .tables
            .iter()
            .map(|t| (t.name.as_str(), TableToml::of(t)))
            .collect();
        let mut settings = Settings::of(self);
        // A token read from a file prints as that file's path.
        settings.auth_token = (self.auth_token_file.is_none())
            .then(|| self.auth_token.as_ref().map(|_| MASK.to_string()))
            .flatten();
        settings.tls_cert = self.tls.as_ref().map(|t| t.cert.clone());
        settings.tls_key = self.tls.as_ref().map(|t| t.key.clone());
        let printed = Printed {
            settings,
            // Every value explicit: the defaults depend on the machine.
            sql: SqlSettings::of(&self.sql),
            limits: self.limits,
            tables,
        };
        toml::to_string(&printed).expect("plain structs serialize to TOML")
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
        let scratch = crate::scratch::dir("print");
        let dir = scratch.path().to_path_buf();
        let path = dir.join("printed.toml");
        std::fs::write(&path, &text).unwrap();
        private(&path); // it holds auth_token (masked)
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

    /// `chmod 600`: a file holding a token is refused otherwise.
    fn private(path: &std::path::Path) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }

    #[test]
    fn printed_config_names_the_token_file_and_tls_files_not_the_token() -> Result<(), ConfigError>
    {
        let scratch = crate::scratch::dir("print-tls");
        let dir = scratch.path().to_path_buf();
        let token = dir.join("token");
        std::fs::write(&token, "s3cret-from-file\n").unwrap();
        private(&token);
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
