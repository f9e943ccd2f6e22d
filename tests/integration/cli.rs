//! The `rozd` binary: config errors, `check`, `status`, and the systemd
//! notification protocol over a real unix datagram socket.

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

const ROZD: &str = env!("CARGO_BIN_EXE_rozd");
/// Bound on how long a test waits for the daemon to say something.
const WAIT: Duration = Duration::from_secs(15);

fn rozd(args: &[&str], dir: &Path) -> Output {
    Command::new(ROZD)
        .args(args)
        .env_remove("ROZD_CONFIG")
        .env_remove("NOTIFY_SOCKET")
        .env("HOME", dir)
        .stdin(Stdio::null())
        .output()
        .expect("run rozd")
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

#[test]
fn bad_configs_fail_check_and_run_naming_file_line_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "unknown.toml",
            "[server]\nlisten = \"127.0.0.1:0\"\nlistne = 1\n",
            ":3: key `server.listne`",
        ),
        (
            "type.toml",
            "[host]\nid = \"a\"\n[log]\nlevel = 5\n",
            ":4: key `log.level`",
        ),
        (
            "addr.toml",
            "[server]\nlisten = \"not-an-address\"\n",
            ":2: key `server.listen`",
        ),
        (
            "remote.toml",
            "[server]\nlisten = \"0.0.0.0:0\"\n",
            ":2: key `server.listen`",
        ),
        // Raw serial_query on a port that drives an actuator would bypass
        // the actuator's limits.
        (
            "raw.toml",
            "[[serial]]\nname = \"motor\"\npath = \"/dev/null\"\nallow_raw = true\n\n\
             [[actuators]]\nname = \"speed\"\nkind = \"serial\"\nport = \"motor\"\n\
             template = \"M {value}\\n\"\nmin = -1.0\nmax = 1.0\nsafe_value = 0.0\n",
            ":4: key `serial[0].allow_raw`",
        ),
    ];
    for (name, text, expected) in cases {
        let path = write(dir.path(), name, text);
        for command in ["check", "run"] {
            let out = rozd(&[command, "--config", &path], dir.path());
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(78), "{command} {name}: {stderr}");
            assert!(
                stderr.contains(&format!("{path}{expected}")),
                "{command} {name}: {stderr}"
            );
            assert!(
                !stderr.contains("serving"),
                "{command} {name} must not bind: {stderr}"
            );
        }
    }
}

/// `rozd check` fails (78, naming the file and key) on what `rozd run`
/// would refuse on this machine before serving: `backend = "rppal"` off a
/// Raspberry Pi, a `fleet.password_env` that is not set; and `run` refuses
/// them the same way, before binding (issue 35, item 13).
#[test]
fn check_catches_what_run_would_refuse_on_this_machine() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("s.db").display().to_string();
    let base = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\ncontrol_socket = \"\"\n[store]\npath = \"{store}\"\n"
    );
    let token = write(dir.path(), "fleet-token", "a-fleet-token-of-some-length\n");
    let mut cases = vec![(
        "fleet.toml",
        format!(
            "{base}[fleet]\nurl = \"mqtt://127.0.0.1:9\"\nusername = \"u\"\n\
             password_env = \"ROZD_TEST_FLEET_PASSWORD_SURELY_UNSET\"\ntoken_file = \"{token}\"\n"
        ),
        "fleet.password_env names ROZD_TEST_FLEET_PASSWORD_SURELY_UNSET, which is not set",
    )];
    // Off a Pi (this test machine) `rppal` cannot start; on a Pi it can.
    let on_a_pi = rozd::hw::gpio::is_raspberry_pi();
    if !on_a_pi {
        cases.push((
            "rppal.toml",
            format!("{base}[gpio]\nbackend = \"rppal\"\n"),
            "gpio.backend = \"rppal\": this machine is not a Raspberry Pi",
        ));
    }
    for (name, text, expected) in cases {
        let path = write(dir.path(), name, &text);
        for command in ["check", "run"] {
            let out = rozd(&[command, "--config", &path], dir.path());
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(78), "{command} {name}: {stderr}");
            assert!(
                stderr.contains(&format!("{path}: {expected}")),
                "{command} {name}: {stderr}"
            );
            assert_eq!(stderr.matches(expected).count(), 1, "once: {stderr}");
            assert!(!stderr.contains("serving"), "{command} {name}: {stderr}");
        }
        let out = rozd(&["check", "--config", &path], dir.path());
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("not checked"), "{stdout}");
        assert!(!stdout.contains("configuration OK"), "{stdout}");
    }
}

/// `rozd run` that cannot start says why once: one line, each cause once
/// (it printed the error as a log line and again, and the cause twice)
/// (issue 35, item 13).
#[test]
fn run_says_why_it_cannot_start_once() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let store = dir.path().join("s.db").display().to_string();
    let path = write(
        dir.path(),
        "taken.toml",
        &format!(
            "[server]\nlisten = \"{addr}\"\ncontrol_socket = \"\"\n[store]\npath = \"{store}\"\n"
        ),
    );
    let out = rozd(&["run", "--config", &path], dir.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let said = format!("cannot listen on {addr}");
    assert_eq!(stderr.matches(&said).count(), 1, "{stderr}");
    let line = stderr.lines().find(|l| l.contains(&said)).unwrap();
    assert!(line.starts_with("rozd: "), "{stderr}");
    let cause = line.rsplit(": ").next().unwrap();
    assert_eq!(line.matches(cause).count(), 1, "the cause once: {line}");
    drop(taken);
}

#[test]
fn missing_config_file_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("absent.toml").display().to_string();
    for command in ["check", "run"] {
        let out = rozd(&[command, "--config", &missing], dir.path());
        assert_eq!(out.status.code(), Some(78));
        assert!(String::from_utf8_lossy(&out.stderr).contains(&missing));
    }
}

#[test]
fn rozd_config_env_is_used_when_no_flag_is_given() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "env.toml", "[host]\nid = \"from-env\"\n");
    let out = Command::new(ROZD)
        .arg("check")
        .env("ROZD_CONFIG", &path)
        .output()
        .unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("from-env") && stdout.contains(&path),
        "{stdout}"
    );
}

#[test]
fn check_prints_the_effective_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "ok.toml",
        "[host]\nid = \"rover-1\"\n[server]\nlisten = \"0.0.0.0:9000\"\nauth_tokens = [\"top-secret-token\"]\nallow_plaintext_remote = true\n",
    );
    let out = rozd(&["check", "--config", &path], dir.path());
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("rover-1")
            && stdout.contains("0.0.0.0:9000")
            && stdout.contains("1 bearer token")
    );
    assert!(
        !stdout.contains("top-secret-token"),
        "tokens are never printed"
    );
}

#[test]
fn version_flag() {
    let out = Command::new(ROZD).arg("--version").output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("rozd {}", env!("CARGO_PKG_VERSION"))
    );
}

/// Reads datagrams until one contains `wanted`; returns all lines seen.
fn recv_until(socket: &UnixDatagram, wanted: &str) -> Vec<String> {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = socket
            .recv(&mut buf)
            .unwrap_or_else(|e| panic!("waiting for {wanted}: {e}; seen {seen:?}"));
        let text = String::from_utf8_lossy(&buf[..n]).to_string();
        let done = text.lines().any(|l| l == wanted);
        seen.extend(text.lines().map(String::from));
        if done {
            return seen;
        }
    }
}

/// A notify socket (read with a timeout) in `dir`, its path, and a minimal
/// config for `rozd run` on a free loopback port with its store in `dir`.
fn notify_setup(dir: &Path) -> (UnixDatagram, std::path::PathBuf, String) {
    let socket_path = dir.join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    socket.set_read_timeout(Some(WAIT)).unwrap();
    let config = write(
        dir,
        "rozd.toml",
        &format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n[store]\npath = {:?}\n",
            dir.join("rozd.db").display().to_string()
        ),
    );
    (socket, socket_path, config)
}

fn sigterm(child: &std::process::Child) {
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
}

#[test]
fn sd_notify_ready_watchdog_stopping_and_clean_exit() {
    let dir = tempfile::tempdir().unwrap();
    let (socket, socket_path, config) = notify_setup(dir.path());
    let mut child = Command::new(ROZD)
        .args(["run", "--config", &config])
        .env("NOTIFY_SOCKET", &socket_path)
        .env("WATCHDOG_USEC", "200000")
        .env_remove("WATCHDOG_PID")
        .env("HOME", dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();

    let ready = recv_until(&socket, "READY=1");
    let status = ready
        .iter()
        .find_map(|l| l.strip_prefix("STATUS=serving roz.v1 on "))
        .expect("READY comes with the address in STATUS");
    // READY=1 means the port already accepts connections.
    std::net::TcpStream::connect(status).expect("port accepts once READY=1 is sent");

    // rozd status against the live binary.
    let out = rozd(&["status", "--addr", status], dir.path());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("listening:    ") && text.contains(status),
        "{text}"
    );

    // WATCHDOG=1 keeps arriving.
    recv_until(&socket, "WATCHDOG=1");
    recv_until(&socket, "WATCHDOG=1");

    sigterm(&child);
    recv_until(&socket, "STOPPING=1");
    let exit = child.wait().unwrap();
    assert_eq!(exit.code(), Some(0), "graceful shutdown exits 0");
}

#[test]
fn sigterm_right_after_ready_is_a_graceful_stop() {
    let dir = tempfile::tempdir().unwrap();
    let (socket, socket_path, config) = notify_setup(dir.path());
    // Several times: the window between READY=1 and the signal handlers is small.
    for _ in 0..5 {
        let mut child = Command::new(ROZD)
            .args(["run", "--config", &config])
            .env("NOTIFY_SOCKET", &socket_path)
            .env_remove("WATCHDOG_USEC")
            .env("HOME", dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        recv_until(&socket, "READY=1");
        sigterm(&child);
        recv_until(&socket, "STOPPING=1");
        let exit = child.wait().unwrap();
        assert_eq!(
            exit.code(),
            Some(0),
            "SIGTERM at once after READY=1 shuts down gracefully: {exit}"
        );
    }
}

#[test]
fn status_against_nothing_fails_clearly() {
    let dir = tempfile::tempdir().unwrap();
    // Bind then drop to get a port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let out = rozd(&["status", "--addr", &addr], dir.path());
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains(&addr));
}

/// A client command given a configuration talks to that configuration's
/// daemon (issue 35, item 11): `rozd status`, `hosts`, `chat` and `task`
/// with `--config rover-1.toml` reach rover-1's listen address, not
/// 127.0.0.1:8080; `--addr` still wins; a configuration that cannot be read
/// is an error (78), not a silent fall-back to another daemon.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_commands_given_a_config_use_its_listen_address() {
    let daemon = crate::common::TestDaemon::start("[host]\nname = \"rover-1\"\n").await;
    let dir = tempfile::tempdir().unwrap();
    // Everything a client reads from it: the listen address (and no socket).
    let config = write(
        dir.path(),
        "rover-1.toml",
        &format!(
            "[host]\nname = \"rover-1\"\n[server]\nlisten = \"{}\"\ncontrol_socket = \"\"\n",
            daemon.addr
        ),
    );
    let run = |args: Vec<String>| {
        let dir = dir.path().to_path_buf();
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let out = Command::new(ROZD)
                .args(&args)
                .env_remove("ROZD_CONFIG")
                .env_remove("ROZD_ADDR")
                .env_remove("ROZD_TOKEN")
                .env("HOME", &dir)
                .stdin(Stdio::null())
                .output()
                .expect("run rozd");
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        })
    };
    let args = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();

    let (code, out, err) = run(args(&["status", "--config", &config])).await.unwrap();
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.contains("rover-1") && out.contains(&daemon.addr.to_string()),
        "{out}"
    );
    let (code, out, err) = run(args(&["hosts", "--config", &config, "--json"]))
        .await
        .unwrap();
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("rover-1"), "{out}");
    let (code, out, err) = run(args(&["task", "list", "--config", &config]))
        .await
        .unwrap();
    assert_eq!(code, Some(0), "{out}{err}");
    let (code, out, err) = run(args(&["chat", "--config", &config, "--prompt", "observe"]))
        .await
        .unwrap();
    assert_eq!(code, Some(0), "{out}{err}");
    // The local model's token counts are rozd's estimate, and say so.
    assert!(err.contains("(estimated"), "{err}");
    // $ROZD_CONFIG counts as given too.
    let (code, out, err) = {
        let dir = dir.path().to_path_buf();
        let config = config.clone();
        tokio::task::spawn_blocking(move || {
            let out = Command::new(ROZD)
                .args(["status"])
                .env("ROZD_CONFIG", &config)
                .env_remove("ROZD_ADDR")
                .env_remove("ROZD_TOKEN")
                .env("HOME", &dir)
                .stdin(Stdio::null())
                .output()
                .expect("run rozd");
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        })
        .await
        .unwrap()
    };
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("rover-1"), "{out}");

    // --addr wins over the configuration: a port nobody listens on fails.
    let nobody = format!("127.0.0.1:{}", crate::common::broker::free_port());
    let (code, _, err) = run(args(&["status", "--config", &config, "--addr", &nobody]))
        .await
        .unwrap();
    assert_ne!(code, Some(0), "{err}");
    assert!(err.contains(&nobody), "{err}");
    // A configuration that cannot be read for the address: an error, naming it.
    let broken = write(
        dir.path(),
        "broken.toml",
        "[server]\nlisten = \"nowhere\"\n",
    );
    let (code, _, err) = run(args(&["chat", "--config", &broken, "--prompt", "hi"]))
        .await
        .unwrap();
    assert_eq!(code, Some(78), "{err}");
    assert!(
        err.contains("broken.toml") && err.contains("server.listen"),
        "{err}"
    );
    daemon.shutdown().await;
}

/// `rozd status` shows every sensor and actuator with its value, health
/// and alarm, and the approvals, MCP, fleet and recording state (issue 35,
/// item 12); over the control socket too (it serves the Observation).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_lists_each_sensor_and_actuator_with_health_and_alarm() {
    let daemon = crate::common::TestDaemon::start(
        r#"
[[sensors]]
name = "coolant_temp"
source = "sim"
signal = "constant"
offset = 91.25
unit = "degC"
warn_max = 80.0
critical_max = 85.0

[[sensors]]
name = "battery"
source = "sim"
signal = "constant"
offset = 12.5
unit = "V"

[[actuators]]
name = "pump"
kind = "sim"
unit = "%"
min = 0.0
max = 100.0
safe_value = 0.0
"#,
    )
    .await;
    // The alarm has been evaluated once the Observation says so.
    let mut observations = daemon.host.ooda().subscribe();
    tokio::time::timeout(
        crate::common::EXPECT_WITHIN,
        observations.wait_for(|o| {
            o.sensor("coolant_temp")
                .is_some_and(|s| s.alarm == rozd::ooda::orient::AlarmLevel::Critical)
        }),
    )
    .await
    .expect("coolant_temp turns critical")
    .expect("the loop runs");
    let socket = daemon.control_socket.display().to_string();
    let dir = tempfile::tempdir().unwrap();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(ROZD)
            .args(["status", "--socket", &socket, "--addr", "127.0.0.1:9"])
            .env_remove("ROZD_CONFIG")
            .env_remove("ROZD_TOKEN")
            .env("HOME", dir.path())
            .stdin(Stdio::null())
            .output()
            .expect("run rozd")
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = |name: &str| {
        text.lines()
            .find(|l| l.trim_start().starts_with(name))
            .unwrap_or_else(|| panic!("no line for {name}:\n{text}"))
            .to_string()
    };
    let coolant = line("coolant_temp");
    for want in [
        "91.25 degC",
        " ok ",
        "alarm CRITICAL: above critical_max 85 degC, for ",
    ] {
        assert!(coolant.contains(want), "{want:?} in {coolant:?}");
    }
    let battery = line("battery");
    assert!(
        battery.contains("12.5 V") && battery.contains("alarm ok"),
        "{battery}"
    );
    let pump = line("pump");
    assert!(
        pump.contains("0 %") && pump.contains("at its safe value"),
        "{pump}"
    );
    for want in [
        "sensors:",
        "actuators:",
        "approvals:    none waiting",
        "mcp:          0 session(s)",
        "fleet:        not configured",
        "recording:    off",
    ] {
        assert!(text.contains(want), "{want:?} in\n{text}");
    }
    daemon.shutdown().await;
}

/// `GET /v1/audit?order=desc` lists the newest rows first, so the README's
/// `order=desc&limit=10` after the walkthrough shows the stop rows; another
/// `order` is a JSON 400 (issue 35, item 16).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_order_desc_lists_the_newest_rows_first() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let daemon = crate::common::TestDaemon::start("").await;
    for at_ms in 1..=4 {
        daemon
            .host
            .store()
            .audit(rozd::store::AuditRecord {
                at_ms,
                kind: rozd::store::AuditKind::Actuator,
                result: Some(format!("row {at_ms}")),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    let get = |query: &'static str| {
        let url = format!("http://{}/v1/audit{query}", daemon.addr);
        async move {
            let reply = reqwest::get(url).await.expect("request");
            let status = reply.status().as_u16();
            let body: serde_json::Value = reply.json().await.expect("JSON");
            (status, body)
        }
    };
    let results = |body: &serde_json::Value| {
        body["data"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| {
                r["kind"] == "actuator"
                    && r["result"].as_str().is_some_and(|t| t.starts_with("row "))
            })
            .map(|r| r["result"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    let (status, newest) = get("?order=desc").await;
    assert_eq!(status, 200, "{newest}");
    assert_eq!(
        results(&newest),
        ["row 4", "row 3", "row 2", "row 1"],
        "{newest}"
    );
    let (status, oldest) = get("").await;
    assert_eq!(status, 200, "{oldest}");
    assert_eq!(
        results(&oldest),
        ["row 1", "row 2", "row 3", "row 4"],
        "{oldest}"
    );
    let (status, bad) = get("?order=sideways").await;
    assert_eq!(status, 400, "{bad}");
    assert_eq!(bad["error"]["code"], "invalid_argument", "{bad}");
    daemon.shutdown().await;
}
