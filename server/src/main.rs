use clap::Parser;
use sqs_flight_server::{Config, config::Cli, server, telemetry};
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    telemetry::init();
    let config = Config::try_from(Cli::parse())?;
    let listener = server::bind(&config).await?;
    let shutdown = CancellationToken::new();
    tokio::spawn(server::stop_on_signal(shutdown.clone()));
    server::run(listener, config, shutdown).await?;
    Ok(())
}
