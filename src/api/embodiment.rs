//! `GET /v1/embodiment` (read scope, like every GET): what a session
//! starting now is told. JSON by default: the embodiment (the data and its
//! Markdown), the operator's manual, the version a session row records, and
//! the whole text (`briefing`); `?format=markdown` (or `Accept:
//! text/markdown`) answers the embodiment's Markdown alone.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use http::{StatusCode, header};
use serde::Deserialize;
use serde_json::json;

use super::reply::json_error;
use crate::HostContext;

pub(super) fn routes() -> Router<Arc<HostContext>> {
    Router::new().route("/v1/embodiment", get(embodiment))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {
    format: Option<String>,
}

async fn embodiment(
    State(ctx): State<Arc<HostContext>>,
    headers: http::HeaderMap,
    params: Result<Query<Params>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let params = match params {
        Ok(Query(p)) => p,
        Err(e) => {
            return json_error(StatusCode::BAD_REQUEST, "invalid_argument", &e.body_text())
                .into_response();
        }
    };
    let accepts_markdown = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("text/markdown"));
    let markdown = match params.format.as_deref() {
        None => accepts_markdown,
        Some("markdown") => true,
        Some("json") => false,
        Some(other) => {
            return json_error(
                StatusCode::BAD_REQUEST,
                "invalid_argument",
                &format!("format {other:?} is not one of json, markdown"),
            )
            .into_response();
        }
    };
    let briefing = ctx.briefings.current();
    if markdown {
        return (
            [(header::CONTENT_TYPE, "text/markdown; charset=utf-8")],
            briefing.embodiment.markdown.clone(),
        )
            .into_response();
    }
    axum::Json(json!({
        "version": briefing.version,
        "embodiment": *briefing.embodiment,
        "manual": briefing.manual,
        "briefing": briefing.text(),
    }))
    .into_response()
}
