//! The guides, followed as written, against the real `rozd` binary: their
//! configuration blocks and commands are read from the Markdown itself, so
//! a guide that drifts from what works fails here.
//!
//! - docs/guides/first-hardware.md, "A serial device" / "Without a device":
//!   the fake microcontroller (`examples/fake_mcu.py`, started by the
//!   guide's command), the guide's tables, `rozd check`, `rozd run`, the
//!   sensor's first value, `rozd chat` setting the motor (answered `OK`
//!   within `reply_timeout_ms`), and each simulated fault: overcurrent
//!   latches the stop through the guide's rule, `rozd estop --clear`
//!   clears it, silence makes the sensor stale, `noreply` fails a command
//!   with `tool_timeout`, `quit` disconnects the sensor.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};

use crate::common::{self, EXPECT_WITHIN, ROZD};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The text of `file` from heading `from` up to the next heading of the
/// same level or above (outside code blocks).
fn section(file: &str, from: &str) -> String {
    let text = std::fs::read_to_string(root().join(file)).expect("the guide");
    let start = text
        .find(from)
        .unwrap_or_else(|| panic!("{file} has no heading {from:?}"));
    let level = from.chars().take_while(|&c| c == '#').count();
    let mut out = String::new();
    let mut in_code = false;
    for line in text[start + from.len()..].split_inclusive('\n') {
        if line.starts_with("```") {
            in_code = !in_code;
        }
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !in_code && hashes > 0 && hashes <= level && line[hashes..].starts_with(' ') {
            break;
        }
        out.push_str(line);
    }
    out
}

/// The fenced code blocks of `text` in language `lang`, in order.
fn blocks(text: &str, lang: &str) -> Vec<String> {
    let fence = format!("```{lang}\n");
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(&fence) {
        let body = &rest[start + fence.len()..];
        let end = body.find("```").expect("a closed code block");
        out.push(body[..end].to_string());
        rest = &body[end..];
    }
    out
}

/// The guide's shell commands, one per line, without comments.
fn commands(text: &str) -> Vec<String> {
    blocks(text, "bash")
        .iter()
        .flat_map(|b| b.lines().map(str::to_string).collect::<Vec<_>>())
        .map(|l| l.split(" #").next().unwrap_or("").trim().to_string())
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect()
}

/// A running fake MCU: its stdin (faults) and every line it printed.
struct FakeMcu {
    child: Child,
    stdin: ChildStdin,
    lines: Arc<Mutex<Vec<String>>>,
}

impl FakeMcu {
    /// Runs the guide's command `command` (`python3 examples/fake_mcu.py
    /// /tmp/rozd-mcu`) with the link at `link`, from the source tree.
    async fn start(command: &str, link: &Path) -> FakeMcu {
        let words: Vec<String> = command
            .split_whitespace()
            .map(|w| w.replace("/tmp/rozd-mcu", &link.display().to_string()))
            .collect();
        let mut child = Command::new(&words[0])
            .args(&words[1..])
            .current_dir(root())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("{command}: {e}"));
        let stdin = child.stdin.take().expect("stdin");
        let mut out = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let lines: Arc<Mutex<Vec<String>>> = Arc::default();
        let seen = lines.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = out.next_line().await {
                seen.lock().unwrap().push(line);
            }
        });
        let mcu = FakeMcu {
            child,
            stdin,
            lines,
        };
        mcu.printed(|l| l.starts_with("fake MCU on")).await;
        assert!(link.exists(), "{} was not made", link.display());
        mcu
    }

    /// How many lines it printed so far.
    fn mark(&self) -> usize {
        self.lines.lock().unwrap().len()
    }

    /// Waits until it printed a line that `good` takes.
    async fn printed(&self, good: impl Fn(&str) -> bool) -> String {
        self.printed_after(0, good).await
    }

    /// Waits until it printed, after its first `from` lines, one that `good` takes.
    async fn printed_after(&self, from: usize, good: impl Fn(&str) -> bool) -> String {
        let deadline = tokio::time::Instant::now() + EXPECT_WITHIN;
        loop {
            if let Some(line) = self
                .lines
                .lock()
                .unwrap()
                .iter()
                .skip(from)
                .find(|l| good(l))
            {
                return line.clone();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the fake MCU never printed that; it printed: {:?}",
                self.lines.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn type_fault(&mut self, word: &str) {
        let from = self.mark();
        self.stdin
            .write_all(format!("{word}\n").as_bytes())
            .await
            .expect("the fake MCU reads its input");
        let said = format!("fault: {word}");
        if word != "quit" {
            self.printed_after(from, |l| l == said).await;
        }
    }
}

async fn get(addr: &str, path: &str) -> Value {
    let reply = rozd::cli::client::get(addr, path, None)
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    serde_json::from_str(&reply.body).unwrap_or_else(|e| panic!("{path}: {e}: {}", reply.body))
}

/// Polls `GET path` until `good` takes it.
async fn until(addr: &str, path: &str, good: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + EXPECT_WITHIN;
    loop {
        let value = get(addr, path).await;
        if good(&value) {
            return value;
        }
        assert!(tokio::time::Instant::now() < deadline, "{path}: {value}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `rozd chat` with `input` typed, to its end: what it printed.
async fn chat(addr: &str, input: &str) -> String {
    let mut child = Command::new(ROZD)
        .args(["chat", "--addr", addr])
        .env_remove("ROZD_ADDR")
        .env_remove("ROZD_TOKEN")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("rozd chat");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(input.as_bytes()).await.expect("type");
    drop(stdin);
    let out = tokio::time::timeout(EXPECT_WITHIN * 2, child.wait_with_output())
        .await
        .expect("rozd chat ends")
        .expect("rozd chat runs");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_hardware_serial_walkthrough_works_with_the_fake_mcu() {
    let guide = "docs/guides/first-hardware.md";
    let serial = section(guide, "## A serial device");
    let steps = commands(&section(guide, "### Without a device"));
    let start_mcu = steps
        .iter()
        .find(|c| c.contains("examples/fake_mcu.py"))
        .expect("the guide starts the fake MCU");
    assert_eq!(start_mcu, "python3 examples/fake_mcu.py /tmp/rozd-mcu");
    for step in [
        "rozd check --config mcu.toml",
        "rozd run --config mcu.toml",
        "curl -s localhost:8080/v1/sensors/motor_current",
        "rozd chat",
    ] {
        assert!(steps.iter().any(|c| c == step), "{step:?} in {steps:?}");
    }

    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("rozd-mcu");
    let mut mcu = FakeMcu::start(start_mcu, &link).await;

    // The guide's tables, its serial path pointing at the fake MCU; a free
    // port and a store of its own instead of the defaults.
    let tables = blocks(&serial, "toml").into_iter().next().expect("tables");
    let path_line = tables
        .lines()
        .find(|l| l.starts_with("path = "))
        .expect("a [[serial]] path");
    let tables = tables.replace(
        path_line,
        &format!("path = {:?}", link.display().to_string()),
    );
    let addr = format!("127.0.0.1:{}", common::broker::free_port());
    let config = dir.path().join("mcu.toml");
    std::fs::write(
        &config,
        format!(
            "{tables}\n[server]\nlisten = \"{addr}\"\ncontrol_socket = {:?}\n[store]\npath = {:?}\n",
            dir.path().join("control.sock").display().to_string(),
            dir.path().join("rozd.db").display().to_string()
        ),
    )
    .unwrap();
    let config_arg = config.display().to_string();
    let (code, out, err) = common::rozd_cli(&["check", "--config", &config_arg]).await;
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("configuration OK"), "{out}");
    let mut rozd = common::spawn_rozd(dir.path(), &config).await;

    // The sensor's first values: 0.05 A at rest.
    until(&addr, "/v1/sensors/motor_current", |s| {
        s["sensor"]["value"] == 0.05 && s["sensor"]["health"] == "ok"
    })
    .await;

    // rozd chat: set motor 0.4, approved; the fake MCU answers OK in time,
    // and the hold expires back to the safe value.
    let from = mcu.mark();
    let said = chat(&addr, "set motor 0.4\ny\n").await;
    assert!(said.contains("motor returned"), "{said}");
    assert!(!said.contains("tool_timeout"), "{said}");
    mcu.printed_after(from, |l| l == "<- M 0.4").await;
    mcu.printed_after(from, |l| l == "-> OK").await;
    mcu.printed_after(from, |l| l == "<- M 0").await;

    // overcurrent: the guide's rule latches the stop; cleared on purpose.
    mcu.type_fault("overcurrent").await;
    let safety = until(&addr, "/v1/safety", |s| s["estop_active"] == true).await;
    assert!(
        safety["causes"].as_array().is_some_and(|c| c
            .iter()
            .any(|c| c["source"] == "rule:overcurrent" && c["reason"] == "motor overcurrent")),
        "{safety}"
    );
    mcu.type_fault("ok").await;
    until(&addr, "/v1/sensors/motor_current", |s| s["alarm"] == "ok").await;
    let (code, out, err) = common::rozd_cli(&["estop", "--clear", "--config", &config_arg]).await;
    assert_eq!(code, Some(0), "{out}{err}");
    until(&addr, "/v1/safety", |s| s["estop_active"] == false).await;

    // silent: the sensor goes stale.
    mcu.type_fault("silent").await;
    until(&addr, "/v1/sensors/motor_current", |s| {
        s["sensor"]["health"] == "stale"
    })
    .await;
    mcu.type_fault("ok").await;

    // noreply: a command fails with tool_timeout; the motor stays safe.
    mcu.type_fault("noreply").await;
    let said = chat(&addr, "set motor 0.4\ny\n").await;
    assert!(said.contains("tool_timeout"), "{said}");
    let observation = get(&addr, "/v1/observation").await;
    let motor = observation["actuators"]
        .as_array()
        .and_then(|a| a.iter().find(|a| a["name"] == "motor"))
        .cloned()
        .expect("motor");
    assert_eq!(motor["value"], 0.0, "{motor}");
    mcu.type_fault("ok").await;

    // quit: the port disappears, the sensor is disconnected.
    mcu.type_fault("quit").await;
    tokio::time::timeout(EXPECT_WITHIN, mcu.child.wait())
        .await
        .expect("the fake MCU quits")
        .expect("wait");
    assert!(!link.exists(), "the link is removed");
    until(&addr, "/v1/sensors/motor_current", |s| {
        s["sensor"]["health"] == "disconnected"
    })
    .await;
    common::broker::terminate(&mut rozd).await;
}

/// The fenced block between `<!-- name:begin -->` and `<!-- name:end -->`
/// of `file`, without its fences.
fn marked_block(file: &str, name: &str) -> String {
    let text = std::fs::read_to_string(root().join(file)).expect("the guide");
    let block = text
        .split(&format!("<!-- {name}:begin -->"))
        .nth(1)
        .and_then(|rest| rest.split(&format!("<!-- {name}:end -->")).next())
        .unwrap_or_else(|| panic!("{file} has no block {name}"));
    block
        .lines()
        .filter(|l| !l.starts_with("```"))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// Runs `script` with bash in `dir`, `PATH` finding rozd and the tests'
/// Python tools (grpcurl) first: (exit code, stdout, stderr).
async fn bash(dir: &Path, script: &str, env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let rozd_dir = Path::new(ROZD).parent().expect("rozd's directory");
    let tools = common::pyenv_tool("grpcurl");
    let tools = tools.parent().expect("the tools' directory");
    let path = format!(
        "{}:{}:{}",
        rozd_dir.display(),
        tools.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut command = Command::new("bash");
    command
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(dir)
        .env("PATH", path)
        .env_remove("ROZD_ADDR")
        .env_remove("ROZD_TOKEN")
        .env_remove("ROZD_CONFIG")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    for (k, v) in env {
        command.env(k, v);
    }
    let out = tokio::time::timeout(EXPECT_WITHIN * 3, command.output())
        .await
        .expect("the commands end")
        .expect("bash runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// docs/guides/tls-and-credentials.md: the certificate recipe, run as
/// written, makes a certificate the daemon serves and every client of the
/// guide accepts (curl, rozd, grpcurl, by `localhost` and the host's name),
/// with the token the recipe made; the plaintext commands need
/// `-plaintext`; the forwarder for the roz CLI carries gRPC into TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_guide_recipe_and_client_commands_work_against_the_daemon() {
    let guide = "docs/guides/tls-and-credentials.md";
    let dir = tempfile::tempdir().unwrap();
    let (code, _, err) = bash(dir.path(), &marked_block(guide, "tls-certs"), &[]).await;
    assert_eq!(code, Some(0), "the recipe failed: {err}");
    let file = |name: &str| dir.path().join(name).display().to_string();
    let token = std::fs::read_to_string(dir.path().join("tokens")).unwrap();
    let token = token.trim().to_string();
    assert_eq!(token.len(), 64, "{token}");

    let server = format!(
        "auth_token_file = {:?}\n[server.tls]\ncert_file = {:?}\nkey_file = {:?}\n",
        file("tokens"),
        file("rozd.pem"),
        file("rozd.key")
    );
    let daemon = crate::common::TestDaemon::setup("")
        .server(&server)
        .start()
        .await;
    let port = daemon.addr.port().to_string();

    // The clients block, on this daemon's port: every command succeeds.
    let clients = marked_block(guide, "tls-clients").replace("8443", &port);
    for line in clients.lines().filter(|l| !l.trim().is_empty()) {
        if line.starts_with("export ") {
            continue;
        }
        let script = format!("export ROZD_TOKEN=$(head -n 1 tokens)\n{line}\n");
        let (code, out, err) = bash(dir.path(), &script, &[]).await;
        assert_eq!(code, Some(0), "{line}\n{out}{err}");
        if line.starts_with("curl") {
            let status: Value = serde_json::from_str(&out).expect("status JSON");
            assert_eq!(status["tls"]["enabled"], true, "{status}");
        } else if line.ends_with(" list") {
            assert!(out.lines().any(|l| l == "roz.v1.AgentService"), "{out}");
        } else if line.contains("GetSafetyStatus") {
            let safety: Value = serde_json::from_str(&out).expect("GetSafetyStatus JSON");
            assert!(safety.is_object(), "{out}");
        } else if line.starts_with("rozd status") {
            assert!(out.contains("stop:") && out.contains("listening:"), "{out}");
        }
    }
    // The host's own name is in the certificate too.
    let host = bash(dir.path(), "hostname", &[]).await.1.trim().to_string();
    let (code, _, err) = bash(
        dir.path(),
        &format!(
            "curl -sS --resolve {host}:{port}:127.0.0.1 --cacert ca.pem \
             -H \"authorization: Bearer $ROZD_TOKEN\" https://{host}:{port}/v1/status"
        ),
        &[("ROZD_TOKEN", &token)],
    )
    .await;
    assert_eq!(code, Some(0), "{err}");
    // Without the CA: refused in the handshake.
    let (code, _, _) = bash(
        dir.path(),
        &format!("curl -sS https://localhost:{port}/v1/status"),
        &[],
    )
    .await;
    assert_eq!(code, Some(60), "an unknown CA is refused");
    // grpcurl without -plaintext against a plaintext daemon: the guide's error.
    let plain = crate::common::TestDaemon::start("").await;
    let (code, _, err) = bash(
        dir.path(),
        &format!("grpcurl localhost:{} list", plain.addr.port()),
        &[],
    )
    .await;
    assert_ne!(code, Some(0));
    assert!(
        err.contains("first record does not look like a TLS handshake"),
        "{err}"
    );
    let section = section(guide, "### Clients");
    for line in commands(&section)
        .iter()
        .filter(|l| l.contains("-plaintext"))
    {
        let line = line.replace("8080", &plain.addr.port().to_string());
        let (code, out, err) = bash(dir.path(), &line, &[]).await;
        assert_eq!(code, Some(0), "{line}\n{out}{err}");
    }
    plain.shutdown().await;

    // The roz CLI's forwarder: plaintext gRPC on loopback into TLS.
    let forwarded = common::broker::free_port();
    let guide_text = std::fs::read_to_string(root().join(guide)).unwrap();
    let forwarder = guide_text
        .split('`')
        .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
        .find(|s| s.starts_with("socat TCP-LISTEN:8080"))
        .expect("the guide's forwarder")
        .replace("TCP-LISTEN:8080", &format!("TCP-LISTEN:{forwarded}"))
        .replace("OPENSSL:robot:8443", &format!("OPENSSL:localhost:{port}"));
    let words: Vec<&str> = forwarder.split(' ').collect();
    let mut socat = Command::new(words[0])
        .args(&words[1..])
        .current_dir(dir.path())
        .kill_on_drop(true)
        .spawn()
        .expect("socat");
    let deadline = tokio::time::Instant::now() + EXPECT_WITHIN;
    let listed = loop {
        let (code, out, err) = bash(
            dir.path(),
            &format!(
                "grpcurl -plaintext -H \"authorization: Bearer $ROZD_TOKEN\" 127.0.0.1:{forwarded} list"
            ),
            &[("ROZD_TOKEN", &token)],
        )
        .await;
        if code == Some(0) {
            break out;
        }
        assert!(tokio::time::Instant::now() < deadline, "{forwarder}: {err}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        listed.lines().any(|l| l == "roz.v1.AgentService"),
        "{listed}"
    );
    socat.kill().await.ok();
    daemon.shutdown().await;
}

/// docs/guides/first-hardware.md, "Rehearse it without a Pi": the guide's
/// configuration and commands, as written, against the real daemon: the
/// sim pin pressed latches the stop, a clear is refused while it is held,
/// released it stays latched until cleared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_hardware_stop_button_rehearsal_works_on_the_sim_backend() {
    let guide = "docs/guides/first-hardware.md";
    let rehearsal = section(guide, "### Rehearse it without a Pi");
    let tables = blocks(&rehearsal, "toml")
        .into_iter()
        .next()
        .expect("button.toml");
    let steps = commands(&rehearsal);
    assert_eq!(steps.len(), 5, "{steps:?}");
    assert!(rehearsal.contains("rozd run --config button.toml"));

    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", common::broker::free_port());
    let config = dir.path().join("button.toml");
    std::fs::write(
        &config,
        format!(
            "{tables}\n[server]\nlisten = \"{addr}\"\ncontrol_socket = {:?}\n[store]\npath = {:?}\n",
            dir.path().join("control.sock").display().to_string(),
            dir.path().join("rozd.db").display().to_string()
        ),
    )
    .unwrap();
    let mut rozd = common::spawn_rozd(dir.path(), &config).await;
    let safety = get(&addr, "/v1/safety").await;
    assert_eq!(safety["estop_active"], false, "{safety}");

    // Each step with its expected exit status and what then holds.
    let expected = [0, 4, 0, 0, 0];
    for (step, want) in steps.iter().zip(expected) {
        let (code, out, err) = bash(dir.path(), step, &[]).await;
        assert_eq!(code, Some(want), "{step}\n{out}{err}");
        let safety = get(&addr, "/v1/safety").await;
        match step.as_str() {
            s if s.starts_with("rozd gpio set 26 0") => {
                assert_eq!(safety["estop_active"], true, "{safety}");
                assert_eq!(safety["causes"][0]["source"], "gpio", "{safety}");
                assert_eq!(
                    safety["inputs"][0],
                    serde_json::json!({"name": "gpio:26", "asserted": true}),
                    "{safety}"
                );
                assert!(out.contains("GPIO 26 set low (0)"), "{out}");
            }
            s if s.starts_with("rozd estop --clear") && want == 4 => {
                assert!(err.contains("26"), "names the input: {err}");
                assert_eq!(safety["estop_active"], true, "{safety}");
            }
            s if s.starts_with("rozd gpio set 26 1") => {
                assert_eq!(
                    safety["estop_active"], true,
                    "released, still latched: {safety}"
                );
            }
            s if s.starts_with("rozd estop --clear") => {
                assert_eq!(safety["estop_active"], false, "{safety}");
            }
            s if s.starts_with("rozd gpio list") => {
                assert!(out.contains("GPIO 26: high (1), input"), "{out}");
            }
            other => panic!("a step the test does not know: {other}"),
        }
    }
    // An actuator's pin is not the operator's to drive.
    let reply =
        rozd::cli::client::post_json(&addr, "/v1/gpio/x", None, &serde_json::json!({"level": 1}))
            .await
            .unwrap();
    assert_eq!(reply.status.as_u16(), 400, "{}", reply.body);
    common::broker::terminate(&mut rozd).await;
}

/// Three ports in a row that are free now (the guide numbers its hosts'
/// ports `1850$N`).
fn three_free_ports() -> u16 {
    for _ in 0..200 {
        let base = common::broker::free_port();
        if base < 65000
            && (1..3).all(|i| std::net::TcpListener::bind(("127.0.0.1", base + i)).is_ok())
        {
            return base;
        }
    }
    panic!("no three free ports in a row");
}

/// docs/guides/fleet.md, "Try it on one machine": the token, the two
/// configurations, the broker and both hosts started by the guide's own
/// command lines (on free ports), then every client command as written:
/// `rozd hosts` lists both online, `rozd chat --host-id rover-2` through
/// rover-1 answers from rover-2, `rozd estop --fleet` stops both (rover-2's
/// `rozd status` shows the fleet stop) and `--fleet --clear` clears both
/// (issue 35, item 8).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_guide_two_hosts_on_one_machine_work_as_written() {
    let guide = "docs/guides/fleet.md";
    let dir = tempfile::tempdir().unwrap();
    let base = three_free_ports();
    let broker_port = common::broker::free_port();
    let setup = marked_block(guide, "fleet-setup")
        .replace("1850$N", &format!("$(( {base} + N ))"))
        .replace("18830", &broker_port.to_string());
    let (code, out, err) = bash(dir.path(), &setup, &[]).await;
    assert_eq!(code, Some(0), "setup: {out}{err}");
    assert!(out.contains("configuration OK"), "{out}");
    let demo = dir.path().join("fleet-demo");

    // The guide's start lines, each a child of this test.
    let rozd_dir = Path::new(ROZD).parent().unwrap().display().to_string();
    let mut started = Vec::new();
    for line in marked_block(guide, "fleet-start").lines() {
        let line = line.trim().trim_end_matches('&').trim();
        if line.is_empty() {
            continue;
        }
        let line = line.replace("18830", &broker_port.to_string());
        let child = Command::new("bash")
            .args(["-c", &format!("exec {line}")])
            .current_dir(&demo)
            .env(
                "PATH",
                format!("{rozd_dir}:{}", std::env::var("PATH").unwrap_or_default()),
            )
            .env_remove("ROZD_CONFIG")
            .env_remove("NOTIFY_SOCKET")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start the guide's process");
        started.push(child);
    }
    assert_eq!(started.len(), 3, "mosquitto and two hosts");

    let token = std::fs::read_to_string(demo.join("fleet-token")).unwrap();
    let env = [("ROZD_TOKEN", token.trim())];
    // Both hosts online in rover-1's view before the commands.
    let deadline = tokio::time::Instant::now() + EXPECT_WITHIN * 2;
    loop {
        let (_, out, _) = bash(&demo, "rozd hosts --config rover-1.toml", &env).await;
        if out.lines().filter(|l| l.contains(" online ")).count() == 2 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "hosts: {out}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for line in marked_block(guide, "fleet-use").lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let script = format!("export ROZD_TOKEN=$(cat fleet-token)\n{line}\n");
        let (code, out, err) = bash(&demo, &script, &[]).await;
        assert_eq!(code, Some(0), "{line}\n{out}{err}");
        if line.starts_with("rozd hosts") {
            assert!(out.contains("rover-1") && out.contains("rover-2"), "{out}");
        } else if line.starts_with("rozd chat") {
            assert!(err.contains("on host rover-2"), "{err}");
            assert!(out.lines().any(|l| l.starts_with("temp")), "{out}");
        } else if line.contains("estop --fleet --clear") {
            assert_eq!(out.matches("not stopped").count(), 2, "{out}");
        } else if line.contains("estop --fleet") {
            assert_eq!(out.matches("stopped (fleet)").count(), 2, "{out}");
            assert!(out.contains("confirmed:    yes"), "{out}");
        } else if line.starts_with("rozd status") {
            assert!(out.contains("stop:         ACTIVE (fleet"), "{out}");
        }
    }
    for child in &mut started {
        common::broker::terminate(child).await;
    }
}

/// docs/guides/roz-cli.md: the guide's server block passes `rozd check`
/// and, served, holds a gRPC session that never answers its own approval
/// (as the roz CLI); the guide's approval commands, as written (the `ID`
/// the list shows, the token file the block names), answer it and the call
/// runs (issue 35, item 17).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roz_cli_guide_config_and_approval_commands_work() {
    use crate::approvals::Token;
    use rozd::api::proto;
    use rozd::api::proto::agent_service_client::AgentServiceClient;
    use rozd::api::proto::session_request::Request as Req;
    use rozd::api::proto::session_response::Response as Resp;

    let guide = "docs/guides/roz-cli.md";
    let dir = tempfile::tempdir().unwrap();
    const SECRET: &str = "roz-cli-guide-token-0001";
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("{SECRET}\n")).unwrap();
    let tokens = tokens.display().to_string();
    let block = marked_block(guide, "roz-cli-config").replace("/etc/rozd/tokens", &tokens);
    assert!(block.contains("listen = \"127.0.0.1:8080\""), "{block}");
    let config = dir.path().join("roz.toml");
    std::fs::write(
        &config,
        format!(
            "{block}control_socket = \"\"\n[store]\npath = {:?}\n",
            dir.path().join("rozd.db").display().to_string()
        ),
    )
    .unwrap();
    let (code, out, err) =
        common::rozd_cli(&["check", "--config", &config.display().to_string()]).await;
    assert_eq!(code, Some(0), "{out}{err}");

    // Served (on a free port instead of 8080): the block's server keys.
    let server: String = block
        .lines()
        .filter(|l| !l.starts_with('[') && !l.starts_with("listen"))
        .map(|l| format!("{l}\n"))
        .collect();
    let daemon = crate::common::TestDaemon::setup(
        "[[actuators]]\nname = \"lamp\"\nkind = \"sim\"\nallowed = [0, 1]\nsafe_value = 0\n",
    )
    .server(&server)
    .start()
    .await;
    let mut client = AgentServiceClient::with_interceptor(daemon.channel().await, Token(SECRET));
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let response = client
        .stream_session(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .expect("StreamSession");
    let mut session = common::Session {
        tx,
        rx: response.into_inner(),
        wait_bound: EXPECT_WITHIN,
    };
    session.start(proto::StartSession::default()).await;
    session
        .send(Req::UserMessage(proto::UserMessage {
            content: "set lamp 1".into(),
            ..Default::default()
        }))
        .await;
    let id = loop {
        match session.next().await {
            Resp::ActivityUpdate(a) if a.state == "waiting_approval" => break a.detail,
            Resp::Error(e) => panic!("{e:?}"),
            _ => {}
        }
    };
    let addr = daemon.addr.to_string();
    let commands = marked_block(guide, "roz-cli-approvals").replace("/etc/rozd/tokens", &tokens);
    let export = commands
        .lines()
        .find(|l| l.starts_with("export ROZD_TOKEN="))
        .expect("the token line");
    for line in commands.lines().filter(|l| l.starts_with("rozd approvals")) {
        let script = format!("{export}\n{}\n", line.replace(" ID", &format!(" {id}")));
        let (code, out, err) = bash(dir.path(), &script, &[("ROZD_ADDR", &addr)]).await;
        assert_eq!(code, Some(0), "{line}\n{out}{err}");
        if line == "rozd approvals" {
            assert!(
                out.lines()
                    .any(|l| l.starts_with(&id) && l.contains("lamp")),
                "{out}"
            );
        } else {
            assert!(out.starts_with("approved lamp"), "{out}");
        }
    }
    // The call ran: the turn completes and the lamp is on.
    loop {
        if let Resp::TurnComplete(_) = session.next().await {
            break;
        }
    }
    assert_eq!(daemon.host.sim_actuator("lamp").unwrap().value(), Some(1.0));
    daemon.shutdown().await;
}
