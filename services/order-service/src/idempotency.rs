//! `Idempotency-Key` for POST /orders: the same key with the same body gets
//! the original response and writes nothing new; with another body, an error.
//!
//! The key row is inserted first, in the order's own transaction, with the
//! complete response. A concurrent request with the same key blocks on the
//! primary key until the first transaction ends: after a commit it finds the
//! row and replays it; after a rollback its own insert goes through.

use sha2::{Digest, Sha256};
use sqlx::types::Json;
use sqlx::{PgExecutor, PgPool, Postgres, Transaction};
use time::Duration;

use crate::domain::OrderId;

/// A client-chosen key: 1 to 255 printable ASCII characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    pub const MAX_LEN: usize = 255;

    pub fn parse(value: &str) -> Result<Self, String> {
        if value.is_empty() || value.len() > Self::MAX_LEN {
            return Err(format!("must be 1 to {} characters", Self::MAX_LEN));
        }
        if !value.bytes().all(|b| (0x20..=0x7e).contains(&b)) || value.trim().is_empty() {
            return Err("must be printable ASCII and not blank".to_owned());
        }
        Ok(Self(value.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// SHA-256 of a request body in canonical form (field order fixed by the
/// request type, no whitespace), so formatting differences do not count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHash([u8; 32]);

impl RequestHash {
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl RequestHash {
    pub fn of<T: serde::Serialize>(request: &T) -> Result<Self, serde_json::Error> {
        let canonical = serde_json::to_vec(request)?;
        Ok(Self(Sha256::digest(canonical).into()))
    }
}

/// A response as stored, to be replayed.
#[derive(Debug, Clone, PartialEq)]
pub struct SavedResponse {
    pub status: u16,
    pub body: serde_json::Value,
}

impl SavedResponse {
    /// The status as its smallint column holds it.
    pub fn stored_status(&self) -> i16 {
        i16::try_from(self.status).unwrap_or(i16::MAX)
    }
}

/// What a request does next, as its Idempotency-Key decides.
#[derive(Debug)]
pub enum NextAction {
    /// Do the work in this transaction: the key, if any, is claimed in it,
    /// so a concurrent repeat waits for it to end.
    Proceed(Transaction<'static, Postgres>),
    /// The key was used before with the same request: answer this and
    /// write nothing.
    Replay(SavedResponse),
}

#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    #[error("this Idempotency-Key was already used with a different request")]
    Reused,
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// Begins a request's transaction and, with a `key`, claims the key in it
/// for this request, storing the response it will give.
#[tracing::instrument(skip_all, fields(idempotency.key = key.map(IdempotencyKey::as_str)), err)]
pub async fn begin(
    pool: &PgPool,
    key: Option<&IdempotencyKey>,
    hash: RequestHash,
    order_id: OrderId,
    response: &SavedResponse,
) -> Result<NextAction, ClaimError> {
    let mut tx = pool.begin().await?;
    let Some(key) = key else {
        return Ok(NextAction::Proceed(tx));
    };
    // Two rounds at most: the row found conflicting can be purged (expired)
    // before it is read, and then the key is free again.
    for _ in 0..2 {
        // Insert first, no SELECT before it: the primary key is the lock.
        let inserted = sqlx::query!(
            "insert into idempotency_keys (key, request_hash, response_status, response_body, order_id)
             values ($1, $2, $3, $4, $5)
             on conflict (key) do nothing",
            key.as_str(),
            hash.0.as_slice(),
            response.stored_status(),
            // Json<&Value>: the body is encoded without a copy.
            Json(&response.body) as _,
            order_id.as_uuid(),
        )
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if inserted == 1 {
            return Ok(NextAction::Proceed(tx));
        }
        match saved(&mut *tx, key, hash).await? {
            Some(response) => return Ok(NextAction::Replay(response)),
            None => continue,
        }
    }
    Err(ClaimError::Database(sqlx::Error::RowNotFound))
}

/// The response stored with `key`, claimed before by a request with the
/// same `hash`; `None` when the key's row is gone (expired and purged since
/// the claim conflicted with it): the key is free again.
pub async fn saved(
    conn: impl PgExecutor<'_>,
    key: &IdempotencyKey,
    hash: RequestHash,
) -> Result<Option<SavedResponse>, ClaimError> {
    let saved = sqlx::query!(
        "select request_hash, response_status, response_body from idempotency_keys where key = $1",
        key.as_str(),
    )
    .fetch_optional(conn)
    .await?;
    match saved {
        Some(saved) if saved.request_hash == hash.0 => Ok(Some(SavedResponse {
            status: u16::try_from(saved.response_status).unwrap_or(500),
            body: saved.response_body,
        })),
        Some(_) => Err(ClaimError::Reused),
        None => Ok(None),
    }
}

/// Replaces the response stored with `key`, in the transaction that claimed
/// it: for requests whose response is known only after their work.
pub async fn record_response(
    tx: &mut Transaction<'_, Postgres>,
    key: &IdempotencyKey,
    response: &SavedResponse,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "update idempotency_keys set response_status = $2, response_body = $3 where key = $1",
        key.as_str(),
        response.stored_status(),
        Json(&response.body) as _,
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Deletes keys older than `ttl`, a batch at a time; returns how many went.
pub async fn purge_expired(pool: &PgPool, ttl: Duration, batch: i64) -> Result<u64, sqlx::Error> {
    let mut total = 0;
    loop {
        let deleted = sqlx::query!(
            "delete from idempotency_keys
             where key in (select key from idempotency_keys
                           where created_at < now() - $1::interval
                           order by created_at limit $2
                           for update skip locked)",
            ttl as Duration,
            batch,
        )
        .execute(pool)
        .await?
        .rows_affected();
        total += deleted;
        if deleted < u64::try_from(batch).unwrap_or(u64::MAX) {
            return Ok(total);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_printable_ascii_up_to_255_characters() {
        assert!(IdempotencyKey::parse("3f0b8c9e-order-1").is_ok());
        assert!(IdempotencyKey::parse(&"k".repeat(255)).is_ok());
        for bad in ["", "   ", "clé", "a\tb", &"k".repeat(256)] {
            assert!(IdempotencyKey::parse(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn the_hash_ignores_formatting_but_not_content() {
        let a: serde_json::Value = serde_json::from_str(r#"{"a": 1, "b": [1, 2]}"#).unwrap();
        let b: serde_json::Value = serde_json::from_str(r#"{"b":[1,2],"a":1}"#).unwrap();
        let c: serde_json::Value = serde_json::from_str(r#"{"b":[2,1],"a":1}"#).unwrap();
        assert_eq!(RequestHash::of(&a).unwrap(), RequestHash::of(&b).unwrap());
        assert_ne!(RequestHash::of(&a).unwrap(), RequestHash::of(&c).unwrap());
    }
}
