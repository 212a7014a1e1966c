//! CDC mode (`--mode cdc`, issue 16, in progress; docs/notes/cdc-relay.md):
//! the outbox rows read from a logical replication slot (`pgoutput`)
//! instead of polled. Built so far: which WAL position may be confirmed to
//! the server, the decoding of the messages the replication crate hands
//! over as bytes, and the row they carry made into poll mode's row.

pub mod pgoutput; // Relation and Insert messages, decoded without trusting a byte
pub mod progress; // which WAL position may be confirmed: delivered transactions only
pub mod row; // a WAL row made into the OutboxRow poll mode reads
