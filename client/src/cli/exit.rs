//! The CLI's errors, each with the exit status scripts rely on and a hint
//! that says what to fix.

use std::process::ExitCode;

use crate::Error;
use crate::send::{LineError, LineFault, SendError};

/// Exit statuses; `--help` lists them (see [`EXIT_STATUS_HELP`]).
pub mod code {
    pub const OK: u8 = 0;
    pub const FAILURE: u8 = 1;
    pub const USAGE: u8 = 2;
    pub const UNREACHABLE: u8 = 3;
    pub const REFUSED: u8 = 4;
    pub const NOT_FOUND: u8 = 5;
    pub const UNAUTHORIZED: u8 = 6;
    pub const BAD_INPUT: u8 = 7;
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
       a batch already committed, a plan released meanwhile, a message
       given to `send` that SQS cannot take)
  5    not found: no such table on the server
  6    unauthorized: the server wants a token (--token, --token-file) or
       refused the one given
  7    bad input: a line `send` cannot turn into a message (the error names
       it; the lines before its batch were sent)
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
    /// A line of `send`'s input that is not a message; the batches before
    /// the one it is in were sent.
    #[error("{input}: {error}; {}", sent_before_line(*.sent, *.batch_start))]
    BadLine {
        input: String,
        error: LineError,
        /// The first line of the batch that was not sent.
        batch_start: u64,
        sent: u64,
    },
    /// `send`'s input could not be read to its end.
    #[error("cannot read {input}: {reason}; {} before", were_sent(*.sent))]
    Input {
        input: String,
        reason: String,
        sent: u64,
    },
    /// A send the server stopped; `line` is the input line of the row it
    /// refused, when one row was the reason.
    #[error("{}{}", .error, line_note(.line, .input))]
    Send {
        error: Box<SendError>,
        input: String,
        line: Option<u64>,
    },
    /// `infer-schema` found nothing to infer a schema from.
    #[error("{0}")]
    Infer(String),
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
            Self::Send { error, .. } => client_code(&error.error),
            Self::BadLine { .. } => code::BAD_INPUT,
            Self::Query(_)
            | Self::Render(_)
            | Self::Stdout(_)
            | Self::Input { .. }
            | Self::Infer(_) => code::FAILURE,
            Self::OutputClosed => code::OK,
            Self::Interrupted => code::INTERRUPTED,
        }
    }

    /// What to do about it, when there is something to say.
    pub fn hint(&self, url: &str) -> Option<String> {
        match self {
            Self::Client(e) => client_hint(e, url),
            Self::BadLine { error, .. } => line_hint(error),
            Self::Send { error, .. } if !error.exact => {
                client_hint(&error.error, url).or_else(|| {
                    Some(format!(
                        "{} confirmed; a batch in flight may have been sent in part",
                        were_sent(error.sent)
                    ))
                })
            }
            Self::Send { error, .. } => client_hint(&error.error, url),
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

/// What to do about a client error, when there is something to say.
fn client_hint(e: &Error, url: &str) -> Option<String> {
    match e {
        Error::Connect { reason, .. }
            if url.starts_with("grpc+tls://") || url.starts_with("https://") =>
        {
            Some(
                if reason.contains("certificate") || reason.contains("UnknownIssuer") {
                    "the server's TLS certificate is not trusted: pass the CA that signed it with --tls-ca".into()
                } else {
                    format!(
                        "is sqs-flight-server running at {url} with --tls-cert? Pass its address with --url or SQSF_URL"
                    )
                },
            )
        }
        Error::Connect { .. } => Some(format!(
            "is sqs-flight-server running at {url}? Pass its address with --url or SQSF_URL \
             (a server started with --tls-cert needs grpc+tls://)"
        )),
        Error::InvalidUrl { .. } => {
            Some("--url takes grpc://HOST:PORT or grpc+tls://HOST:PORT".into())
        }
        Error::Unauthenticated { .. } => Some(
            "pass the server's token with --token, --token-file or the SQSF_TOKEN variable".into(),
        ),
        Error::NotFound { .. } => Some("`sqs-flight tables` lists the tables of the server".into()),
        // A connection the server closed: a TLS port answers a plaintext
        // client so (UNKNOWN, INTERNAL or CANCELLED, depending on timing,
        // or the client's refused reconnect).
        Error::Unavailable { code, message, .. }
            if url.starts_with("grpc://")
                && (message.contains(crate::NOT_HTTP2)
                    || matches!(
                        code,
                        tonic::Code::Unknown | tonic::Code::Internal | tonic::Code::Cancelled
                    )) =>
        {
            Some(
                "the connection broke; if the server was started with --tls-cert, use grpc+tls:// \
                 (and --tls-ca for a self-signed certificate)"
                    .into(),
            )
        }
        Error::Unavailable { .. } => {
            Some("the server or SQS is busy or down; try again later".into())
        }
        _ => None,
    }
}

/// `--raw`, for a line that is not a message object: most often a line that
/// is meant to be the body itself (an event in JSON, a line of text).
fn line_hint(error: &LineError) -> Option<String> {
    (error.fault == LineFault::NotAMessage).then(|| {
        "without --raw each line is a message object, {\"body\": \"...\"} with optional \
         message_group_id, message_deduplication_id, delay_seconds, message_attributes; \
         to send each line as it is as the body, add --raw"
            .into()
    })
}

/// `1 message was sent`, `3 messages were sent`, `no message was sent`.
pub fn were_sent(n: u64) -> String {
    match n {
        0 => "no message was sent".into(),
        1 => "1 message was sent".into(),
        n => format!("{n} messages were sent"),
    }
}

/// What a bad line stopped: the batches before the one it is in were sent.
fn sent_before_line(sent: u64, batch_start: u64) -> String {
    if batch_start <= 1 {
        return were_sent(sent);
    }
    format!(
        "{} from the lines before line {batch_start}, none from it on",
        were_sent(sent)
    )
}

/// ` (line L of INPUT)` after a refused row's error.
fn line_note(line: &Option<u64>, input: &str) -> String {
    line.map_or_else(String::new, |l| {
        format!(" (that row is line {l} of {input})")
    })
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
        let bad_line = CliError::BadLine {
            input: "stdin".into(),
            error: LineError {
                line: 7,
                fault: LineFault::NotAMessage,
                reason: "not JSON".into(),
            },
            batch_start: 5,
            sent: 4,
        };
        assert_eq!(bad_line.code(), code::BAD_INPUT);
        assert_eq!(
            bad_line.to_string(),
            "stdin: line 7: not JSON; 4 messages were sent from the lines before line 5, none from it on"
        );
        assert!(bad_line.hint("u").unwrap().contains("add --raw"));
        for c in [1, 2, 3, 4, 5, 6, 7, 130] {
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
