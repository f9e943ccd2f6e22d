//! Transport: tonic gRPC services and the axum REST API on one listener.

mod agent;
mod approvals;
pub(crate) mod auth;
pub(crate) mod browser;
mod cameras;
pub(crate) mod connections;
pub mod convert;
mod embodiment;
pub(crate) mod foxglove;
mod gpio;
mod hosts;
mod metrics;
pub use hosts::MAX_HOSTS_LIMIT;
mod recordings;
pub mod relay;
mod reply;
mod rest;
mod safety;
pub(crate) mod scopes;
mod tasks;
pub(crate) mod tracked;
pub(crate) mod ui;

/// A connection's verified client certificate (a request extension).
pub use crate::tls::PeerIdentity;

/// The generated roz.v1 types, where the API's users have found them.
pub use crate::proto;

use std::sync::Arc;

use tonic_health::server::HealthReporter;

use crate::HostContext;

/// Fully qualified name of the agent service, as reflection and health report it.
pub const AGENT_SERVICE_NAME: &str = "roz.v1.AgentService";
/// Fully qualified name of the safety service (protective stop).
pub const SAFETY_SERVICE_NAME: &str = "roz.v1.SafetyService";
/// Fully qualified name of the task service.
pub const TASK_SERVICE_NAME: &str = "roz.v1.TaskService";
/// Fully qualified name of the host registry service.
pub const HOST_SERVICE_NAME: &str = "roz.v1.HostService";

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("cannot build gRPC reflection service: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
}

/// Builds the one router that serves gRPC and REST, behind authentication.
/// `live`: the hub the Foxglove clients at `/foxglove` watch through.
pub(crate) async fn router(
    ctx: Arc<HostContext>,
    live: Arc<crate::live::Hub>,
) -> Result<(axum::Router, HealthReporter), ApiError> {
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<proto::agent_service_server::AgentServiceServer<agent::AgentApi>>()
        .await;
    health_reporter
        .set_serving::<proto::safety_service_server::SafetyServiceServer<safety::SafetyApi>>()
        .await;
    health_reporter
        .set_serving::<proto::task_service_server::TaskServiceServer<tasks::TaskApi>>()
        .await;
    health_reporter
        .set_serving::<proto::host_service_server::HostServiceServer<hosts::HostApi>>()
        .await;
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;
    let grpc = tonic::service::Routes::builder()
        .add_service(proto::agent_service_server::AgentServiceServer::new(
            agent::AgentApi::new(ctx.clone()),
        ))
        .add_service(proto::safety_service_server::SafetyServiceServer::new(
            safety::SafetyApi::new(ctx.clone()),
        ))
        .add_service(proto::task_service_server::TaskServiceServer::new(
            tasks::TaskApi::new(ctx.clone()),
        ))
        .add_service(proto::host_service_server::HostServiceServer::new(
            hosts::HostApi::new(ctx.clone()),
        ))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .clone()
        .routes()
        .into_axum_router();
    let mut router = grpc
        .merge(rest::routes().with_state(ctx.clone()))
        .merge(approvals::routes().with_state(ctx.clone()))
        .merge(safety::routes().with_state(ctx.clone()))
        .merge(tasks::routes().with_state(ctx.clone()))
        .merge(hosts::routes().with_state(ctx.clone()))
        .merge(recordings::routes().with_state(ctx.clone()))
        .merge(gpio::routes().with_state(ctx.clone()))
        .merge(cameras::routes().with_state(ctx.clone()))
        .merge(embodiment::routes().with_state(ctx.clone()))
        .merge(ui::routes().with_state(ctx.clone()));
    let allowed_hosts = Arc::new(browser::AllowedHosts::from_config(&ctx.config));
    let credentials = Arc::new(auth::Credentials::from_config(&ctx.config));
    if ctx.config.foxglove.enabled {
        router = router.merge(foxglove::routes(ctx.clone(), live));
    }
    if ctx.config.mcp.enabled {
        // Behind the same token and browser checks as every route; rmcp's
        // own Host and Origin checks get the same names.
        router = router.merge(crate::mcp::server::router(
            ctx.clone(),
            allowed_hosts.as_list(ctx.listen_addr),
        ));
    }
    let router = router
        .fallback(rest::fallback)
        .method_not_allowed_fallback(rest::method_not_allowed)
        // Inside authentication: what the routes and extractors answer
        // (413, a path that does not decode) becomes the JSON error body.
        .layer(axum::middleware::from_fn(reply::json_errors))
        .layer(axum::middleware::from_fn_with_state(
            credentials.clone(),
            auth::require_credential,
        ))
        // Outermost: a request for another host or from another origin
        // learns nothing, not even whether it would need a token.
        .layer(axum::middleware::from_fn_with_state(
            (allowed_hosts, credentials),
            browser::guard,
        ));
    Ok((router, health_reporter))
}

/// What `[foxglove] listen` serves: `/foxglove` alone (at `/` too, where
/// `ws://host:8765` lands), behind the same credentials and browser checks
/// as the server's listener.
pub(crate) fn foxglove_router(ctx: Arc<HostContext>, live: Arc<crate::live::Hub>) -> axum::Router {
    let allowed_hosts = Arc::new(browser::AllowedHosts::from_config(&ctx.config));
    let credentials = Arc::new(auth::Credentials::from_config(&ctx.config));
    let inner = foxglove::routes(ctx, live)
        .fallback(rest::fallback)
        .method_not_allowed_fallback(rest::method_not_allowed)
        .layer(axum::middleware::from_fn(reply::json_errors))
        .layer(axum::middleware::from_fn_with_state(
            credentials.clone(),
            auth::require_credential,
        ))
        .layer(axum::middleware::from_fn_with_state(
            (allowed_hosts, credentials),
            browser::guard,
        ));
    // Before routing, so that `/` reaches the route and its checks.
    axum::Router::new().fallback_service(tower::ServiceExt::map_request(inner, root_is_foxglove))
}

/// `/` (with its query) becomes `/foxglove` on Foxglove's own port.
fn root_is_foxglove(mut request: axum::extract::Request) -> axum::extract::Request {
    if request.uri().path() == "/" {
        let target = match request.uri().query() {
            Some(query) => format!("{}?{query}", foxglove::PATH),
            None => foxglove::PATH.to_string(),
        };
        let mut parts = request.uri().clone().into_parts();
        parts.path_and_query = target.parse().ok();
        if let Ok(uri) = http::Uri::from_parts(parts) {
            *request.uri_mut() = uri;
        }
    }
    request
}

/// Marks requests that arrived on the local control socket (a request
/// extension): their file permissions authenticated them.
#[derive(Debug, Clone, Copy)]
pub struct ControlSocket;

/// What the local control socket serves: `GET /healthz`, `GET /v1/status`,
/// `GET /v1/observation` (what `rozd status` shows of each sensor),
/// `GET /v1/safety`, `POST /v1/estop`, `POST /v1/estop/clear` and the sim
/// GPIO's `GET /v1/gpio`, `POST /v1/gpio/{pin}`, without
/// bearer tokens (only root and the daemon's group may open the socket) and
/// without the browser checks (no browser can open a Unix socket).
pub(crate) fn control_router(ctx: Arc<HostContext>) -> axum::Router {
    rest::control_routes()
        .merge(safety::routes())
        .merge(gpio::routes())
        .with_state(ctx)
        .fallback(rest::fallback)
        .method_not_allowed_fallback(rest::method_not_allowed)
        .layer(axum::middleware::from_fn(reply::json_errors))
        .layer(axum::Extension(ControlSocket))
        .layer(axum::Extension(auth::Caller::control_socket()))
}
