//! CDC mode (`--mode cdc`; docs/relay.md, "CDC mode"; the choice of crate
//! in docs/notes/cdc-relay.md): the outbox rows read from a logical
//! replication slot (`pgoutput`) instead of polled, made into the very rows
//! and records poll mode makes.

pub mod pgoutput; // Relation and Insert messages, decoded without trusting a byte
pub mod progress; // which WAL position may be confirmed: delivered transactions only
pub mod row; // a WAL row made into the OutboxRow poll mode reads
pub mod slot; // slot and publication set-up, health, the last confirmation
pub mod stream; // the loop: hold the slot, publish in commit order, confirm
