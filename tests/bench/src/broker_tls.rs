//! P3 with the broker over SASL_SSL (SCRAM-SHA-512; TLS verified against a
//! CA made for the run) beside plaintext: two private brokers of one kind
//! (tansu on PostgreSQL storage), the same records, the rounds interleaved.
//! tansu 0.6 cannot serve TLS itself, so the secure broker is reached
//! through the test support's rustls proxy, and the plaintext one through
//! its TCP proxy: both sides pay for one hop through this process.

use test_support::broker::{PrivateBroker, SecureBroker};
use test_support::proxy::TcpProxy;
use test_support::tls::TestCa;

use crate::consumer::{self, Broker, DEFAULT_BATCH_SIZE};
use crate::report::{Figure, Ratio, interleaved, rates};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Records each side consumes, per round.
    #[arg(long, default_value_t = 20_000)]
    records: usize,
    /// Plaintext / SASL_SSL rounds, interleaved.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// The inventory service binary (a release build).
    #[arg(long, default_value = "target/release/inventory-service")]
    service: String,
}

pub(crate) async fn measure(args: &Args) -> Vec<Figure> {
    let ca = TestCa::new();
    let mut plain = PrivateBroker::start().await;
    let hop = TcpProxy::start(plain.address.parse().unwrap()).await;
    plain.stop().await;
    plain.advertise(hop.address.to_string());
    plain.restart().await;
    let mut secure = SecureBroker::start(&ca.ca, &ca.server, &[]).await;
    let password_file = ca.dir().join("kafka-password");
    std::fs::write(&password_file, format!("{}\n", secure.password)).unwrap();
    let sides = [
        Broker::plaintext(hop.address.to_string()),
        Broker {
            bootstrap: secure.bootstrap.clone(),
            properties: secure.client_properties(&ca.ca),
            env: secure.client_env(&ca.ca, &password_file),
        },
    ];
    let consumer_args = consumer::Args::consuming(args.records, args.service.clone());
    let mut figures = Vec::new();
    for (batch_size, kind) in [(1, "per-message"), (DEFAULT_BATCH_SIZE, "batched")] {
        let (sasl_ssl, plaintext) = interleaved(
            args.rounds,
            || consumer::consumer_rate(&consumer_args, &sides[1], batch_size, None, &[], 1),
            || consumer::consumer_rate(&consumer_args, &sides[0], batch_size, None, &[], 1),
        )
        .await;
        let figure = Figure {
            name: format!(
                "P3 consumer over SASL_SSL, {} records, {kind} transactions (batch {batch_size})",
                args.records
            ),
            figure: format!("{} records/s", rates(&sasl_ssl)),
            baseline: format!("plaintext: {} records/s", rates(&plaintext)),
            ratio: Some(Ratio::of_rounds(&sasl_ssl, &plaintext)),
            target: "≥ 0.9".to_owned(),
        };
        println!("{}", figure.ratio_line());
        figures.push(figure);
    }
    plain.stop().await;
    secure.broker.stop().await;
    figures
}

pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    measure(&args).await;
    Ok(())
}
