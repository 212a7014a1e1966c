use anyhow::Context;
use clap::Parser;
use order_service::{Application, Config};
use service_support::{shutdown, telemetry};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = Config::parse();
    telemetry::init(config.log_format, "info,sqlx=warn,tower_http=info");
    tracing::info!(database = %config.database_url, addr = %config.http_addr, "starting order service");
    let application = Application::build(config)
        .await
        .context("order service failed to start")?;
    application
        .run_until_stopped(shutdown::signal())
        .await
        .context("order service failed while serving")
}
