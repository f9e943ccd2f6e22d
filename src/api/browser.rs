//! Browser safety, with or without tokens: a web page the operator visits
//! must not drive this daemon.
//!
//! - **Host** (HTTP/1 `Host`, HTTP/2 and gRPC `:authority`) must name this
//!   daemon: an IP address (DNS rebinding needs a name, so an address cannot
//!   be rebound), `localhost`, this machine's host name or `<hostname>.local`,
//!   the host of the fleet's advertised endpoint, or a name in
//!   `server.allowed_hosts` (`"*"`: any). Otherwise `421 host_not_allowed`
//!   (gRPC `PERMISSION_DENIED`). A request without any host is not from a
//!   browser (browsers always send one) and passes.
//! - **Origin**: a state-changing request (any method but GET, HEAD and
//!   OPTIONS) that carries an `Origin` must come from the daemon's own
//!   origin (`http(s)://<the request's Host>`); otherwise `403 cross_origin`.
//!   Reads are not checked: without CORS headers a browser does not let a
//!   foreign page read the answer.
//! - **Content type**: a state-changing request with a body must say
//!   `application/json` (gRPC's `application/grpc` is fine): `text/plain`,
//!   forms and multipart are what a page may send cross-site without a
//!   preflight. Otherwise `415 unsupported_media_type`.
//!
//! Triggering the protective stop (`POST /v1/estop`, `POST /v1/fleet/estop`,
//! gRPC `TriggerEstop`) is exempt: anyone may stop, a browser page included,
//! whatever its headers and content type.
//!
//! A request that carries a valid bearer token or a client certificate of
//! `server.clients` is exempt from the Origin and content-type checks: a
//! page cannot attach either to a cross-site form, so such a request is no
//! forgery (`curl -d` sends a form content type with a token).
//!
//! Two `Host` headers are a bad request (RFC 9112 §3.2: `400`), before
//! anything else but a stop.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use axum::body::HttpBody as _;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, Method, StatusCode, Uri};

use super::auth::Credentials;
use super::reply::json_error;
use crate::config::Config;
#[cfg(test)]
use crate::config::check_allowed_host_entry;

/// Paths anyone may call from anywhere: triggering the stop.
const STOP_TRIGGERS: &[&str] = &[
    "/v1/estop",
    "/v1/fleet/estop",
    "/roz.v1.SafetyService/TriggerEstop",
];

/// Whether a request to `path` triggers the stop.
pub(crate) fn is_stop_trigger(path: &str) -> bool {
    STOP_TRIGGERS.contains(&path)
}

/// The names a request may address this daemon by.
#[derive(Debug, Clone)]
pub(crate) struct AllowedHosts {
    any: bool,
    /// Lower case, without a trailing dot.
    names: Vec<String>,
}

impl AllowedHosts {
    /// `localhost`, this machine's host name and `<hostname>.local`, the
    /// fleet's advertised endpoint host, and `server.allowed_hosts`.
    pub(crate) fn from_config(config: &Config) -> AllowedHosts {
        let mut names = vec!["localhost".to_string()];
        if let Some(hostname) = crate::config::machine_hostname() {
            let hostname = normalize(&hostname);
            names.push(format!("{hostname}.local"));
            names.push(hostname);
        }
        if let Some(advertised) = config.fleet.as_ref().and_then(|f| f.advertise.as_deref())
            && let Ok(uri) = advertised.parse::<Uri>()
            && let Some(host) = uri.host()
        {
            names.push(normalize(host));
        }
        let any = config.server.allowed_hosts.iter().any(|h| h == "*");
        names.extend(
            config
                .server
                .allowed_hosts
                .iter()
                .filter(|h| *h != "*")
                .map(|h| normalize(h)),
        );
        names.sort();
        names.dedup();
        AllowedHosts { any, names }
    }

    /// Whether `host` (a host as in a URI: a name, an IPv4 address or a
    /// bracketed IPv6 address; no port) names this daemon.
    pub(crate) fn allows(&self, host: &str) -> bool {
        if self.any || is_ip_literal(host) {
            return true;
        }
        let host = normalize(host);
        self.names.contains(&host)
    }
}

impl AllowedHosts {
    /// The same names as a list, for a check that takes one (rmcp's at
    /// `/mcp`): "any IP address" becomes the addresses this daemon can be
    /// reached at (loopback, the listen address, or, listening on every
    /// interface, each interface's address as of start-up). `None`: any host.
    pub(crate) fn as_list(&self, listen: SocketAddr) -> Option<Vec<String>> {
        if self.any {
            return None;
        }
        let mut ips: Vec<IpAddr> = vec![Ipv4Addr::LOCALHOST.into(), Ipv6Addr::LOCALHOST.into()];
        if listen.ip().is_unspecified() {
            match nix::ifaddrs::getifaddrs() {
                Ok(interfaces) => ips.extend(interfaces.filter_map(|i| {
                    let address = i.address?;
                    address
                        .as_sockaddr_in()
                        .map(|a| IpAddr::from(a.ip()))
                        .or_else(|| address.as_sockaddr_in6().map(|a| IpAddr::from(a.ip())))
                })),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot list this machine's addresses; /mcp answers to names and loopback only");
                }
            }
        } else {
            ips.push(listen.ip());
        }
        let mut list = self.names.clone();
        list.extend(ips.into_iter().map(|ip| ip.to_string()));
        list.sort();
        list.dedup();
        Some(list)
    }
}

fn normalize(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

fn is_ip_literal(host: &str) -> bool {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    bare.parse::<IpAddr>().is_ok()
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// `Host` / `:authority` names something else (DNS rebinding).
    HostNotAllowed(String),
    /// A state-changing request from another origin.
    CrossOrigin(String),
    /// A state-changing request whose body is not JSON.
    UnsupportedMediaType(String),
    /// Not a valid HTTP request (two `Host` headers).
    BadRequest(String),
}

impl Refusal {
    fn status(&self) -> StatusCode {
        match self {
            Refusal::HostNotAllowed(_) => StatusCode::MISDIRECTED_REQUEST,
            Refusal::CrossOrigin(_) => StatusCode::FORBIDDEN,
            Refusal::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Refusal::BadRequest(_) => StatusCode::BAD_REQUEST,
        }
    }

    fn code(&self) -> &'static str {
        match self {
            Refusal::HostNotAllowed(_) => "host_not_allowed",
            Refusal::CrossOrigin(_) => "cross_origin",
            Refusal::UnsupportedMediaType(_) => "unsupported_media_type",
            Refusal::BadRequest(_) => "invalid_argument",
        }
    }

    fn message(&self) -> &str {
        match self {
            Refusal::HostNotAllowed(m)
            | Refusal::CrossOrigin(m)
            | Refusal::UnsupportedMediaType(m)
            | Refusal::BadRequest(m) => m,
        }
    }
}

/// What [`check`] looks at: the request without its body.
pub(crate) struct Checked<'a> {
    pub method: &'a Method,
    pub uri: &'a Uri,
    pub headers: &'a HeaderMap,
    /// The body is known to be empty (no `content-length`, `content-length:
    /// 0`, or an HTTP/2 request that ended with its headers).
    pub body_empty: bool,
    /// The request carries a valid bearer token or a configured client
    /// certificate (see the module doc).
    pub credentialed: bool,
}

/// The host:port the request addresses: the URI's authority (HTTP/2
/// `:authority`, an absolute-form HTTP/1 target), else `Host`.
/// `Err` when it is present but malformed.
fn request_authority(r: &Checked<'_>) -> Result<Option<(String, Option<u16>)>, String> {
    if let Some(authority) = r.uri.authority() {
        return Ok(Some((authority.host().to_string(), authority.port_u16())));
    }
    let Some(value) = r.headers.get(http::header::HOST) else {
        return Ok(None);
    };
    let text = value
        .to_str()
        .map_err(|_| "the Host header is not text".to_string())?;
    let authority = text
        .parse::<http::uri::Authority>()
        .map_err(|_| format!("the Host header {text:?} is not host[:port]"))?;
    Ok(Some((authority.host().to_string(), authority.port_u16())))
}

fn changes_state(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// The whole decision, without I/O.
pub(crate) fn check(r: &Checked<'_>, allowed: &AllowedHosts) -> Result<(), Refusal> {
    if is_stop_trigger(r.uri.path()) {
        return Ok(());
    }
    if r.headers
        .get_all(http::header::HOST)
        .iter()
        .nth(1)
        .is_some()
    {
        return Err(Refusal::BadRequest(
            "a request with more than one Host header is invalid (RFC 9112 section 3.2)".into(),
        ));
    }
    let authority = request_authority(r).map_err(Refusal::HostNotAllowed)?;
    if let Some((host, _)) = &authority
        && !allowed.allows(host)
    {
        return Err(Refusal::HostNotAllowed(format!(
            "{host:?} is not a name of this daemon; add it to server.allowed_hosts if it is"
        )));
    }
    if !changes_state(r.method) || r.credentialed {
        return Ok(());
    }
    if let Some(origin) = r.headers.get(http::header::ORIGIN) {
        same_origin(origin, authority.as_ref(), allowed).map_err(Refusal::CrossOrigin)?;
    }
    if !r.body_empty {
        let content_type = r
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let media = content_type
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        if media != "application/json" && !media.starts_with("application/grpc") {
            return Err(Refusal::UnsupportedMediaType(format!(
                "the body must be application/json (content-type: {})",
                if content_type.is_empty() {
                    "none"
                } else {
                    content_type
                }
            )));
        }
    }
    Ok(())
}

/// `Ok` when `origin` is `http(s)://` plus the request's own host and port.
fn same_origin(
    origin: &http::HeaderValue,
    authority: Option<&(String, Option<u16>)>,
    allowed: &AllowedHosts,
) -> Result<(), String> {
    let text = origin.to_str().unwrap_or("<not text>");
    let refused =
        || format!("a state-changing request from origin {text:?} (not this daemon's own)");
    let uri = text.parse::<Uri>().map_err(|_| refused())?;
    let default_port = match uri.scheme_str() {
        Some("http") => 80,
        Some("https") => 443,
        _ => return Err(refused()),
    };
    let Some(origin_authority) = uri.authority() else {
        return Err(refused());
    };
    let origin_host = normalize(origin_authority.host());
    let origin_port = origin_authority.port_u16().unwrap_or(default_port);
    let ours = match authority {
        // A Host without a port is compared by name only (the scheme, and so
        // the default port, is not known behind a proxy).
        Some((host, port)) => {
            normalize(host) == origin_host && port.is_none_or(|p| p == origin_port)
        }
        None => allowed.allows(&origin_host),
    };
    if ours { Ok(()) } else { Err(refused()) }
}

/// The middleware: refuses what [`check`] refuses, as JSON (REST) or a
/// gRPC status.
pub(crate) async fn guard(
    State((allowed, credentials)): State<(Arc<AllowedHosts>, Arc<Credentials>)>,
    request: Request,
    next: Next,
) -> Response {
    let body = request.body();
    let peer = request.extensions().get::<crate::tls::PeerIdentity>();
    let checked = Checked {
        method: request.method(),
        uri: request.uri(),
        headers: request.headers(),
        body_empty: body.is_end_stream() || body.size_hint().exact() == Some(0),
        credentialed: credentials.vouch_for(request.headers(), peer),
    };
    match check(&checked, &allowed) {
        Ok(()) => next.run(request).await,
        Err(refusal) => {
            tracing::warn!(
                method = %request.method(),
                path = %request.uri().path(),
                reason = refusal.message(),
                "refused a request a browser may have sent"
            );
            if super::reply::is_grpc(&request) {
                tonic::Status::permission_denied(refusal.message()).into_http::<axum::body::Body>()
            } else {
                json_error(refusal.status(), refusal.code(), refusal.message()).into_response()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed(extra: &[&str]) -> AllowedHosts {
        let mut names: Vec<String> = ["localhost", "rover-1", "rover-1.local"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        names.extend(extra.iter().filter(|h| **h != "*").map(|h| normalize(h)));
        AllowedHosts {
            any: extra.contains(&"*"),
            names,
        }
    }

    fn run(
        method: Method,
        uri: &str,
        headers: &[(&str, &str)],
        body_empty: bool,
        allowed: &AllowedHosts,
    ) -> Result<(), Refusal> {
        let uri: Uri = uri.parse().unwrap();
        let mut map = HeaderMap::new();
        for (k, v) in headers {
            map.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        check(
            &Checked {
                method: &method,
                uri: &uri,
                headers: &map,
                body_empty,
                credentialed: false,
            },
            allowed,
        )
    }

    #[test]
    fn a_credentialed_request_is_no_forgery_and_a_stop_is_never_refused() {
        let a = allowed(&[]);
        let uri: Uri = "/v1/fleet/estop/clear".parse().unwrap();
        let mut form = HeaderMap::new();
        form.insert(http::header::HOST, "127.0.0.1:8080".parse().unwrap());
        form.insert(
            http::header::CONTENT_TYPE,
            "application/x-www-form-urlencoded".parse().unwrap(),
        );
        form.insert(http::header::ORIGIN, "http://evil.example".parse().unwrap());
        let checked = |credentialed| Checked {
            method: &Method::POST,
            uri: &uri,
            headers: &form,
            body_empty: false,
            credentialed,
        };
        assert!(matches!(
            check(&checked(false), &a),
            Err(Refusal::CrossOrigin(_))
        ));
        assert_eq!(check(&checked(true), &a), Ok(()));
        // Every stop route, whatever the form, origin or host.
        for stop in [
            "/v1/estop",
            "/v1/fleet/estop",
            "/roz.v1.SafetyService/TriggerEstop",
        ] {
            let headers = [
                ("host", "evil.example"),
                ("host", "other.example"),
                ("origin", "http://evil.example"),
                ("content-type", "application/x-www-form-urlencoded"),
            ];
            assert_eq!(
                run(Method::POST, stop, &headers, false, &a),
                Ok(()),
                "{stop}"
            );
        }
    }

    #[test]
    fn two_host_headers_are_a_bad_request() {
        let a = allowed(&[]);
        for method in [Method::GET, Method::POST] {
            let refused = run(
                method.clone(),
                "/v1/status",
                &[("host", "127.0.0.1"), ("host", "127.0.0.1")],
                true,
                &a,
            );
            assert!(
                matches!(refused, Err(Refusal::BadRequest(_))),
                "{method}: {refused:?}"
            );
        }
        assert_eq!(
            run(
                Method::GET,
                "/v1/status",
                &[("host", "127.0.0.1")],
                true,
                &a
            ),
            Ok(())
        );
    }

    #[test]
    fn hosts_by_name_and_any_ip_address() {
        let a = allowed(&["Robot.Example."]);
        for ok in [
            "localhost",
            "LOCALHOST",
            "rover-1",
            "rover-1.local.",
            "robot.example",
            "127.0.0.1",
            "10.1.2.3",
            "[::1]",
            "[fe80::1]",
        ] {
            assert!(a.allows(ok), "{ok}");
        }
        for refused in ["evil.example", "rover-1.evil.example", "localhost.evil", ""] {
            assert!(!a.allows(refused), "{refused}");
        }
        assert!(allowed(&["*"]).allows("evil.example"));
    }

    #[test]
    fn host_header_and_authority_are_checked_on_every_request() {
        let a = allowed(&[]);
        assert!(
            run(
                Method::GET,
                "/v1/status",
                &[("host", "127.0.0.1:8080")],
                true,
                &a
            )
            .is_ok()
        );
        assert!(
            run(
                Method::GET,
                "/v1/status",
                &[("host", "localhost")],
                true,
                &a
            )
            .is_ok()
        );
        assert!(matches!(
            run(
                Method::GET,
                "/v1/status",
                &[("host", "evil.example:8080")],
                true,
                &a
            ),
            Err(Refusal::HostNotAllowed(_))
        ));
        // HTTP/2 :authority (and absolute-form HTTP/1 targets).
        assert!(matches!(
            run(
                Method::POST,
                "http://evil.example:8080/roz.v1.AgentService/StreamSession",
                &[("content-type", "application/grpc")],
                false,
                &a
            ),
            Err(Refusal::HostNotAllowed(_))
        ));
        assert!(
            run(
                Method::POST,
                "http://127.0.0.1:9/roz.v1.AgentService/StreamSession",
                &[("content-type", "application/grpc")],
                false,
                &a
            )
            .is_ok()
        );
        // No host at all: not a browser.
        assert!(run(Method::GET, "/healthz", &[], true, &a).is_ok());
        assert!(matches!(
            run(Method::GET, "/healthz", &[("host", "a b")], true, &a),
            Err(Refusal::HostNotAllowed(_))
        ));
    }

    #[test]
    fn state_changes_need_the_daemons_own_origin() {
        let a = allowed(&[]);
        let host = ("host", "127.0.0.1:8080");
        let json = ("content-type", "application/json");
        for own in ["http://127.0.0.1:8080", "HTTP://127.0.0.1:8080"] {
            assert!(
                run(
                    Method::POST,
                    "/v1/estop/clear",
                    &[host, json, ("origin", own)],
                    false,
                    &a
                )
                .is_ok(),
                "{own}"
            );
        }
        for foreign in [
            "http://evil.example",
            "http://127.0.0.1:3000",
            "https://127.0.0.1",
            "null",
            "file://",
        ] {
            assert!(
                matches!(
                    run(
                        Method::POST,
                        "/v1/estop/clear",
                        &[host, json, ("origin", foreign)],
                        false,
                        &a
                    ),
                    Err(Refusal::CrossOrigin(_))
                ),
                "{foreign}"
            );
        }
        // Reads are not checked against Origin.
        assert!(
            run(
                Method::GET,
                "/v1/safety",
                &[host, ("origin", "http://evil.example")],
                true,
                &a
            )
            .is_ok()
        );
        // A Host without a port: compared by name.
        assert!(
            run(
                Method::POST,
                "/v1/tasks",
                &[("host", "rover-1"), json, ("origin", "https://rover-1")],
                false,
                &a
            )
            .is_ok()
        );
    }

    #[test]
    fn bodies_of_state_changes_must_be_json() {
        let a = allowed(&[]);
        let host = ("host", "127.0.0.1:8080");
        for bad in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
        ] {
            assert!(
                matches!(
                    run(
                        Method::POST,
                        "/v1/tasks",
                        &[host, ("content-type", bad)],
                        false,
                        &a
                    ),
                    Err(Refusal::UnsupportedMediaType(_))
                ),
                "{bad}"
            );
        }
        assert!(matches!(
            run(Method::POST, "/v1/tasks", &[host], false, &a),
            Err(Refusal::UnsupportedMediaType(_))
        ));
        for good in [
            "application/json",
            "Application/JSON; charset=utf-8",
            "application/grpc+proto",
        ] {
            assert!(
                run(
                    Method::POST,
                    "/v1/tasks",
                    &[host, ("content-type", good)],
                    false,
                    &a
                )
                .is_ok(),
                "{good}"
            );
        }
        // An empty body needs no type.
        assert!(
            run(
                Method::POST,
                "/v1/estop/clear",
                &[host, ("content-type", "text/plain")],
                true,
                &a
            )
            .is_ok()
        );
    }

    #[test]
    fn triggering_the_stop_is_never_refused() {
        let a = allowed(&[]);
        for path in STOP_TRIGGERS {
            assert!(
                run(
                    Method::POST,
                    path,
                    &[
                        ("host", "evil.example"),
                        ("origin", "http://evil.example"),
                        ("content-type", "text/plain")
                    ],
                    false,
                    &a
                )
                .is_ok()
            );
        }
    }

    #[test]
    fn allowed_host_entries() {
        for ok in ["*", "robot.lab", "rover-1", "my_host"] {
            assert!(check_allowed_host_entry(ok).is_ok(), "{ok}");
        }
        for bad in ["", "http://x", "x:8080", "a/b", "a b", "[::1]"] {
            assert!(check_allowed_host_entry(bad).is_err(), "{bad}");
        }
    }
}
