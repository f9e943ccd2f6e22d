//! rozd as a TLS client: the CLI's connections to a daemon and one host's
//! relays to another. Roots from a CA file (else the system's, which honour
//! `SSL_CERT_FILE`), an optional client certificate, and the name the
//! server's certificate must carry (the address's host for the CLI, the
//! target's `host_id` for a relay).

use std::path::PathBuf;
use std::sync::Arc;

use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use super::{TlsError, certified_key, provider, read_roots};

/// ALPN of gRPC clients (HTTP/2 only).
pub const ALPN_H2: &[u8] = b"h2";
/// ALPN of the CLI's REST client.
pub const ALPN_HTTP1: &[u8] = b"http/1.1";

/// Where a client's trust and identity come from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientTlsFiles {
    /// PEM CA certificates the server's certificate must chain to; `None`:
    /// the system's roots.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate chain (mTLS), with `key_file`.
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
}

/// A client configuration offering `alpn` (none: no ALPN, as MQTT).
pub fn client_config(
    files: &ClientTlsFiles,
    alpn: Option<&[u8]>,
) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let provider = provider();
    let roots = match &files.ca_file {
        Some(path) => read_roots(path)?,
        None => {
            let found = rustls_native_certs::load_native_certs();
            let mut roots = rustls::RootCertStore::empty();
            roots.add_parsable_certificates(found.certs);
            if roots.is_empty() {
                return Err(TlsError::Config {
                    message: "no system root certificates found (name a CA file)".into(),
                });
            }
            roots
        }
    };
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config {
            message: e.to_string(),
        })?
        .with_root_certificates(roots);
    let mut config = match (&files.cert_file, &files.key_file) {
        (Some(cert), Some(key)) => {
            let key = certified_key(cert, key, &provider)?;
            builder.with_client_cert_resolver(Arc::new(rustls::sign::SingleCertAndKey::from(key)))
        }
        (None, None) => builder.with_no_client_auth(),
        _ => {
            return Err(TlsError::Config {
                message: "a client certificate needs both its certificate and its key file".into(),
            });
        }
    };
    config.alpn_protocols = alpn.map(|p| vec![p.to_vec()]).unwrap_or_default();
    Ok(Arc::new(config))
}

/// The name a server's certificate must carry: a DNS name or an IP address
/// (IPv6 with or without its brackets).
pub fn server_name(host: &str) -> Result<ServerName<'static>, TlsError> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(host.to_string()).map_err(|_| TlsError::Config {
        message: format!("{host:?} is not a host name a certificate can carry"),
    })
}

/// TLS over a new TCP connection to `addr`, checking that the server's
/// certificate names `name`.
pub async fn connect(
    config: Arc<rustls::ClientConfig>,
    addr: &str,
    name: ServerName<'static>,
) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    let _ = tcp.set_nodelay(true);
    tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
}

/// A connector for `tonic::transport::Endpoint::connect_with_connector`:
/// dials the URI's host and port, then TLS checking `name`.
pub fn grpc_connector(
    config: Arc<rustls::ClientConfig>,
    name: ServerName<'static>,
) -> impl tower::Service<
    http::Uri,
    Response = TokioIo<TlsStream<TcpStream>>,
    Error = std::io::Error,
    Future = impl Send,
> + Clone
+ Send
+ 'static {
    tower::service_fn(move |uri: http::Uri| {
        let config = config.clone();
        let name = name.clone();
        async move {
            let host = uri.host().unwrap_or_default();
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let port = uri.port_u16().unwrap_or(443);
            let addr = if host.contains(':') {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
            };
            connect(config, &addr, name).await.map(TokioIo::new)
        }
    })
}
