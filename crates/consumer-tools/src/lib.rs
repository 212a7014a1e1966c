//! The operator's tools for any consumer built on the idempotent-consumer
//! library: list, show and redrive its dead letters (with the audit of who
//! redrove what), and the retention of its dedupe rows. They return what
//! they found or did; [`present`] prints it. A service declares its
//! consumer's options with [`consumer_args!`], mounts [`DltCommand`] as its
//! `dlt` subcommand and hands it to [`run`], and runs [`retention::run`] for
//! its `retention` subcommand.

pub mod args; // the consumer's command line, under a service's prefixes
pub mod audit; // the redrive audit: who redrove what, when, to where
mod cli; // the subcommand and its arguments
mod dlt_read; // reading the DLT from its low watermark up to its current end
mod list; // dlt list and dlt show
pub mod present; // the tools' output: the only place that prints
mod redrive; // dlt redrive
pub mod retention; // the retention options and command

use rdkafka::ClientConfig;
use sqlx::postgres::PgConnectOptions;

pub use audit::{Audit, AuditEntry, OperatorError};
pub use cli::{DltCommand, DltFilter, RedriveArgs};
pub use dlt_read::{DltRead, Expired, ReadError, dead_lettered_at, matches};
pub use list::{list, show};
// For the expansion of `consumer_args!` in a service.
#[doc(hidden)]
pub use idempotent_consumer::{Circuit, ConsumerOptions, Retention};
#[doc(hidden)]
pub use service_support::config::parse_positive_duration;

pub use redrive::{RedriveError, RedriveStep, RedriveSummary, redrive, redrive_group};

#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error("dlt list failed")]
    List(#[source] ReadError),
    #[error("dlt show failed")]
    Show(#[source] ReadError),
    #[error("dlt redrive failed")]
    Redrive(#[from] RedriveError),
    #[error("dlt redrive: --operator")]
    Operator(#[from] OperatorError),
}

/// Runs `command` on `dlt`, the DLT of the consumer group `group`, and
/// prints what it found; a redrive is recorded in the audit of `database`,
/// the consumer's own. Returns false when `dlt show` found no record.
pub async fn run(
    command: DltCommand,
    config: ClientConfig,
    dlt: String,
    group: &str,
    database: PgConnectOptions,
) -> Result<bool, ToolError> {
    match command {
        DltCommand::List(filter) => {
            let read = list(config, dlt, filter).await.map_err(ToolError::List)?;
            present::listing(&read);
            Ok(true)
        }
        DltCommand::Show { partition, offset } => {
            let read = show(config, dlt, partition, offset)
                .await
                .map_err(ToolError::Show)?;
            Ok(present::shown(&read, partition, offset))
        }
        DltCommand::Redrive(args) => {
            let redrive_group = args
                .redrive_group
                .clone()
                .unwrap_or_else(|| redrive::redrive_group(group));
            let operator = args.operator.clone().unwrap_or_else(audit::login_name);
            let audit = Audit::new(database, &operator, "cli")?;
            let mut progress = present::redrive_progress(args.dry_run);
            let summary = redrive(config, dlt, &redrive_group, args, &audit, &mut progress).await?;
            present::redrive_summary(&summary);
            Ok(true)
        }
    }
}
