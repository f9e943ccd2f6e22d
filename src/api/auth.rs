//! Authentication and authorisation of every gRPC call and REST route on
//! the TCP listener (the control socket's file permissions authenticate its
//! connections; it does not pass through here).
//!
//! A caller is identified by a bearer token (`Authorization: Bearer <t>`,
//! the scheme in any case, RFC 7235) or, without one, by a verified client
//! certificate's subject (the TLS layer puts a [`PeerIdentity`] into the
//! request). [`Credentials::identify`] turns either into a
//! credential's name and scope; [`super::scopes::need`] says what the
//! request needs. The request then carries a [`Caller`] for the handlers,
//! which name it (never the secret) in logs and the audit.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::{ConditionallySelectable, ConstantTimeEq};
use tracing::Instrument as _;

use super::reply::{is_grpc, json_error};
use super::scopes::{Need, need};
use super::tracked::Connection;
use crate::config::Config;
use crate::config::types::{FLEET_CREDENTIAL, NamedClient, Scope};
use crate::tls::PeerIdentity;

/// Who made a request, as the handlers see it: the credential's name (a
/// token's name, a certificate subject, `anonymous` when no credentials are
/// configured, `control-socket` on the local socket) and its scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Caller {
    pub credential: Arc<str>,
    pub scope: Scope,
}

impl Caller {
    /// The caller when the daemon has no credentials configured (loopback only).
    pub(crate) fn anonymous() -> Caller {
        Caller {
            credential: Arc::from("anonymous"),
            scope: Scope::Admin,
        }
    }

    /// A request on the local control socket (its file mode authenticated it).
    pub(crate) fn control_socket() -> Caller {
        Caller {
            credential: Arc::from("control-socket"),
            scope: Scope::Admin,
        }
    }

    pub(crate) fn name(&self) -> &str {
        &self.credential
    }

    /// The credential's name, or `None` for the anonymous caller of a
    /// daemon without credentials (there is nobody to name).
    pub(crate) fn named(&self) -> Option<&str> {
        (*self != Caller::anonymous()).then_some(&*self.credential)
    }
}

/// How a caller presents itself.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Identity<'a> {
    Bearer(&'a str),
    CertificateSubject(&'a str),
}

type Digest = [u8; 32];

fn digest(secret: &str) -> Digest {
    let d = ring::digest::digest(&ring::digest::SHA256, secret.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

struct Token {
    name: Arc<str>,
    digest: Digest,
    scope: Scope,
}

/// Every configured credential. Tokens are kept as SHA-256 digests and
/// compared digest to digest, so neither the time taken nor anything else
/// depends on a stored token's length or content.
pub(crate) struct Credentials {
    required: bool,
    tokens: Vec<Token>,
    clients: Vec<NamedClient>,
}

impl Credentials {
    /// `auth_tokens` and `auth_token_file` (admin, named `auth_tokens[<n>]`),
    /// `[[server.tokens]]`, the fleet token (admin, named `fleet`: other
    /// hosts relay here with it) and `[[server.clients]]`.
    pub(crate) fn from_config(config: &Config) -> Credentials {
        let mut tokens: Vec<Token> = config
            .auth
            .admin_tokens
            .iter()
            .enumerate()
            .map(|(i, t)| Token {
                name: Arc::from(format!("auth_tokens[{i}]")),
                digest: digest(t.expose()),
                scope: Scope::Admin,
            })
            .collect();
        tokens.extend(config.auth.tokens.iter().map(|t| Token {
            name: Arc::from(t.name.as_str()),
            digest: digest(t.secret.expose()),
            scope: t.scope,
        }));
        if let Some(token) = config.fleet.as_ref().map(|f| &f.token) {
            tokens.push(Token {
                name: Arc::from(FLEET_CREDENTIAL),
                digest: digest(token.expose()),
                scope: Scope::Admin,
            });
        }
        Credentials {
            required: config.auth_required(),
            tokens,
            clients: config.auth.clients.clone(),
        }
    }

    pub(crate) fn required(&self) -> bool {
        self.required
    }

    /// The credential an identity stands for: its name and scope.
    pub(crate) fn identify(&self, identity: Identity<'_>) -> Option<Caller> {
        match identity {
            Identity::Bearer(token) => self.token(token),
            Identity::CertificateSubject(subject) => self
                .clients
                .iter()
                .find(|c| c.subject == subject)
                .map(|c| Caller {
                    credential: Arc::from(c.subject.as_str()),
                    scope: c.scope,
                }),
        }
    }

    /// Whether the request carries a credential this daemon issued: a valid
    /// bearer token, or (without an `Authorization` header) a verified
    /// client certificate of `server.clients`. For the browser guard: such a
    /// request cannot be a cross-site forgery.
    pub(crate) fn vouch_for(&self, headers: &http::HeaderMap, peer: Option<&PeerIdentity>) -> bool {
        match presented(headers.get(http::header::AUTHORIZATION)) {
            Presented::Bearer(token) => self.token(token).is_some(),
            Presented::Malformed(_) => false,
            Presented::Absent => peer.is_some_and(|p| {
                self.identify(Identity::CertificateSubject(&p.subject))
                    .is_some()
            }),
        }
    }

    /// Compares against every token without short-circuiting: the time
    /// taken says nothing about which token (or how much of one) matched.
    fn token(&self, presented: &str) -> Option<Caller> {
        let presented = digest(presented);
        let mut found = subtle::Choice::from(0u8);
        let mut index = 0u32;
        for (i, token) in self.tokens.iter().enumerate() {
            let same = presented.ct_eq(&token.digest);
            index = u32::conditional_select(&index, &(i as u32), same);
            found |= same;
        }
        if !bool::from(found) {
            return None;
        }
        self.tokens.get(index as usize).map(|t| Caller {
            credential: t.name.clone(),
            scope: t.scope,
        })
    }
}

/// What the `Authorization` header holds.
#[derive(Debug, PartialEq, Eq)]
enum Presented<'a> {
    Absent,
    Bearer(&'a str),
    /// Present but not `Bearer <token>`: why.
    Malformed(&'static str),
}

/// RFC 7235: `auth-scheme 1*SP token68`, the scheme case-insensitive.
fn presented(header: Option<&http::HeaderValue>) -> Presented<'_> {
    let Some(value) = header else {
        return Presented::Absent;
    };
    let Ok(text) = value.to_str() else {
        return Presented::Malformed("the authorization header is not text");
    };
    let text = text.trim();
    let (scheme, rest) = text.split_once(' ').unwrap_or((text, ""));
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Presented::Malformed("the authorization scheme must be Bearer");
    }
    let token = rest.trim_start_matches(' ');
    if token.is_empty() || token.contains(char::is_whitespace) {
        return Presented::Malformed("expected authorization: Bearer <token>");
    }
    Presented::Bearer(token)
}

/// The middleware: identifies the caller, checks what the request needs,
/// and runs it with a [`Caller`] extension inside a span naming the
/// credential.
pub(crate) async fn require_credential(
    State(credentials): State<Arc<Credentials>>,
    mut request: Request,
    next: Next,
) -> Response {
    let needed = need(request.method(), request.uri().path());
    if needed == Need::Public {
        return next.run(request).await;
    }
    let caller = if credentials.required() {
        let subject = request
            .extensions()
            .get::<PeerIdentity>()
            .map(|p| p.subject.clone());
        // The Foxglove app cannot set headers: at `/foxglove` the token may
        // come as a `token` query parameter (never logged: only paths are).
        let from_query = (request.uri().path() == super::foxglove::PATH)
            .then(|| query_token(request.uri().query()))
            .flatten();
        let presented = match presented(request.headers().get(http::header::AUTHORIZATION)) {
            Presented::Absent => from_query
                .as_deref()
                .map_or(Presented::Absent, Presented::Bearer),
            other => other,
        };
        match presented {
            Presented::Bearer(token) => credentials
                .identify(Identity::Bearer(token))
                .ok_or("invalid bearer token"),
            Presented::Malformed(why) => Err(why),
            Presented::Absent => match subject {
                Some(subject) => credentials
                    .identify(Identity::CertificateSubject(&subject))
                    .ok_or("the client certificate's subject is not in server.clients"),
                None => Err("missing authorization: Bearer <token>"),
            },
        }
    } else {
        Ok(Caller::anonymous())
    };
    let caller = match caller {
        Ok(caller) => caller,
        Err(why) => return unauthenticated(&request, why),
    };
    // A connection that completed a request past this check is shed only
    // after those that never did (see `connections`).
    if let Some(connection) = request.extensions().get::<Connection>() {
        connection.mark_authenticated();
    }
    if let Need::Scope(scope) = needed
        && !caller.scope.allows(scope)
    {
        let why = format!(
            "credential {:?} has scope {}; {} {} needs {scope}",
            caller.name(),
            caller.scope,
            request.method(),
            request.uri().path()
        );
        tracing::warn!(credential = caller.name(), path = %request.uri().path(), needed = %scope, "refused a request outside its credential's scope");
        return if is_grpc(&request) {
            tonic::Status::permission_denied(why).into_http::<axum::body::Body>()
        } else {
            json_error(http::StatusCode::FORBIDDEN, "permission_denied", &why).into_response()
        };
    }
    let span = tracing::info_span!("request", credential = %caller.credential);
    request.extensions_mut().insert(caller);
    next.run(request).instrument(span).await
}

/// The `token` parameter of a query (percent-decoded; `+` is itself).
fn query_token(query: Option<&str>) -> Option<String> {
    query?.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=')?;
        (key == "token" && !value.is_empty()).then(|| {
            percent_encoding::percent_decode_str(value)
                .decode_utf8_lossy()
                .into_owned()
        })
    })
}

fn unauthenticated(request: &Request, why: &str) -> Response {
    tracing::warn!(path = %request.uri().path(), reason = why, "refused unauthenticated request");
    if is_grpc(request) {
        return tonic::Status::unauthenticated(why).into_http::<axum::body::Body>();
    }
    let mut response =
        json_error(http::StatusCode::UNAUTHORIZED, "unauthenticated", why).into_response();
    response.headers_mut().insert(
        http::header::WWW_AUTHENTICATE,
        http::HeaderValue::from_static("Bearer"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, ConfigSource};

    /// An admin token, a named read token (from its file) and a client
    /// certificate's subject, configured as an operator writes them.
    fn credentials() -> Credentials {
        let dir = tempfile::tempdir().unwrap();
        let token_file = dir.path().join("viewer.token");
        std::fs::write(&token_file, "beta\n").unwrap();
        let text = format!(
            "[server]\nauth_tokens = [\"alpha\"]\n\
             [[server.tokens]]\nname = \"viewer\"\ntoken_file = {:?}\nscopes = [\"read\"]\n\
             [[server.clients]]\nsubject = \"CN=rover-2\"\nscopes = [\"operate\"]\n",
            token_file.display().to_string()
        );
        let config = Config::parse(&text, ConfigSource::BuiltIn).unwrap();
        Credentials::from_config(&config)
    }

    #[test]
    fn only_an_exact_token_matches_and_names_its_credential() {
        let c = credentials();
        let who = |t| {
            c.identify(Identity::Bearer(t))
                .map(|c| (c.credential.to_string(), c.scope))
        };
        assert_eq!(who("beta"), Some(("viewer".into(), Scope::Read)));
        assert_eq!(who("alpha"), Some(("auth_tokens[0]".into(), Scope::Admin)));
        for wrong in ["bet", "betaa", "", "ALPHA"] {
            assert_eq!(who(wrong), None, "{wrong}");
        }
        let subject = c
            .identify(Identity::CertificateSubject("CN=rover-2"))
            .unwrap();
        assert_eq!(
            (subject.name(), subject.scope),
            ("CN=rover-2", Scope::Operate)
        );
        assert!(
            c.identify(Identity::CertificateSubject("CN=other"))
                .is_none()
        );
        assert!(c.required());
    }

    #[test]
    fn a_token_from_the_query() {
        assert_eq!(query_token(Some("token=abc")), Some("abc".into()));
        assert_eq!(
            query_token(Some("x=1&token=a%2Bb%20c+d&y=2")),
            Some("a+b c+d".into())
        );
        for none in [
            None,
            Some(""),
            Some("token="),
            Some("tokens=abc"),
            Some("xtoken=a"),
        ] {
            assert_eq!(query_token(none), None, "{none:?}");
        }
    }

    #[test]
    fn the_scheme_is_case_insensitive() {
        let h = |s: &str| http::HeaderValue::from_str(s).unwrap();
        for ok in [
            "Bearer t",
            "bearer t",
            "BEARER t",
            "Bearer   t",
            " bEaReR t ",
        ] {
            assert_eq!(presented(Some(&h(ok))), Presented::Bearer("t"), "{ok:?}");
        }
        for bad in ["Basic t", "Bearer", "Bearert", "Bearer a b", "Token t"] {
            assert!(
                matches!(presented(Some(&h(bad))), Presented::Malformed(_)),
                "{bad:?}"
            );
        }
        assert_eq!(presented(None), Presented::Absent);
    }
}
