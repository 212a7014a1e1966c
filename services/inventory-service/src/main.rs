use std::io::Write;

use anyhow::Context;
use clap::Parser;
use idempotent_consumer::tools;
use inventory_service::config::{Cli, Command};
use inventory_service::retention;
use inventory_service::startup::{self, Application};
use service_support::{shutdown, telemetry};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let telemetry = telemetry::init(
        cli.common.log_format,
        "info,sqlx=warn,rdkafka=warn",
        "inventory-service",
    )?;
    let kafka = startup::kafka_config(&cli.common, &[])?;
    let dlt = cli.common.dlt_topic.clone();
    match cli.command {
        None | Some(Command::Serve) => {
            tracing::info!(database = %cli.common.database_url, bootstrap = %cli.common.bootstrap_servers,
                topic = %cli.common.topic, group = %cli.common.group, "starting inventory service");
            let application = Application::build(cli.common, cli.serve)
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
            let group = cli.common.group.clone();
            let database = cli.common.database_url.options.clone();
            if !tools::run(command, kafka, dlt, &group, database).await? {
                std::process::exit(1);
            }
            Ok(())
        }
        Some(Command::Retention) => {
            retention::check(&kafka, &cli.common.topic, &cli.serve.retention)
                .await
                .context("refusing to delete processed rows")?;
            let pool = startup::connect(&cli.common, 2, std::time::Duration::from_secs(60)).await?;
            let deleted = retention::run_once(&pool, cli.serve.retention.retention)
                .await
                .context("retention failed")?;
            // Not println!: it panics when stdout is closed.
            let _ = writeln!(
                std::io::stdout(),
                "deleted {deleted} mensagem_processada row(s) older than the retention"
            );
            Ok(())
        }
    }
}
