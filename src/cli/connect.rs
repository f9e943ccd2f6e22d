//! How every command-line client reaches a daemon: the address it is
//! given (`https://` for TLS, with the CA and client certificate of
//! [`set_client_tls`]), the bearer token it presents (an HTTP header for
//! REST, gRPC metadata for the streams), the gRPC channel, and how long it
//! waits.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::tls::client::ClientTlsFiles;

use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Channel, Endpoint};

/// The daemon's address when the command is not given one (`--addr`, `$ROZD_ADDR`).
pub const DEFAULT_ADDR: &str = "127.0.0.1:8080";

/// How long `rozd chat` waits for the TCP connection of its session.
pub const SESSION_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long `rozd task watch` waits for the TCP connection of its streams.
pub const WATCH_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Bound on `rozd estop`'s whole request (triggering waits until every
/// actuator was driven to its safe value).
pub const ESTOP_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("invalid address {0:?}: expected host:port, http://host:port or https://host:port")]
    Address(String),
    #[error("TLS: {0}")]
    Tls(String),
    #[error("the token cannot be sent: it must be printable ASCII")]
    Token,
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: String,
        #[source]
        source: tonic::transport::Error,
    },
}

/// The TLS files of this process's command (`--cacert`, `--cert`, `--key`):
/// the CLI runs one command per process, so they are set once, by `main`.
static CLIENT_TLS: OnceLock<ClientTlsFiles> = OnceLock::new();

/// Sets the CA and client certificate every `https://` connection of this
/// process uses (the first call wins).
pub fn set_client_tls(files: ClientTlsFiles) {
    let _ = CLIENT_TLS.set(files);
}

/// Whether `addr` asks for TLS (`https://`).
pub fn is_tls(addr: &str) -> bool {
    addr.starts_with("https://")
}

/// The client configuration of an `https://` connection offering `alpn`.
pub fn tls_config(alpn: &[u8]) -> Result<Arc<rustls::ClientConfig>, ConnectError> {
    let files = CLIENT_TLS.get().cloned().unwrap_or_default();
    crate::tls::client::client_config(&files, Some(alpn))
        .map_err(|e| ConnectError::Tls(e.to_string()))
}

/// The name the daemon's certificate must carry: the host of `authority`.
pub fn tls_server_name(
    authority: &str,
) -> Result<rustls::pki_types::ServerName<'static>, ConnectError> {
    let host = match authority.rsplit_once(':') {
        Some((host, _)) => host,
        None => authority,
    };
    crate::tls::client::server_name(host).map_err(|e| ConnectError::Tls(e.to_string()))
}

/// `host:port` from `host:port`, `http://host:port`, `https://host:port`
/// (each with or without a trailing `/`).
pub fn authority(addr: &str) -> Result<String, ConnectError> {
    let rest = addr
        .strip_prefix("https://")
        .or_else(|| addr.strip_prefix("http://"))
        .unwrap_or(addr)
        .trim_end_matches('/');
    if rest.is_empty() || rest.contains('/') || !rest.contains(':') {
        return Err(ConnectError::Address(addr.to_string()));
    }
    Ok(rest.to_string())
}

/// The `authorization` value that presents `token`.
pub fn authorization(token: &str) -> String {
    format!("Bearer {token}")
}

/// Sends `authorization: Bearer <token>` with every gRPC call when a token is set.
#[derive(Debug, Clone, Default)]
pub struct Bearer(Option<MetadataValue<Ascii>>);

impl Bearer {
    /// Refuses a token that cannot travel in an HTTP header.
    pub fn new(token: Option<&str>) -> Result<Bearer, ConnectError> {
        match token {
            Some(token) => MetadataValue::try_from(authorization(token))
                .map(|value| Bearer(Some(value)))
                .map_err(|_| ConnectError::Token),
            None => Ok(Bearer(None)),
        }
    }
}

impl tonic::service::Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// A gRPC channel to `addr` (see [`authority`]; TLS for `https://`),
/// connected within `timeout`.
pub async fn channel(addr: &str, timeout: Duration) -> Result<Channel, ConnectError> {
    let authority = authority(addr)?;
    let scheme = if is_tls(addr) { "https" } else { "http" };
    let endpoint = Endpoint::from_shared(format!("{scheme}://{authority}"))
        .map_err(|_| ConnectError::Address(addr.to_string()))?
        .connect_timeout(timeout);
    let connected = if is_tls(addr) {
        let config = tls_config(crate::tls::client::ALPN_H2)?;
        let name = tls_server_name(&authority)?;
        endpoint
            .connect_with_connector(crate::tls::client::grpc_connector(config, name))
            .await
    } else {
        endpoint.connect().await
    };
    connected.map_err(|source| ConnectError::Connect {
        addr: authority.to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_with_and_without_a_scheme() {
        assert_eq!(authority("127.0.0.1:8080").unwrap(), "127.0.0.1:8080");
        assert_eq!(authority("http://host:1/").unwrap(), "host:1");
        assert_eq!(authority("https://[::1]:8443").unwrap(), "[::1]:8443");
        assert!(is_tls("https://h:1") && !is_tls("h:1") && !is_tls("http://h:1"));
        assert_eq!(
            tls_server_name("[::1]:8443").unwrap(),
            rustls::pki_types::ServerName::IpAddress(std::net::Ipv6Addr::LOCALHOST.into())
        );
        for bad in ["", "host", "http://host:1/path", "http://", "https://"] {
            assert!(
                matches!(authority(bad), Err(ConnectError::Address(a)) if a == bad),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_token_must_fit_a_header() {
        assert!(Bearer::new(Some("s3cret")).is_ok());
        assert!(Bearer::new(None).is_ok());
        assert!(matches!(
            Bearer::new(Some("line\nbreak")),
            Err(ConnectError::Token)
        ));
    }
}
