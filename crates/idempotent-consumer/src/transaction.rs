//! The transaction that applies a run of records: the dedupe rows first
//! ([`processed::claim`]), then the handler's effect for the messages seen
//! for the first time, then the claims of refused messages withdrawn, then
//! commit. Nothing else touches the database on a record's behalf.

use sqlx::pool::PoolConnection;
use sqlx::{Connection, PgPool, Postgres};
use tracing::Span;
use uuid::Uuid;

use crate::failure::InvalidMessage;
use crate::handler::{Claimed, Handler, Verdict};
use crate::outcome::Outcome;
use crate::processed;
use crate::record::Record;

/// How a record of a committed transaction finished: with its outcome, or
/// refused by the handler and still to be dead-lettered.
#[derive(Debug)]
pub(crate) enum Committed {
    Finished(Outcome),
    Refused(InvalidMessage),
}

/// A record that parsed, with its message id and its processing span.
pub(crate) struct Valid<'a, M> {
    pub(crate) record: &'a Record,
    pub(crate) span: &'a Span,
    pub(crate) id: Uuid,
    pub(crate) message: M,
}

/// The transaction of `run`: dedupe rows first, then the effect.
///
/// `live`: a connection that answers is drawn (see [`live_connection`]),
/// for a retry.
pub(crate) async fn transact<H: Handler>(
    handler: &H,
    pool: &PgPool,
    run: &[&Valid<'_, H::Message>],
    live: bool,
) -> Result<Vec<Committed>, sqlx::Error> {
    let mut connection = if live {
        live_connection(pool).await?
    } else {
        pool.acquire().await?
    };
    let mut tx = connection.begin().await?;
    let ids: Vec<Uuid> = run.iter().map(|valid| valid.id).collect();
    let mut claimed = processed::claim(&mut tx, handler.consumer_name(), &ids).await?;
    // A message id is claimed once; a second copy in the run is a duplicate.
    let fresh: Vec<bool> = run.iter().map(|valid| claimed.remove(&valid.id)).collect();
    let messages: Vec<Claimed<'_, H::Message>> = run
        .iter()
        .zip(&fresh)
        .filter(|(_, fresh)| **fresh)
        .map(|(valid, _)| Claimed {
            id: valid.id,
            message: &valid.message,
            record: valid.record,
            span: valid.span,
        })
        .collect();
    let verdicts = handler.apply(&mut tx, &messages).await?;
    if verdicts.len() != messages.len() {
        return Err(sqlx::Error::Decode(
            format!(
                "the handler returned {} verdicts for {} messages",
                verdicts.len(),
                messages.len()
            )
            .into(),
        ));
    }
    // A refused message leaves no claim behind: a redrive applies it.
    let refused: Vec<Uuid> = messages
        .iter()
        .zip(&verdicts)
        .filter(|(_, verdict)| matches!(verdict, Verdict::Refused(_)))
        .map(|(claimed, _)| claimed.id)
        .collect();
    if !refused.is_empty() {
        processed::withdraw(&mut tx, handler.consumer_name(), &refused).await?;
    }
    tx.commit().await?;
    // Verdicts belong to the fresh messages only, in order.
    let mut verdicts = verdicts.into_iter();
    Ok(fresh
        .into_iter()
        .map(|fresh| match fresh.then(|| verdicts.next()).flatten() {
            Some(Verdict::Applied(outcome)) => Committed::Finished(Outcome::Applied(outcome)),
            Some(Verdict::Refused(invalid)) => Committed::Refused(invalid),
            None => Committed::Finished(Outcome::Duplicate),
        })
        .collect())
}

/// A pooled connection that answered a ping. The pool hands connections out
/// without one (a round trip per transaction saved), so after a database
/// restart or `pg_terminate_backend` its idle connections are all dead, and
/// retries that drew them one by one would fail without the database being
/// at fault. A retry therefore closes dead connections until one answers,
/// or the pool opens a new one.
async fn live_connection(pool: &PgPool) -> Result<PoolConnection<Postgres>, sqlx::Error> {
    let mut dead = 0;
    loop {
        let mut connection = pool.acquire().await?;
        match connection.ping().await {
            Ok(()) => {
                if dead > 0 {
                    tracing::info!(
                        closed = dead,
                        "closed dead pooled connections before a retry"
                    );
                }
                return Ok(connection);
            }
            // More dead ones than the pool can hold: the database itself is
            // failing.
            Err(error) if dead >= pool.options().get_max_connections() => return Err(error),
            Err(_) => {
                connection.close_on_drop();
                dead += 1;
            }
        }
    }
}
