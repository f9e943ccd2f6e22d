//! TLS on every hop (issue 16, transport): the listener with curl, grpcurl,
//! a grpcio client and rozd's own CLI; client certificates; rotation
//! without a restart; relays that send the fleet token only to the host a
//! certificate names; a mosquitto broker whose ACL keeps each host to its own
//! record. Every certificate is made at run time (rcgen, or the fleet guide's
//! openssl recipe); nothing secret is committed.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use rozd::proto;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt as _, BufReader};
use tokio::process::Command;

use crate::common::broker::free_port;
use crate::common::{self, EXPECT_WITHIN, TestDaemon, rozd_cli};

const ROZD: &str = env!("CARGO_BIN_EXE_rozd");
const TOKEN: &str = "tls-test-token";

/// A test CA (rcgen) writing its certificates into a temporary directory.
struct Pki {
    dir: tempfile::TempDir,
    ca: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
}

impl Pki {
    fn new() -> Pki {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "rozd test CA");
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        let ca = rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap())
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
        Pki { dir, ca }
    }

    fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `<file>.pem` and `<file>.key`: subject `O=Lab,CN=<cn>` (RFC 4514:
    /// `CN=<cn>,O=Lab`), for `localhost` and 127.0.0.1, valid until
    /// `not_after` (year, month, day). Written by rename, as a deployment
    /// tool would.
    fn issue(&self, file: &str, cn: &str, not_after: (i32, u8, u8)) -> (PathBuf, PathBuf) {
        self.issue_period(file, cn, (2000, 1, 1), not_after)
    }

    /// [`Pki::issue`], valid from `not_before`.
    fn issue_period(
        &self,
        file: &str,
        cn: &str,
        not_before: (i32, u8, u8),
        not_after: (i32, u8, u8),
    ) -> (PathBuf, PathBuf) {
        let mut params =
            rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
                .unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "Lab");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        params.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.not_before = rcgen::date_time_ymd(not_before.0, not_before.1, not_before.2);
        params.not_after = rcgen::date_time_ymd(not_after.0, not_after.1, not_after.2);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.ca).unwrap();
        let (cert_path, key_path) = (
            self.path(&format!("{file}.pem")),
            self.path(&format!("{file}.key")),
        );
        replace(&cert_path, cert.pem().as_bytes());
        replace(&key_path, key.serialize_pem().as_bytes());
        (cert_path, key_path)
    }
}

/// Writes `path` whole by rename (never a half-written file).
fn replace(path: &Path, content: &[u8]) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, content).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// `[server]` lines: the token, and `[server.tls]` with `cert`/`key` and `extra`.
fn tls_server(cert: &Path, key: &Path, extra: &str) -> String {
    format!(
        "auth_tokens = [\"{TOKEN}\"]\n[server.tls]\ncert_file = {:?}\nkey_file = {:?}\n{extra}\n",
        s(cert),
        s(key)
    )
}

async fn start_tls(server: &str, extra: &str) -> TestDaemon {
    TestDaemon::setup(extra).server(server).start().await
}

/// The subject of the certificate a TLS listener at `addr` serves now.
async fn served_subject(addr: &str, ca: &Path) -> String {
    let config = rozd::tls::client::client_config(
        &rozd::tls::client::ClientTlsFiles {
            ca_file: Some(ca.to_path_buf()),
            ..Default::default()
        },
        Some(b"http/1.1"),
    )
    .unwrap();
    let name = rozd::tls::client::server_name("localhost").unwrap();
    let stream = tokio::time::timeout(
        EXPECT_WITHIN,
        rozd::tls::client::connect(config, addr, name),
    )
    .await
    .expect("handshake in time")
    .expect("TLS handshake");
    let leaf = stream.get_ref().1.peer_certificates().unwrap()[0].clone();
    rozd::tls::PeerIdentity::from_der(leaf.as_ref())
        .unwrap()
        .subject
}

async fn run(
    program: &Path,
    args: &[&str],
    env: &[(&str, &Path)],
) -> (Option<i32>, String, String) {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_remove("ROZD_ADDR")
        .env_remove("ROZD_TOKEN")
        .env_remove("ROZD_CONFIG")
        .env_remove("ROZD_CACERT")
        .env_remove("ROZD_CERT")
        .env_remove("ROZD_KEY")
        .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = tokio::time::timeout(EXPECT_WITHIN * 4, cmd.output())
        .await
        .expect("exits in time")
        .unwrap_or_else(|e| panic!("run {}: {e}", program.display()));
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_grpcurl_and_the_cli_speak_tls_and_status_reports_it() {
    let pki = Pki::new();
    let (cert, key) = pki.issue("rozd", "rozd-test", (2031, 1, 1));
    let daemon = start_tls(&tls_server(&cert, &key, ""), "").await;
    let port = daemon.addr.port();
    let ca = pki.ca_file();
    let url = format!("https://localhost:{port}/v1/status");
    let auth = format!("authorization: Bearer {TOKEN}");
    let curl = Path::new("curl");

    let (code, out, err) = run(curl, &["-sS", "--cacert", &s(&ca), "-H", &auth, &url], &[]).await;
    assert_eq!(code, Some(0), "{err}");
    let status: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(status["tls"]["enabled"], true, "{status}");
    assert_eq!(status["tls"]["client_auth"], "none");
    assert_eq!(status["tls"]["cert_subject"], "CN=rozd-test,O=Lab");
    assert_eq!(status["tls"]["cert_not_after"], "2031-01-01T00:00:00Z");
    assert_eq!(status["tls"]["last_reload_error"], Value::Null);
    assert_eq!(status["client_certificate"], Value::Null);
    // HTTP/2 through ALPN as well.
    let (code, out, err) = run(
        curl,
        &[
            "-sS",
            "--http2",
            "-o",
            "/dev/null",
            "-w",
            "%{http_version}",
            "--cacert",
            &s(&ca),
            "-H",
            &auth,
            &url,
        ],
        &[],
    )
    .await;
    assert_eq!((code, out.as_str()), (Some(0), "2"), "{err}");
    // A client that does not trust the CA gets nothing.
    let (code, _, _) = run(curl, &["-sS", "-H", &auth, &url], &[]).await;
    assert_eq!(
        code,
        Some(60),
        "curl: peer certificate cannot be authenticated"
    );
    // Plaintext to the TLS port is not HTTP.
    assert!(
        rozd::cli::client::get(&daemon.addr.to_string(), "/healthz", None)
            .await
            .is_err()
    );

    let grpcurl = common::pyenv_tool("grpcurl");
    let target = format!("localhost:{port}");
    let (code, out, err) = run(
        &grpcurl,
        &["-cacert", &s(&ca), "-H", &auth, &target, "list"],
        &[],
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    assert!(out.lines().any(|l| l == "roz.v1.AgentService"), "{out}");
    let (code, out, err) = run(
        &grpcurl,
        &[
            "-cacert",
            &s(&ca),
            "-H",
            &auth,
            "-d",
            r#"{"start":{"environment_id":"lab"}}"#,
            &target,
            "roz.v1.AgentService/StreamSession",
        ],
        &[],
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("sessionStarted"), "{out}");

    // rozd's own CLI, REST (status, hosts) and gRPC (task watch is covered by chat below).
    let addr = format!("https://127.0.0.1:{port}");
    for args in [
        vec![
            "status",
            "--addr",
            &addr,
            "--cacert",
            &s(&ca),
            "--token",
            TOKEN,
            "--json",
        ],
        vec![
            "hosts",
            "--addr",
            &addr,
            "--cacert",
            &s(&ca),
            "--token",
            TOKEN,
            "--json",
        ],
        vec![
            "task",
            "list",
            "--addr",
            &addr,
            "--cacert",
            &s(&ca),
            "--token",
            TOKEN,
            "--json",
        ],
    ] {
        let (code, out, err) = rozd_cli(&args).await;
        assert_eq!(code, Some(0), "{args:?}: {err}");
        assert!(
            serde_json::from_str::<Value>(&out).is_ok(),
            "{args:?}: {out}"
        );
    }
    // The CA from the environment, as a script would set it.
    let (code, _, err) = run(
        Path::new(ROZD),
        &["status", "--addr", &addr, "--token", TOKEN],
        &[("ROZD_CACERT", &ca)],
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    // Without the CA, the CLI refuses the daemon's certificate.
    let (code, _, err) = run(
        Path::new(ROZD),
        &["status", "--addr", &addr, "--token", TOKEN],
        &[("SSL_CERT_FILE", Path::new("/dev/null"))],
    )
    .await;
    assert_eq!(code, Some(1), "{err}");
    daemon.shutdown().await;
}

/// Configured like the published roz CLI: TLS with the machine's roots (no
/// CA given to the client; the test CA is the whole root store) and a
/// bearer token: a grpcio client completes a session with a client tool,
/// and `rozd chat` (rustls with the native roots) one turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_with_system_roots_and_a_bearer_token_completes_a_session() {
    let pki = Pki::new();
    let (cert, key) = pki.issue("rozd", "rozd-test", (2031, 1, 1));
    let daemon = start_tls(&tls_server(&cert, &key, ""), "").await;
    let port = daemon.addr.port();
    let ca = pki.ca_file();
    let python = common::pyenv_tool("python");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/session_client.py");
    let out = tokio::time::timeout(
        EXPECT_WITHIN * 6,
        Command::new(&python)
            .arg(&script)
            .arg(format!("https://localhost:{port}"))
            .env("ROZD_TOKEN", TOKEN)
            .env("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH", &ca)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .stdin(Stdio::null())
            .output(),
    )
    .await
    .expect("the client exits")
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("session_client: OK"), "{stdout}");

    let (code, out, err) = run(
        Path::new(ROZD),
        &[
            "chat",
            "--addr",
            &format!("https://localhost:{port}"),
            "--prompt",
            "echo hello over tls",
        ],
        &[("SSL_CERT_FILE", &ca), ("ROZD_TOKEN", Path::new(TOKEN))],
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("hello over tls"), "{out}");
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_required_refuses_a_client_without_a_certificate_and_names_the_one_with() {
    let pki = Pki::new();
    let (cert, key) = pki.issue("rozd", "rozd-test", (2031, 1, 1));
    let (client_cert, client_key) = pki.issue("operator", "operator-1", (2031, 1, 1));
    let extra = format!(
        "client_ca_file = {:?}\nclient_auth = \"required\"\n",
        s(&pki.ca_file())
    );
    let daemon = start_tls(&tls_server(&cert, &key, &extra), "").await;
    let addr = format!("https://127.0.0.1:{}", daemon.addr.port());
    let ca = s(&pki.ca_file());
    let (code, _, err) =
        rozd_cli(&["status", "--addr", &addr, "--cacert", &ca, "--token", TOKEN]).await;
    assert_eq!(code, Some(1), "refused in the handshake: {err}");
    let url = format!("https://localhost:{}/healthz", daemon.addr.port());
    let (code, _, _) = run(Path::new("curl"), &["-sS", "--cacert", &ca, &url], &[]).await;
    assert_ne!(code, Some(0), "curl without a client certificate");

    let (code, out, err) = rozd_cli(&[
        "status",
        "--addr",
        &addr,
        "--cacert",
        &ca,
        "--cert",
        &s(&client_cert),
        "--key",
        &s(&client_key),
        "--token",
        TOKEN,
        "--json",
    ])
    .await;
    assert_eq!(code, Some(0), "{err}");
    let status: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(status["tls"]["client_auth"], "required");
    assert_eq!(status["client_certificate"], "CN=operator-1,O=Lab");
    // A certificate from another CA is refused too.
    let other = Pki::new();
    let (foreign_cert, foreign_key) = other.issue("operator", "operator-1", (2031, 1, 1));
    let (code, _, _) = rozd_cli(&[
        "status",
        "--addr",
        &addr,
        "--cacert",
        &ca,
        "--cert",
        &s(&foreign_cert),
        "--key",
        &s(&foreign_key),
        "--token",
        TOKEN,
    ])
    .await;
    assert_eq!(code, Some(1));
    daemon.shutdown().await;
}

/// `rozd run` with a notification socket, as systemd runs it.
struct Service {
    child: tokio::process::Child,
    port: u16,
    notify: tokio::net::UnixDatagram,
    _dir: tempfile::TempDir,
}

impl Service {
    async fn start(server: &str) -> Service {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let notify_path = dir.path().join("notify.sock");
        let notify = tokio::net::UnixDatagram::bind(&notify_path).unwrap();
        let config = dir.path().join("rozd.toml");
        std::fs::write(
            &config,
            format!(
                "[server]\nlisten = \"127.0.0.1:{port}\"\n{server}\n[store]\npath = {:?}\n",
                s(&dir.path().join("rozd.db"))
            ),
        )
        .unwrap();
        let child = Command::new(ROZD)
            .args(["run", "--config", &s(&config)])
            .env("NOTIFY_SOCKET", &notify_path)
            .env_remove("ROZD_CONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut service = Service {
            child,
            port,
            notify,
            _dir: dir,
        };
        service.until_notified("READY=1").await;
        service
    }

    /// Waits for a notification containing `state`.
    async fn until_notified(&mut self, state: &str) -> String {
        let mut buf = [0u8; 4096];
        loop {
            let n = tokio::time::timeout(EXPECT_WITHIN, self.notify.recv(&mut buf))
                .await
                .unwrap_or_else(|_| panic!("no {state} from rozd"))
                .unwrap();
            let text = String::from_utf8_lossy(&buf[..n]).into_owned();
            if text.lines().any(|l| l == state) {
                return text;
            }
        }
    }

    async fn hangup(&mut self) {
        let pid = self.child.id().unwrap().to_string();
        let status = Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .await
            .unwrap();
        assert!(status.success());
        self.until_notified("RELOADING=1").await;
        self.until_notified("READY=1").await;
    }

    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

async fn tls_status(addr: &str, ca: &Path) -> Value {
    let (code, out, err) = rozd_cli(&[
        "status",
        "--addr",
        &format!("https://{addr}"),
        "--cacert",
        &s(ca),
        "--token",
        TOKEN,
        "--json",
    ])
    .await;
    assert_eq!(code, Some(0), "{err}");
    serde_json::from_str::<Value>(&out).unwrap()["tls"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_rotated_on_disk_is_served_without_a_restart() {
    let pki = Pki::new();
    let (cert, key) = pki.issue("rozd", "rozd-v1", (2030, 1, 1));
    let ca = pki.ca_file();
    // SIGHUP (systemctl reload): RELOADING=1, the new certificate, READY=1.
    let mut service = Service::start(&tls_server(&cert, &key, "reload_check_secs = 0")).await;
    assert_eq!(
        served_subject(&service.addr(), &ca).await,
        "CN=rozd-v1,O=Lab"
    );
    pki.issue("rozd", "rozd-v2", (2031, 6, 1));
    service.hangup().await;
    assert_eq!(
        served_subject(&service.addr(), &ca).await,
        "CN=rozd-v2,O=Lab"
    );
    let tls = tls_status(&service.addr(), &ca).await;
    assert_eq!(tls["cert_not_after"], "2031-06-01T00:00:00Z", "{tls}");
    assert_eq!(tls["reloads"], 1);
    // A key that does not belong to the certificate: the old one stays.
    let (_, other_key) = pki.issue("other", "other", (2031, 1, 1));
    replace(&key, &std::fs::read(&other_key).unwrap());
    service.hangup().await;
    assert_eq!(
        served_subject(&service.addr(), &ca).await,
        "CN=rozd-v2,O=Lab"
    );
    let tls = tls_status(&service.addr(), &ca).await;
    let error = tls["last_reload_error"].as_str().unwrap_or_default();
    assert!(
        error.contains("does not belong to the certificate"),
        "{tls}"
    );
    assert_eq!(tls["reloads"], 1);

    // Without a signal: the files changed, checked every second.
    let pki = Pki::new();
    let (cert, key) = pki.issue("rozd", "rozd-v1", (2030, 1, 1));
    let daemon = start_tls(&tls_server(&cert, &key, "reload_check_secs = 1"), "").await;
    let addr = daemon.addr.to_string();
    assert_eq!(
        served_subject(&addr, &pki.ca_file()).await,
        "CN=rozd-v1,O=Lab"
    );
    pki.issue("rozd", "rozd-v2", (2031, 6, 1));
    let deadline = tokio::time::Instant::now() + EXPECT_WITHIN;
    // Polls (bounded) what a new client is served.
    while served_subject(&addr, &pki.ca_file()).await != "CN=rozd-v2,O=Lab" {
        assert!(tokio::time::Instant::now() < deadline, "never reloaded");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(daemon.host.tls().unwrap().status().reloads, 1);
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_the_certificate_warns_before_it_expires_and_refuses_a_wrong_key() {
    let pki = Pki::new();
    let soon = rozd::tls::server::rfc3339(rozd::clock::now_ms() / 1000 + 10 * 86_400);
    let ymd = |i: std::ops::Range<usize>| soon[i].parse::<u32>().unwrap();
    let (cert, key) = pki.issue(
        "rozd",
        "rozd-soon",
        (ymd(0..4) as i32, ymd(5..7) as u8, ymd(8..10) as u8),
    );
    let config = pki.path("rozd.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = \"0.0.0.0:8443\"\n{}",
            tls_server(&cert, &key, "")
        ),
    )
    .unwrap();
    let (code, out, err) = rozd_cli(&["check", "--config", &s(&config)]).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("CN=rozd-soon,O=Lab"), "{out}");
    assert!(
        out.contains("warning: server.tls.cert_file: the certificate"),
        "{out}"
    );
    assert!(
        out.contains("expires in 9 day(s)") || out.contains("expires in 10 day(s)"),
        "{out}"
    );
    let (_, other_key) = pki.issue("other", "other", (2031, 1, 1));
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = \"0.0.0.0:8443\"\n{}",
            tls_server(&cert, &other_key, "")
        ),
    )
    .unwrap();
    let (code, _, err) = rozd_cli(&["check", "--config", &s(&config)]).await;
    assert_eq!(code, Some(78), "{err}");
    assert!(err.contains("server.tls.key_file"), "{err}");
    assert!(err.contains("does not belong to the certificate"), "{err}");
}

/// Issue 32, item 7: `systemctl reload` (SIGHUP to the rozd binary) with an
/// expired, then a not yet valid certificate on disk: each reload is
/// refused, the previous certificate is still what a checking client is
/// served (its handshake succeeds), and `/v1/status` says why; a valid one
/// is then taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_refuses_an_expired_or_not_yet_valid_certificate_and_keeps_the_old_one() {
    let pki = Pki::new();
    let (cert, key) = pki.issue("rozd", "rozd-good", (2031, 1, 1));
    let ca = pki.ca_file();
    let mut service = Service::start(&tls_server(&cert, &key, "reload_check_secs = 0")).await;
    assert_eq!(
        served_subject(&service.addr(), &ca).await,
        "CN=rozd-good,O=Lab"
    );

    pki.issue_period("rozd", "rozd-expired", (2019, 1, 1), (2020, 1, 1));
    service.hangup().await;
    assert_eq!(
        served_subject(&service.addr(), &ca).await,
        "CN=rozd-good,O=Lab",
        "the expired certificate must not be served"
    );
    let tls = tls_status(&service.addr(), &ca).await;
    let error = tls["last_reload_error"].as_str().unwrap_or_default();
    assert!(
        error.contains("CN=rozd-expired,O=Lab")
            && error.contains("expired at 2020-01-01T00:00:00Z"),
        "{tls}"
    );
    assert_eq!(tls["reloads"], 0, "{tls}");
    assert_eq!(tls["cert_subject"], "CN=rozd-good,O=Lab", "{tls}");
    assert_eq!(tls["cert_problem"], Value::Null, "{tls}");

    pki.issue_period("rozd", "rozd-future", (2090, 1, 1), (2091, 1, 1));
    service.hangup().await;
    assert_eq!(
        served_subject(&service.addr(), &ca).await,
        "CN=rozd-good,O=Lab",
        "a certificate not valid yet must not be served"
    );
    let tls = tls_status(&service.addr(), &ca).await;
    let error = tls["last_reload_error"].as_str().unwrap_or_default();
    assert!(
        error.contains("CN=rozd-future,O=Lab")
            && error.contains("not valid before 2090-01-01T00:00:00Z"),
        "{tls}"
    );
    assert_eq!(tls["reloads"], 0, "{tls}");

    // A valid certificate is taken, and the error is gone.
    pki.issue("rozd", "rozd-next", (2032, 1, 1));
    service.hangup().await;
    assert_eq!(
        served_subject(&service.addr(), &ca).await,
        "CN=rozd-next,O=Lab"
    );
    let tls = tls_status(&service.addr(), &ca).await;
    assert_eq!(tls["last_reload_error"], Value::Null, "{tls}");
    assert_eq!(tls["reloads"], 1, "{tls}");
}

/// Issue 32, item 7, start-up: an expired listener certificate does not
/// keep rozd down (the daemon runs the stop inputs and the safe drives);
/// it is served, and `/v1/status` says that checking clients will refuse it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_certificate_at_start_up_is_served_and_reported() {
    let pki = Pki::new();
    let (cert, key) = pki.issue_period("rozd", "rozd-old", (2019, 1, 1), (2020, 1, 1));
    let daemon = start_tls(&tls_server(&cert, &key, "reload_check_secs = 0"), "").await;
    let url = format!("https://localhost:{}/v1/status", daemon.addr.port());
    let auth = format!("authorization: Bearer {TOKEN}");
    // A client that checks refuses it (curl: 60, certificate problem).
    let (code, _, _) = run(
        Path::new("curl"),
        &["-sS", "--cacert", &s(&pki.ca_file()), "-H", &auth, &url],
        &[],
    )
    .await;
    assert_eq!(code, Some(60));
    // One told not to check (what an operator does to look) reads the status.
    let (code, out, err) = run(Path::new("curl"), &["-sSk", "-H", &auth, &url], &[]).await;
    assert_eq!(code, Some(0), "{err}");
    let status: Value = serde_json::from_str(&out).expect("JSON");
    let problem = status["tls"]["cert_problem"].as_str().unwrap_or_default();
    assert!(
        problem.contains("CN=rozd-old,O=Lab")
            && problem.contains("expired at 2020-01-01T00:00:00Z"),
        "{status}"
    );
    assert_eq!(status["tls"]["cert_not_before"], "2019-01-01T00:00:00Z");
    daemon.shutdown().await;
}

/// A self-signed certificate `<name>.pem` (and `<name>.key`) in `dir`,
/// valid from `not_before` to `not_after` (Unix seconds).
fn lone_cert(dir: &Path, name: &str, not_before: i64, not_after: i64) -> (PathBuf, PathBuf) {
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let at = |secs: i64| {
        let day = rozd::tls::server::rfc3339(secs);
        let n = |r: std::ops::Range<usize>| day[r].parse::<u32>().unwrap();
        rcgen::date_time_ymd(n(0..4) as i32, n(5..7) as u8, n(8..10) as u8)
    };
    params.not_before = at(not_before);
    params.not_after = at(not_after);
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

/// Issue 32, item 7: `rozd check` warns of every configured certificate
/// that expired, is not valid yet or expires soon (the listener's client
/// CAs, the MQTT and fleet connections'), not only the listener's; and
/// still says the configuration is OK (none of them stops rozd).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_warns_about_every_configured_certificate_that_expires() {
    let pki = Pki::new();
    let (cert, key) = pki.issue("rozd", "rozd-fine", (2031, 1, 1));
    let dir = pki.dir.path();
    let now = rozd::clock::now_ms() / 1000;
    let day = 86_400;
    let (client_ca, _) = lone_cert(dir, "client-ca-old", now - 400 * day, now - 30 * day);
    let (mqtt_ca, _) = lone_cert(dir, "mqtt-ca-future", now + 30 * day, now + 400 * day);
    let (mqtt_cert, mqtt_key) = lone_cert(dir, "mqtt-client-soon", now - day, now + 10 * day);
    let (fleet_ca, _) = lone_cert(dir, "fleet-ca-fine", now - day, now + 400 * day);
    let (fleet_cert, fleet_key) = lone_cert(dir, "rover-1-old", now - 400 * day, now - 2 * day);
    let token = dir.join("fleet.token");
    std::fs::write(&token, "fleet-secret\n").unwrap();
    let config = pki.path("rozd.toml");
    std::fs::write(
        &config,
        format!(
            "[host]\nid = \"rover-1\"\n[server]\nlisten = \"127.0.0.1:8443\"\n{}\
             client_auth = \"optional\"\nclient_ca_file = {:?}\n\
             [mqtt]\nurl = \"mqtts://127.0.0.1:8883\"\nca_file = {:?}\ncert_file = {:?}\nkey_file = {:?}\n\
             [fleet]\nurl = \"mqtts://127.0.0.1:8884\"\ntoken_file = {:?}\nca_file = {:?}\ncert_file = {:?}\nkey_file = {:?}\n\
             advertise = \"https://127.0.0.1:8443\"\n",
            tls_server(&cert, &key, ""),
            s(&client_ca),
            s(&mqtt_ca),
            s(&mqtt_cert),
            s(&mqtt_key),
            s(&token),
            s(&fleet_ca),
            s(&fleet_cert),
            s(&fleet_key),
        ),
    )
    .unwrap();
    let (code, out, err) = rozd_cli(&["check", "--config", &s(&config)]).await;
    assert_eq!(code, Some(0), "{err}\n{out}");
    assert!(out.contains("configuration OK"), "{out}");
    // The certificates' warnings (a missing operator's manual is another).
    let warnings: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("warning:") && l.contains("the certificate"))
        .collect();
    let has = |key: &str, cn: &str, what: &str| {
        warnings.iter().any(|w| {
            w.starts_with(&format!("warning: {key}: ")) && w.contains(cn) && w.contains(what)
        })
    };
    assert!(
        has(
            "server.tls.client_ca_file",
            "CN=client-ca-old",
            "expired at"
        ),
        "{out}"
    );
    assert!(
        has("mqtt.ca_file", "CN=mqtt-ca-future", "is not valid before"),
        "{out}"
    );
    assert!(
        has("mqtt.cert_file", "CN=mqtt-client-soon", "expires in"),
        "{out}"
    );
    assert!(
        has("fleet.cert_file", "CN=rover-1-old", "expired at"),
        "{out}"
    );
    // Valid certificates (the listener's, the fleet CA) are not warned about.
    assert!(
        !warnings
            .iter()
            .any(|w| w.contains("fleet-ca-fine") || w.contains("rozd-fine")),
        "{out}"
    );
    assert_eq!(warnings.len(), 4, "{out}");
}

/// Runs the fleet guide's certificate recipe (docs/guides/fleet.md), exactly, in `dir`.
fn fleet_certificates(dir: &Path) {
    let guide =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/guides/fleet.md"))
            .unwrap();
    let block = guide
        .split("<!-- fleet-certs:begin -->")
        .nth(1)
        .and_then(|rest| rest.split("<!-- fleet-certs:end -->").next())
        .expect("docs/guides/fleet.md has the fleet-certificate recipe");
    let script: String = block
        .lines()
        .filter(|l| !l.starts_with("```"))
        .map(|l| format!("{l}\n"))
        .collect();
    let out = std::process::Command::new("bash")
        .args(["-euo", "pipefail", "-c", &script])
        .current_dir(dir)
        .output()
        .expect("run bash");
    assert!(
        out.status.success(),
        "the fleet guide's recipe failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for file in [
        "fleet-ca.pem",
        "rover-1.pem",
        "rover-1.key",
        "rover-2.pem",
        "rover-2.key",
    ] {
        assert!(dir.join(file).exists(), "{file}");
    }
}

/// A TLS server that accepts one connection with `cert`/`key` and reports
/// how many bytes of application data it read (the fleet token would be
/// among them).
async fn trap(cert: &Path, key: &Path) -> (String, tokio::task::JoinHandle<usize>) {
    let settings = rozd::config::ServerTlsConfig {
        cert_file: cert.to_path_buf(),
        key_file: key.to_path_buf(),
        client_ca_file: None,
        client_auth: rozd::config::ClientAuth::None,
        handshake_timeout: std::time::Duration::from_secs(10),
        reload_check: None,
    };
    let acceptor = rozd::tls::ServerTls::load(&settings).unwrap().acceptor();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("https://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        let Ok(Ok((tcp, _))) = tokio::time::timeout(EXPECT_WITHIN, listener.accept()).await else {
            return 0;
        };
        match acceptor.accept(tcp).await {
            Err(_) => 0,
            Ok(mut stream) => {
                let mut buf = Vec::new();
                let _ = tokio::time::timeout(EXPECT_WITHIN, stream.read_to_end(&mut buf)).await;
                buf.len()
            }
        }
    });
    (endpoint, task)
}

fn remote(id: &str, endpoint: &str, dir: &Path) -> rozd::fleet::RemoteHost {
    rozd::fleet::RemoteHost {
        id: id.into(),
        endpoint: endpoint.into(),
        token: Some(rozd::config::Secret::new(TOKEN)),
        relayed_by: "rover-1".into(),
        tls: rozd::tls::client::ClientTlsFiles {
            ca_file: Some(dir.join("fleet-ca.pem")),
            cert_file: Some(dir.join("rover-1.pem")),
            key_file: Some(dir.join("rover-1.key")),
        },
    }
}

/// What a relaying host does with a host record: connect to its endpoint
/// over TLS as `rover-1`. The genuine rover-2 is reached (and sees
/// rover-1's certificate); a record for rover-2 pointing at another fleet
/// member's endpoint, or at a certificate from outside the fleet that
/// claims the name, gets no connection and so no fleet token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_sends_the_fleet_token_only_to_the_host_its_certificate_names() {
    let dir = tempfile::tempdir().unwrap();
    fleet_certificates(dir.path());
    let d = dir.path();
    let server = format!(
        "auth_tokens = [\"{TOKEN}\"]\n[server.tls]\ncert_file = {:?}\nkey_file = {:?}\n\
         client_ca_file = {:?}\nclient_auth = \"required\"\n",
        s(&d.join("rover-2.pem")),
        s(&d.join("rover-2.key")),
        s(&d.join("fleet-ca.pem")),
    );
    let rover2 = start_tls(&server, "[host]\nid = \"rover-2\"\n").await;
    let genuine = remote("rover-2", &format!("https://{}", rover2.addr), d);
    let channel = rozd::api::relay::connect(&genuine, None)
        .await
        .expect("relay to rover-2");
    let mut safety = proto::safety_service_client::SafetyServiceClient::new(channel);
    let status = safety
        .get_safety_status(proto::GetSafetyStatusRequest::default())
        .await
        .expect("rover-2 answers a relayed call");
    assert!(!status.into_inner().estop_active);

    // Another fleet member's valid certificate, but it does not name rover-2.
    let (endpoint, read) = trap(&d.join("rover-1.pem"), &d.join("rover-1.key")).await;
    match rozd::api::relay::connect(&remote("rover-2", &endpoint, d), None).await {
        Err(rozd::fleet::RouteError::Unavailable(why)) => {
            assert!(why.contains("certificate"), "{why}")
        }
        other => panic!("relayed to a host that is not rover-2: {:?}", other.is_ok()),
    }
    assert_eq!(read.await.unwrap(), 0, "the trap read application data");
    // A certificate naming rover-2 from outside the fleet CA.
    let outsider = Pki::new();
    let mut params = rcgen::CertificateParams::new(vec!["rover-2".to_string()]).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "rover-2");
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &outsider.ca).unwrap();
    std::fs::write(outsider.path("rover-2.pem"), cert.pem()).unwrap();
    std::fs::write(outsider.path("rover-2.key"), key.serialize_pem()).unwrap();
    let (endpoint, read) = trap(&outsider.path("rover-2.pem"), &outsider.path("rover-2.key")).await;
    assert!(
        rozd::api::relay::connect(&remote("rover-2", &endpoint, d), None)
            .await
            .is_err()
    );
    assert_eq!(read.await.unwrap(), 0);
    rover2.shutdown().await;
}

/// mosquitto with the shipped example configuration and ACL (paths and
/// port adapted), the fleet guide's certificates and a broker certificate for
/// 127.0.0.1; `extra` is appended to the configuration.
async fn fleet_broker(d: &Path, extra: &str) -> (tokio::process::Child, u16) {
    let ext = d.join("broker.ext");
    std::fs::write(
        &ext,
        "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    for args in [
        "req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=broker -keyout broker.key -out broker.csr",
        "x509 -req -in broker.csr -CA fleet-ca.pem -CAkey fleet-ca.key -CAcreateserial -days 30 -extfile broker.ext -out broker.pem",
    ] {
        let out = std::process::Command::new("openssl")
            .args(args.split(' '))
            .current_dir(d)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let port = free_port();
    let shipped = concat!(env!("CARGO_MANIFEST_DIR"), "/packaging/mosquitto/");
    let conf = std::fs::read_to_string(format!("{shipped}rozd-fleet.conf"))
        .unwrap()
        .replace("listener 8883", &format!("listener {port} 127.0.0.1"))
        .replace("/etc/mosquitto/certs/", &format!("{}/", d.display()))
        .replace(
            "/etc/mosquitto/rozd-fleet.acl",
            &format!("{shipped}rozd-fleet.acl"),
        );
    let user = std::process::Command::new("id")
        .arg("-un")
        .output()
        .unwrap();
    let user = String::from_utf8_lossy(&user.stdout).trim().to_string();
    // `user`: mosquitto started as root would drop to `mosquitto`, which
    // cannot read the test's private directory.
    let conf = format!("{conf}\nlog_dest stderr\npersistence false\nuser {user}\n{extra}\n");
    std::fs::write(d.join("mosquitto.conf"), conf).unwrap();
    let mut child = Command::new("mosquitto")
        .args(["-c", &s(&d.join("mosquitto.conf"))])
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn mosquitto");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut log = String::new();
    let running = tokio::time::timeout(EXPECT_WITHIN, async {
        while let Ok(Some(line)) = lines.next_line().await {
            log.push_str(&line);
            log.push('\n');
            if line.contains(" running") {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(running, Ok(true), "mosquitto did not start:\n{log}");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, port)
}

fn mqtt_tls_args(d: &Path, port: u16, host: &str) -> Vec<String> {
    [
        "-h",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "--cafile",
        &s(&d.join("fleet-ca.pem")),
        "--cert",
        &s(&d.join(format!("{host}.pem"))),
        "--key",
        &s(&d.join(format!("{host}.key"))),
    ]
    .iter()
    .map(|a| a.to_string())
    .collect()
}

async fn mqtt_publish(d: &Path, port: u16, as_host: &str, topic: &str, payload: &str) {
    let mut args = mqtt_tls_args(d, port, as_host);
    args.extend(["-q", "1", "-r", "-t", topic, "-m", payload].map(String::from));
    let out = Command::new("mosquitto_pub")
        .args(&args)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The retained messages under `filter`, as `topic payload` lines, read
/// as `as_host` (`count` of them, within the bound).
async fn retained(d: &Path, port: u16, as_host: &str, filter: &str, count: usize) -> Vec<String> {
    let mut args = mqtt_tls_args(d, port, as_host);
    args.extend(
        [
            "--retained-only",
            "-v",
            "-W",
            "10",
            "-C",
            &count.to_string(),
            "-t",
            filter,
        ]
        .map(String::from),
    );
    let out = Command::new("mosquitto_sub")
        .args(&args)
        .output()
        .await
        .unwrap();
    let mut lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(String::from)
        .collect();
    lines.sort();
    lines
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_broker_acl_keeps_each_host_to_its_own_record() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    fleet_certificates(d);
    let (_broker, port) = fleet_broker(d, "").await;
    mqtt_publish(
        d,
        port,
        "rover-2",
        "roz/v1/hosts/lab/rover-2",
        "rover-2's own record",
    )
    .await;
    // rover-1 tries to overwrite rover-2's record (the broker refuses it
    // silently), then publishes its own.
    mqtt_publish(
        d,
        port,
        "rover-1",
        "roz/v1/hosts/lab/rover-2",
        "forged by rover-1",
    )
    .await;
    mqtt_publish(
        d,
        port,
        "rover-1",
        "roz/v1/hosts/lab/rover-1",
        "rover-1's own record",
    )
    .await;
    assert_eq!(
        retained(d, port, "rover-2", "roz/v1/hosts/#", 2).await,
        [
            "roz/v1/hosts/lab/rover-1 rover-1's own record",
            "roz/v1/hosts/lab/rover-2 rover-2's own record"
        ]
    );

    // rozd itself on that broker with its host certificate ([fleet]
    // cert_file/key_file): its record lands on its own topic.
    let token = d.join("fleet-token");
    std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
    let server = format!(
        "[server.tls]\ncert_file = {:?}\nkey_file = {:?}\n",
        s(&d.join("rover-1.pem")),
        s(&d.join("rover-1.key")),
    );
    let fleet = format!(
        "[host]\nid = \"rover-1\"\nenvironment_id = \"lab\"\n[fleet]\nurl = \"mqtts://127.0.0.1:{port}\"\n\
         ca_file = {:?}\ncert_file = {:?}\nkey_file = {:?}\ntoken_file = {:?}\nkeep_alive_secs = 5\n",
        s(&d.join("fleet-ca.pem")),
        s(&d.join("rover-1.pem")),
        s(&d.join("rover-1.key")),
        s(&token),
    );
    let rover1 = start_tls(&server, &fleet).await;
    let deadline = tokio::time::Instant::now() + EXPECT_WITHIN;
    loop {
        let lines = retained(d, port, "rover-2", "roz/v1/hosts/lab/rover-1", 1).await;
        if lines
            .iter()
            .any(|l| l.contains("\\\"endpoint\\\":\\\"https://"))
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no record from rozd: {lines:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    rover1.shutdown().await;
}

/// `[server.tls]` and `[fleet]` of fleet host `id` on the broker at `port`,
/// with the fleet guide's certificates in `d`.
fn fleet_host(d: &Path, id: &str, port: u16) -> (String, String) {
    let token = d.join("fleet-token");
    std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
    let server = format!(
        "[server.tls]\ncert_file = {:?}\nkey_file = {:?}\n",
        s(&d.join(format!("{id}.pem"))),
        s(&d.join(format!("{id}.key"))),
    );
    let fleet = format!(
        "[host]\nid = \"{id}\"\nenvironment_id = \"lab\"\n[fleet]\nurl = \"mqtts://127.0.0.1:{port}\"\n\
         ca_file = {:?}\ncert_file = {:?}\nkey_file = {:?}\ntoken_file = {:?}\nkeep_alive_secs = 5\n",
        s(&d.join("fleet-ca.pem")),
        s(&d.join(format!("{id}.pem"))),
        s(&d.join(format!("{id}.key"))),
        s(&token),
    );
    (server, fleet)
}

/// Polls `check` until it holds, failing after a generous bound.
async fn until(what: &str, check: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + EXPECT_WITHIN * 3;
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not in time: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// [`retained`] (read as rover-2) until `check` holds for what it reads.
async fn retained_until(
    d: &Path,
    port: u16,
    filter: &str,
    count: usize,
    check: impl Fn(&[String]) -> bool,
) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + EXPECT_WITHIN * 3;
    loop {
        let lines = retained(d, port, "rover-2", filter, count).await;
        if check(&lines) {
            return lines;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not retained in time on {filter}: {lines:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `mosquitto_pub` of an empty retained message on `topic` (the broker's way
/// of deleting the retained message) with `args` for the connection; whether
/// the client says it published.
async fn delete_retained(args: &[String], topic: &str) -> bool {
    let out = tokio::time::timeout(
        EXPECT_WITHIN,
        Command::new("mosquitto_pub")
            .args(args)
            .args(["-q", "1", "-r", "-n", "-t", topic])
            .stdin(Stdio::null())
            .output(),
    )
    .await
    .expect("mosquitto_pub hung")
    .unwrap();
    out.status.success()
}

/// Issue 32, item 4: an empty retained message removes the retained fleet
/// stop from the broker, and a host that joins later does not latch. The
/// example ACL lets no one but the fleet's hosts write the fleet's topics.
/// Here the broker also admits anonymous clients on a second, plain
/// listener (as a broker shared with other devices might): the ACL keeps
/// them off the stop topic. On the shipped TLS listener a client without a
/// certificate, or with one from another CA, does not get in at all. After
/// every attempt the retained stop is still there, and a host that joins
/// later latches; the hosts' identities still publish their records, the
/// stop and the clear.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_broker_acl_keeps_the_retained_fleet_stop_from_anyone_but_the_fleet() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    fleet_certificates(d);
    let plain = free_port();
    let (_broker, port) = fleet_broker(
        d,
        &format!("allow_anonymous true\nlistener {plain} 127.0.0.1\n"),
    )
    .await;
    let topic = "roz/v1/estop/lab";
    let (server, fleet) = fleet_host(d, "rover-1", port);
    let rover1 = start_tls(&server, &fleet).await;
    until("rover-1 joins the fleet", || {
        rover1.host.fleet().is_connected()
    })
    .await;
    rover1
        .host
        .fleet()
        .publish_stop("lab", true, "drill")
        .expect("rover-1 publishes the fleet stop");
    let stop = retained_until(d, port, topic, 1, |lines| {
        lines.iter().any(|l| l.contains("\\\"stop\\\":true"))
    })
    .await;

    // An anonymous client on the plain listener: the broker takes the
    // message (MQTT 3.1.1 has no way to say no) and drops it.
    let anonymous: Vec<String> = ["-h", "127.0.0.1", "-p", &plain.to_string()]
        .map(String::from)
        .to_vec();
    delete_retained(&anonymous, topic).await;
    let forged_clear = Command::new("mosquitto_pub")
        .args(&anonymous)
        .args(["-q", "1", "-r", "-t", topic, "-m", r#"{"stop":false}"#])
        .output()
        .await
        .unwrap();
    assert!(forged_clear.status.success());
    // On the TLS listener: no certificate, or one from another CA that
    // names a fleet host.
    let mut no_certificate = mqtt_tls_args(d, port, "rover-2");
    no_certificate.truncate(6);
    assert!(
        !delete_retained(&no_certificate, topic).await,
        "a client without a certificate got in"
    );
    let outsider = Pki::new();
    let (cert, key) = outsider.issue("rover-2", "rover-2", (2099, 1, 1));
    let mut foreign = no_certificate.clone();
    foreign.extend(["--cert".into(), s(&cert), "--key".into(), s(&key)]);
    assert!(
        !delete_retained(&foreign, topic).await,
        "a client with another CA's certificate got in"
    );
    assert_eq!(
        retained(d, port, "rover-2", topic, 1).await,
        stop,
        "the retained stop was deleted or replaced"
    );

    // A host that joins now latches from the retained stop.
    let (server, fleet) = fleet_host(d, "rover-2", port);
    let rover2 = start_tls(&server, &fleet).await;
    let latch = rover2.host.ooda().protective_stop().clone();
    until("rover-2 latches the fleet stop", || {
        latch.state().causes.iter().any(|c| c.source == "fleet")
    })
    .await;
    // Its record is on its own topic; the fleet's clear gets through.
    retained_until(d, port, "roz/v1/hosts/+/+", 2, |lines| {
        lines.len() == 2
            && lines[0].starts_with("roz/v1/hosts/lab/rover-1 ")
            && lines[1].starts_with("roz/v1/hosts/lab/rover-2 ")
    })
    .await;
    rover1
        .host
        .fleet()
        .publish_stop("lab", false, "drill over")
        .expect("rover-1 publishes the clear");
    until("rover-2 cleared by the fleet", || {
        !latch.state().is_active()
    })
    .await;
    rover2.shutdown().await;
    rover1.shutdown().await;
}

/// `[[server.clients]]`: a verified client certificate without any token is
/// the credential its subject maps to, with that scope; an unlisted subject
/// is not authenticated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_maps_to_its_scopes_by_subject() {
    let pki = Pki::new();
    let (cert, key) = pki.issue("rozd", "rozd-test", (2031, 1, 1));
    let (viewer_cert, viewer_key) = pki.issue("viewer", "viewer-1", (2031, 1, 1));
    let (other_cert, other_key) = pki.issue("other", "someone-else", (2031, 1, 1));
    let extra = format!(
        "client_ca_file = {:?}\nclient_auth = \"optional\"\n\
         [[server.clients]]\nsubject = \"CN=viewer-1,O=Lab\"\nscopes = [\"read\"]\n",
        s(&pki.ca_file())
    );
    let daemon = start_tls(&tls_server(&cert, &key, &extra), "").await;
    let ca = s(&pki.ca_file());
    let url = |path: &str| format!("https://localhost:{}{path}", daemon.addr.port());
    // The HTTP status of `method path` with a client certificate.
    let curl = |method: &'static str, path: String, cert: PathBuf, key: PathBuf| {
        let ca = ca.clone();
        async move {
            let (code, out, err) = run(
                Path::new("curl"),
                &[
                    "-sS",
                    "-o",
                    "/dev/null",
                    "-w",
                    "%{http_code}",
                    "-X",
                    method,
                    "--cacert",
                    &ca,
                    "--cert",
                    &s(&cert),
                    "--key",
                    &s(&key),
                    &path,
                ],
                &[],
            )
            .await;
            assert_eq!(code, Some(0), "curl {method} {path}: {err}");
            out
        }
    };
    let viewer = || (viewer_cert.clone(), viewer_key.clone());
    let (c, k) = viewer();
    assert_eq!(curl("GET", url("/v1/status"), c, k).await, "200");
    let (c, k) = viewer();
    assert_eq!(curl("POST", url("/v1/estop"), c, k).await, "200");
    let (c, k) = viewer();
    assert_eq!(curl("POST", url("/v1/estop/clear"), c, k).await, "403");
    assert!(daemon.host.ooda().protective_stop().active().is_some());
    assert_eq!(
        curl("GET", url("/v1/status"), other_cert, other_key).await,
        "401",
        "a verified certificate whose subject is not in server.clients"
    );
    let rows = daemon
        .host
        .store()
        .audit_records(None, None, 100)
        .await
        .unwrap();
    let stop = rows
        .iter()
        .find(|r| r.kind == "protective_stop")
        .expect("the stop's audit row");
    assert_eq!(stop.credential.as_deref(), Some("CN=viewer-1,O=Lab"));
    daemon.shutdown().await;
}

/// A client command given the configuration of a TLS daemon speaks TLS to
/// its listen address (issue 35, item 11), trusting `[fleet] ca_file` when
/// no `--cacert` is given.
#[tokio::test]
async fn a_client_given_a_tls_daemons_config_speaks_tls_to_its_address() {
    let pki = Pki::new();
    let (cert, key) = pki.issue("rozd", "rozd-test", (2031, 1, 1));
    let daemon = start_tls(&tls_server(&cert, &key, ""), "").await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rover.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = \"{}\"\ncontrol_socket = \"\"\n[server.tls]\ncert_file = {:?}\nkey_file = {:?}\n\
             [fleet]\nca_file = {:?}\n",
            daemon.addr,
            s(&cert),
            s(&key),
            s(&pki.ca_file())
        ),
    )
    .unwrap();
    let rozd = Path::new(env!("CARGO_BIN_EXE_rozd"));
    let no_roots = dir.path().join("no-roots.pem");
    let (code, out, err) = run(
        rozd,
        &[
            "status",
            "--config",
            &s(&config),
            "--token",
            TOKEN,
            "--json",
        ],
        &[("HOME", dir.path())],
    )
    .await;
    assert_eq!(code, Some(0), "{out}{err}");
    let status: Value = serde_json::from_str(&out).expect("status JSON");
    assert_eq!(status["tls"]["enabled"], true, "{status}");
    // Without the fleet CA, the system's roots do not know the daemon's CA.
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = \"{}\"\ncontrol_socket = \"\"\n[server.tls]\ncert_file = {:?}\nkey_file = {:?}\n",
            daemon.addr,
            s(&cert),
            s(&key)
        ),
    )
    .unwrap();
    let (code, _, err) = run(
        rozd,
        &["status", "--config", &s(&config), "--token", TOKEN],
        &[("HOME", dir.path()), ("SSL_CERT_FILE", &no_roots)],
    )
    .await;
    assert_ne!(code, Some(0), "{err}");
    assert!(err.contains("UnknownIssuer"), "spoke TLS: {err}");
    daemon.shutdown().await;
}
