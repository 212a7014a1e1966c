use anyhow::Context;
use clap::Parser;
use consumer_tools::audit::login_name;
use entrega_console::config::{Cli, Command, DltCommand};
use entrega_console::sources::Sources;
use entrega_console::web::{self, Console};
use entrega_console::{dead_letters, health, journey, present};
use http_api::AdminToken;
use service_support::{shutdown, telemetry};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut cli = Cli::parse();
    cli.sources.resolve_secrets()?;
    let telemetry = telemetry::init(
        cli.sources.log_format,
        "warn,entrega_console=info",
        "entrega-console",
    )?;
    let sources = Sources::new(&cli.sources)?;
    let outcome = run(cli.command, sources).await;
    telemetry.shutdown();
    outcome
}

async fn run(command: Command, sources: Sources) -> anyhow::Result<()> {
    match command {
        Command::Journey { id, json } => {
            let journey = journey::find(&sources, id).await.context("journey")?;
            if json {
                present::json(&journey);
            } else {
                present::journey(&journey);
            }
            if !journey.found() {
                std::process::exit(1);
            }
        }
        Command::Health { json } => {
            let health = health::read(&sources).await;
            if json {
                present::json(&health);
            } else {
                present::health(&health);
            }
        }
        Command::Dlt(DltCommand::List {
            topic,
            filter,
            json,
        }) => {
            let listing = dead_letters::list(&sources, topic.as_deref(), &filter)
                .await
                .context("dlt list")?;
            if json {
                present::json(&listing);
            } else {
                present::listing(&listing);
            }
        }
        Command::Dlt(DltCommand::Show {
            topic,
            partition,
            offset,
            json,
        }) => {
            if json {
                let letter = dead_letters::show(&sources, &topic, partition, offset)
                    .await
                    .context("dlt show")?;
                present::json(&letter);
            } else {
                let record = dead_letters::read(&sources, &topic, partition, offset)
                    .await
                    .context("dlt show")?;
                present::dead_letter(&record);
            }
        }
        Command::Dlt(DltCommand::Redrive {
            topic,
            partition,
            offset,
            dry_run,
            operator,
        }) => {
            let operator = operator.unwrap_or_else(login_name);
            let result = dead_letters::redrive(
                &sources, &topic, partition, offset, &operator, "cli", dry_run,
            )
            .await
            .context("dlt redrive")?;
            present::redrive(&result);
        }
        Command::Serve(args) => {
            let listener = tokio::net::TcpListener::bind(args.http_addr)
                .await
                .with_context(|| format!("binding {}", args.http_addr))?;
            tracing::info!(addr = %args.http_addr, "serving the console");
            let admin = args.admin_token().context("the console's admin token")?;
            let console = Console {
                sources,
                operator: login_name(),
                admin: AdminToken::new(admin.as_ref(), "CONSOLE_ADMIN_TOKEN"),
            };
            axum::serve(listener, web::router(console))
                .with_graceful_shutdown(shutdown::signal())
                .await
                .context("serving")?;
        }
    }
    Ok(())
}
