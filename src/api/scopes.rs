//! What each route and gRPC method needs of its caller: the one table the
//! authentication layer consults for every request (docs/guides/tls-and-credentials.md, "Credentials
//! and scopes" shows it). Plain data, no I/O.

use http::Method;

use crate::config::types::Scope;

/// What a request needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Need {
    /// No credential: liveness probes.
    Public,
    /// Any authenticated caller, whatever its scope: triggering a
    /// protective stop (anyone may stop; only admin may clear).
    Authenticated,
    /// A credential with at least this scope.
    Scope(Scope),
}

/// gRPC methods by full path. Methods of these services not listed (none
/// today) need admin.
const GRPC: &[(&str, Need)] = &[
    (
        "/roz.v1.AgentService/StreamSession",
        Need::Scope(Scope::Operate),
    ),
    ("/roz.v1.AgentService/WatchTeam", Need::Scope(Scope::Read)),
    (
        "/roz.v1.SafetyService/GetSafetyStatus",
        Need::Scope(Scope::Read),
    ),
    ("/roz.v1.SafetyService/TriggerEstop", Need::Authenticated),
    (
        "/roz.v1.SafetyService/ClearEstop",
        Need::Scope(Scope::Admin),
    ),
    (
        "/roz.v1.TaskService/CreateTask",
        Need::Scope(Scope::Operate),
    ),
    ("/roz.v1.TaskService/GetTask", Need::Scope(Scope::Read)),
    ("/roz.v1.TaskService/ListTasks", Need::Scope(Scope::Read)),
    (
        "/roz.v1.TaskService/CancelTask",
        Need::Scope(Scope::Operate),
    ),
    (
        "/roz.v1.TaskService/ApproveToolUse",
        Need::Scope(Scope::Operate),
    ),
    (
        "/roz.v1.TaskService/StreamTaskStatus",
        Need::Scope(Scope::Read),
    ),
    (
        "/roz.v1.HostService/RegisterHost",
        Need::Scope(Scope::Admin),
    ),
    ("/roz.v1.HostService/GetHost", Need::Scope(Scope::Read)),
    ("/roz.v1.HostService/ListHosts", Need::Scope(Scope::Read)),
    (
        "/roz.v1.HostService/DeregisterHost",
        Need::Scope(Scope::Admin),
    ),
];

/// Services every method of which only reads: health and reflection.
const READ_SERVICES: &[&str] = &[
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1.ServerReflection/",
    "/grpc.reflection.v1alpha.ServerReflection/",
];

/// REST requests that change state, by method and path pattern (`*`: one
/// path segment).
const REST_CHANGES: &[(&str, Need)] = &[
    ("/v1/estop", Need::Authenticated),
    ("/v1/fleet/estop", Need::Authenticated),
    ("/v1/estop/clear", Need::Scope(Scope::Admin)),
    ("/v1/fleet/estop/clear", Need::Scope(Scope::Admin)),
    ("/v1/tasks", Need::Scope(Scope::Operate)),
    ("/v1/tasks/*/cancel", Need::Scope(Scope::Operate)),
    ("/v1/tasks/*/approvals", Need::Scope(Scope::Operate)),
    ("/v1/approvals/*", Need::Scope(Scope::Operate)),
];

/// Paths reachable without a credential.
const PUBLIC: &[&str] = &["/healthz"];

/// What `method path` needs. Reads (GET, HEAD) of anything not public need
/// `read`; a state change not in the table needs `admin`, so a route added
/// without a line here fails closed.
pub(crate) fn need(method: &Method, path: &str) -> Need {
    // The dashboard's page and assets load without a credential; the page
    // then calls the API with one.
    if PUBLIC.contains(&path) || super::ui::is_page(path) {
        return Need::Public;
    }
    // MCP: the host tools (actuators among them) for MCP clients.
    if path == "/mcp" {
        return Need::Scope(Scope::Operate);
    }
    if let Some((_, need)) = GRPC.iter().find(|(p, _)| *p == path) {
        return *need;
    }
    if READ_SERVICES.iter().any(|s| path.starts_with(s)) {
        return Need::Scope(Scope::Read);
    }
    if matches!(*method, Method::GET | Method::HEAD) {
        return Need::Scope(Scope::Read);
    }
    REST_CHANGES
        .iter()
        .find(|(pattern, _)| matches_pattern(pattern, path))
        .map_or(Need::Scope(Scope::Admin), |(_, need)| *need)
}

fn matches_pattern(pattern: &str, path: &str) -> bool {
    let mut p = pattern.split('/');
    let mut q = path.split('/');
    loop {
        match (p.next(), q.next()) {
            (None, None) => return true,
            (Some("*"), Some(seg)) if !seg.is_empty() => {}
            (Some(a), Some(b)) if a == b => {}
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stop_is_anyones_its_clear_admins() {
        for (method, path) in [
            (Method::POST, "/v1/estop"),
            (Method::POST, "/v1/fleet/estop"),
            (Method::POST, "/roz.v1.SafetyService/TriggerEstop"),
        ] {
            assert_eq!(need(&method, path), Need::Authenticated, "{path}");
        }
        for path in [
            "/v1/estop/clear",
            "/v1/fleet/estop/clear",
            "/roz.v1.SafetyService/ClearEstop",
            "/roz.v1.HostService/RegisterHost",
            "/roz.v1.HostService/DeregisterHost",
        ] {
            assert_eq!(
                need(&Method::POST, path),
                Need::Scope(Scope::Admin),
                "{path}"
            );
        }
    }

    #[test]
    fn sessions_tasks_and_approvals_need_operate_reads_need_read() {
        for path in [
            "/roz.v1.AgentService/StreamSession",
            "/roz.v1.TaskService/CreateTask",
            "/roz.v1.TaskService/ApproveToolUse",
            "/v1/tasks",
            "/v1/tasks/t-1/cancel",
            "/v1/tasks/t-1/approvals",
            "/v1/approvals/a-1",
            "/mcp",
        ] {
            assert_eq!(
                need(&Method::POST, path),
                Need::Scope(Scope::Operate),
                "{path}"
            );
        }
        for path in [
            "/v1/status",
            "/v1/audit",
            "/v1/tasks/t-1",
            "/v1/hosts",
            "/v1/approvals",
            "/metrics",
            "/v1/observation/stream",
            "/v1/anything-new",
        ] {
            assert_eq!(need(&Method::GET, path), Need::Scope(Scope::Read), "{path}");
        }
        for path in [
            "/grpc.health.v1.Health/Check",
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            "/roz.v1.AgentService/WatchTeam",
        ] {
            assert_eq!(
                need(&Method::POST, path),
                Need::Scope(Scope::Read),
                "{path}"
            );
        }
        assert_eq!(need(&Method::GET, "/healthz"), Need::Public);
        assert_eq!(need(&Method::GET, "/ui"), Need::Public);
    }

    #[test]
    fn an_unknown_state_change_fails_closed() {
        for path in [
            "/v1/new-thing",
            "/v1/tasks//cancel",
            "/roz.v1.AgentService/New",
        ] {
            assert_eq!(
                need(&Method::POST, path),
                Need::Scope(Scope::Admin),
                "{path}"
            );
        }
    }
}
