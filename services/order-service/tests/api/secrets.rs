//! Passwords never reach the terminal: not when a URL is refused, not
//! when the database refuses the password, not in `--help`.

use crate::helpers::{printed, run_to_exit as order_service};

/// The reproduction of a leak: clap's message for a value its parser
/// refused quoted the value, `invalid value 'postgres://app:s3cret@…'`.
#[tokio::test]
async fn a_refused_database_url_is_not_quoted_back() {
    for url in [
        "postgres://app:s3cret-pw@127.0.0.1:5432/orders?sslmode=sometimes",
        "postgres://app:s3cret-pw@127.0.0.1:99999/orders",
        "mysql://app:s3cret-pw@127.0.0.1/orders",
    ] {
        let output = order_service(&["--no-status-consumer"], &[("ORDER_DATABASE_URL", url)]).await;
        let printed = printed(&output);
        assert!(!output.status.success(), "{url} was accepted");
        assert!(printed.contains("ORDER_DATABASE_URL"), "{printed}");
        assert!(
            !printed.contains("s3cret-pw"),
            "the password was printed:\n{printed}"
        );
    }
}

/// A server that wants a password and gets the wrong one: the start fails,
/// naming the database, and the password (from the URL or from its file)
/// is not in the message.
#[tokio::test]
async fn a_refused_password_is_not_printed_whether_in_the_url_or_in_a_file() {
    // scripts/services' PostgreSQL for the broker lets no one in without
    // the right password.
    let server = std::env::var("ENTREGA_BROKER_STORAGE_URL")
        .expect("ENTREGA_BROKER_STORAGE_URL is not set: run the tests through scripts/test");
    let mut url = url::Url::parse(&server).unwrap();
    url.set_path("postgres");
    url.set_password(Some("wr0ng-pw")).unwrap();
    let in_url = url.to_string();
    url.set_password(None).unwrap();
    let without = url.to_string();
    let file = std::env::temp_dir().join(format!("order-db-password-{}", uuid::Uuid::new_v4()));
    std::fs::write(&file, "wr0ng-pw\n").unwrap();
    let file_path = file.display().to_string();
    for envs in [
        vec![("ORDER_DATABASE_URL", in_url.as_str())],
        vec![
            ("ORDER_DATABASE_URL", without.as_str()),
            ("ORDER_DATABASE_PASSWORD_FILE", file_path.as_str()),
        ],
    ] {
        let output = order_service(&["--no-status-consumer"], &envs).await;
        let printed = printed(&output);
        assert!(!output.status.success(), "{envs:?} started");
        assert!(
            printed.contains("password authentication failed"),
            "{printed}"
        );
        assert!(
            printed.contains(":***@"),
            "the URL is named, redacted: {printed}"
        );
        assert!(
            !printed.contains("wr0ng-pw"),
            "the password was printed:\n{printed}"
        );
    }
    std::fs::remove_file(&file).unwrap();
}

/// clap shows each option's environment value in `--help` unless told not
/// to: a URL's password would be on the screen.
#[tokio::test]
async fn help_does_not_show_the_database_url_from_the_environment() {
    let output = order_service(
        &["--help"],
        &[("ORDER_DATABASE_URL", "postgres://app:s3cret-pw@db/orders")],
    )
    .await;
    let printed = printed(&output);
    assert!(printed.contains("ORDER_DATABASE_URL"), "{printed}");
    assert!(!printed.contains("s3cret-pw"), "{printed}");
}
