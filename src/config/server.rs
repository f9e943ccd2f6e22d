//! `[server]` as the file writes it ([`RawServer`], where its defaults are
//! stated) and its validation into what the rest of rozd reads: the
//! listener's settings ([`ServerConfig`], durations and a control socket
//! rather than counts of seconds and `""`) and its credentials
//! ([`AuthConfig`], secrets read and scopes parsed). The raw form never
//! leaves the configuration module.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::types::{
    AuthConfig, ClientAuth, ControlSocket, FLEET_CREDENTIAL, Invalid, MAX_SOCKET_PATH, NamedClient,
    NamedToken, Secret, ServerConfig, ServerTlsConfig, check_allowed_host_entry, parse_scopes,
    token_lines, within,
};

/// `[server]` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawServer {
    listen: SocketAddr,
    auth_tokens: Vec<Secret>,
    auth_token_file: Option<PathBuf>,
    allow_unauthenticated_remote: bool,
    allow_plaintext_remote: bool,
    tls: Option<ServerTlsConfig>,
    shutdown_grace_secs: u64,
    http2_keepalive_secs: u64,
    max_connections: u32,
    header_read_timeout_secs: u64,
    idle_timeout_secs: u64,
    allowed_hosts: Vec<String>,
    control_socket: Option<PathBuf>,
    tokens: Vec<TokenConfig>,
    clients: Vec<ClientConfig>,
    max_concurrent_streams: u32,
}

/// One `[[server.tokens]]`: a named bearer token, read from the environment
/// or a file (never written in the configuration itself).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenConfig {
    name: String,
    #[serde(default)]
    token_env: Option<String>,
    #[serde(default)]
    token_file: Option<PathBuf>,
    #[serde(default)]
    scopes: Vec<String>,
}

/// One `[[server.clients]]`: a client certificate's subject and its scopes.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClientConfig {
    subject: String,
    #[serde(default)]
    scopes: Vec<String>,
}

/// The defaults of `[server]`, each stated here only.
impl Default for RawServer {
    fn default() -> Self {
        RawServer {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            auth_tokens: Vec::new(),
            auth_token_file: None,
            allow_unauthenticated_remote: false,
            allow_plaintext_remote: false,
            tls: None,
            shutdown_grace_secs: 5,
            http2_keepalive_secs: 5,
            max_connections: 1024,
            header_read_timeout_secs: 10,
            idle_timeout_secs: 120,
            allowed_hosts: Vec::new(),
            control_socket: None,
            tokens: Vec::new(),
            clients: Vec::new(),
            max_concurrent_streams: 32,
        }
    }
}

impl RawServer {
    /// The listener's settings as rozd reads them. Whether they are within
    /// their bounds is [`RawServer::check`]'s to say.
    pub(super) fn settings(&self) -> ServerConfig {
        ServerConfig {
            listen: self.listen,
            allow_unauthenticated_remote: self.allow_unauthenticated_remote,
            allow_plaintext_remote: self.allow_plaintext_remote,
            tls: self.tls.clone(),
            shutdown_grace: Duration::from_secs(self.shutdown_grace_secs),
            http2_keepalive: (self.http2_keepalive_secs > 0)
                .then(|| Duration::from_secs(self.http2_keepalive_secs)),
            max_connections: self.max_connections,
            header_read_timeout: Duration::from_secs(self.header_read_timeout_secs),
            idle_timeout: Duration::from_secs(self.idle_timeout_secs),
            allowed_hosts: self.allowed_hosts.clone(),
            control_socket: ControlSocket::from_setting(self.control_socket.clone()),
            max_concurrent_streams: self.max_concurrent_streams,
        }
    }

    /// The connection limits, timeouts, TLS, allowed hosts and control
    /// socket: their first error.
    pub(super) fn check(&self) -> Result<(), Invalid> {
        if self
            .auth_tokens
            .iter()
            .any(|t| t.expose().trim().is_empty())
        {
            return Err(Invalid::new(
                "server.auth_tokens",
                "tokens must not be empty",
            ));
        }
        within(
            "server.max_connections",
            self.max_connections,
            4..=1_048_576,
        )?;
        within(
            "server.header_read_timeout_secs",
            self.header_read_timeout_secs,
            1..=3_600,
        )?;
        within(
            "server.idle_timeout_secs",
            self.idle_timeout_secs,
            1..=86_400,
        )?;
        // Upper bounds keep `now + period` far from overflowing an Instant.
        within(
            "server.shutdown_grace_secs",
            self.shutdown_grace_secs,
            0..=3_600,
        )
        .map_err(|e| e.noting("an hour"))?;
        within(
            "server.http2_keepalive_secs",
            self.http2_keepalive_secs,
            0..=86_400,
        )
        .map_err(|e| e.noting("0 disables the pings"))?;
        within(
            "server.max_concurrent_streams",
            self.max_concurrent_streams,
            1..=65_536,
        )?;
        if let Some(tls) = &self.tls {
            check_tls(tls)?;
        }
        for (i, host) in self.allowed_hosts.iter().enumerate() {
            if let Err(why) = check_allowed_host_entry(host) {
                return Err(Invalid::new(
                    "server.allowed_hosts",
                    format!("entry {i} ({host:?}): {why}"),
                ));
            }
        }
        if let Some(path) = &self.control_socket
            && !path.as_os_str().is_empty()
        {
            if !path.is_absolute() {
                return Err(Invalid::new(
                    "server.control_socket",
                    format!(
                        "{:?} is not an absolute path (or \"\" to disable the control socket)",
                        path.display()
                    ),
                ));
            }
            if path.as_os_str().len() > MAX_SOCKET_PATH {
                return Err(Invalid::new(
                    "server.control_socket",
                    format!("a Unix socket path has at most {MAX_SOCKET_PATH} bytes"),
                ));
            }
        }
        Ok(())
    }

    /// The credentials, their secrets read: `auth_tokens` with the lines of
    /// `auth_token_file`, `[[server.tokens]]` (unique non-empty names, known
    /// scopes, exactly one source, a secret that is not empty and not
    /// another credential's) and `[[server.clients]]` (unique non-empty
    /// subjects, known scopes).
    pub(super) fn auth(&self) -> Result<AuthConfig, Invalid> {
        let mut admin_tokens = self.auth_tokens.clone();
        if let Some(path) = &self.auth_token_file {
            let content = std::fs::read_to_string(path).map_err(|e| {
                Invalid::new(
                    "server.auth_token_file",
                    format!("cannot read {}: {e}", path.display()),
                )
            })?;
            admin_tokens.extend(token_lines(&content).map(Secret::new));
        }
        let mut tokens: Vec<NamedToken> = Vec::new();
        for (i, t) in self.tokens.iter().enumerate() {
            t.check_name(i, &tokens)?;
            let scope = parse_scopes(&t.scopes)
                .map_err(|m| Invalid::new(format!("server.tokens[{i}].scopes"), m))?;
            let secret = t.secret(i)?;
            let shared = tokens.iter().any(|o| o.secret.expose() == secret)
                || admin_tokens.iter().any(|o| o.expose() == secret);
            if shared {
                return Err(Invalid::new(
                    format!("server.tokens[{i}]"),
                    "this token is also another credential's; each credential needs its own",
                ));
            }
            tokens.push(NamedToken {
                name: t.name.clone(),
                secret: Secret::new(secret),
                scope,
            });
        }
        let mut clients: Vec<NamedClient> = Vec::new();
        for (i, c) in self.clients.iter().enumerate() {
            let key = |field: &str| format!("server.clients[{i}].{field}");
            if c.subject.trim().is_empty() {
                return Err(Invalid::new(key("subject"), "must not be empty"));
            }
            if clients.iter().any(|o| o.subject == c.subject) {
                return Err(Invalid::new(
                    key("subject"),
                    format!("{:?} is listed twice", c.subject),
                ));
            }
            let scope = parse_scopes(&c.scopes).map_err(|m| Invalid::new(key("scopes"), m))?;
            clients.push(NamedClient {
                subject: c.subject.clone(),
                scope,
            });
        }
        Ok(AuthConfig {
            admin_tokens,
            tokens,
            clients,
        })
    }
}

impl TokenConfig {
    /// Entry `i`'s name: printable, not reserved, not one of `earlier`'s.
    fn check_name(&self, i: usize, earlier: &[NamedToken]) -> Result<(), Invalid> {
        let key = format!("server.tokens[{i}].name");
        if self.name.trim().is_empty() || self.name.chars().any(char::is_control) {
            return Err(Invalid::new(key, "must be a non-empty printable name"));
        }
        if self.name.starts_with("auth_tokens[") || self.name == FLEET_CREDENTIAL {
            return Err(Invalid::new(
                key,
                format!("{:?} is reserved; choose another name", self.name),
            ));
        }
        if earlier.iter().any(|o| o.name == self.name) {
            return Err(Invalid::new(
                key,
                format!("{:?} names another token too", self.name),
            ));
        }
        Ok(())
    }

    /// Entry `i`'s secret, read from its variable or file and trimmed.
    fn secret(&self, i: usize) -> Result<String, Invalid> {
        let key = |field: &str| format!("server.tokens[{i}].{field}");
        let secret = match (&self.token_env, &self.token_file) {
            (Some(var), None) => std::env::var(var).map_err(|e| {
                Invalid::new(key("token_env"), format!("environment variable {var}: {e}"))
            })?,
            (None, Some(path)) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    Invalid::new(
                        key("token_file"),
                        format!("cannot read {}: {e}", path.display()),
                    )
                })?;
                token_lines(&text).next().unwrap_or_default().to_string()
            }
            _ => {
                return Err(Invalid::new(
                    format!("server.tokens[{i}]"),
                    "give exactly one of token_env and token_file",
                ));
            }
        };
        let secret = secret.trim().to_string();
        if secret.is_empty() {
            let field = if self.token_env.is_some() {
                "token_env"
            } else {
                "token_file"
            };
            return Err(Invalid::new(key(field), "the token is empty"));
        }
        Ok(secret)
    }
}

/// `[server.tls]`: its bounds, and that its files make a certificate the
/// listener can serve (the key belongs to the certificate, the client CAs
/// are CA certificates).
fn check_tls(tls: &ServerTlsConfig) -> Result<(), Invalid> {
    within(
        "server.tls.handshake_timeout_secs",
        tls.handshake_timeout.as_secs(),
        1..=300,
    )?;
    if tls
        .reload_check
        .is_some_and(|every| every.as_secs() > 86_400)
    {
        return Err(Invalid::new(
            "server.tls.reload_check_secs",
            "must be between 0 (only on SIGHUP) and 86400",
        ));
    }
    if tls.client_auth != ClientAuth::None && tls.client_ca_file.is_none() {
        return Err(Invalid::new(
            "server.tls.client_ca_file",
            format!(
                "client_auth = \"{}\" needs the CAs that client certificates chain to",
                tls.client_auth.as_str()
            ),
        ));
    }
    crate::tls::server::check(tls).map_err(|e| {
        let key = match &e {
            crate::tls::TlsError::Read { path, .. }
            | crate::tls::TlsError::Pem { path, .. }
            | crate::tls::TlsError::Certificate { path, .. } => {
                if *path == tls.key_file {
                    "server.tls.key_file"
                } else if Some(path) == tls.client_ca_file.as_ref() {
                    "server.tls.client_ca_file"
                } else {
                    "server.tls.cert_file"
                }
            }
            crate::tls::TlsError::Config { .. } => "server.tls",
        };
        Invalid::new(key, e.to_string())
    })?;
    Ok(())
}
