//! Bearer-token authentication for every gRPC call and REST route but
//! `/healthz` on the TCP listener (the control socket's file permissions
//! authenticate its connections; it does not pass through here).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use super::reply::{is_grpc, json_error};
use super::tracked::Connection;
use crate::HostContext;
use crate::config::types::Secret;

/// Paths reachable without a token: liveness probes must work for supervisors.
const PUBLIC_PATHS: &[&str] = &["/healthz"];

pub async fn require_token(
    State(ctx): State<Arc<HostContext>>,
    request: Request,
    next: Next,
) -> Response {
    let public =
        PUBLIC_PATHS.contains(&request.uri().path()) || super::ui::is_page(request.uri().path());
    if public {
        return next.run(request).await;
    }
    // A connection that completed a request past this check is shed only
    // after those that never did (see `connections`).
    let connection = request.extensions().get::<Connection>().cloned();
    let authenticated = |response: Response| {
        if let Some(connection) = &connection {
            connection.mark_authenticated();
        }
        response
    };
    if !ctx.config.auth_required() {
        return authenticated(next.run(request).await);
    }
    let presented = request
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim);
    match presented {
        Some(token) if token_matches(token, &ctx.config.resolved_tokens) => {
            authenticated(next.run(request).await)
        }
        presented => {
            let why = if presented.is_some() {
                "invalid bearer token"
            } else {
                "missing authorization: Bearer <token>"
            };
            tracing::warn!(path = %request.uri().path(), reason = why, "refused unauthenticated request");
            if is_grpc(&request) {
                tonic::Status::unauthenticated(why).into_http::<axum::body::Body>()
            } else {
                let mut response =
                    json_error(http::StatusCode::UNAUTHORIZED, "unauthenticated", why)
                        .into_response();
                response.headers_mut().insert(
                    http::header::WWW_AUTHENTICATE,
                    http::HeaderValue::from_static("Bearer"),
                );
                response
            }
        }
    }
}

/// Compares against every configured token without short-circuiting, so the
/// time taken says nothing about which token (or how much of it) matched.
fn token_matches(presented: &str, tokens: &[Secret]) -> bool {
    let mut matched = subtle::Choice::from(0u8);
    for token in tokens {
        matched |= presented.as_bytes().ct_eq(token.expose().as_bytes());
    }
    matched.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_exact_token_matches() {
        let tokens = [Secret::new("alpha"), Secret::new("beta")];
        assert!(token_matches("beta", &tokens));
        assert!(!token_matches("bet", &tokens));
        assert!(!token_matches("betaa", &tokens));
        assert!(!token_matches("", &tokens));
    }
}
