use clap::Parser;
use sqs_flight_server::{Config, config::Cli, server, telemetry};
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let (log_format, print) = (cli.log_format, cli.print_config);
    let config = Config::try_from(cli)?;
    if print {
        print!("{}", config.to_toml());
        return Ok(());
    }
    telemetry::init(log_format);
    let listener = server::bind(&config).await?;
    let shutdown = CancellationToken::new();
    server::stop_on_signal(shutdown.clone())?;
    server::run(listener, config, shutdown).await?;
    Ok(())
}
