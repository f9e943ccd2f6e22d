//! How the API answers a request it refuses, shared by the authentication
//! layer, the browser checks and every REST route: the JSON error body, and
//! whether a request is gRPC (which gets a `tonic::Status` instead).

use axum::Json;
use axum::extract::Request;
use http::StatusCode;
use serde_json::json;

/// The error body every REST error uses: `{"error": {"code", "message"}}`.
pub(super) fn json_error(
    status: StatusCode,
    code: &str,
    message: &str,
) -> (StatusCode, Json<serde_json::Value>) {
    (
        status,
        Json(json!({ "error": { "code": code, "message": message } })),
    )
}

/// Parses a JSON request body into `T` (which derives `Deserialize`, with
/// `deny_unknown_fields`), or says what is wrong in words a person can act
/// on, naming the field at fault: `the body is not valid JSON: ...`, `the
/// body must be a JSON object`, `` `prompt`: invalid type: integer `3`,
/// expected a string ``, ``unknown field `colour`, expected one of ...``.
pub(super) fn json_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, String> {
    // A derived struct also reads a JSON array (its fields in order): a
    // body is an object, or refused.
    match body.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => {}
        Some(b'[' | b'"' | b'-' | b'0'..=b'9' | b't' | b'f' | b'n') => {
            return Err("the body must be a JSON object".to_string());
        }
        _ => {}
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let message = inner
            .to_string()
            .replace("expected u32", "expected a whole number")
            .replace("expected u64", "expected a whole number");
        match inner.classify() {
            serde_json::error::Category::Data if path == "." => {
                if message.starts_with("invalid type") {
                    "the body must be a JSON object".to_string()
                } else {
                    message
                }
            }
            serde_json::error::Category::Data => format!("`{path}`: {message}"),
            _ => format!("the body is not valid JSON: {message}"),
        }
    })?;
    de.end()
        .map_err(|e| format!("the body is not valid JSON: {e}"))?;
    Ok(value)
}

/// By its content type (`application/grpc`, `application/grpc+proto`, ...).
pub(super) fn is_grpc(request: &Request) -> bool {
    request
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/grpc"))
}

/// The `code` of a JSON error body for a status that a route or an
/// extractor answered without one.
fn code_for(status: StatusCode) -> &'static str {
    match status {
        StatusCode::BAD_REQUEST => "invalid_argument",
        StatusCode::UNAUTHORIZED => "unauthenticated",
        StatusCode::FORBIDDEN => "permission_denied",
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        StatusCode::UNPROCESSABLE_ENTITY => "invalid_argument",
        StatusCode::TOO_MANY_REQUESTS => "rate_limited",
        s if s.is_server_error() => "internal",
        _ => "invalid_argument",
    }
}

/// Longest body of a plain-text error that is carried into the JSON
/// message (axum's rejections are one line).
const PLAIN_ERROR_KEPT: usize = 1024;

/// Middleware: an error answer that is not JSON (axum's 413 for a body over
/// its limit, 400 for a path or body that does not decode) becomes the
/// documented `{"error": {"code", "message"}}` body with its text as the
/// message. gRPC answers are left alone.
pub(super) async fn json_errors(
    request: Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    use http_body_util::BodyExt as _;
    let grpc = is_grpc(&request);
    let response = next.run(request).await;
    let status = response.status();
    let is_json = response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/json") || ct.starts_with("application/grpc"));
    if grpc || is_json || !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = match http_body_util::Limited::new(body, PLAIN_ERROR_KEPT * 4)
        .collect()
        .await
    {
        Ok(collected) => String::from_utf8_lossy(&collected.to_bytes()).into_owned(),
        Err(_) => String::new(),
    };
    let mut message: String = text.trim().chars().take(PLAIN_ERROR_KEPT).collect();
    if message.is_empty() {
        message = status
            .canonical_reason()
            .unwrap_or("request refused")
            .to_string();
    }
    let mut rewritten = json_error(status, code_for(status), &message).into_response();
    // Keep what the answer said besides its body (Allow, WWW-Authenticate).
    for (name, value) in &parts.headers {
        if name != http::header::CONTENT_TYPE && name != http::header::CONTENT_LENGTH {
            rewritten.headers_mut().insert(name.clone(), value.clone());
        }
    }
    rewritten
}
