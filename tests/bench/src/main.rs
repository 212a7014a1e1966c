//! `bench`: entrega's benchmarks, each run beside its baseline in the same
//! process and reported as `ratio=`; the machine is shared and noisy, so
//! only ratios from one run are compared. Run through `scripts/bench`.

// Benchmarks are programs, not services: a failed step ends the run.
#![allow(clippy::unwrap_used)]

mod all; // every benchmark, and docs/benchmarks.md
mod api; // P1: POST /orders vs pgbench
mod broker_tls; // P3 over SASL_SSL vs plaintext
mod consumer; // P3: the consumer vs the same transaction in SQL
mod cpu; // CPU per component while a load runs
mod history; // P5: relay and consumer with ten million rows of history
mod latency; // P4: created -> reserved latency under load
mod load; // the load generator
mod notify; // LISTEN/NOTIFY's cost on the order transaction
mod pgbench; // pgbench runs as baselines
mod relay; // P2: the relay draining pre-filled rows vs a raw producer
mod report; // a result, and the generated table
mod tracing; // P6: P1 and P3 with tracing on vs off

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "bench", about = "entrega benchmarks, each beside its baseline")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Every benchmark below, then the table in docs/benchmarks.md.
    All(all::Args),
    /// P1: POST /orders at concurrency 16 and 64, beside pgbench running
    /// the same transaction.
    Api(api::Args),
    /// P2: the relay draining pre-filled outbox rows, beside a raw rdkafka
    /// producer sending the same records with the same producer settings.
    Relay(relay::Args),
    /// P3: the inventory consumer on pre-produced records, beside the same
    /// dedupe + reserve transaction run straight from SQL.
    Consumer(consumer::Args),
    /// P3 with the broker over SASL_SSL beside plaintext, interleaved.
    BrokerTls(broker_tls::Args),
    /// P5: P2 and P3 with ten million rows of history, beside empty tables.
    History(history::Args),
    /// P4: latency from outbox row to reservation at 25/50/75 % of the top rate.
    Latency(latency::Args),
    /// P6: P1 and P3 with the OTLP exporter on (sampling 100 %), beside
    /// tracing off.
    Tracing(tracing::Args),
    /// What a NOTIFY in the order transaction costs it: pgbench with and
    /// without, interleaved (why the poll relay polls).
    Notify(notify::Args),
    /// Place orders at a rate (or as fast as possible) for a duration, and
    /// report 2xx/4xx/5xx and latency.
    Load(load::Args),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::All(args) => all::run(args).await,
        Command::Api(args) => api::run(args).await,
        Command::Relay(args) => relay::run(args).await,
        Command::Consumer(args) => consumer::run(args).await,
        Command::BrokerTls(args) => broker_tls::run(args).await,
        Command::Load(args) => load::run(args).await,
        Command::Latency(args) => latency::run(args).await,
        Command::History(args) => history::run(args).await,
        Command::Tracing(args) => tracing::run(args).await,
        Command::Notify(args) => notify::run(args).await,
    }
}
