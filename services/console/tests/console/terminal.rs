//! What a record holds reaches the operator's terminal escaped: a hostile
//! producer cannot drive it (ANSI/OSC sequences) through `entrega`.

use test_support::terminal::{CONTROL, CONTROL_ESCAPED, assert_no_terminal_control};
use uuid::Uuid;

use crate::helpers::{ConsoleTest, Message, ORDERS_DLT, ORDERS_TOPIC};

#[tokio::test]
async fn dlt_list_and_show_print_a_records_control_characters_escaped() {
    let test = ConsoleTest::new().await;
    let key = format!("key{CONTROL}");
    let value = format!("{{value{CONTROL}");
    let header = format!("header{CONTROL}");
    let id = Uuid::now_v7().to_string();
    let offset = test
        .dead_letter(
            ORDERS_TOPIC,
            ORDERS_DLT,
            "estoque",
            2,
            Message {
                key: key.as_bytes(),
                value: value.as_bytes(),
                headers: &[("id", id.as_bytes()), ("note", header.as_bytes())],
            },
        )
        .await
        .to_string();

    let listed = test.entrega(&["dlt", "list"], &[]).await;
    let shown = test
        .entrega(&["dlt", "show", ORDERS_DLT, "2", &offset], &[])
        .await;
    for run in [&listed, &shown] {
        assert_eq!(run.code, Some(0), "{run:?}");
        assert_no_terminal_control(&format!("{}{}", run.stdout, run.stderr));
    }
    assert!(
        listed.stdout.contains(&format!("key{CONTROL_ESCAPED}")),
        "{listed:?}"
    );
    for expected in [
        format!("key:       key{CONTROL_ESCAPED}"),
        format!("{{value{CONTROL_ESCAPED}"),
        format!("note: header{CONTROL_ESCAPED}"),
    ] {
        assert!(
            shown.stdout.contains(&expected),
            "no {expected:?} in:\n{}",
            shown.stdout
        );
    }
}
