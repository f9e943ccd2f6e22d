//! The listener's TLS: its `rustls::ServerConfig`, built from
//! `[server.tls]` and swapped whole on a reload (SIGHUP, or its files
//! changed). Connections already open keep the configuration they
//! started with. A reload that fails keeps the old one and says why in
//! [`TlsStatus`]: files that do not read, a key that does not belong to the
//! certificate, and a certificate that clients would refuse now (expired,
//! not yet valid; see [`served_validity`]).
//!
//! At start-up an expired or not yet valid certificate is served (with an
//! error in the log and `cert_problem` in the status), not refused: the
//! daemon that would not start is also the one that runs the stop inputs,
//! the reflex rules and the safe drives, and a Raspberry Pi has no
//! real-time clock (until NTP syncs, "now" can be months off). A reload
//! can afford to refuse: the previous certificate keeps being served.

use parking_lot::Mutex;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::server::WebPkiClientVerifier;
use serde::Serialize;

use super::{TlsError, certified_key, provider, read_certs, read_roots, x509};
use crate::config::types::{ClientAuth, ServerTlsConfig};

/// What `/v1/status` reports of TLS.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct TlsStatus {
    pub enabled: bool,
    pub client_auth: &'static str,
    /// RFC 3339 (UTC) start of the served certificate's validity.
    pub cert_not_before: Option<String>,
    /// RFC 3339 (UTC) end of the served certificate's validity.
    pub cert_not_after: Option<String>,
    /// The served certificate's subject.
    pub cert_subject: Option<String>,
    /// Why clients that check certificates refuse what is served now (it
    /// expired, or is not valid yet); `None` while it is valid.
    pub cert_problem: Option<String>,
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
            cert_not_before: None,
            cert_not_after: None,
            cert_subject: None,
            cert_problem: None,
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
    /// The served chain, the listener's own certificate first (a
    /// certificate this reader cannot parse after the first is left out).
    chain: Vec<x509::CertInfo>,
    /// The CAs of `client_ca_file`, when client certificates are asked for.
    client_cas: Vec<x509::CertInfo>,
}

impl Loaded {
    fn leaf(&self) -> &x509::CertInfo {
        // `build` always reads the first certificate (an error otherwise).
        &self.chain[0]
    }
}

#[derive(Debug)]
struct State {
    status: TlsStatus,
    stamps: Vec<Stamp>,
    /// What is served now, for [`ServerTls::status`]'s `cert_problem`.
    chain: Vec<x509::CertInfo>,
    client_cas: Vec<x509::CertInfo>,
    /// The last reload refused files only because they are not valid yet:
    /// from this moment (Unix seconds) they would be, and the watcher
    /// tries again then (a certificate issued "now" by a CA whose clock is
    /// ahead of this host's is taken once this host catches up).
    retry_at: Option<i64>,
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
    /// Loads `[server.tls]`; an error names the file and what is wrong. A
    /// certificate outside its validity now is served all the same, and
    /// said loudly (see the module doc for why).
    pub fn load(settings: &ServerTlsConfig) -> Result<ServerTls, TlsError> {
        let stamps = stamps(settings);
        let loaded = build(settings)?;
        let now = now_secs();
        if let Err(problem) = served_validity(&loaded.chain, &loaded.client_cas, now) {
            tracing::error!(
                cert_file = %settings.cert_file.display(),
                problem = %problem,
                "the TLS certificate is served, but clients that check certificates will refuse it; \
                 put a valid one in place and reload (SIGHUP)"
            );
        }
        let status = TlsStatus {
            enabled: true,
            client_auth: settings.client_auth.as_str(),
            cert_not_before: Some(rfc3339(loaded.leaf().not_before)),
            cert_not_after: Some(rfc3339(loaded.leaf().not_after)),
            cert_subject: Some(loaded.leaf().subject.clone()),
            cert_problem: None,
            last_reload_error: None,
            reloads: 0,
        };
        Ok(ServerTls {
            settings: settings.clone(),
            current: ArcSwap::new(loaded.config),
            state: Mutex::new(State {
                status,
                stamps,
                chain: loaded.chain,
                client_cas: loaded.client_cas,
                retry_at: None,
            }),
        })
    }

    /// The acceptor for a new connection (the current certificate).
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.current.load_full())
    }

    pub fn handshake_timeout(&self) -> Duration {
        self.settings.handshake_timeout
    }

    /// The status now (`cert_problem` as of this moment).
    pub fn status(&self) -> TlsStatus {
        let state = self.lock();
        let mut status = state.status.clone();
        status.cert_problem = served_validity(&state.chain, &state.client_cas, now_secs()).err();
        status
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, State> {
        self.state.lock()
    }

    /// Reads the files again and serves them to new connections; on
    /// failure the old certificate stays and the error is kept in the status.
    pub fn reload(&self) -> Result<(), TlsError> {
        self.reload_at(now_secs())
    }

    /// [`ServerTls::reload`] at `now_secs` (Unix seconds): files that do not
    /// make a certificate clients would accept at that moment are refused.
    pub fn reload_at(&self, now_secs: i64) -> Result<(), TlsError> {
        let stamps = stamps(&self.settings);
        let mut retry_at = None;
        let result = build(&self.settings).and_then(|loaded| {
            match served_validity(&loaded.chain, &loaded.client_cas, now_secs) {
                Ok(()) => Ok(loaded),
                Err(message) => {
                    retry_at = valid_from(&loaded.chain, &loaded.client_cas, now_secs);
                    Err(TlsError::Certificate {
                        path: self.settings.cert_file.clone(),
                        message: format!("not loaded: {message}"),
                    })
                }
            }
        });
        let mut state = self.lock();
        state.stamps = stamps;
        state.retry_at = retry_at;
        match result {
            Ok(loaded) => {
                self.current.store(loaded.config.clone());
                let leaf = loaded.leaf();
                state.status.cert_not_before = Some(rfc3339(leaf.not_before));
                state.status.cert_not_after = Some(rfc3339(leaf.not_after));
                state.status.cert_subject = Some(leaf.subject.clone());
                state.status.last_reload_error = None;
                state.status.reloads += 1;
                tracing::info!(
                    subject = %leaf.subject,
                    not_after = %rfc3339(leaf.not_after),
                    "TLS certificate reloaded"
                );
                state.chain = loaded.chain;
                state.client_cas = loaded.client_cas;
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

    /// Whether files refused as not valid yet have become valid by `now_secs`.
    pub fn retry_due(&self, now_secs: i64) -> bool {
        self.lock().retry_at.is_some_and(|at| now_secs >= at)
    }

    /// Reloads whenever the files change (checked every
    /// `reload_check_secs`), until `stop`.
    pub async fn watch(self: Arc<Self>, stop: tokio_util::sync::CancellationToken) {
        let Some(every) = self.settings.reload_check else {
            return;
        };
        let mut ticker = tokio::time::interval(every);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                () = stop.cancelled() => return,
            }
            if self.files_changed() || self.retry_due(now_secs()) {
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
    let mut chain = vec![info];
    chain.extend(
        key.cert
            .iter()
            .skip(1)
            .filter_map(|c| x509::parse(c.as_ref()).ok()),
    );
    let mut client_cas = Vec::new();
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
            client_cas = read_certs(ca)?
                .iter()
                .filter_map(|c| x509::parse(c.as_ref()).ok())
                .collect();
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
        chain,
        client_cas,
    })
}

fn now_secs() -> i64 {
    crate::clock::now_ms().div_euclid(1000)
}

/// Whether clients that check certificates accept what would be served at
/// `now_secs`: every certificate of the served `chain` within its validity,
/// and (when client certificates are asked for) at least one of the
/// `client_cas` within its own (a CA bundle may keep an old CA beside its
/// successor). `Err` says which certificate and why, in words.
pub fn served_validity(
    chain: &[x509::CertInfo],
    client_cas: &[x509::CertInfo],
    now_secs: i64,
) -> Result<(), String> {
    for (i, cert) in chain.iter().enumerate() {
        let which = if i == 0 {
            format!("the certificate ({})", cert.subject)
        } else {
            format!("certificate {} of its chain ({})", i + 1, cert.subject)
        };
        if let Some(why) = outside_validity(cert, now_secs) {
            return Err(format!("{which} {why}"));
        }
    }
    if !client_cas.is_empty()
        && client_cas
            .iter()
            .all(|ca| ca.validity(now_secs) != x509::Validity::Valid)
    {
        let why: Vec<String> = client_cas
            .iter()
            .filter_map(|ca| {
                Some(format!(
                    "{} {}",
                    ca.subject,
                    outside_validity(ca, now_secs)?
                ))
            })
            .collect();
        return Err(format!(
            "no CA of server.tls.client_ca_file is valid now, no client certificate could be verified ({})",
            why.join("; ")
        ));
    }
    Ok(())
}

/// The first moment from `now_secs` on at which what would be served is
/// valid, if it only is not valid yet (`None` when something expired): the
/// latest `notBefore` of the chain, and of the earliest client CA.
fn valid_from(
    chain: &[x509::CertInfo],
    client_cas: &[x509::CertInfo],
    now_secs: i64,
) -> Option<i64> {
    let from = chain
        .iter()
        .map(|c| c.not_before)
        .chain(client_cas.iter().map(|c| c.not_before).min())
        .fold(now_secs, i64::max);
    served_validity(chain, client_cas, from)
        .is_ok()
        .then_some(from)
}

/// Why `cert` is not valid at `now_secs`, or `None`.
fn outside_validity(cert: &x509::CertInfo, now_secs: i64) -> Option<String> {
    match cert.validity(now_secs) {
        x509::Validity::Valid => None,
        x509::Validity::Expired => Some(format!(
            "expired at {} (it is {} now)",
            rfc3339(cert.not_after),
            rfc3339(now_secs)
        )),
        x509::Validity::NotYetValid => Some(format!(
            "is not valid before {} (it is {} now; is the clock right?)",
            rfc3339(cert.not_before),
            rfc3339(now_secs)
        )),
    }
}

/// What `rozd check` says about `[server.tls]`: the certificate's subject
/// and end, or why it cannot be served (its expiry is among
/// [`super::expiry_warnings`]).
pub fn check(settings: &ServerTlsConfig) -> Result<CheckReport, TlsError> {
    let loaded = build(settings)?;
    let leaf = loaded.leaf();
    Ok(CheckReport {
        subject: leaf.subject.clone(),
        not_after: rfc3339(leaf.not_after),
    })
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckReport {
    pub subject: String,
    pub not_after: String,
}

/// Unix seconds as RFC 3339 UTC (`2027-01-31T12:00:00Z`).
pub fn rfc3339(secs: i64) -> String {
    match chrono::DateTime::from_timestamp(secs, 0) {
        Some(t) => t.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
        // Beyond chrono's range (about ±262 000 years): no certificate says that.
        None => format!("{secs} s after 1970-01-01T00:00:00Z"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(subject: &str, not_before: i64, not_after: i64) -> x509::CertInfo {
        x509::CertInfo {
            subject: subject.into(),
            common_name: None,
            not_before,
            not_after,
        }
    }

    #[test]
    fn the_served_chain_must_be_valid_now_and_one_client_ca_is_enough() {
        let leaf = info("CN=leaf", 100, 200);
        let middle = info("CN=middle", 50, 150);
        let only_leaf = std::slice::from_ref(&leaf);
        assert_eq!(served_validity(only_leaf, &[], 100), Ok(()));
        assert_eq!(served_validity(only_leaf, &[], 200), Ok(()));
        let expired = served_validity(only_leaf, &[], 201).unwrap_err();
        assert!(
            expired.starts_with("the certificate (CN=leaf) expired at 1970-01-01T00:03:20Z"),
            "{expired}"
        );
        let early = served_validity(only_leaf, &[], 99).unwrap_err();
        assert!(
            early.contains("is not valid before 1970-01-01T00:01:40Z"),
            "{early}"
        );
        let chain = served_validity(&[leaf.clone(), middle], &[], 160).unwrap_err();
        assert!(
            chain.starts_with("certificate 2 of its chain (CN=middle) expired"),
            "{chain}"
        );
        // A bundle with an old CA beside a current one: fine; only old ones: not.
        let old_ca = info("CN=old CA", 0, 10);
        let new_ca = info("CN=new CA", 0, 1000);
        assert_eq!(
            served_validity(only_leaf, &[old_ca.clone(), new_ca], 150),
            Ok(())
        );
        let cas = served_validity(&[leaf], &[old_ca], 150).unwrap_err();
        assert!(
            cas.contains("no CA of server.tls.client_ca_file is valid now")
                && cas.contains("CN=old CA expired"),
            "{cas}"
        );
    }

    /// Writes a CA-signed certificate for `cn` valid between the two
    /// dates, and its key, into `dir`; their paths.
    fn issue(
        dir: &Path,
        name: &str,
        not_before: (i32, u8, u8),
        not_after: (i32, u8, u8),
    ) -> (PathBuf, PathBuf) {
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.not_before = rcgen::date_time_ymd(not_before.0, not_before.1, not_before.2);
        params.not_after = rcgen::date_time_ymd(not_after.0, not_after.1, not_after.2);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let (cert_path, key_path) = (
            dir.join(format!("{name}.pem")),
            dir.join(format!("{name}.key")),
        );
        std::fs::write(&cert_path, cert.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        (cert_path, key_path)
    }

    fn settings(cert_file: &Path, key_file: &Path) -> ServerTlsConfig {
        ServerTlsConfig {
            cert_file: cert_file.to_path_buf(),
            key_file: key_file.to_path_buf(),
            client_ca_file: None,
            client_auth: ClientAuth::None,
            handshake_timeout: Duration::from_secs(10),
            reload_check: None,
        }
    }

    /// A reload at a given moment refuses files clients would refuse then
    /// (expired, not yet valid, a key of another certificate) and keeps
    /// serving what it served; the status says why.
    #[test]
    fn a_reload_refuses_what_clients_would_refuse_and_keeps_the_old_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = issue(dir.path(), "served", (2020, 1, 1), (2030, 1, 1));
        let tls = ServerTls::load(&settings(&cert, &key)).unwrap();
        let served = tls.current.load_full();
        let in_2025 = x509_secs(2025, 6, 1);
        let replace = |name: &str, from, to| {
            let (c, k) = issue(dir.path(), name, from, to);
            std::fs::rename(c, &cert).unwrap();
            std::fs::rename(k, &key).unwrap();
        };

        replace("expired", (2020, 1, 1), (2024, 1, 1));
        let error = tls.reload_at(in_2025).unwrap_err().to_string();
        assert!(
            error.contains("(CN=expired) expired at 2024-01-01T00:00:00Z"),
            "{error}"
        );
        assert!(
            Arc::ptr_eq(&served, &tls.current.load_full()),
            "the old one is served"
        );
        assert_eq!(tls.status().last_reload_error, Some(error));
        assert_eq!(tls.status().cert_subject.as_deref(), Some("CN=served"));

        assert!(
            !tls.retry_due(x509_secs(2100, 1, 1)),
            "an expired one is not retried"
        );

        replace("early", (2026, 1, 1), (2030, 1, 1));
        let error = tls.reload_at(in_2025).unwrap_err().to_string();
        assert!(
            error.contains("(CN=early) is not valid before 2026-01-01T00:00:00Z"),
            "{error}"
        );
        assert!(Arc::ptr_eq(&served, &tls.current.load_full()));
        // Once it is valid, the watcher tries again (no file changed).
        assert!(!tls.files_changed());
        assert!(!tls.retry_due(x509_secs(2025, 12, 31)));
        assert!(tls.retry_due(x509_secs(2026, 1, 1)));

        // A valid certificate with another certificate's key.
        replace("mine", (2020, 1, 1), (2030, 1, 1));
        let (_, other_key) = issue(dir.path(), "other", (2020, 1, 1), (2030, 1, 1));
        std::fs::rename(other_key, &key).unwrap();
        let error = tls.reload_at(in_2025).unwrap_err().to_string();
        assert!(
            error.contains("does not belong to the certificate"),
            "{error}"
        );
        assert!(Arc::ptr_eq(&served, &tls.current.load_full()));
        assert_eq!(tls.status().reloads, 0);

        replace("next", (2020, 1, 1), (2030, 1, 1));
        tls.reload_at(in_2025).unwrap();
        assert!(!Arc::ptr_eq(&served, &tls.current.load_full()));
        let status = tls.status();
        assert_eq!(status.cert_subject.as_deref(), Some("CN=next"));
        assert_eq!(status.last_reload_error, None);
        assert_eq!(status.reloads, 1);
    }

    fn x509_secs(year: i32, month: u32, day: u32) -> i64 {
        x509::tests::unix_secs(year, month, day)
    }

    #[test]
    fn rfc3339_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(2_147_483_648), "2038-01-19T03:14:08Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    }
}
