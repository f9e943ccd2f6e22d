//! TLS for every hop rozd serves or dials: the listener's certificate
//! (reloaded without a restart, [`server`]), the clients' configuration
//! (the CLI, host-to-host relays, [`client`]), and what rozd reads from a
//! certificate ([`x509`]). rustls with the ring provider throughout (no
//! aws-lc, no OpenSSL).

pub mod client;
pub mod server;
pub(crate) mod x509;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

pub use server::{ServerTls, TlsStatus};

/// ALPN protocols the listener offers: grpc-go clients (grpcurl) insist on
/// `h2`; curl and browsers may speak either.
pub const ALPN_SERVER: [&[u8]; 2] = [b"h2", b"http/1.1"];

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{}: cannot read: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {message}", path.display())]
    Pem { path: PathBuf, message: String },
    #[error("{}: {message}", path.display())]
    Certificate { path: PathBuf, message: String },
    #[error("{message}")]
    Config { message: String },
}

/// The verified client certificate of a connection, as a request extension
/// (absent: the client presented none, or the listener is plaintext).
/// `[[server.clients]]` maps `subject` to scopes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerIdentity {
    /// RFC 4514, most specific first: `CN=operator-1,O=Lab`.
    pub subject: String,
    /// The subject's common name, if it has one.
    pub common_name: Option<String>,
}

impl PeerIdentity {
    /// The identity of the end-entity certificate `der` (already verified by rustls).
    pub fn from_der(der: &[u8]) -> Option<PeerIdentity> {
        x509::parse(der).ok().map(|info| PeerIdentity {
            subject: info.subject,
            common_name: info.common_name,
        })
    }
}

/// The ring provider (the process default is set to it if none is).
pub fn provider() -> Arc<CryptoProvider> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()))
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Every certificate of a PEM file (at least one).
pub fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            path: path.to_path_buf(),
            message: format!("not PEM certificates: {e}"),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            path: path.to_path_buf(),
            message: "holds no certificate (expected -----BEGIN CERTIFICATE-----)".into(),
        });
    }
    Ok(certs)
}

/// The private key of a PEM file.
pub fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read(path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| TlsError::Pem {
        path: path.to_path_buf(),
        message: format!("holds no private key: {e}"),
    })
}

/// A root store of the CAs in a PEM file.
pub fn read_roots(path: &Path) -> Result<rustls::RootCertStore, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in read_certs(path)? {
        roots.add(cert).map_err(|e| TlsError::Certificate {
            path: path.to_path_buf(),
            message: format!("not a usable CA certificate: {e}"),
        })?;
    }
    Ok(roots)
}

/// `rozd check` warns when a certificate ends within this.
pub const EXPIRY_WARNING_SECS: i64 = 30 * 86_400;

/// What `rozd check` says of the certificates in the PEM file `path` at
/// `now_secs` (Unix seconds): a line for each one that has expired, is not
/// valid yet, or ends within [`EXPIRY_WARNING_SECS`]; a line saying why
/// when the file cannot be read.
pub fn expiry_warnings(path: &Path, now_secs: i64) -> Vec<String> {
    let certs = match read_certs(path) {
        Ok(certs) => certs,
        Err(e) => return vec![e.to_string()],
    };
    certs
        .iter()
        .filter_map(|der| {
            let info = x509::parse(der.as_ref()).ok()?;
            let at = |secs| server::rfc3339(secs);
            let what = format!("the certificate {} ({})", path.display(), info.subject);
            match info.validity(now_secs) {
                x509::Validity::Expired => {
                    Some(format!("{what} expired at {}", at(info.not_after)))
                }
                x509::Validity::NotYetValid => Some(format!(
                    "{what} is not valid before {} (is the clock right?)",
                    at(info.not_before)
                )),
                x509::Validity::Valid if info.not_after - now_secs < EXPIRY_WARNING_SECS => {
                    Some(format!(
                        "{what} expires in {} day(s), at {}",
                        (info.not_after - now_secs) / 86_400,
                        at(info.not_after)
                    ))
                }
                x509::Validity::Valid => None,
            }
        })
        .collect()
}

/// A certificate chain and its key, checked to belong together.
pub fn certified_key(
    cert_file: &Path,
    key_file: &Path,
    provider: &CryptoProvider,
) -> Result<rustls::sign::CertifiedKey, TlsError> {
    let chain = read_certs(cert_file)?;
    let key = read_key(key_file)?;
    let signing = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| TlsError::Pem {
            path: key_file.to_path_buf(),
            message: format!("unusable private key: {e}"),
        })?;
    let certified = rustls::sign::CertifiedKey::new(chain, signing);
    match certified.keys_match() {
        Ok(()) => Ok(certified),
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => Ok(certified),
        Err(e) => Err(TlsError::Certificate {
            path: key_file.to_path_buf(),
            message: format!(
                "does not belong to the certificate in {} ({e})",
                cert_file.display()
            ),
        }),
    }
}
