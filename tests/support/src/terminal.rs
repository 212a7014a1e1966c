//! What the DLT tools print for a record that tries to drive the operator's
//! terminal: the hostile bytes, their escaped form, and the check.

/// An OSC sequence that sets the terminal's title (ESC ] 0 ; … BEL).
pub const CONTROL: &str = "\x1b]0;pwn\x07";

/// [`CONTROL`] as the tools print it (`tools::present::for_terminal`).
pub const CONTROL_ESCAPED: &str = r"\u{1b}]0;pwn\u{7}";

/// Fails unless `printed` (a tool's stdout and stderr) is free of ESC and
/// BEL, showing where they were.
pub fn assert_no_terminal_control(printed: &str) {
    assert!(
        !printed.contains(['\x1b', '\x07']),
        "a record's bytes reached the terminal raw:\n{}",
        printed.replace('\x1b', "<ESC>").replace('\x07', "<BEL>")
    );
}
