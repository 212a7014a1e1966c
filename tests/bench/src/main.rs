//! `bench`: entrega's benchmarks, each run beside its baseline in the same
//! process and reported as `ratio=`; the machine is shared and noisy, so
//! only ratios from one run are compared. Run through `scripts/bench`.

// Benchmarks are programs, not services: a failed step ends the run.
#![allow(clippy::unwrap_used)]

mod api; // P1: POST /orders vs pgbench
mod consumer; // P3: the consumer vs the same transaction in SQL
mod load; // the load generator
mod pgbench; // pgbench runs as baselines
mod relay; // P2: the relay draining pre-filled rows vs a raw producer

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "bench", about = "entrega benchmarks, each beside its baseline")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// P1: POST /orders at concurrency 16 and 64, beside pgbench running
    /// the same transaction.
    Api(api::Args),
    /// P2: the relay draining pre-filled outbox rows, beside a raw rdkafka
    /// producer sending the same records with the same producer settings.
    Relay(relay::Args),
    /// P3: the inventory consumer on pre-produced records, beside the same
    /// dedupe + reserve transaction run straight from SQL.
    Consumer(consumer::Args),
    /// Place orders at a rate (or as fast as possible) for a duration, and
    /// report 2xx/4xx/5xx and latency.
    Load(load::Args),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Api(args) => api::run(args).await,
        Command::Relay(args) => relay::run(args).await,
        Command::Consumer(args) => consumer::run(args).await,
        Command::Load(args) => load::run(args).await,
    }
}
