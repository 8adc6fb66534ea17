//! `sqs-flight`: the command-line client of sqs-flight (feature `cli`).
//!
//! [`main`] is the whole program: the `sqs-flight` binary of this crate
//! calls it, and so does the server binary when it is run under the name
//! `sqs-flight` (the server wheel ships the CLI that way, without a second
//! copy of DataFusion).
//!
//! # Layout
//!
//! - `args`: the clap command line and its help.
//! - `exit`: errors, exit statuses and hints.
//! - `info`: `tables`, `schema`, `status`.
//! - `commit`: commit a consumer's batches, with rejects.
//! - `tail`: read, print, then commit or release, batch by batch.
//! - `sql`: DataFusion over every table of the server.
//! - `send`: input lines in, DoPut batches out, with a progress bar.
//! - `infer`: `infer-schema`, a payload block from a peeked batch.
//! - `output`: table, JSON lines, CSV and body formats.

mod args;
mod commit;
mod exit;
mod infer;
mod info;
mod output;
mod send;
mod sql;
mod tail;

use std::process::ExitCode;
use std::time::Duration;

use crate::Client;
use clap::Parser;

use self::args::{Cli, Command, Connection};
use self::exit::CliError;

/// Progress and summaries go to stderr, so that stdout holds only rows.
struct Say {
    quiet: bool,
}

impl Say {
    pub fn line(&self, text: impl std::fmt::Display) {
        if !self.quiet {
            eprintln!("sqs-flight: {text}");
        }
    }

    /// Whether live progress may be drawn: stderr is a terminal, and no
    /// --quiet.
    pub fn live(&self) -> bool {
        use std::io::IsTerminal;
        !self.quiet && std::io::stderr().is_terminal()
    }
}

/// `1 message`, `2 messages`, `2 batches`.
fn plural(n: u64, word: &str) -> String {
    match (n, word.ends_with('h')) {
        (1, _) => format!("1 {word}"),
        (_, true) => format!("{n} {word}es"),
        (_, false) => format!("{n} {word}s"),
    }
}

/// Runs the command line of this process (`std::env::args`) to its end.
pub fn main() -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("sqs-flight: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(main_async())
}

async fn main_async() -> ExitCode {
    let cli = Cli::parse();
    let url = cli.connection.url.clone();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => e.report(&url),
    }
}

async fn run(cli: Cli) -> Result<(), CliError> {
    let say = Say { quiet: cli.quiet };
    let client = connect(&cli.connection).await?;
    match cli.command {
        Command::Tables => info::tables(&client).await,
        Command::Schema { table } => info::schema(&client, &table).await,
        Command::Status { table, json } => info::status(&client, table.as_deref(), json).await,
        Command::Tail(args) => tail::run(&client, args, &say).await,
        Command::Sql(args) => sql::run(&client, args, &say).await,
        Command::Send(args) => send::run(&client, args, &say).await,
        Command::InferSchema(args) => infer::run(&client, args, &say).await,
        Command::Commit(args) => commit::run(&client, args).await,
    }
}

async fn connect(c: &Connection) -> Result<Client, CliError> {
    let mut builder =
        Client::builder(&c.url).connect_timeout(Duration::from_secs(c.connect_timeout));
    if let Some(token) = &c.token {
        builder = builder.bearer_token(token);
    }
    if let Some(path) = &c.token_file {
        builder = builder.bearer_token_file(path);
    }
    // SQSF_CA_CERT: the variable's earlier name.
    let ca = c
        .tls_ca
        .clone()
        .or_else(|| std::env::var_os("SQSF_CA_CERT").map(Into::into));
    if let Some(path) = ca {
        builder = builder.ca_certificate_file(path);
    }
    Ok(builder.connect().await?)
}
