use std::process::ExitCode;

use clap::Parser;
use sqs_flight_server::{Config, config::Cli, server, telemetry};
use tokio_util::sync::CancellationToken;

/// The name under which this binary is the command-line client.
#[cfg(feature = "cli")]
const CLI_NAME: &str = "sqs-flight";

fn main() -> ExitCode {
    // First: a worker started by the server, whatever the binary's name.
    if sqs_flight_server::sql::worker::invoked() {
        return sqs_flight_server::sql::worker::main();
    }
    #[cfg(feature = "cli")]
    if invoked_as(CLI_NAME) {
        return sqs_flight_client::cli::main();
    }
    match serve() {
        Ok(()) => ExitCode::SUCCESS,
        // As `main` returning the error would print it.
        Err(e) => {
            eprintln!("Error: {e:?}");
            ExitCode::FAILURE
        }
    }
}

/// Whether the program was started under `name` (argv[0]'s file name), as
/// busybox tells its applets apart.
#[cfg(feature = "cli")]
fn invoked_as(name: &str) -> bool {
    std::env::args_os()
        .next()
        .as_deref()
        .map(std::path::Path::new)
        .and_then(std::path::Path::file_name)
        .is_some_and(|file| file == name)
}

#[tokio::main]
async fn serve() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let (log_format, print) = (cli.log_format, cli.print_config);
    let config = Config::try_from(cli)?;
    if print {
        print!("{}", config.to_toml());
        return Ok(());
    }
    telemetry::init(log_format);
    // Each connection takes a file descriptor: use all the process may have.
    server::raise_fd_limit();
    let listener = server::bind(&config).await?;
    let shutdown = CancellationToken::new();
    server::stop_on_signal(shutdown.clone())?;
    server::run(listener, config, shutdown).await?;
    Ok(())
}
