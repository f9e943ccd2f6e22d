//! How every command-line client reaches a daemon: the address it is
//! given, the bearer token it presents (an HTTP header for REST, gRPC
//! metadata for the streams), the gRPC channel, and how long it waits.

use std::time::Duration;

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
    #[error("invalid address {0:?}: expected host:port or http://host:port")]
    Address(String),
    #[error("the token cannot be sent: it must be printable ASCII")]
    Token,
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: String,
        #[source]
        source: tonic::transport::Error,
    },
}

/// `host:port` from `host:port`, `http://host:port` or `http://host:port/`.
pub fn authority(addr: &str) -> Result<String, ConnectError> {
    let rest = addr
        .strip_prefix("http://")
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

/// A gRPC channel to `authority` (`host:port`), connected within `timeout`.
pub async fn channel(authority: &str, timeout: Duration) -> Result<Channel, ConnectError> {
    Endpoint::from_shared(format!("http://{authority}"))
        .map_err(|_| ConnectError::Address(authority.to_string()))?
        .connect_timeout(timeout)
        .connect()
        .await
        .map_err(|source| ConnectError::Connect {
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
        for bad in ["", "host", "http://host:1/path", "http://"] {
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
