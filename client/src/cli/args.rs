//! The command line: global connection flags and one subcommand each.

use std::path::PathBuf;

use crate::PlanOptions;
use clap::{Args, Parser, Subcommand, ValueEnum};
use sqs_flight_schemas::plan::PlanValue;

use super::exit::EXIT_STATUS_HELP;
use super::output::{DEFAULT_COLUMNS, Format};

/// Where the CLI looks for a server unless told otherwise.
pub const DEFAULT_URL: &str = "grpc://127.0.0.1:50051";
/// The consumer `tail`, `sql` and `infer-schema` read as unless
/// `--consumer` says otherwise.
pub const DEFAULT_CONSUMER: &str = "sqs-flight-cli";
/// Messages per DoPut batch of `send`: the server acknowledges each batch,
/// so this is also the step of the progress count.
pub const DEFAULT_BATCH_ROWS: usize = 500;
/// Messages `infer-schema` samples unless told otherwise.
pub const DEFAULT_INFER_MESSAGES: u64 = 1000;

/// sqs-flight: read and write Amazon SQS queues served by sqs-flight-server
/// as tables.
///
/// Reading is not destructive unless asked: `tail` and `sql` peek by default
/// (what they read goes back to the queue when they exit), and delete only
/// with --commit, after the rows have been written out. `send` writes
/// messages; `infer-schema` proposes a payload schema for JSON bodies.
#[derive(Debug, Parser)]
#[command(name = "sqs-flight", version, about, long_about, after_help = EXIT_STATUS_HELP)]
pub struct Cli {
    #[command(flatten)]
    pub connection: Connection,
    /// Print nothing on stderr but errors (no summary of what was read).
    #[arg(long, short, global = true, help_heading = "Global options")]
    pub quiet: bool,
    #[command(subcommand)]
    pub command: Command,
}

/// How to reach the server.
#[derive(Debug, Args)]
#[command(next_help_heading = "Global options")]
pub struct Connection {
    /// The server: grpc://HOST:PORT, or grpc+tls://HOST:PORT for TLS.
    #[arg(long, global = true, env = "SQSF_URL", default_value = DEFAULT_URL)]
    pub url: String,
    /// Bearer token, for a server started with --auth-token.
    #[arg(long, global = true, env = "SQSF_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// File holding the bearer token (one line), instead of --token.
    #[arg(long, global = true, env = "SQSF_TOKEN_FILE", conflicts_with = "token")]
    pub token_file: Option<PathBuf>,
    /// PEM file of the certificate authority that signed the server's TLS
    /// certificate, for a grpc+tls:// URL (default: the system's roots).
    /// Also read from SQSF_CA_CERT.
    #[arg(long, global = true, env = "SQSF_TLS_CA", visible_alias = "ca-cert")]
    pub tls_ca: Option<PathBuf>,
    /// Seconds to wait for the connection.
    #[arg(
        long,
        global = true,
        env = "SQSF_CONNECT_TIMEOUT",
        default_value_t = 10
    )]
    pub connect_timeout: u64,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// List the server's tables, one per line.
    Tables,
    /// Print a table's columns and types.
    Schema {
        /// The table.
        table: String,
    },
    /// Print queue depths and each consumer's batches.
    Status {
        /// One table (default: all of them).
        table: Option<String>,
        /// Print the server's JSON answer instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Print a table's messages, batch by batch, then delete them (--commit)
    /// or give them back (--peek, the default).
    ///
    /// Without --follow, tail reads batches until one comes back empty, then
    /// exits. Each batch is written out completely before it is committed,
    /// so a tail that dies or is interrupted never deletes a message it has
    /// not printed. With --peek the messages stay invisible to other readers
    /// while tail runs and become visible again when it exits; each peek
    /// counts as a receive (ApproximateReceiveCount), which matters for a
    /// queue with a redrive policy.
    #[command(after_help = EXIT_STATUS_HELP)]
    Tail(TailArgs),
    /// Run an SQL query over the server's tables (DataFusion).
    ///
    /// Every table of the server is registered under its name. Each table
    /// the query reads is read as one batch of --consumer; after the result
    /// is printed, that batch is committed (--commit) or released (--peek,
    /// the default). JSON functions work on `body`:
    /// json_get_str(body, 'event'), json_get_int(body, 'amount_cents'),
    /// json_contains(body, 'order_id'), body->>'event'. On a table whose
    /// server config declares a payload, its typed fields are
    /// payload['user'] (or get_field(payload, 'user'), or t.payload.user).
    #[command(after_help = EXIT_STATUS_HELP)]
    Sql(SqlArgs),
    /// Send messages to a table, one per input line.
    ///
    /// Each line of the input (stdin, or --file) is a JSON object:
    /// {"body": "text", "message_group_id": "g", "message_deduplication_id":
    /// "d", "delay_seconds": 5, "message_attributes": {"k": "v"}}, where only
    /// `body` (a string) is required; blank lines are skipped. With --raw
    /// each line is sent as it is as a body (empty lines are skipped; a
    /// trailing CR is dropped).
    ///
    /// Lines are sent in batches of --batch-rows. A line that is not a
    /// message stops the send before anything of its batch is sent (exit 7);
    /// a message the server refuses (an empty or oversized body, a FIFO
    /// message without message_group_id) stops it at that message (exit 4).
    /// Either way the error names the line and says how many messages were
    /// sent before it.
    #[command(after_help = EXIT_STATUS_HELP)]
    Send(SendArgs),
    /// Propose a payload schema for a table's JSON bodies.
    ///
    /// Peeks one batch of at most --max-messages messages (they go back to
    /// the queue afterwards, also on failure), infers the schema of the
    /// bodies that are JSON objects, and prints it as a
    /// [tables.TABLE.payload] block for the server's config file: put it
    /// after the table's [tables.TABLE] section and edit the types where the
    /// sample was not representative (fields seen only as null are utf8;
    /// integers mixed with decimals are float64). Bodies that are not JSON
    /// objects are skipped and counted on stderr.
    #[command(after_help = EXIT_STATUS_HELP)]
    InferSchema(InferArgs),
    /// Commit a consumer's batches up to BATCH: delete every message it
    /// read in them, except those given back with --reject or
    /// --reject-payload-errors.
    ///
    /// tail and sql commit their own batches (--commit); this commits a
    /// batch another client read, or gives back the messages a pipeline
    /// failed on. A message given back is visible again after
    /// --reject-delay with a higher receive count, so a queue with a redrive
    /// policy moves a message given back maxReceiveCount times to its
    /// dead-letter queue. An id the consumer does not hold in an open batch
    /// up to BATCH refuses the whole commit (exit 4) and nothing changes.
    /// Prints what was deleted, given back (rejected) and expired.
    #[command(after_help = EXIT_STATUS_HELP)]
    Commit(CommitArgs),
}

/// Whether what was read is deleted or given back.
#[derive(Debug, Args, Clone, Copy)]
#[group(multiple = false)]
pub struct Acknowledge {
    /// Delete each batch from the queue once it has been written out.
    #[arg(long)]
    pub commit: bool,
    /// Give every message back to the queue at exit. The default: the
    /// first look at a queue must not delete it.
    #[arg(long)]
    pub peek: bool,
}

/// Makes [`PlanFlags`]: a flag `--NAME` for each plan parameter of
/// `plan_params!` that has CLI help (its `cli`), at least 1 unless the
/// parameter may be 0.
macro_rules! plan_flags {
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
            }
        )*
    ) => {
        /// The plan parameters the CLI has flags for, each `None` where not given.
        #[derive(Debug, Args, Clone)]
        pub struct PlanFlags {
            $($(
                $(#[doc = $cli_doc])*
                #[arg(long, value_parser = clap::value_parser!(u64).range(u64::from(!$zero)..))]
                pub $name: Option<u64>,
            )?)*
        }

        impl PlanFlags {
            /// `options` with the parameters given here.
            fn over(&self, mut options: PlanOptions) -> PlanOptions {
                $($(
                    let _help = ($($cli_doc,)*);
                    if let Some(value) = self.$name {
                        options.$client = Some(PlanValue::from_plan_value(value));
                    }
                )?)*
                options
            }
        }
    };
}

sqs_flight_schemas::plan_params!(plan_flags);

/// How batches are planned.
#[derive(Debug, Args, Clone)]
pub struct Batching {
    /// The consumer to read as; use a different one per concurrent reader.
    #[arg(long, env = "SQSF_CONSUMER", default_value = DEFAULT_CONSUMER)]
    pub consumer: String,
    #[command(flatten)]
    pub plan: PlanFlags,
}

impl Batching {
    /// The plan options these flags stand for.
    pub fn options(&self) -> PlanOptions {
        self.plan.over(PlanOptions::consumer(self.consumer.clone()))
    }
}

#[derive(Debug, Args)]
pub struct TailArgs {
    /// The table to read.
    pub table: String,
    #[command(flatten)]
    pub acknowledge: Acknowledge,
    #[command(flatten)]
    pub batching: Batching,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Comma-separated columns to print, or `all`.
    #[arg(long, default_value = DEFAULT_COLUMNS)]
    pub columns: String,
    /// Stop after N messages; batches are planned so that no more than N
    /// are received.
    #[arg(long, short = 'n', value_parser = clap::value_parser!(u64).range(1..))]
    pub limit: Option<u64>,
    /// Keep reading when the table is empty, until Ctrl-C (or --limit).
    #[arg(long, short)]
    pub follow: bool,
}

#[derive(Debug, Args)]
pub struct SqlArgs {
    /// The query, e.g. "SELECT count(*) FROM demo".
    pub query: String,
    #[command(flatten)]
    pub acknowledge: Acknowledge,
    #[command(flatten)]
    pub batching: Batching,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

#[derive(Debug, Args)]
pub struct SendArgs {
    /// The table to send to.
    pub table: String,
    /// Read this file instead of stdin (`-` is stdin).
    #[arg(long, short = 'f')]
    pub file: Option<PathBuf>,
    /// Send each line as it is as a message body, instead of JSON objects.
    #[arg(long)]
    pub raw: bool,
    /// Messages per batch; the server confirms each batch once SQS has it.
    #[arg(long, default_value_t = DEFAULT_BATCH_ROWS,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=100_000))]
    pub batch_rows: usize,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("rejects").multiple(true)))]
pub struct CommitArgs {
    /// The table.
    pub table: String,
    /// Every batch of the consumer up to this one is committed.
    pub batch: u64,
    /// The consumer whose batches to commit.
    #[arg(long, env = "SQSF_CONSUMER", default_value = DEFAULT_CONSUMER)]
    pub consumer: String,
    /// A message id (the message_id column) to give back to the queue
    /// instead of deleting it; repeat for more.
    #[arg(long = "reject", value_name = "ID", group = "rejects")]
    pub reject: Vec<String>,
    /// Seconds the messages given back stay invisible, 0 to 43200
    /// (default 0: visible again at once).
    #[arg(long, value_name = "SECONDS", requires = "rejects",
          value_parser = clap::value_parser!(u32).range(0..=43_200))]
    pub reject_delay: Option<u32>,
    /// Also give back every message whose typed payload did not decode
    /// (payload_error set; tables with a payload only).
    #[arg(long, group = "rejects")]
    pub reject_payload_errors: bool,
}

/// How bodies are unwrapped before their schema is inferred.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum UnwrapArg {
    /// The body is the payload.
    None,
    /// The body is an SNS envelope whose `Message` holds the payload;
    /// prints `unwrap = "sns"` too.
    Sns,
}

#[derive(Debug, Args)]
pub struct InferArgs {
    /// The table whose bodies to sample.
    pub table: String,
    /// The consumer to peek as; its uncommitted messages are released
    /// afterwards.
    #[arg(long, env = "SQSF_CONSUMER", default_value = DEFAULT_CONSUMER)]
    pub consumer: String,
    /// Messages to sample (one batch of one partition).
    #[arg(long, default_value_t = DEFAULT_INFER_MESSAGES,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_messages: u64,
    /// Milliseconds to wait for a message before the sample ends (default:
    /// the table's).
    #[arg(long)]
    pub max_wait_ms: Option<u64>,
    /// How bodies are wrapped.
    #[arg(long, value_enum, default_value_t = UnwrapArg::None)]
    pub unwrap: UnwrapArg,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn tail_defaults_to_peek_and_refuses_both() {
        let cli = Cli::try_parse_from(["sqs-flight", "tail", "demo"]).unwrap();
        let Command::Tail(t) = cli.command else {
            panic!()
        };
        assert!(!t.acknowledge.commit);
        assert_eq!(t.batching.consumer, DEFAULT_CONSUMER);
        let both = Cli::try_parse_from(["sqs-flight", "tail", "demo", "--commit", "--peek"]);
        assert!(both.is_err());
    }

    #[test]
    fn send_and_infer_schema_defaults() {
        let cli = Cli::try_parse_from(["sqs-flight", "send", "t"]).unwrap();
        let Command::Send(s) = cli.command else {
            panic!()
        };
        assert_eq!(
            (s.file, s.raw, s.batch_rows),
            (None, false, DEFAULT_BATCH_ROWS)
        );
        assert!(Cli::try_parse_from(["sqs-flight", "send", "t", "--batch-rows", "0"]).is_err());
        let cli =
            Cli::try_parse_from(["sqs-flight", "infer-schema", "t", "--unwrap", "sns"]).unwrap();
        let Command::InferSchema(i) = cli.command else {
            panic!()
        };
        assert_eq!(
            (i.max_messages, i.unwrap),
            (DEFAULT_INFER_MESSAGES, UnwrapArg::Sns)
        );
    }

    #[test]
    fn commit_takes_repeated_rejects_and_a_delay_only_with_them() {
        let cli = Cli::try_parse_from([
            "sqs-flight",
            "commit",
            "t",
            "3",
            "--reject",
            "a",
            "--reject",
            "b",
            "--reject-delay",
            "60",
        ])
        .unwrap();
        let Command::Commit(c) = cli.command else {
            panic!()
        };
        assert_eq!(
            (c.batch, c.reject, c.reject_delay),
            (3, vec!["a".to_string(), "b".to_string()], Some(60))
        );
        assert!(
            Cli::try_parse_from(["sqs-flight", "commit", "t", "3", "--reject-delay", "5"]).is_err()
        );
        assert!(
            Cli::try_parse_from([
                "sqs-flight",
                "commit",
                "t",
                "3",
                "--reject-payload-errors",
                "--reject-delay",
                "43201",
            ])
            .is_err()
        );
        let errors = [
            "sqs-flight",
            "commit",
            "t",
            "3",
            "--reject-payload-errors",
            "--reject-delay",
            "5",
        ];
        assert!(Cli::try_parse_from(errors).is_ok());
    }

    #[test]
    fn url_is_global() {
        let cli = Cli::try_parse_from(["sqs-flight", "tables", "--url", "grpc://h:1"]).unwrap();
        assert_eq!(cli.connection.url, "grpc://h:1");
    }
}
