//! How the API answers a request it refuses, shared by the authentication
//! layer, the browser checks and every REST route: the JSON error body, and
//! whether a request is gRPC (which gets a `tonic::Status` instead).

use axum::Json;
use axum::extract::Request;
use http::StatusCode;
use serde_json::json;

/// The error body every REST error uses: `{"error": {"code", "message"}}`.
pub fn json_error(
    status: StatusCode,
    code: &str,
    message: &str,
) -> (StatusCode, Json<serde_json::Value>) {
    (
        status,
        Json(json!({ "error": { "code": code, "message": message } })),
    )
}

/// By its content type (`application/grpc`, `application/grpc+proto`, ...).
pub fn is_grpc(request: &Request) -> bool {
    request
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/grpc"))
}
