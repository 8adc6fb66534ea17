//! Logging setup: `tracing` with `RUST_LOG` (default `info`), as text or
//! JSON lines on stderr.
//!
//! The AWS SDK logs the resolved credentials' access key id at DEBUG and
//! whole SQS responses, receipt handles included, at TRACE. So when
//! `RUST_LOG` asks for more than INFO in general, the SDK's own targets are
//! kept at INFO; naming one of them in `RUST_LOG` (for example
//! `RUST_LOG=debug,aws_smithy_runtime=debug`) opts in, knowingly.

use tracing::level_filters::LevelFilter;
use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Log targets of the AWS SDK and its HTTP stack, kept at INFO unless named.
const SDK_TARGETS: [&str; 10] = [
    "aws_config",
    "aws_runtime",
    "aws_sdk_sqs",
    "aws_sigv4",
    "aws_smithy_http",
    "aws_smithy_http_client",
    "aws_smithy_runtime",
    "aws_smithy_runtime_api",
    "aws_smithy_types",
    "hyper_util",
];

/// The filter for `spec` (a `RUST_LOG` value).
fn filter(spec: &str) -> EnvFilter {
    let mut filter = EnvFilter::try_new(spec).unwrap_or_else(|e| {
        eprintln!("RUST_LOG={spec:?} is not a valid filter ({e}); logging at info");
        EnvFilter::new("info")
    });
    if filter
        .max_level_hint()
        .is_some_and(|l| l > LevelFilter::INFO)
    {
        for target in SDK_TARGETS.iter().filter(|t| !spec.contains(*t)) {
            let directive = format!("{target}=info").parse().expect("valid directive");
            filter = filter.add_directive(directive);
        }
    }
    filter
}

/// Installs the global subscriber.
pub fn init(format: LogFormat) {
    let spec = std::env::var("RUST_LOG").unwrap_or_else(|_| "info".to_string());
    // A log line that cannot be written is dropped. By default the fmt
    // layer reports it with `eprintln!`, which panics when stderr itself is
    // gone (the pipe of a parent that died): the task that logged would
    // panic, the signal handler among them, and SIGTERM would no longer stop
    // the server.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter(&spec))
        .with_writer(std::io::stderr)
        .log_internal_errors(false);
    match format {
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        LogFormat::Json => builder.json().init(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sdk_stays_at_info_unless_named() {
        let f = filter("debug").to_string();
        assert!(f.contains("aws_smithy_runtime=info"), "{f}");
        let f = filter("debug,aws_smithy_runtime=trace").to_string();
        assert!(!f.contains("aws_smithy_runtime=info"), "{f}");
        assert!(f.contains("aws_config=info"), "{f}");
        let f = filter("warn").to_string();
        assert!(!f.contains("aws_config"), "{f}");
    }
}
