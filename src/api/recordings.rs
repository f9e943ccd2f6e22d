//! `GET /v1/recordings` (the recordings directory, oldest first) and
//! `GET /v1/recordings/{name}` (one file, streamed). Reads: the `read`
//! scope, like every GET. A name is one path component ending in `.mcap`;
//! anything else (`..`, a slash, a hidden file) is refused with 400.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use http::StatusCode;
use serde_json::json;

use super::reply::json_error;
use crate::HostContext;
use crate::record::files::{self, FilesError};

pub(super) fn routes() -> Router<Arc<HostContext>> {
    Router::new()
        .route("/v1/recordings", get(list))
        .route("/v1/recordings/{name}", get(download))
}

fn internal(e: &FilesError) -> Response {
    tracing::error!(error = %e, "recordings");
    json_error(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        "cannot read the recordings directory; see the daemon log",
    )
    .into_response()
}

/// `{"enabled", "directory", "current_file", "data": [{name, bytes,
/// modified_unix_ms, state}]}`; without `[record]`: enabled false, no data.
async fn list(State(ctx): State<Arc<HostContext>>) -> Response {
    let Some(dir) = ctx.recorder.directory().map(ToOwned::to_owned) else {
        return Json(json!({ "enabled": false, "data": [] })).into_response();
    };
    let current = ctx.recorder.current_file();
    let active = current.clone();
    let listed = tokio::task::spawn_blocking(move || files::list(&dir, active.as_deref())).await;
    match listed {
        Ok(Ok(data)) => Json(json!({
            "enabled": true,
            "directory": ctx.recorder.directory().map(|d| d.display().to_string()),
            "current_file": current,
            "data": data,
        }))
        .into_response(),
        Ok(Err(e)) => internal(&e),
        Err(e) => {
            tracing::error!(error = %e, "recordings: listing task failed");
            json_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "listing failed",
            )
            .into_response()
        }
    }
}

/// The file as `application/octet-stream`; 400 for a name that is not a
/// recording's, 404 for none such (or recording off), 409 for the file
/// being written now.
async fn download(
    State(ctx): State<Arc<HostContext>>,
    name: Result<Path<String>, PathRejection>,
) -> Response {
    let Ok(Path(name)) = name else {
        return json_error(
            StatusCode::BAD_REQUEST,
            "invalid_argument",
            "the recording name does not decode",
        )
        .into_response();
    };
    if !files::valid_name(&name) {
        return json_error(
            StatusCode::BAD_REQUEST,
            "invalid_argument",
            &FilesError::BadName(name).to_string(),
        )
        .into_response();
    }
    let Some(dir) = ctx.recorder.directory() else {
        return json_error(
            StatusCode::NOT_FOUND,
            "not_found",
            "recording is off on this host ([record] is not configured)",
        )
        .into_response();
    };
    if ctx.recorder.current_file().as_deref() == Some(name.as_str()) {
        return json_error(
            StatusCode::CONFLICT,
            "still_recording",
            &format!("{name} is being written; it can be downloaded once it is finished (rotation or shutdown)"),
        )
        .into_response();
    }
    let path = match files::resolve(dir, &name) {
        Ok(path) => path,
        Err(FilesError::NotFound(_)) => {
            return json_error(
                StatusCode::NOT_FOUND,
                "not_found",
                &format!("no recording named {name:?}"),
            )
            .into_response();
        }
        Err(e) => return internal(&e),
    };
    let file = match tokio::fs::File::open(&path).await {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // Deleted by the retention cap in between.
            return json_error(
                StatusCode::NOT_FOUND,
                "not_found",
                &format!("no recording named {name:?}"),
            )
            .into_response();
        }
        Err(e) => {
            return internal(&FilesError::Io {
                path: path.display().to_string(),
                source: e,
            });
        }
    };
    let length = file.metadata().await.map(|m| m.len()).ok();
    let mut response = Response::new(Body::from_stream(tokio_util::io::ReaderStream::new(file)));
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/octet-stream"),
    );
    if let Ok(value) = http::HeaderValue::from_str(&format!("attachment; filename=\"{name}\"")) {
        headers.insert(http::header::CONTENT_DISPOSITION, value);
    }
    if let Some(length) = length {
        headers.insert(
            http::header::CONTENT_LENGTH,
            http::HeaderValue::from(length),
        );
    }
    response
}
