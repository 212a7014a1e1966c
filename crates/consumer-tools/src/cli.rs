//! The DLT tools' subcommand, as every service that consumes with this
//! library offers it: `<service> dlt list | show | redrive`.

use clap::{Args, Subcommand};
use service_support::config::parse_positive_duration;
use time::OffsetDateTime;

use idempotent_consumer::DltReason;

#[derive(Debug, Clone, Subcommand)]
pub enum DltCommand {
    /// List DLT records: partition, offset, key, id, reason, attempts, time.
    List(DltFilter),
    /// Show one DLT record with every header decoded.
    Show {
        #[arg(long)]
        partition: i32,
        #[arg(long)]
        offset: i64,
    },
    /// Republish DLT records to their original topic (same key, value,
    /// headers and id) once their cause is fixed.
    Redrive(RedriveArgs),
}

/// Which DLT records a command looks at.
#[derive(Debug, Clone, Default, Args)]
pub struct DltFilter {
    /// Only this reason (invalid-json, missing-header, invalid-header,
    /// unknown-event-type, schema-violation, unknown-aggregate,
    /// retries-exhausted).
    #[arg(long, value_parser = parse_reason)]
    pub reason: Option<DltReason>,
    /// Only this DLT partition.
    #[arg(long)]
    pub partition: Option<i32>,
    /// Only this offset (with --partition).
    #[arg(long, requires = "partition")]
    pub offset: Option<i64>,
    /// Only records with this key (the aggregate's id).
    #[arg(long)]
    pub key: Option<String>,
    /// Only records dead-lettered at or after this time (RFC 3339, or a
    /// duration ago such as 2h).
    #[arg(long, value_parser = parse_time)]
    pub since: Option<OffsetDateTime>,
    /// Only records dead-lettered before this time.
    #[arg(long, value_parser = parse_time)]
    pub until: Option<OffsetDateTime>,
}

#[derive(Debug, Clone, Args)]
pub struct RedriveArgs {
    #[command(flatten)]
    pub filter: DltFilter,
    /// Show what would be redriven; publish and commit nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Records per second at most.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub rate: u32,
    /// Who redrives, as the audit (`dlt_redrive`) records it. Default: the
    /// login name.
    #[arg(long, env = "DLT_OPERATOR")]
    pub operator: Option<String>,
    /// The redrive's own consumer group on the DLT: its committed offsets
    /// mark what was redriven. Default: the service's group + `.redrive`.
    #[arg(long)]
    pub redrive_group: Option<String>,
}

fn parse_reason(value: &str) -> Result<DltReason, String> {
    DltReason::parse(value).ok_or_else(|| {
        let names: Vec<&str> = DltReason::ALL.iter().map(|r| r.as_str()).collect();
        format!("unknown reason; one of {}", names.join(", "))
    })
}

/// RFC 3339, or a duration meaning that long ago.
fn parse_time(value: &str) -> Result<OffsetDateTime, String> {
    if let Ok(at) = OffsetDateTime::parse(value, &time::format_description::well_known::Rfc3339) {
        return Ok(at);
    }
    let ago = parse_positive_duration(value)
        .map_err(|_| format!("{value:?} is neither an RFC 3339 time nor a duration such as 2h"))?;
    let ago = time::Duration::try_from(ago).map_err(|e| e.to_string())?;
    Ok(OffsetDateTime::now_utc() - ago)
}
