//! Every benchmark in one run, and the table of `docs/benchmarks.md`.

use std::path::PathBuf;
use std::time::Duration;

use crate::report::{self, Figure, Ratio};
use crate::{api, consumer, history, latency, relay, tracing};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Rows drained (P2) and records consumed (P3).
    #[arg(long, default_value_t = 100_000)]
    rows: usize,
    /// Rows of history for P5.
    #[arg(long, default_value_t = 10_000_000)]
    history: i64,
    /// Rows drained and records consumed in each P5 run.
    #[arg(long, default_value_t = 30_000)]
    history_rows: usize,
    /// Where the table goes.
    #[arg(long, default_value = "docs/benchmarks.md")]
    write: PathBuf,
}

pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    let bin = "target/release";
    let mut figures: Vec<Figure> = Vec::new();

    let (order_write_rate, p1) = api::measure(&api::Args {
        service: format!("{bin}/order-service"),
        duration: Duration::from_secs(10),
        rounds: 3,
        pool_size: None,
    })
    .await;
    figures.extend(p1);

    let rows = i64::try_from(args.rows)?;
    let all_setups = <relay::Setup as clap::ValueEnum>::value_variants().to_vec();
    let (drain_rate, p2) = relay::measure(&relay::Args {
        rows,
        relay: format!("{bin}/outbox-relay"),
        setups: all_setups.clone(),
        rounds: 3,
    })
    .await;
    figures.extend(p2);
    if let Some(drain_rate) = drain_rate {
        let keeps_up = Figure {
            name: "P2 relay drain ÷ order write rate".to_owned(),
            figure: format!("{drain_rate:.0} rows/s drained"),
            baseline: format!("POST /orders at 16 connections: {order_write_rate:.0} orders/s"),
            ratio: Some(Ratio::single(drain_rate / order_write_rate)),
            target: "> 1 (the relay keeps up)".to_owned(),
        };
        println!("{}", keeps_up.ratio_line());
        figures.push(keeps_up);
    }

    figures.extend(
        consumer::measure(&consumer::Args::consuming(
            args.rows,
            format!("{bin}/inventory-service"),
        ))
        .await,
    );

    // The modes side by side where the consumer does not hide them behind
    // the broker's 500 ms fetch wait.
    // (The delivery log's cost is P2's question only.)
    let latency_setups: Vec<relay::Setup> = all_setups
        .into_iter()
        .filter(|setup| *setup != relay::Setup::PollNoDeliveryLog)
        .collect();
    for (fetch_wait_max_ms, setups) in
        [(None, vec![relay::Setup::Poll]), (Some(20), latency_setups)]
    {
        figures.extend(
            latency::measure(&latency::Args {
                duration: Duration::from_secs(15),
                bin: bin.to_owned(),
                fetch_wait_max_ms,
                top_rate: None,
                setups,
            })
            .await,
        );
    }

    figures.extend(
        history::measure(&history::Args {
            history: args.history,
            rows: args.history_rows,
        })
        .await,
    );

    figures.extend(
        tracing::measure(&tracing::Args {
            order_service: format!("{bin}/order-service"),
            inventory_service: format!("{bin}/inventory-service"),
            duration: Duration::from_secs(10),
            records: args.rows / 2,
            rounds: 3,
        })
        .await,
    );

    report::write(&args.write, &figures)?;
    println!("wrote {}", args.write.display());
    Ok(())
}
