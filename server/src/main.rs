use clap::Parser;
use sqs_flight_server::{Config, config::Cli, server, telemetry};
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    telemetry::init();
    let config = Config::try_from(Cli::parse())?;
    let listener = server::bind(&config).await?;
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        stop.cancel();
    });
    server::run(listener, config, shutdown).await?;
    Ok(())
}
