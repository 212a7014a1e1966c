use anyhow::Context;
use clap::Parser;
use idempotent_consumer::tools;
use order_service::config::Command;
use order_service::{Application, Config};
use service_support::{shutdown, telemetry};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut config = Config::parse();
    let telemetry = telemetry::init(
        config.log_format,
        "info,sqlx=warn,tower_http=info",
        "order-service",
    )?;
    if let Some(Command::Dlt(command)) = config.command.take() {
        let options = config.status.options();
        let kafka = options
            .kafka_config(&[])
            .context("invalid Kafka configuration")?;
        let database = config.database_url.options.clone();
        if !tools::run(command, kafka, options.dlt_topic, &options.group, database).await? {
            std::process::exit(1);
        }
        return Ok(());
    }
    tracing::info!(database = %config.database_url, addr = %config.http_addr, "starting order service");
    let application = Application::build(config)
        .await
        .context("order service failed to start")?;
    let served = application
        .run_until_stopped(shutdown::signal())
        .await
        .context("order service failed while serving");
    telemetry.shutdown();
    served
}
