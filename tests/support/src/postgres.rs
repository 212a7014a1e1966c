//! A PostgreSQL cluster owned by one test, so the test may stop, crash and
//! restart it. Uses the PostgreSQL binaries `scripts/services` caches
//! (ENTREGA_POSTGRES_BIN); as root, runs them in a user namespace as an
//! ordinary user, as the script does. Like the script's, it asks for a
//! password: as root it runs as a process that owns root's files, and any
//! local user could otherwise write them through it (COPY ... TO).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::time::Duration;

use nix::sys::signal::Signal;
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection};

use crate::eventually::eventually;
use crate::process::{Service, free_port};
use crate::tls::TestCa;

fn required(name: &str) -> String {
    std::env::var(name)
        .unwrap_or_else(|_| panic!("{name} is not set: run the tests through scripts/test"))
}

/// The command prefix that runs PostgreSQL as a non-root user.
pub fn unprivileged(program: String, args: Vec<String>) -> (String, Vec<String>) {
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

pub struct PrivatePostgres {
    pub port: u16,
    /// The superuser's, made up for this cluster (hex: no URL escaping).
    password: String,
    dir: PathBuf,
    process: Option<Service>,
    /// With TLS: the CA whose server certificate it presents; it then lets
    /// in only TLS connections (`hostssl`).
    tls: Option<TestCa>,
}

impl std::fmt::Debug for PrivatePostgres {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Everything but the password.
        f.debug_struct("PrivatePostgres")
            .field("port", &self.port)
            .field("dir", &self.dir)
            .field("process", &self.process)
            .finish_non_exhaustive()
    }
}

impl PrivatePostgres {
    /// A new cluster, started; waits until it accepts connections.
    pub async fn start() -> Self {
        Self::start_with(None).await
    }

    /// A new cluster that accepts only TLS connections, presenting a
    /// certificate for localhost and 127.0.0.1 signed by `ca`; its URLs
    /// ask for `sslmode=verify-full` against that CA.
    pub async fn start_with_tls(ca: TestCa) -> Self {
        Self::start_with(Some(ca)).await
    }

    async fn start_with(tls: Option<TestCa>) -> Self {
        let bin = PathBuf::from(required("ENTREGA_POSTGRES_BIN"));
        let dir =
            std::env::temp_dir().join(format!("entrega-pg-{}", uuid::Uuid::new_v4().simple()));
        let data = dir.join("data");
        std::fs::create_dir(&dir).expect("creating the cluster's directory");
        let password = uuid::Uuid::new_v4().simple().to_string();
        let password_file = dir.join("password");
        // Private from its first byte: no moment in which others may read it.
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&password_file)
            .and_then(|mut file| file.write_all(password.as_bytes()))
            .expect("writing the password file");
        let (program, args) = unprivileged(
            bin.join("initdb").display().to_string(),
            [
                "-D",
                &data.display().to_string(),
                "-U",
                "postgres",
                "--auth=scram-sha-256",
                &format!("--pwfile={}", password_file.display()),
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
        let _ = std::fs::remove_file(&password_file);
        if let Some(ca) = &tls {
            // The key must be private to the server's user: copied, 0600.
            std::fs::copy(&ca.server.cert, dir.join("server.crt")).unwrap();
            let key = std::fs::read(&ca.server.key).unwrap();
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(dir.join("server.key"))
                .and_then(|mut file| file.write_all(&key))
                .unwrap();
            std::fs::write(
                data.join("pg_hba.conf"),
                "hostssl all all 127.0.0.1/32 scram-sha-256\n\
                 hostssl replication all 127.0.0.1/32 scram-sha-256\n",
            )
            .unwrap();
        }
        let mut cluster = Self {
            port: free_port(),
            password,
            dir,
            process: None,
            tls,
        };
        cluster.restart().await;
        cluster
    }

    /// The URL of database `database` on this cluster.
    pub fn url(&self, database: &str) -> String {
        match &self.tls {
            // By name, as a managed server is reached: the relay's
            // replication client verifies names only, not addresses.
            Some(ca) => format!(
                "postgres://postgres:{}@localhost:{}/{database}?sslmode=verify-full&sslrootcert={}",
                self.password,
                self.port,
                ca.ca.display()
            ),
            None => format!(
                "postgres://postgres:{}@127.0.0.1:{}/{database}",
                self.password, self.port
            ),
        }
    }

    /// The CA its certificate is signed by, with TLS.
    pub fn ca(&self) -> Option<&TestCa> {
        self.tls.as_ref()
    }

    /// Starts the cluster again on the same port and data (after a stop or a crash).
    pub async fn restart(&mut self) {
        assert!(self.process.is_none(), "the cluster is running");
        let bin = PathBuf::from(required("ENTREGA_POSTGRES_BIN"));
        let data = self.dir.join("data").display().to_string();
        let port = self.port.to_string();
        let mut settings: Vec<String> = [
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
        .collect();
        if self.tls.is_some() {
            for setting in [
                "ssl=on".to_owned(),
                format!("ssl_cert_file={}", self.dir.join("server.crt").display()),
                format!("ssl_key_file={}", self.dir.join("server.key").display()),
            ] {
                settings.extend(["-c".to_owned(), setting]);
            }
        }
        let (program, args) = unprivileged(bin.join("postgres").display().to_string(), settings);
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
