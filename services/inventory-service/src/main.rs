use anyhow::Context;
use clap::Parser;
use consumer_tools as tools;
use inventory_service::config::{Cli, Command};
use inventory_service::startup::{self, Application};
use service_support::{shutdown, telemetry};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut cli = Cli::parse();
    let telemetry = telemetry::init(
        cli.common.log_format,
        "info,sqlx=warn,rdkafka=warn",
        "inventory-service",
    )?;
    cli.common.resolve_secrets()?;
    let kafka = startup::kafka_config(&cli.consumer)?;
    match cli.command {
        None | Some(Command::Serve) => {
            tracing::info!(database = %cli.common.database_url, bootstrap = %cli.consumer.bootstrap_servers,
                topic = %cli.consumer.topic, group = %cli.consumer.group, "starting inventory service");
            let application = Application::build(&cli.common, cli.consumer, cli.serve)
                .await
                .context("inventory service failed to start")?;
            let stopped = application
                .run_until_stopped(shutdown::signal())
                .await
                .context("inventory service stopped with an error");
            telemetry.shutdown();
            stopped
        }
        Some(Command::Dlt(command)) => {
            let database = cli.common.database_url.options.clone();
            let (dlt, group) = (cli.consumer.dlt_topic, &cli.consumer.group);
            if !tools::run(command, kafka, dlt, group, database).await? {
                std::process::exit(1);
            }
            Ok(())
        }
        Some(Command::Migrate { no_grants }) => {
            let pool =
                startup::connect(&cli.common, 1, std::time::Duration::from_secs(600)).await?;
            startup::migrate(&pool, !no_grants).await?;
            tracing::info!(database = %cli.common.database_url, grants = !no_grants, "the inventory database is migrated");
            Ok(())
        }
        Some(Command::Retention) => {
            let pool = startup::connect(&cli.common, 2, std::time::Duration::from_secs(60)).await?;
            let deleted = tools::retention::run(
                &kafka,
                &cli.consumer.topic,
                &pool,
                inventory_service::event::CONSUMER_NAME,
                cli.consumer.options().retention,
            )
            .await
            .context("retention refused or failed")?;
            tools::present::purged(deleted);
            Ok(())
        }
    }
}
