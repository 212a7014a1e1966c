//! An inserted outbox row, as the WAL carries it, made into the same
//! [`OutboxRow`] poll mode reads with SQL: from there `to_record` gives the
//! same Kafka record whichever mode read it.

use std::collections::HashMap;

use uuid::Uuid;

use super::pgoutput::Value;
use crate::record::OutboxRow;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RowError {
    #[error("the outbox row has no column {0} (or it is NULL)")]
    Missing(&'static str),
    #[error("the outbox row's {column} is not valid: {value:?}")]
    Invalid { column: &'static str, value: String },
}

fn text(row: &mut HashMap<String, Value>, column: &'static str) -> Result<String, RowError> {
    match row.remove(column) {
        Some(Value::Text(text)) => Ok(text),
        _ => Err(RowError::Missing(column)),
    }
}

/// A nullable column; absent from tables that predate it.
fn optional_text(
    row: &mut HashMap<String, Value>,
    column: &'static str,
) -> Result<Option<String>, RowError> {
    match row.remove(column) {
        Some(Value::Text(text)) => Ok(Some(text)),
        Some(Value::Null) | None => Ok(None),
        Some(Value::Unchanged) => Err(RowError::Missing(column)),
    }
}

/// The row's columns by name (see [`super::pgoutput::Relations::named`]).
pub fn outbox_row(mut row: HashMap<String, Value>) -> Result<OutboxRow, RowError> {
    let id = text(&mut row, "id")?;
    let id = Uuid::parse_str(&id).map_err(|_| RowError::Invalid {
        column: "id",
        value: id,
    })?;
    let seq = text(&mut row, "seq")?;
    let seq = seq.parse().map_err(|_| RowError::Invalid {
        column: "seq",
        value: seq,
    })?;
    let traceparent = optional_text(&mut row, "traceparent")?;
    let tracingspancontext = optional_text(&mut row, "tracingspancontext")?;
    Ok(OutboxRow {
        id,
        aggregatetype: text(&mut row, "aggregatetype")?,
        aggregateid: text(&mut row, "aggregateid")?,
        event_type: text(&mut row, "type")?,
        payload: text(&mut row, "payload")?,
        traceparent,
        tracingspancontext,
        seq,
        attempts: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(traceparent: Value) -> HashMap<String, Value> {
        [
            (
                "id",
                Value::Text("0190f5d2-7c1e-7000-8000-0000000000a1".into()),
            ),
            ("aggregatetype", Value::Text("pedido".into())),
            ("aggregateid", Value::Text("o-1".into())),
            ("type", Value::Text("PedidoCriado".into())),
            ("payload", Value::Text("{\"a\": 1}".into())),
            ("seq", Value::Text("42".into())),
            ("traceparent", traceparent),
            ("attempts", Value::Text("0".into())),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    #[test]
    fn a_wal_row_becomes_the_row_poll_mode_reads() {
        let row = outbox_row(row(Value::Null)).unwrap();
        assert_eq!(row.seq, 42);
        assert_eq!(row.traceparent, None);
        assert_eq!(row.event_type, "PedidoCriado");
        assert_eq!(row.to_record("t.eventos", None).value, b"{\"a\":1}");
    }

    #[test]
    fn a_missing_or_invalid_column_is_an_error() {
        let mut broken = row(Value::Null);
        broken.remove("payload");
        assert_eq!(outbox_row(broken), Err(RowError::Missing("payload")));
        let mut broken = row(Value::Null);
        broken.insert("id".into(), Value::Text("nope".into()));
        assert!(matches!(
            outbox_row(broken),
            Err(RowError::Invalid { column: "id", .. })
        ));
        assert!(outbox_row(row(Value::Unchanged)).is_err());
    }
}
