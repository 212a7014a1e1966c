//! How a finished record ended: the outcome its offset is stored with, and
//! how it is put on the record's span.

use tracing::Span;

use crate::failure::DltReason;

/// What happened to a finished record; its offset may be stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Applied, with the handler's outcome name.
    Applied(&'static str),
    /// Its message id was processed before: no effect.
    Duplicate,
    DeadLettered(DltReason),
}

/// Puts how a record finished on its span: `entrega.outcome` (`applied`,
/// `duplicate`, `dead-lettered`), the handler's effect or the DLT reason.
pub(crate) fn record_outcome(span: &Span, outcome: &Outcome) {
    match outcome {
        Outcome::Applied(effect) => {
            span.record("entrega.outcome", "applied");
            span.record("entrega.effect", *effect);
        }
        Outcome::Duplicate => {
            span.record("entrega.outcome", "duplicate");
        }
        Outcome::DeadLettered(reason) => {
            span.record("entrega.outcome", "dead-lettered");
            span.record("entrega.dlt.reason", reason.as_str());
            span.record("otel.status_code", "ERROR");
        }
    }
}
