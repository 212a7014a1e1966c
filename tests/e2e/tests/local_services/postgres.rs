//! The PostgreSQL that `scripts/services` runs: as root it runs as a process
//! that owns root's files, so whoever connects as its superuser can write
//! them (`copy ... to '/root/...'`). Only who holds the password may connect.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Output;

use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection};
use test_support::database::TestDatabase;
use test_support::process::free_port;

use crate::{Scratch, root};

/// The URL without its password, as any local user could write it.
fn without_password(url: &str) -> String {
    let options: PgConnectOptions = url.parse().expect("a PostgreSQL URL");
    format!(
        "postgres://{}@{}:{}/{}",
        options.get_username(),
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap_or("postgres")
    )
}

/// The password a URL carries (the scripts write it URL-safe), if any.
fn password(url: &str) -> Option<&str> {
    let (_, rest) = url.split_once("://")?;
    let (userinfo, _) = rest.split_once('@')?;
    userinfo.split_once(':').map(|(_, password)| password)
}

/// psql, as an attacker on the machine would run it: no password from the
/// environment or a password file, never a prompt.
async fn psql_without_password(url: &str, sql: &str) -> Output {
    tokio::process::Command::new("psql")
        .arg(url)
        .args(["-X", "-w", "-At", "-v", "ON_ERROR_STOP=1", "-c", sql])
        .env_remove("PGPASSWORD")
        // A path that cannot exist: no password file, and no warning.
        .env("PGPASSFILE", "/dev/null/none")
        .env("PGCONNECT_TIMEOUT", "5")
        .output()
        .await
        .expect("running psql")
}

async fn assert_refused_without_password(url: &str) {
    let bare = without_password(url);
    let scratch = Scratch::new("entrega-copy");
    let target = scratch.0.join("written-by-the-server");
    let output = psql_without_password(
        &bare,
        &format!("copy (select 'x') to '{}'", target.display()),
    )
    .await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "psql connected to {bare} without a password and ran COPY ... TO a file \
         (written: {}); stderr: {stderr}",
        target.exists()
    );
    assert!(
        stderr.contains("password"),
        "psql failed without a password, but not for want of one: {stderr}"
    );
    assert!(!target.exists(), "the server wrote {}", target.display());
}

#[tokio::test]
async fn the_broker_storage_server_refuses_a_connection_without_the_password() {
    let url = std::env::var("ENTREGA_BROKER_STORAGE_URL")
        .expect("ENTREGA_BROKER_STORAGE_URL is not set: run the tests through scripts/test");
    // The URL scripts/services exports is the way in ...
    let options: PgConnectOptions = url.parse().expect("a PostgreSQL URL");
    let connection = options
        .connect()
        .await
        .expect("the URL `scripts/services env` exports connects");
    connection.close().await.unwrap();
    // ... and without its password there is none.
    assert_refused_without_password(&url).await;
}

/// The clone's scripts/services run against a scratch copy of its state
/// (ENTREGA_LOCAL), with ports of the test's own for its PostgreSQL and its
/// broker: the shared ones are never touched. `down` when dropped, so a
/// failing test leaves no server behind.
struct ScratchServices {
    local: PathBuf,
    port: u16,
    kafka: String,
}

impl ScratchServices {
    fn command(&self, command: &str) -> std::process::Command {
        let mut child = std::process::Command::new(root().join("scripts/services"));
        child
            .arg(command)
            .env("ENTREGA_LOCAL", &self.local)
            .env("ENTREGA_BROKER_PG_PORT", self.port.to_string())
            .env("ENTREGA_KAFKA_ADDR", &self.kafka)
            // `env` keeps what the caller already exports; this test wants
            // what the script itself says.
            .env_remove("ENTREGA_CDC_POSTGRES_URL")
            .env_remove("KAFKA_BOOTSTRAP_SERVERS");
        child
    }

    async fn run(&self, command: &str) -> Output {
        tokio::process::Command::from(self.command(command))
            .output()
            .await
            .unwrap()
    }

    /// A line `export NAME=value` of `scripts/services env`.
    async fn exported(&self, name: &str) -> String {
        let output = self.run("env").await;
        assert!(output.status.success(), "scripts/services env failed");
        let text = String::from_utf8(output.stdout).unwrap();
        let prefix = format!("export {name}=");
        text.lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("scripts/services env does not export {name}:\n{text}"))
            .to_owned()
    }
}

impl Drop for ScratchServices {
    fn drop(&mut self) {
        let _ = self.command("down").status();
    }
}

/// initdb as scripts/services ran it on a0d3f5b: every connection trusted.
fn initdb_with_trust(data: &Path) {
    let bin = PathBuf::from(
        std::env::var("ENTREGA_POSTGRES_BIN")
            .expect("ENTREGA_POSTGRES_BIN is not set: run the tests through scripts/test"),
    );
    let (program, args) = test_support::postgres::unprivileged(
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
        .map(str::to_owned)
        .to_vec(),
    );
    let status = std::process::Command::new(program)
        .args(args)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "initdb failed");
}

#[tokio::test]
async fn up_moves_a_data_directory_initialised_with_trust_to_passwords() {
    let scratch = Scratch::new("entrega-services");
    let services = ScratchServices {
        local: scratch.0.join("local"),
        port: free_port(),
        kafka: format!("127.0.0.1:{}", free_port()),
    };
    let data = services.local.join("postgres/data");
    std::fs::create_dir_all(&data).unwrap();
    initdb_with_trust(&data);

    let up = services.run("up").await;
    let up_log = format!(
        "{}{}",
        String::from_utf8_lossy(&up.stdout),
        String::from_utf8_lossy(&up.stderr)
    );
    assert!(up.status.success(), "scripts/services up failed:\n{up_log}");

    let url = services.exported("ENTREGA_BROKER_STORAGE_URL").await;
    assert!(
        url.contains(&format!(":{}/", services.port)),
        "the broker's storage is not the scratch server: {}",
        without_password(&url)
    );
    let secret = password(&url)
        .unwrap_or_else(|| panic!("the exported URL carries no password: {url}"))
        .to_owned();
    let options: PgConnectOptions = url.parse().unwrap();
    let connection = options
        .connect()
        .await
        .expect("the exported URL connects to the migrated server");
    connection.close().await.unwrap();
    assert_refused_without_password(&url).await;

    let hba = std::fs::read_to_string(data.join("pg_hba.conf")).unwrap();
    let trusting: Vec<&str> = hba
        .lines()
        .filter(|line| !line.trim_start().starts_with('#') && line.contains("trust"))
        .collect();
    assert!(
        trusting.is_empty(),
        "pg_hba.conf still trusts: {trusting:?}"
    );

    // The password is in the URLs `env` prints and in its file, nowhere
    // else: not in a log, not on a command line (which every user can read).
    // The scratch broker answered `up` and holds its topics: it reached its
    // storage with the password.
    assert!(!up_log.contains(&secret), "up printed the password");
    for log in ["postgres/postgres.log", "tansu/tansu.log"] {
        let text = std::fs::read_to_string(services.local.join(log)).unwrap_or_default();
        assert!(!text.contains(&secret), "{log} holds the password");
    }
    for name in ["postgres", "tansu"] {
        let pid = std::fs::read_to_string(services.local.join(format!("run/{name}.pid")))
            .unwrap_or_else(|e| panic!("up started no {name}: {e}"));
        let command_line = std::fs::read(format!("/proc/{}/cmdline", pid.trim())).unwrap();
        assert!(
            !String::from_utf8_lossy(&command_line).contains(&secret),
            "{name}'s command line holds the password"
        );
    }
    let cache = std::env::var_os("ENTREGA_CACHE").map_or_else(
        || PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/entrega"),
        PathBuf::from,
    );
    let file = cache.join("postgres-password");
    let mode = std::fs::metadata(&file)
        .unwrap_or_else(|e| panic!("{}: {e}", file.display()))
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "{} has mode {mode:o}", file.display());
}

/// Tests that log in as a role of their own (to take a grant away) get one
/// with a password: the server trusts no one.
#[tokio::test]
async fn a_role_from_login_role_logs_in_to_the_services_postgresql() {
    let server = std::env::var("ENTREGA_BROKER_STORAGE_URL")
        .expect("ENTREGA_BROKER_STORAGE_URL is not set: run the tests through scripts/test");
    let database = TestDatabase::create(&server, "login_role").await;
    let role = format!(
        "login_role_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let url = database.login_role(&role).await;
    let options: PgConnectOptions = url.parse().unwrap();
    let user = async {
        let mut connection = options.connect().await?;
        let user: String = sqlx::query_scalar("select current_user::text")
            .fetch_one(&mut connection)
            .await?;
        connection.close().await?;
        Ok::<_, sqlx::Error>(user)
    }
    .await;
    let mut admin = database.options.connect().await.unwrap();
    sqlx::query(&format!(r#"drop role "{role}""#))
        .execute(&mut admin)
        .await
        .unwrap();
    let user = user.expect("the role logs in with the URL login_role returned");
    assert_eq!(user, role);
}
