use anyhow::Context;
use clap::Parser;
use outbox_relay::{Application, Config};
use service_support::{shutdown, telemetry};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut config = Config::parse();
    config.resolve_secrets()?;
    let telemetry = telemetry::init(
        config.log_format,
        "info,sqlx=warn,rdkafka=warn",
        "outbox-relay",
    )?;
    tracing::info!(database = %config.database_url, bootstrap = %config.bootstrap_servers, "starting outbox relay");
    let application = Application::build(config)
        .await
        .context("outbox relay failed to start")?;
    let stopped = application
        .run_until_stopped(shutdown::signal())
        .await
        .context("outbox relay stopped with an error");
    telemetry.shutdown();
    stopped
}
