//! The listener's TLS: its `rustls::ServerConfig`, built from
//! `[server.tls]` and swapped whole on a reload (SIGHUP, or its files
//! changed). Connections already open keep the configuration they
//! started with; a reload that fails keeps the old one and says why in
//! [`TlsStatus`].

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::server::WebPkiClientVerifier;
use serde::Serialize;

use super::{TlsError, certified_key, provider, read_roots, x509};
use crate::config::types::{ClientAuth, ServerTlsConfig};

/// What `/v1/status` reports of TLS.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct TlsStatus {
    pub enabled: bool,
    pub client_auth: &'static str,
    /// RFC 3339 (UTC) end of the served certificate's validity.
    pub cert_not_after: Option<String>,
    /// The served certificate's subject.
    pub cert_subject: Option<String>,
    /// Why the last reload failed (the old certificate is still served);
    /// `None` once a reload succeeds.
    pub last_reload_error: Option<String>,
    /// Successful reloads since start.
    pub reloads: u64,
}

impl TlsStatus {
    /// The status of a plaintext listener.
    pub fn disabled() -> TlsStatus {
        TlsStatus {
            enabled: false,
            client_auth: ClientAuth::None.as_str(),
            cert_not_after: None,
            cert_subject: None,
            last_reload_error: None,
            reloads: 0,
        }
    }
}

/// A file's identity and change stamp: a rename or a rewrite changes it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp(Option<(u64, std::time::SystemTime, u64)>);

impl Stamp {
    fn of(path: &Path) -> Stamp {
        use std::os::unix::fs::MetadataExt as _;
        Stamp(
            std::fs::metadata(path)
                .ok()
                .and_then(|m| Some((m.ino(), m.modified().ok()?, m.len()))),
        )
    }
}

/// One loaded configuration and what was read to build it.
struct Loaded {
    config: Arc<rustls::ServerConfig>,
    info: x509::CertInfo,
}

#[derive(Debug)]
struct State {
    status: TlsStatus,
    stamps: Vec<Stamp>,
}

/// The listener's TLS, reloadable.
pub struct ServerTls {
    settings: ServerTlsConfig,
    current: ArcSwap<rustls::ServerConfig>,
    state: Mutex<State>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Loads `[server.tls]`; an error names the file and what is wrong.
    pub fn load(settings: &ServerTlsConfig) -> Result<ServerTls, TlsError> {
        let stamps = stamps(settings);
        let loaded = build(settings)?;
        let status = TlsStatus {
            enabled: true,
            client_auth: settings.client_auth.as_str(),
            cert_not_after: Some(rfc3339(loaded.info.not_after)),
            cert_subject: Some(loaded.info.subject.clone()),
            last_reload_error: None,
            reloads: 0,
        };
        Ok(ServerTls {
            settings: settings.clone(),
            current: ArcSwap::new(loaded.config),
            state: Mutex::new(State { status, stamps }),
        })
    }

    /// The acceptor for a new connection (the current certificate).
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.current.load_full())
    }

    pub fn handshake_timeout(&self) -> Duration {
        Duration::from_secs(self.settings.handshake_timeout_secs)
    }

    pub fn status(&self) -> TlsStatus {
        self.lock().status.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reads the files again and serves them to new connections; on
    /// failure the old certificate stays and the error is kept in the status.
    pub fn reload(&self) -> Result<(), TlsError> {
        let stamps = stamps(&self.settings);
        let result = build(&self.settings);
        let mut state = self.lock();
        state.stamps = stamps;
        match result {
            Ok(loaded) => {
                self.current.store(loaded.config);
                state.status.cert_not_after = Some(rfc3339(loaded.info.not_after));
                state.status.cert_subject = Some(loaded.info.subject.clone());
                state.status.last_reload_error = None;
                state.status.reloads += 1;
                tracing::info!(
                    subject = %loaded.info.subject,
                    not_after = %rfc3339(loaded.info.not_after),
                    "TLS certificate reloaded"
                );
                Ok(())
            }
            Err(e) => {
                tracing::error!(error = %e, "TLS reload failed; still serving the previous certificate");
                state.status.last_reload_error = Some(e.to_string());
                Err(e)
            }
        }
    }

    /// Whether a file changed since it was last read.
    pub fn files_changed(&self) -> bool {
        self.lock().stamps != stamps(&self.settings)
    }

    /// Reloads whenever the files change (checked every
    /// `reload_check_secs`), until `stop`.
    pub async fn watch(self: Arc<Self>, stop: tokio_util::sync::CancellationToken) {
        let every = self.settings.reload_check_secs;
        if every == 0 {
            return;
        }
        let mut ticker = tokio::time::interval(Duration::from_secs(every));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                () = stop.cancelled() => return,
            }
            if self.files_changed() {
                let tls = self.clone();
                // Reading files: off the runtime's threads.
                let _ = tokio::task::spawn_blocking(move || tls.reload()).await;
            }
        }
    }
}

fn files(settings: &ServerTlsConfig) -> Vec<PathBuf> {
    let mut files = vec![settings.cert_file.clone(), settings.key_file.clone()];
    files.extend(settings.client_ca_file.clone());
    files
}

fn stamps(settings: &ServerTlsConfig) -> Vec<Stamp> {
    files(settings).iter().map(|p| Stamp::of(p)).collect()
}

/// The server configuration of `settings`, from its files.
fn build(settings: &ServerTlsConfig) -> Result<Loaded, TlsError> {
    let provider = provider();
    let key = certified_key(&settings.cert_file, &settings.key_file, &provider)?;
    let leaf = key.cert.first().ok_or_else(|| TlsError::Pem {
        path: settings.cert_file.clone(),
        message: "holds no certificate".into(),
    })?;
    let info = x509::parse(leaf.as_ref()).map_err(|e| TlsError::Certificate {
        path: settings.cert_file.clone(),
        message: e.to_string(),
    })?;
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config {
            message: e.to_string(),
        })?;
    let builder = match (settings.client_auth, &settings.client_ca_file) {
        (ClientAuth::None, _) => builder.with_no_client_auth(),
        (_, None) => {
            return Err(TlsError::Config {
                message: format!(
                    "server.tls.client_auth = \"{}\" needs server.tls.client_ca_file",
                    settings.client_auth.as_str()
                ),
            });
        }
        (auth, Some(ca)) => {
            let roots = Arc::new(read_roots(ca)?);
            let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider.clone());
            let verifier = if auth == ClientAuth::Optional {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            builder.with_client_cert_verifier(verifier.build().map_err(|e| {
                TlsError::Certificate {
                    path: ca.clone(),
                    message: e.to_string(),
                }
            })?)
        }
    };
    let mut config =
        builder.with_cert_resolver(Arc::new(rustls::sign::SingleCertAndKey::from(key)));
    config.alpn_protocols = super::ALPN_SERVER.iter().map(|p| p.to_vec()).collect();
    Ok(Loaded {
        config: Arc::new(config),
        info,
    })
}

/// What `rozd check` says about `[server.tls]`: the certificate's subject
/// and end, or why it cannot be served; `warning` when it expires within
/// 30 days (or has expired).
pub fn check(settings: &ServerTlsConfig, now_secs: i64) -> Result<CheckReport, TlsError> {
    let loaded = build(settings)?;
    let left = loaded.info.not_after - now_secs;
    let warning = if left <= 0 {
        Some(format!(
            "the certificate {} expired at {}",
            settings.cert_file.display(),
            rfc3339(loaded.info.not_after)
        ))
    } else if left < EXPIRY_WARNING_SECS {
        Some(format!(
            "the certificate {} expires in {} day(s), at {}",
            settings.cert_file.display(),
            left / 86_400,
            rfc3339(loaded.info.not_after)
        ))
    } else {
        None
    };
    Ok(CheckReport {
        subject: loaded.info.subject,
        not_after: rfc3339(loaded.info.not_after),
        warning,
    })
}

/// `rozd check` warns when the certificate ends within this.
pub const EXPIRY_WARNING_SECS: i64 = 30 * 86_400;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckReport {
    pub subject: String,
    pub not_after: String,
    pub warning: Option<String>,
}

/// Unix seconds as RFC 3339 UTC (`2027-01-31T12:00:00Z`).
pub fn rfc3339(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// H. Hinnant's `civil_from_days`.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(2_147_483_648), "2038-01-19T03:14:08Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    }
}
