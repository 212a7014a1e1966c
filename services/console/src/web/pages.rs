//! The page: server-rendered HTML (maud escapes every value), no script,
//! nothing loaded from elsewhere. Forms are plain GETs, and POSTs for the
//! redrive.

use axum::extract::rejection::{FormRejection, PathRejection, QueryRejection};
use axum::extract::{Form, Path, Query, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use maud::{DOCTYPE, Markup, html};
use serde::Deserialize;
use uuid::Uuid;

use super::Console;
use super::api::{DltQuery, position};
use crate::dead_letters::{self, DeadLetter, DltError, RedriveResult};
use crate::health::{self, Health};
use crate::journey::{self, Journey};
use crate::text::{chain, rfc3339};

const STYLE: &str = "
body{font-family:system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:.6rem 1.2rem;display:flex;gap:1.5rem;align-items:center}
header a{color:#fff;text-decoration:none;font-weight:600}
header form{margin-left:auto}
main{padding:1rem 1.2rem;max-width:1400px}
table{border-collapse:collapse;width:100%;background:#fff;margin:.5rem 0 1.2rem}
th,td{border:1px solid #d8dce3;padding:.3rem .5rem;text-align:left;vertical-align:top;font-size:.9rem}
th{background:#eceff3}
code,pre,.mono{font-family:ui-monospace,monospace;font-size:.85rem}
pre{background:#fff;border:1px solid #d8dce3;padding:.6rem;overflow:auto}
.alert{background:#fdecea;border:1px solid #f5c2bd;padding:.4rem .6rem;margin:.3rem 0}
.ok{background:#e8f5e9;border:1px solid #b9dfbd;padding:.4rem .6rem}
.note{color:#6b7280}
.bad{color:#b42318;font-weight:600}
input,select,button{font-size:.9rem;padding:.25rem .4rem}
button{cursor:pointer}
dl{display:grid;grid-template-columns:max-content auto;gap:.2rem 1rem}
dt{font-weight:600}
";

/// The most dead letters the list page renders.
const LIST_LIMIT: usize = 500;

fn page(title: &str, body: Markup) -> Html<String> {
    Html(
        html! {
            (DOCTYPE)
            html lang="en" {
                head {
                    meta charset="utf-8";
                    title { (title) " · entrega console" }
                    style { (maud::PreEscaped(STYLE)) }
                }
                body {
                    header {
                        a href="/" { "entrega" }
                        a href="/" { "Health" }
                        a href="/dead-letters" { "Dead letters" }
                        a href="/docs/" { "API" }
                        form action="/journey" method="get" {
                            input id="journey-id" name="id" size="40"
                                placeholder="message id or order id" required;
                            " "
                            button id="journey-search" type="submit" { "Journey" }
                        }
                    }
                    main { h1 { (title) } (body) }
                }
            }
        }
        .into_string(),
    )
}

fn error_page(status: StatusCode, title: &str, detail: &str) -> Response {
    (status, page(title, html! { p.alert { (detail) } })).into_response()
}

fn dlt_error_page(error: DltError) -> Response {
    match error {
        DltError::UnknownTopic { .. } | DltError::NotFound { .. } => {
            error_page(StatusCode::NOT_FOUND, "Not found", &error.to_string())
        }
        DltError::Operator(_) => error_page(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid operator",
            &error.to_string(),
        ),
        other => error_page(
            StatusCode::SERVICE_UNAVAILABLE,
            "Unavailable",
            &chain(&other),
        ),
    }
}

fn time(at: Option<time::OffsetDateTime>) -> String {
    at.map_or_else(|| "-".to_owned(), rfc3339)
}

pub(super) async fn health_page(State(console): State<Console>) -> Html<String> {
    let health = health::read(&console.sources).await;
    page("Pipeline health", health_body(&health))
}

fn health_body(health: &Health) -> Markup {
    html! {
        p.note { "Read at " (rfc3339(health.read_at)) ". Thresholds as in compose/prometheus/alerts.yml." }
        @if health.alerts.is_empty() {
            p.ok #alerts { "No alert would fire." }
        } @else {
            div #alerts { @for alert in &health.alerts { div.alert { (alert) } } }
        }
        h2 { "Topics" }
        @for topic in &health.topics {
            h3 { code { (topic.topic) } " · group " code { (topic.group) } " · lag " (topic.lag) }
            @if let Some(error) = &topic.error { p.alert { (error) } }
            table.lag {
                tr { th { "partition" } th { "end" } th { "committed" } th { "lag" } }
                @for p in &topic.partitions {
                    tr {
                        td { (p.partition) } td { (p.end) }
                        td { (p.committed.map_or_else(|| "-".to_owned(), |c| c.to_string())) }
                        td class=(if p.lag > health::LAG_ALERT { "bad" } else { "" }) { (p.lag) }
                    }
                }
            }
            p {
                "DLT " a href={ "/dead-letters?topic=" (topic.dlt.topic) } { code { (topic.dlt.topic) } } ": "
                span.dlt-depth { (topic.dlt.depth) } " record(s), "
                span class=(if topic.dlt.unredriven > 0 { "bad" } else { "" }) { (topic.dlt.unredriven) " unredriven" }
                ", newest " (time(topic.dlt.newest))
            }
        }
        h2 { "Outboxes" }
        table #outboxes {
            tr { th { "database" } th { "topic" } th { "pending" } th { "oldest pending (s)" } th { "parked" } th { "held" } th { "relay leader" } }
            @for outbox in &health.outboxes {
                tr {
                    td { (outbox.database.name()) }
                    td { code { (outbox.topic) } }
                    td { (opt(outbox.pending)) }
                    td { (outbox.oldest_pending_seconds.map_or_else(|| "-".to_owned(), |s| format!("{s:.1}"))) }
                    td class=(if outbox.parked.unwrap_or(0) > 0 { "bad" } else { "" }) { (opt(outbox.parked)) }
                    td { (opt(outbox.held)) }
                    td {
                        @match &outbox.leader {
                            Some(leader) => { "pid " (leader.pid) " (" (leader.mode) ", " (leader.application_name.as_deref().unwrap_or("-")) ")" }
                            None => { span.bad { "none" } }
                        }
                        @if let Some(error) = &outbox.error { div.alert { (error) } }
                    }
                }
            }
        }
        h2 { "Services" }
        table #services {
            tr { th { "service" } th { "up" } th { "DLQ circuit" } th { "database" } th { "relay leader" } }
            @for service in &health.services {
                tr {
                    td { (service.name) " " span.note { (service.url) } }
                    td class=(if service.up { "" } else { "bad" }) { (if service.up { "up" } else { "down" }) }
                    td { (flag(service.circuit_open, "open", "closed")) }
                    td { (flag(service.database_available, "available", "unavailable")) }
                    td { (flag(service.leader, "leads", "standby")) }
                }
            }
        }
    }
}

fn opt(value: Option<i64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

fn flag(value: Option<bool>, yes: &str, no: &str) -> String {
    match value {
        Some(true) => yes.to_owned(),
        Some(false) => no.to_owned(),
        None => "-".to_owned(),
    }
}

#[derive(Debug, Deserialize)]
pub(super) struct JourneyQuery {
    id: Option<String>,
}

pub(super) async fn journey_page(
    State(console): State<Console>,
    query: Result<Query<JourneyQuery>, QueryRejection>,
) -> Response {
    let text = match query {
        Ok(Query(JourneyQuery { id: Some(id) })) => id.trim().to_owned(),
        _ => {
            return error_page(
                StatusCode::BAD_REQUEST,
                "Journey",
                "give a message id or an order id",
            );
        }
    };
    let Ok(id) = Uuid::try_parse(&text) else {
        return error_page(
            StatusCode::BAD_REQUEST,
            "Journey",
            &format!("{text:?} is not a message id or order id (a UUID)"),
        );
    };
    match journey::find(&console.sources, id).await {
        Ok(journey) if journey.found() => {
            page(&format!("Journey of {id}"), journey_body(&journey)).into_response()
        }
        Ok(journey) => (
            StatusCode::NOT_FOUND,
            page(&format!("Journey of {id}"), journey_body(&journey)),
        )
            .into_response(),
        Err(error) => error_page(StatusCode::SERVICE_UNAVAILABLE, "Journey", &chain(&error)),
    }
}

fn journey_body(journey: &Journey) -> Markup {
    html! {
        @if let Some(order) = &journey.order {
            p #order {
                "Order " a href={ "/journey?id=" (journey.order_id.as_deref().unwrap_or_default()) } { code { (journey.order_id.as_deref().unwrap_or_default()) } }
                " is " strong #order-status { (order.status) }
                @if let Some(reason) = &order.status_reason { " (" (reason) ")" }
                ", customer " (order.customer_id) ", placed " (rfc3339(order.created_at)) "."
            }
        }
        @for note in &journey.notes { p.note { (note) } }
        @if !journey.steps.is_empty() {
            table #journey-steps {
                tr { th { "time" } th { "place" } th { "what" } th { "message" } th { "evidence" } }
                @for step in &journey.steps {
                    tr.step {
                        td.mono { (time(step.at)) }
                        td { code { (step.place) } }
                        td.what { (step.what) }
                        td {
                            @if let Some(id) = step.message_id {
                                a.mono href={ "/journey?id=" (id) } { (id) }
                            }
                            @if let Some(event) = &step.event_type { " " (event) }
                        }
                        td.mono {
                            @for (name, value) in &step.evidence {
                                div { (name) "=" (value) }
                            }
                        }
                    }
                }
            }
        }
    }
}

pub(super) async fn dead_letters_page(
    State(console): State<Console>,
    query: Result<Query<DltQuery>, QueryRejection>,
) -> Response {
    let Ok(Query(query)) = query else {
        return error_page(StatusCode::BAD_REQUEST, "Dead letters", "invalid query");
    };
    let query = query.without_blanks();
    let (topic, filter) = match query.parse() {
        Ok(parsed) => parsed,
        Err(errors) => {
            let detail: Vec<String> = errors
                .iter()
                .map(|error| format!("{}: {}", error.pointer, error.detail))
                .collect();
            return error_page(StatusCode::BAD_REQUEST, "Dead letters", &detail.join("; "));
        }
    };
    let listing = match dead_letters::list(&console.sources, topic, &filter).await {
        Ok(listing) => listing,
        Err(error) => return dlt_error_page(error),
    };
    let selected = |value: &str| topic == Some(value);
    page(
        "Dead letters",
        html! {
            form #dlt-filter action="/dead-letters" method="get" {
                select name="topic" {
                    option value="" { "all DLTs" }
                    @for flow in &console.sources.flows { option value=(flow.dlt) selected[selected(&flow.dlt)] { (flow.dlt) } }
                }
                " "
                input name="reason" placeholder="reason" value=(query.reason.as_deref().unwrap_or_default());
                " "
                input name="key" placeholder="key (order id)" size="38" value=(query.key.as_deref().unwrap_or_default());
                " "
                input name="since" placeholder="since (RFC 3339)" value=(query.since.as_deref().unwrap_or_default());
                " "
                input name="until" placeholder="until (RFC 3339)" value=(query.until.as_deref().unwrap_or_default());
                " "
                button type="submit" { "Filter" }
            }
            @for note in &listing.notes { p.note { (note) } }
            p {
                (listing.letters.len()) " dead letter(s)"
                @if listing.letters.len() > LIST_LIMIT { "; the newest " (LIST_LIMIT) " shown (filter, or use `entrega dlt list`)" }
            }
            table #dead-letters {
                tr { th { "dead-lettered at" } th { "record" } th { "key" } th { "id" } th { "event" } th { "reason" } th { "attempts" } }
                @for letter in listing.letters.iter().take(LIST_LIMIT) {
                    tr.dead-letter {
                        td.mono { (time(letter.at)) }
                        td { a href={ "/dead-letters/" (letter.topic) "/" (letter.partition) "/" (letter.offset) } {
                            code { (letter.topic) "[" (letter.partition) "]@" (letter.offset) } } }
                        td.mono { (letter.key.as_deref().unwrap_or("(null)")) }
                        td.mono { (letter.message_id.as_deref().unwrap_or("-")) }
                        td { (letter.event_type.as_deref().unwrap_or("-")) }
                        td { (letter.reason.as_deref().unwrap_or("-")) }
                        td { (letter.attempts.map_or_else(|| "-".to_owned(), |a| a.to_string())) }
                    }
                }
            }
        },
    )
    .into_response()
}

pub(super) async fn dead_letter_page(
    State(console): State<Console>,
    path: Result<Path<(String, String, String)>, PathRejection>,
) -> Response {
    let (topic, partition, offset) = match position(path) {
        Ok(position) => position,
        Err(error) => {
            return error_page(StatusCode::BAD_REQUEST, "Dead letter", &error.to_string());
        }
    };
    match dead_letters::show(&console.sources, &topic, partition, offset).await {
        Ok(letter) => page(
            &format!("Dead letter {topic}[{partition}]@{offset}"),
            letter_body(&letter, &console.operator),
        )
        .into_response(),
        Err(error) => dlt_error_page(error),
    }
}

fn letter_body(letter: &DeadLetter, operator: &str) -> Markup {
    let action = format!(
        "/dead-letters/{}/{}/{}/redrive",
        letter.topic, letter.partition, letter.offset
    );
    html! {
        dl #dead-letter {
            dt { "dead-lettered at" } dd { (time(letter.at)) }
            dt { "key" } dd.mono { (letter.key.as_deref().unwrap_or("(null)")) }
            dt { "message id" } dd.mono {
                @if let Some(id) = &letter.message_id { a href={ "/journey?id=" (id) } { (id) } } @else { "-" }
            }
            dt { "event" } dd { (letter.event_type.as_deref().unwrap_or("-")) }
            dt { "reason" } dd #reason { (letter.reason.as_deref().unwrap_or("-")) }
            dt { "attempts" } dd { (letter.attempts.map_or_else(|| "-".to_owned(), |a| a.to_string())) }
            dt { "consumed from" } dd.mono { (letter.original.as_deref().unwrap_or("-")) }
        }
        h2 { "Headers" }
        table #headers {
            tr { th { "name" } th { "value (decoded)" } }
            @for (name, value) in &letter.headers { tr { td.mono { (name) } td.mono { (value) } } }
        }
        h2 { "Value" }
        pre #value { (letter.value.as_deref().unwrap_or("(null)")) }
        h2 { "Redrive" }
        @if letter.skeleton {
            p.alert { "A skeleton: sent without its value (too large for the DLT); it cannot be redriven." }
        } @else {
            form #redrive-form action=(action) method="post" {
                label { "operator " input #operator name="operator" required value=(operator); }
                " "
                label { "admin token " input #token name="token" type="password" required autocomplete="off"; }
                " "
                button #redrive-dry-run type="submit" name="action" value="dry-run" { "Dry run" }
                " "
                button #redrive type="submit" name="action" value="redrive" { "Redrive" }
            }
            p.note { "The copy keeps the record's id: a consumer that already processed it records a duplicate and changes nothing." }
        }
    }
}

#[derive(Debug, Deserialize)]
pub(super) struct RedriveForm {
    operator: String,
    action: String,
    /// The console's admin token (CONSOLE_ADMIN_TOKEN).
    #[serde(default)]
    token: String,
}

pub(super) async fn redrive_page(
    State(console): State<Console>,
    path: Result<Path<(String, String, String)>, PathRejection>,
    form: Result<Form<RedriveForm>, FormRejection>,
) -> Response {
    let (topic, partition, offset) = match position(path) {
        Ok(position) => position,
        Err(error) => return error_page(StatusCode::BAD_REQUEST, "Redrive", &error.to_string()),
    };
    let Ok(Form(form)) = form else {
        return error_page(
            StatusCode::BAD_REQUEST,
            "Redrive",
            "the form needs operator and action",
        );
    };
    if form.token.is_empty() {
        return error_page(
            StatusCode::UNAUTHORIZED,
            "Redrive",
            "a redrive needs the console's admin token",
        );
    }
    if let Err(refused) = console.admin.admits(&form.token) {
        return error_page(StatusCode::FORBIDDEN, "Redrive", &refused.to_string());
    }
    let dry_run = match form.action.as_str() {
        "dry-run" => true,
        "redrive" => false,
        _ => {
            return error_page(
                StatusCode::BAD_REQUEST,
                "Redrive",
                "action is dry-run or redrive",
            );
        }
    };
    let redriven = dead_letters::redrive_detached(
        console.sources.clone(),
        topic,
        partition,
        offset,
        form.operator,
        "console",
        dry_run,
    )
    .await;
    match redriven {
        Ok(result) => page(
            if dry_run {
                "Redrive: dry run"
            } else {
                "Redrive"
            },
            redrive_body(&result),
        )
        .into_response(),
        Err(error) => dlt_error_page(error),
    }
}

fn redrive_body(result: &RedriveResult) -> Markup {
    let letter = &result.letter;
    html! {
        div #redrive-result {
            p {
                (if result.dry_run { "Dry run for " } else { "Redrive of " })
                a href={ "/dead-letters/" (letter.topic) "/" (letter.partition) "/" (letter.offset) } {
                    code { (letter.topic) "[" (letter.partition) "]@" (letter.offset) } }
                " by " (result.operator) ":"
            }
            ul #verdict { @for line in &result.prediction.verdict { li { (line) } } }
            dl {
                dt { "order status now" } dd #prediction-order-status { (result.prediction.order_status.as_deref().unwrap_or("-")) }
                dt { "reservation now" } dd { (result.prediction.reservation.as_deref().unwrap_or("-")) }
                dt { "processed at" } dd { (time(result.prediction.processed_at)) }
                dt { "redriven before" } dd { (result.prediction.redriven_before.len()) " time(s)" }
            }
            @match (&result.redriven_to, result.dry_run) {
                (Some(to), _) => { p.ok #outcome { "Redriven to " code { (to) } "." } }
                (None, true) => { p.note #outcome { "Nothing published: dry run." } }
                (None, false) => { p.alert #outcome { "Nothing published: redriven already, or not redrivable." } }
            }
            @if let Some(id) = &letter.message_id {
                p { a #journey-link href={ "/journey?id=" (id) } { "Journey of message " (id) } }
            }
            @if let Some(key) = &letter.key {
                p { a #order-link href={ "/journey?id=" (key) } { "Journey of order " (key) } }
            }
        }
    }
}
