//! The JSON API: what the CLI prints, over HTTP. Errors are problem
//! documents: bad input 4xx; a database or broker that does not answer 503.

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use consumer_tools::DltFilter;
use consumer_tools::audit::{MAX_OPERATOR_LEN, operator_pattern};
use http_api::{Admin, ApiError, FieldError, Problem, ValidJson, id_from_path};
use idempotent_consumer::DltReason;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use utoipa::openapi::schema::{Object, ObjectBuilder, Type};
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
    /// A dead-letter topic of the pipeline; every one when absent or empty.
    pub(super) topic: Option<String>,
    #[param(schema_with = reason_schema)]
    pub(super) reason: Option<String>,
    /// The record key (the order id); any when absent or empty.
    pub(super) key: Option<String>,
    /// Dead-lettered at or after (RFC 3339).
    #[param(format = DateTime)]
    pub(super) since: Option<String>,
    /// Dead-lettered before (RFC 3339).
    #[param(format = DateTime)]
    pub(super) until: Option<String>,
}

/// The `reason` parameter: one of the library's reasons.
fn reason_schema() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(DltReason::ALL.iter().map(|reason| reason.as_str())))
        .description(Some("Only dead letters of this dlt-reason."))
        .build()
}

/// Absent when empty or only whitespace; trimmed otherwise.
fn given(value: &Option<String>) -> Option<String> {
    value
        .as_deref()
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
}

impl DltQuery {
    /// As the page's form sends it: an empty field is no filter, and the
    /// whitespace around a value (pasted) is not part of it.
    pub(super) fn without_blanks(&self) -> Self {
        Self {
            topic: given(&self.topic),
            reason: given(&self.reason),
            key: given(&self.key),
            since: given(&self.since),
            until: given(&self.until),
        }
    }

    /// The topic (none for all) and the filter; field errors for what is
    /// not valid. A reason or a time is taken as given, as the API's
    /// document states it: an empty one is not one.
    pub(super) fn parse(&self) -> Result<(Option<&str>, DltFilter), Vec<FieldError>> {
        let mut errors = Vec::new();
        let time = |name: &str, value: &Option<String>, errors: &mut Vec<FieldError>| {
            value.as_deref().and_then(|text| {
                OffsetDateTime::parse(text, &Rfc3339)
                    .map_err(|_| {
                        errors.push(FieldError::new(format!("/{name}"), "not an RFC 3339 time"))
                    })
                    .ok()
            })
        };
        let reason = self.reason.as_deref().and_then(|text| {
            DltReason::parse(text)
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
                key: given(&self.key),
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
        (status = 400, description = "A query that cannot be read", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Not a DLT of this pipeline", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "An invalid reason or time", body = Problem, content_type = "application/problem+json"),
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
    #[schema(schema_with = operator_schema)]
    operator: String,
    /// Say what would happen; publish nothing.
    #[serde(rename = "dryRun", default)]
    dry_run: bool,
}

/// The `operator` field: the audit's rule (`valid_operator`) as a schema.
fn operator_schema() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .min_length(Some(1))
        .max_length(Some(MAX_OPERATOR_LEN))
        .pattern(Some(operator_pattern()))
        .description(Some(
            "Who redrives, for the audit: no control character, not only whitespace \
             (the whitespace around it is dropped)",
        ))
        .examples(["ana"])
        .build()
}

/// Redrive one dead letter to its original topic (same id), or with
/// `dryRun` say what would happen now.
#[utoipa::path(post, path = "/api/dead-letters/{topic}/{partition}/{offset}/redrive", tag = "dead letters",
    params(("topic" = String, Path), ("partition" = i32, Path), ("offset" = i64, Path)),
    request_body = RedriveRequest,
    security(("adminToken" = [])),
    responses(
        (status = 200, description = "What was done, or would be", body = RedriveResult),
        (status = 400, description = "An invalid partition or offset, or a body that is not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No bearer token", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "Not the admin token, or none is configured (CONSOLE_ADMIN_TOKEN)", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such DLT or record", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Content-Type is not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A body of the wrong shape, or an invalid operator", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The broker or a database did not answer", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn redrive(
    _admin: Admin,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn query(reason: &str, since: &str) -> DltQuery {
        DltQuery {
            reason: Some(reason.to_owned()),
            since: Some(since.to_owned()),
            ..DltQuery::default()
        }
    }

    fn refused(query: &DltQuery) -> Vec<String> {
        query
            .parse()
            .err()
            .unwrap_or_default()
            .into_iter()
            .map(|error| error.pointer)
            .collect()
    }

    #[test]
    fn the_api_takes_a_reason_or_time_as_given_and_the_page_drops_empty_fields() {
        let (_, filter) = query("invalid-json", "2026-12-02T15:00:00+01:00")
            .parse()
            .unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(filter.reason, Some(DltReason::InvalidJson));
        assert!(filter.since.is_some());
        assert_eq!(refused(&query("", "")), ["#/reason", "#/since"]);
        assert_eq!(
            refused(&query("junk", " 2026-12-02T15:00:00Z")),
            ["#/reason", "#/since"]
        );
        let (_, filter) = query(" ", "")
            .without_blanks()
            .parse()
            .unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!((filter.reason, filter.since), (None, None));
        let (_, filter) = query(" retries-exhausted ", " 2026-12-02T15:00:00Z ")
            .without_blanks()
            .parse()
            .unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(filter.reason, Some(DltReason::RetriesExhausted));
        assert!(filter.since.is_some());
    }
}
