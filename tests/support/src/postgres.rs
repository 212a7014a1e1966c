//! A PostgreSQL cluster owned by one test, so the test may stop, crash and
//! restart it. Uses the PostgreSQL binaries `scripts/services` caches
//! (ENTREGA_POSTGRES_BIN); as root, runs them in a user namespace as an
//! ordinary user, as the script does.

use std::path::PathBuf;
use std::time::Duration;

use nix::sys::signal::Signal;
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection};

use crate::eventually::eventually;
use crate::process::{Service, free_port};

fn required(name: &str) -> String {
    std::env::var(name)
        .unwrap_or_else(|_| panic!("{name} is not set: run the tests through scripts/test"))
}

/// The command prefix that runs PostgreSQL as a non-root user.
fn unprivileged(program: String, args: Vec<String>) -> (String, Vec<String>) {
    if nix::unistd::geteuid().is_root() {
        let mut all = vec![
            "--user".to_owned(),
            "--map-user=1000".to_owned(),
            "--map-group=1000".to_owned(),
            program,
        ];
        all.extend(args);
        ("unshare".to_owned(), all)
    } else {
        (program, args)
    }
}

#[derive(Debug)]
pub struct PrivatePostgres {
    pub port: u16,
    dir: PathBuf,
    process: Option<Service>,
}

impl PrivatePostgres {
    /// A new cluster, started; waits until it accepts connections.
    pub async fn start() -> Self {
        let bin = PathBuf::from(required("ENTREGA_POSTGRES_BIN"));
        let dir =
            std::env::temp_dir().join(format!("entrega-pg-{}", uuid::Uuid::new_v4().simple()));
        let data = dir.join("data");
        let (program, args) = unprivileged(
            bin.join("initdb").display().to_string(),
            [
                "-D",
                &data.display().to_string(),
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C.UTF-8",
            ]
            .iter()
            .map(|s| (*s).to_owned())
            .collect(),
        );
        let status = std::process::Command::new(program)
            .args(args)
            .stdout(std::process::Stdio::null())
            .status()
            .expect("running initdb");
        assert!(status.success(), "initdb failed");
        let mut cluster = Self {
            port: free_port(),
            dir,
            process: None,
        };
        cluster.restart().await;
        cluster
    }

    /// The URL of database `database` on this cluster.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// Starts the cluster again on the same port and data (after a stop or a crash).
    pub async fn restart(&mut self) {
        assert!(self.process.is_none(), "the cluster is running");
        let bin = PathBuf::from(required("ENTREGA_POSTGRES_BIN"));
        let data = self.dir.join("data").display().to_string();
        let port = self.port.to_string();
        let (program, args) = unprivileged(
            bin.join("postgres").display().to_string(),
            [
                "-D",
                &data,
                "-p",
                &port,
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "unix_socket_directories=",
                "-c",
                "max_connections=200",
                // For the relay's CDC mode: a logical replication slot.
                "-c",
                "wal_level=logical",
            ]
            .iter()
            .map(|s| (*s).to_owned())
            .collect(),
        );
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.process = Some(Service::start("postgres", &program, &args, &[]));
        let options: PgConnectOptions = self.url("postgres").parse().expect("a PostgreSQL URL");
        eventually(
            "the private PostgreSQL accepts connections",
            Duration::from_secs(30),
            || async {
                let connection = options.connect().await.ok()?;
                connection.close().await.ok()
            },
        )
        .await;
    }

    /// A fast shutdown (SIGINT): sessions end, the cluster stops cleanly.
    pub async fn stop(&mut self) {
        if let Some(process) = self.process.take() {
            process.signal(Signal::SIGINT);
            process.wait(Duration::from_secs(30)).await;
        }
    }

    /// A crash (SIGKILL of the postmaster): the next start recovers from WAL.
    pub async fn crash(&mut self) {
        if let Some(process) = self.process.take() {
            process.kill().await;
        }
        // Orphaned backends notice their postmaster is gone and exit; the
        // next start waits for the port to be free.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        if let Some(process) = &self.process {
            process.signal(Signal::SIGKILL);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
