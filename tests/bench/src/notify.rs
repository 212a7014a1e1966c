//! What a `NOTIFY` in the order transaction would cost the write path: the
//! order transaction in pgbench with and without `pg_notify` before its
//! commit, rounds interleaved, with a session listening. The poll relay
//! could wake on it instead of polling; docs/relay.md says why it does not.

use std::time::Duration;

use sqlx::Connection;

use crate::api::{order_transaction, orders_database};
use crate::pgbench;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// How long each round runs.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub(crate) duration: Duration,
    /// Rounds of each, interleaved.
    #[arg(long, default_value_t = 2)]
    pub(crate) rounds: u32,
    /// pgbench connections.
    #[arg(long, default_value_t = 16)]
    pub(crate) clients: u32,
}

pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    let database = orders_database("bench_notify").await;
    let plain_script = order_transaction();
    let notifying = plain_script.replace("COMMIT;", "SELECT pg_notify('outbox', '');\nCOMMIT;");
    anyhow::ensure!(notifying != plain_script, "no COMMIT to notify before");
    // A session listening, as the relay would.
    let mut listener = sqlx::postgres::PgListener::connect(&database.url()).await?;
    listener.listen("outbox").await?;
    let drain = tokio::spawn(async move { while listener.recv().await.is_ok() {} });
    let (mut plain, mut notify) = (Vec::new(), Vec::new());
    // Interleaved, and each goes first in turn: the outbox grows as they run.
    for round in 0..args.rounds {
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for notifies in order {
            let (script, rates) = if notifies {
                (notifying.as_str(), &mut notify)
            } else {
                (plain_script.as_str(), &mut plain)
            };
            rates.push(pgbench::tps(&database.url(), script, args.clients, args.duration).await);
        }
    }
    drain.abort();
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    println!(
        "order transaction, {} clients: {:.0} tps plain {plain:.0?}, {:.0} tps with pg_notify {notify:.0?}; ratio {:.2}",
        args.clients,
        mean(&plain),
        mean(&notify),
        mean(&notify) / mean(&plain)
    );
    let mut conn = sqlx::PgConnection::connect(&database.url()).await?;
    let written: i64 = sqlx::query_scalar("select count(*) from outbox")
        .fetch_one(&mut conn)
        .await?;
    anyhow::ensure!(written > 0, "pgbench wrote no outbox rows");
    Ok(())
}
