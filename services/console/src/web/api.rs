//! The JSON API: what the CLI prints, over HTTP. Errors are problem
//! documents: bad input 4xx; a database or broker that does not answer 503.

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use idempotent_consumer::DltReason;
use idempotent_consumer::tools::DltFilter;
use serde::{Deserialize, Serialize};
use service_support::http::{ApiError, FieldError, Problem, ValidJson, id_from_path};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use utoipa::{IntoParams, ToSchema};

use super::Console;
use crate::dead_letters::{self, DeadLetter, DltError, Listing, RedriveResult};
use crate::health::{self, Health};
use crate::journey::{self, Journey, JourneyError};
use crate::text::chain;

pub(super) fn journey_error(error: &JourneyError) -> ApiError {
    ApiError::Unavailable(chain(error))
}

pub(super) fn dlt_error(error: DltError) -> ApiError {
    match error {
        DltError::UnknownTopic { .. } | DltError::NotFound { .. } => {
            ApiError::NotFound(error.to_string())
        }
        DltError::Operator(_) => {
            ApiError::Validation(vec![FieldError::new("/operator", error.to_string())])
        }
        other => ApiError::Unavailable(chain(&other)),
    }
}

/// Where a message or an order has been.
#[utoipa::path(
    get,
    path = "/api/journey/{id}",
    tag = "journey",
    params(("id" = String, Path, description = "A message id or an order id (UUID)", format = Uuid)),
    responses(
        (status = 200, description = "The journey, steps in time order", body = Journey),
        (status = 400, description = "Not a UUID", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Nothing knows this id", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "A database or the broker did not answer", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(super) async fn get_journey(
    State(console): State<Console>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<Journey>, ApiError> {
    let id = id_from_path(id)?;
    let journey = journey::find(&console.sources, id)
        .await
        .map_err(|error| journey_error(&error))?;
    if !journey.found() {
        return Err(ApiError::NotFound(journey.notes.join("; ")));
    }
    Ok(Json(journey))
}

/// The pipeline's health: lag, outbox backlog, DLT depth, circuits, relay leaders.
#[utoipa::path(get, path = "/api/health", tag = "health",
    responses((status = 200, description = "The numbers; a source that did not answer carries its error", body = Health)))]
pub(super) async fn get_health(State(console): State<Console>) -> Json<Health> {
    Json(health::read(&console.sources).await)
}

/// Which dead letters to list.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct DltQuery {
    /// pedido.eventos.dlt or estoque.eventos.dlt; both when absent.
    pub(super) topic: Option<String>,
    /// A dlt-reason (invalid-json, schema-violation, retries-exhausted, …).
    pub(super) reason: Option<String>,
    /// The record key (the order id).
    pub(super) key: Option<String>,
    /// Dead-lettered at or after (RFC 3339).
    pub(super) since: Option<String>,
    /// Dead-lettered before (RFC 3339).
    pub(super) until: Option<String>,
}

impl DltQuery {
    /// The topic (none for all) and the filter; field errors for what is not valid.
    pub(super) fn parse(&self) -> Result<(Option<&str>, DltFilter), Vec<FieldError>> {
        let mut errors = Vec::new();
        let blank = |value: &Option<String>| {
            value
                .as_deref()
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(str::to_owned)
        };
        let time = |name: &str, value: &Option<String>, errors: &mut Vec<FieldError>| {
            blank(value).and_then(|text| {
                OffsetDateTime::parse(&text, &Rfc3339)
                    .map_err(|_| {
                        errors.push(FieldError::new(format!("/{name}"), "not an RFC 3339 time"))
                    })
                    .ok()
            })
        };
        let reason = blank(&self.reason).and_then(|text| {
            DltReason::parse(&text)
                .ok_or_else(|| errors.push(FieldError::new("/reason", "not a dlt-reason")))
                .ok()
        });
        let since = time("since", &self.since, &mut errors);
        let until = time("until", &self.until, &mut errors);
        let topic = self
            .topic
            .as_deref()
            .map(str::trim)
            .filter(|t| !t.is_empty());
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok((
            topic,
            DltFilter {
                reason,
                key: blank(&self.key),
                since,
                until,
                ..DltFilter::default()
            },
        ))
    }
}

/// Dead letters, newest first.
#[utoipa::path(get, path = "/api/dead-letters", tag = "dead letters", params(DltQuery),
    responses(
        (status = 200, description = "The dead letters that pass the filter", body = Listing),
        (status = 400, description = "An invalid query", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Not a DLT of this pipeline", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The broker did not answer", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn list_dead_letters(
    State(console): State<Console>,
    query: Result<Query<DltQuery>, QueryRejection>,
) -> Result<Json<Listing>, ApiError> {
    let Query(query) = query.map_err(|rejection| ApiError::InvalidPath {
        parameter: "query",
        reason: rejection.body_text(),
    })?;
    let (topic, filter) = query.parse().map_err(ApiError::Validation)?;
    dead_letters::list(&console.sources, topic, &filter)
        .await
        .map(Json)
        .map_err(dlt_error)
}

/// A dead letter's place, from the path.
pub(super) fn position(
    path: Result<Path<(String, String, String)>, PathRejection>,
) -> Result<(String, i32, i64), ApiError> {
    let Path((topic, partition, offset)) = path.map_err(|rejection| ApiError::InvalidPath {
        parameter: "path",
        reason: rejection.body_text(),
    })?;
    let partition = partition.parse().map_err(|_| ApiError::InvalidPath {
        parameter: "partition",
        reason: format!("{partition:?} is not a partition number"),
    })?;
    let offset = offset.parse().map_err(|_| ApiError::InvalidPath {
        parameter: "offset",
        reason: format!("{offset:?} is not an offset"),
    })?;
    Ok((topic, partition, offset))
}

/// One dead letter, every header decoded.
#[utoipa::path(get, path = "/api/dead-letters/{topic}/{partition}/{offset}", tag = "dead letters",
    params(("topic" = String, Path), ("partition" = i32, Path), ("offset" = i64, Path)),
    responses(
        (status = 200, description = "The dead letter", body = DeadLetter),
        (status = 400, description = "An invalid partition or offset", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such DLT or record", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The broker did not answer", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn get_dead_letter(
    State(console): State<Console>,
    path: Result<Path<(String, String, String)>, PathRejection>,
) -> Result<Json<DeadLetter>, ApiError> {
    let (topic, partition, offset) = position(path)?;
    dead_letters::show(&console.sources, &topic, partition, offset)
        .await
        .map(Json)
        .map_err(dlt_error)
}

#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RedriveRequest {
    /// Who redrives, for the audit.
    #[schema(example = "ana")]
    operator: String,
    /// Say what would happen; publish nothing.
    #[serde(rename = "dryRun", default)]
    dry_run: bool,
}

/// Redrive one dead letter to its original topic (same id), or with
/// `dryRun` say what would happen now.
#[utoipa::path(post, path = "/api/dead-letters/{topic}/{partition}/{offset}/redrive", tag = "dead letters",
    params(("topic" = String, Path), ("partition" = i32, Path), ("offset" = i64, Path)),
    request_body = RedriveRequest,
    responses(
        (status = 200, description = "What was done, or would be", body = RedriveResult),
        (status = 400, description = "An invalid partition or offset, or body", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such DLT or record", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "An invalid operator", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The broker or a database did not answer", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn redrive(
    State(console): State<Console>,
    path: Result<Path<(String, String, String)>, PathRejection>,
    ValidJson(request): ValidJson<RedriveRequest>,
) -> Result<Json<RedriveResult>, ApiError> {
    let (topic, partition, offset) = position(path)?;
    dead_letters::redrive_detached(
        console.sources.clone(),
        topic,
        partition,
        offset,
        request.operator,
        "console",
        request.dry_run,
    )
    .await
    .map(Json)
    .map_err(dlt_error)
}
