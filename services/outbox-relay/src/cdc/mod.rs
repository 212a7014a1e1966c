//! CDC mode (`--mode cdc`, issue 16, in progress): the outbox rows read
//! from a logical replication slot (`pgoutput`) instead of polled. Built so
//! far: [`progress`], which WAL position may be confirmed to the server.

pub mod progress; // which WAL position may be confirmed: delivered transactions only
