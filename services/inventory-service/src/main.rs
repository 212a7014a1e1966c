use anyhow::Context;
use clap::Parser;
use inventory_service::admin::{self, present};
use inventory_service::config::{Cli, Command, DltCommand};
use inventory_service::retention;
use inventory_service::startup::{self, Application};
use service_support::{shutdown, telemetry};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    telemetry::init(cli.common.log_format, "info,sqlx=warn,rdkafka=warn");
    let kafka = startup::kafka_config(&cli.common, &[])?;
    let dlt = cli.common.dlt_topic.clone();
    match cli.command {
        None | Some(Command::Serve) => {
            tracing::info!(database = %cli.common.database_url, bootstrap = %cli.common.bootstrap_servers,
                topic = %cli.common.topic, group = %cli.common.group, "starting inventory service");
            let application = Application::build(cli.common, cli.serve)
                .await
                .context("inventory service failed to start")?;
            application
                .run_until_stopped(shutdown::signal())
                .await
                .context("inventory service stopped with an error")
        }
        Some(Command::Dlt(DltCommand::List(filter))) => {
            let read = admin::list(kafka, dlt, filter)
                .await
                .context("dlt list failed")?;
            present::listing(&read);
            Ok(())
        }
        Some(Command::Dlt(DltCommand::Show { partition, offset })) => {
            let read = admin::show(kafka, dlt, partition, offset)
                .await
                .context("dlt show failed")?;
            if !present::shown(&read, partition, offset) {
                std::process::exit(1);
            }
            Ok(())
        }
        Some(Command::Dlt(DltCommand::Redrive(args))) => {
            let mut progress = present::redrive_progress(args.dry_run);
            let summary = admin::redrive(kafka, dlt, args, &mut progress)
                .await
                .context("dlt redrive failed")?;
            present::redrive_summary(&summary);
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
            present::retention(deleted);
            Ok(())
        }
    }
}
