//! `sqs-flight`: the command-line client of sqs-flight.
//!
//! # Layout
//!
//! - `args`: the clap command line and its help.
//! - `exit`: errors, exit statuses and hints.
//! - `info`: `tables`, `schema`, `status`.
//! - `tail`: read, print, then commit or release, batch by batch.
//! - `sql`: DataFusion over every table of the server.
//! - `send`: input lines in, DoPut batches out, with a progress bar.
//! - `infer`: `infer-schema`, a payload block from a peeked batch.
//! - `output`: table, JSON lines, CSV and body formats.

mod args;
mod exit;
mod infer;
mod info;
mod output;
mod send;
mod sql;
mod tail;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use sqs_flight_client::Client;

use crate::args::{Cli, Command, Connection};
use crate::exit::CliError;

/// Progress and summaries go to stderr, so that stdout holds only rows.
pub struct Say {
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
pub fn plural(n: u64, word: &str) -> String {
    match (n, word.ends_with('h')) {
        (1, _) => format!("1 {word}"),
        (_, true) => format!("{n} {word}es"),
        (_, false) => format!("{n} {word}s"),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
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
