use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{Connection, Executor, PgConnection};

/// A database created for one test on the server of `server_url`, dropped
/// (with any connection still open) when the value is dropped.
#[derive(Debug)]
pub struct TestDatabase {
    pub name: String,
    pub options: PgConnectOptions,
    url: String,
    maintenance: PgConnectOptions,
}

impl TestDatabase {
    pub async fn create(server_url: &str, prefix: &str) -> Self {
        let maintenance = server_url
            .parse::<PgConnectOptions>()
            .expect("a PostgreSQL URL")
            .database("postgres");
        let name = format!("{prefix}_{}", uuid::Uuid::new_v4().simple());
        let mut admin = PgConnection::connect_with(&maintenance)
            .await
            .expect("PostgreSQL is reachable: run the tests through scripts/test");
        admin
            .execute(format!(r#"create database "{name}""#).as_str())
            .await
            .unwrap();
        admin.close().await.unwrap();
        let mut url = url::Url::parse(server_url).expect("a PostgreSQL URL");
        url.set_path(&name);
        Self {
            options: maintenance.clone().database(&name),
            url: url.to_string(),
            name,
            maintenance,
        }
    }

    /// A fresh database with `migrators`' migrations applied in order, and a
    /// pool of `connections` to it.
    pub async fn create_migrated(
        server_url: &str,
        prefix: &str,
        migrators: &[Migrator],
        connections: u32,
    ) -> (Self, PgPool) {
        let database = Self::create(server_url, prefix).await;
        let pool = PgPoolOptions::new()
            .max_connections(connections)
            .connect_with(database.options.clone())
            .await
            .expect("the new database accepts connections");
        for migrator in migrators {
            migrator
                .run(&pool)
                .await
                .expect("the migrations apply to an empty database");
        }
        (database, pool)
    }

    /// The database's URL, for a service under test: the server's URL with
    /// this database, and nothing added.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// Creates `role`, which may log in with a password of its own, and
    /// returns this database's URL as that role. The PostgreSQL that
    /// scripts/services runs (and [`crate::postgres::PrivatePostgres`])
    /// trusts no one: a role without a password could not log in there.
    /// Dropping the role is the caller's.
    pub async fn login_role(&self, role: &str) -> String {
        create_login(&self.options, role, "").await.url(&self.url)
    }

    pub async fn drop_now(&self) {
        drop_database(&self.maintenance, &self.name).await;
    }
}

async fn drop_database(maintenance: &PgConnectOptions, name: &str) {
    if let Ok(mut admin) = PgConnection::connect_with(maintenance).await {
        // A logical replication slot (the relay's CDC mode) keeps a database
        // from being dropped, even with (force): end its session, drop it.
        for _ in 0..50 {
            for statement in [
                "select pg_terminate_backend(active_pid) from pg_replication_slots
                 where database = $1 and active_pid is not null",
                "select 1 from (select pg_drop_replication_slot(slot_name) from pg_replication_slots
                                where database = $1 and not active) as dropped",
            ] {
                let _ = sqlx::query(statement).bind(name).execute(&mut admin).await;
            }
            let left: Result<i64, _> =
                sqlx::query_scalar("select count(*) from pg_replication_slots where database = $1")
                    .bind(name)
                    .fetch_one(&mut admin)
                    .await;
            if !matches!(left, Ok(n) if n > 0) {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        let _ = admin
            .execute(format!(r#"drop database if exists "{name}" with (force)"#).as_str())
            .await;
    }
}

/// A role that may log in, with its password.
#[derive(Debug, Clone)]
pub struct Login {
    pub name: String,
    pub password: String,
}

impl Login {
    /// `database_url` (a URL of a database on the role's server) as this role.
    pub fn url(&self, database_url: &str) -> String {
        let mut url = url::Url::parse(database_url).expect("a PostgreSQL URL");
        url.set_username(&self.name)
            .expect("a URL with a user name");
        url.set_password(Some(&self.password))
            .expect("a URL with a password");
        url.to_string()
    }
}

/// `create role <name> login password '…' <attributes>` on the server of
/// `admin` (a superuser's options).
async fn create_login(admin: &PgConnectOptions, name: &str, attributes: &str) -> Login {
    let password = uuid::Uuid::new_v4().simple().to_string();
    let mut connection = PgConnection::connect_with(admin).await.unwrap();
    connection
        .execute(
            format!(r#"create role "{name}" login password '{password}' {attributes}"#).as_str(),
        )
        .await
        .unwrap();
    connection.close().await.unwrap();
    Login {
        name: name.to_owned(),
        password,
    }
}

/// Log-in roles made for one test on one server, dropped with the value.
/// Drop it after the test's databases: a role that owns a database, or
/// holds a privilege in one, cannot be dropped.
#[derive(Debug)]
pub struct TestRoles {
    admin: PgConnectOptions,
    prefix: String,
    names: Vec<String>,
}

impl TestRoles {
    /// Roles on `database`'s server, named `<prefix>_<random>_<name>`.
    pub fn on(database: &TestDatabase, prefix: &str) -> Self {
        Self {
            admin: database.options.clone(),
            prefix: format!(
                "{prefix}_{}",
                &uuid::Uuid::new_v4().simple().to_string()[..8]
            ),
            names: Vec::new(),
        }
    }

    /// A new log-in role; `attributes` follow `create role … login
    /// password '…'` (e.g. `in role entrega_relay replication`).
    pub async fn login(&mut self, name: &str, attributes: &str) -> Login {
        let name = format!("{}_{name}", self.prefix);
        let login = create_login(&self.admin, &name, attributes).await;
        self.names.push(name);
        login
    }
}

impl Drop for TestRoles {
    fn drop(&mut self) {
        let admin = self.admin.clone().database("postgres");
        let names = std::mem::take(&mut self.names);
        let _ = std::thread::spawn(move || {
            if let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                runtime.block_on(async {
                    if let Ok(mut connection) = PgConnection::connect_with(&admin).await {
                        for name in names {
                            let drop = format!(r#"drop role if exists "{name}""#);
                            let _ = connection.execute(drop.as_str()).await;
                        }
                    }
                });
            }
        })
        .join();
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let maintenance = self.maintenance.clone();
        let name = self.name.clone();
        // Drop cannot await; a short-lived runtime on its own thread can.
        let _ = std::thread::spawn(move || {
            if let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                runtime.block_on(drop_database(&maintenance, &name));
            }
        })
        .join();
    }
}
