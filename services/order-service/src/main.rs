use anyhow::Context;
use clap::Parser;
use consumer_tools as tools;
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
    config.resolve_secrets()?;
    match config.command.take() {
        None | Some(Command::Serve) => {}
        Some(Command::Dlt(command)) => {
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
        Some(Command::Migrate { no_grants }) => {
            let pool = order_service::startup::connect(&config)
                .await
                .context("cannot connect to the orders database")?;
            order_service::startup::migrate(&pool, !no_grants).await?;
            tracing::info!(database = %config.database_url, grants = !no_grants, "the orders database is migrated");
            return Ok(());
        }
        Some(Command::Retention) => {
            let options = config.status.options();
            let kafka = options
                .kafka_config(&[])
                .context("invalid Kafka configuration")?;
            let pool = order_service::startup::connect(&config)
                .await
                .context("cannot connect to the orders database")?;
            let deleted = tools::retention::run(
                &kafka,
                &options.topic,
                &pool,
                service_support::consumers::ORDER_STATUS.name,
                options.retention,
            )
            .await
            .context("retention refused or failed")?;
            tools::present::purged(deleted);
            return Ok(());
        }
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
