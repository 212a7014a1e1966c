//! What a record holds reaches the operator's terminal escaped: a hostile
//! producer cannot drive it (ANSI/OSC sequences) through `entrega`.

use uuid::Uuid;

use crate::helpers::{ConsoleTest, Message, ORDERS_DLT, ORDERS_TOPIC};

/// An OSC sequence that sets the window title, ended by BEL.
const TERMINAL_CONTROL: &str = "\x1b]0;pwn\x07";
/// The same as the console prints it.
const TERMINAL_CONTROL_ESCAPED: &str = r"\u{1b}]0;pwn\u{7}";

#[tokio::test]
async fn dlt_list_and_show_print_a_records_control_characters_escaped() {
    let test = ConsoleTest::new().await;
    let key = format!("key{TERMINAL_CONTROL}");
    let value = format!("{{value{TERMINAL_CONTROL}");
    let header = format!("header{TERMINAL_CONTROL}");
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
        let printed = format!("{}{}", run.stdout, run.stderr);
        assert!(
            !printed.contains(['\x1b', '\x07']),
            "a record's bytes reached the terminal raw:\n{}",
            printed.replace('\x1b', "<ESC>").replace('\x07', "<BEL>")
        );
    }
    assert!(
        listed
            .stdout
            .contains(&format!("key{TERMINAL_CONTROL_ESCAPED}")),
        "{listed:?}"
    );
    for expected in [
        format!("key:      key{TERMINAL_CONTROL_ESCAPED}"),
        format!("{{value{TERMINAL_CONTROL_ESCAPED}"),
        format!("note: header{TERMINAL_CONTROL_ESCAPED}"),
    ] {
        assert!(
            shown.stdout.contains(&expected),
            "no {expected:?} in:\n{}",
            shown.stdout
        );
    }
}
