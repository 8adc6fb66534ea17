//! The CLI's errors, each with the exit status scripts rely on and a hint
//! that says what to fix.

use std::process::ExitCode;

use sqs_flight_client::Error;

/// Exit statuses; `--help` lists them (see [`EXIT_STATUS_HELP`]).
pub mod code {
    pub const OK: u8 = 0;
    pub const FAILURE: u8 = 1;
    pub const USAGE: u8 = 2;
    pub const UNREACHABLE: u8 = 3;
    pub const REFUSED: u8 = 4;
    pub const NOT_FOUND: u8 = 5;
    pub const UNAUTHORIZED: u8 = 6;
    pub const INTERRUPTED: u8 = 130;
}

/// The exit statuses, as printed at the end of `--help`.
pub const EXIT_STATUS_HELP: &str = "\
Exit status:
  0    success (also when the table was empty)
  1    any other failure: a server-side error, a malformed answer, output
       that could not be written
  2    usage: a bad flag or argument, or an SQL query that does not parse
       or plan (nothing was read)
  3    unreachable: no connection to --url, or the server or SQS is
       unavailable; worth retrying later
  4    refused: the server refused the request (a value out of its limits,
       a batch already committed, a plan released meanwhile)
  5    not found: no such table on the server
  6    unauthorized: the server wants a token (--token / SQSF_TOKEN) or
       refused the one given
  130  interrupted (Ctrl-C); messages read but not committed were released";

/// Why the CLI stopped.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A command line or query the CLI cannot run.
    #[error("{0}")]
    Usage(String),
    /// A failed client call; the kind decides the exit status.
    #[error("{0}")]
    Client(#[from] Error),
    /// An SQL query that failed in DataFusion, not on a Flight call.
    #[error("query failed: {0}")]
    Query(String),
    /// Rows that could not be formatted.
    #[error("cannot format the rows: {0}")]
    Render(String),
    /// Stdout failed (other than closed; see [`CliError::OutputClosed`]).
    #[error("cannot write to stdout: {0}")]
    Stdout(std::io::Error),
    /// The reader of stdout went away (`| head`): stop quietly.
    #[error("stdout was closed")]
    OutputClosed,
    /// Ctrl-C.
    #[error("interrupted")]
    Interrupted,
}

impl CliError {
    pub fn render(e: impl ToString) -> Self {
        Self::Render(e.to_string())
    }

    pub fn stdout(e: std::io::Error) -> Self {
        match e.kind() {
            std::io::ErrorKind::BrokenPipe => Self::OutputClosed,
            _ => Self::Stdout(e),
        }
    }

    /// The exit status of this error.
    pub fn code(&self) -> u8 {
        match self {
            Self::Usage(_) => code::USAGE,
            Self::Client(e) => client_code(e),
            Self::Query(_) | Self::Render(_) | Self::Stdout(_) => code::FAILURE,
            Self::OutputClosed => code::OK,
            Self::Interrupted => code::INTERRUPTED,
        }
    }

    /// What to do about it, when there is something to say.
    pub fn hint(&self, url: &str) -> Option<String> {
        match self {
            Self::Client(Error::Connect { .. }) => Some(format!(
                "is sqs-flight-server running at {url}? Pass its address with --url or SQSF_URL"
            )),
            Self::Client(Error::InvalidUrl { .. }) => {
                Some("--url takes grpc://HOST:PORT or grpc+tls://HOST:PORT".into())
            }
            Self::Client(Error::Unauthenticated { .. }) => Some(
                "pass the server's --auth-token with --token or the SQSF_TOKEN variable".into(),
            ),
            Self::Client(Error::NotFound { .. }) => {
                Some("`sqs-flight tables` lists the tables of the server".into())
            }
            Self::Client(e @ Error::Unavailable { .. }) if e.is_retryable() => {
                Some("the server or SQS is busy or down; try again later".into())
            }
            _ => None,
        }
    }

    /// Prints the error and its hint on stderr and returns the exit code.
    pub fn report(&self, url: &str) -> ExitCode {
        match self {
            Self::OutputClosed => {}
            Self::Interrupted => eprintln!("sqs-flight: interrupted"),
            _ => {
                eprintln!("sqs-flight: error: {self}");
                if let Some(hint) = self.hint(url) {
                    eprintln!("  hint: {hint}");
                }
            }
        }
        ExitCode::from(self.code())
    }
}

/// The exit status of a client error.
pub fn client_code(e: &Error) -> u8 {
    match e {
        Error::InvalidUrl { .. } | Error::InvalidConfig { .. } => code::USAGE,
        Error::Connect { .. } | Error::Unavailable { .. } => code::UNREACHABLE,
        Error::Refused { .. } => code::REFUSED,
        Error::NotFound { .. } => code::NOT_FOUND,
        Error::Unauthenticated { .. } => code::UNAUTHORIZED,
        Error::Server { .. } | Error::Protocol { .. } => code::FAILURE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Status;

    #[test]
    fn codes_follow_the_documented_table() {
        let client = |s: Status| CliError::Client(Error::from(s)).code();
        assert_eq!(client(Status::unavailable("x")), code::UNREACHABLE);
        assert_eq!(client(Status::invalid_argument("x")), code::REFUSED);
        assert_eq!(client(Status::failed_precondition("x")), code::REFUSED);
        assert_eq!(client(Status::not_found("x")), code::NOT_FOUND);
        assert_eq!(client(Status::unauthenticated("x")), code::UNAUTHORIZED);
        assert_eq!(client(Status::internal("x")), code::FAILURE);
        let connect = Error::Connect {
            url: "u".into(),
            reason: "r".into(),
        };
        assert_eq!(CliError::Client(connect).code(), code::UNREACHABLE);
        assert_eq!(CliError::Usage("x".into()).code(), code::USAGE);
        assert_eq!(CliError::Interrupted.code(), code::INTERRUPTED);
        let pipe = std::io::Error::from(std::io::ErrorKind::BrokenPipe);
        assert_eq!(CliError::stdout(pipe).code(), code::OK);
        for c in [1, 2, 3, 4, 5, 6, 130] {
            assert!(
                EXIT_STATUS_HELP.contains(&format!("\n  {c} ")),
                "{c} documented"
            );
        }
    }

    #[test]
    fn unreachable_server_gets_a_hint_naming_the_url() {
        let e = CliError::Client(Error::Connect {
            url: "grpc://h:1".into(),
            reason: "connection refused".into(),
        });
        let hint = e.hint("grpc://h:1").unwrap();
        assert!(hint.contains("grpc://h:1") && hint.contains("SQSF_URL"));
    }
}
