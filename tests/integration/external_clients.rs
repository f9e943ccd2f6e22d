//! Clients that are not ours: grpcurl (Go) and a grpcio client generated
//! from `proto/` (Python) against the built binary. `scripts/test.sh`
//! installs both into `target/pyenv` (or `$ROZD_TEST_PYENV`).

use crate::common;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const ROZD: &str = env!("CARGO_BIN_EXE_rozd");

/// The built binary on a free port; killed when dropped.
struct RunningRozd {
    child: Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl RunningRozd {
    fn start() -> RunningRozd {
        let dir = tempfile::tempdir().unwrap();
        let socket_path = dir.path().join("notify.sock");
        let socket = std::os::unix::net::UnixDatagram::bind(&socket_path).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(15)))
            .unwrap();
        let config = dir.path().join("rozd.toml");
        std::fs::write(
            &config,
            format!(
                "[host]\nid = \"ext-host\"\n[server]\nlisten = \"127.0.0.1:0\"\n[store]\npath = {:?}\n",
                dir.path().join("rozd.db").display().to_string()
            ),
        )
        .unwrap();
        let child = Command::new(ROZD)
            .arg("run")
            .arg("--config")
            .arg(&config)
            .env("NOTIFY_SOCKET", &socket_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // READY=1 (with the bound address) is the signal that it serves.
        let mut buf = [0u8; 1024];
        let addr = loop {
            let n = socket.recv(&mut buf).expect("rozd reports READY=1");
            let text = String::from_utf8_lossy(&buf[..n]).to_string();
            if let Some(addr) = text
                .lines()
                .find_map(|l| l.strip_prefix("STATUS=serving roz.v1 on "))
            {
                break addr.to_string();
            }
        };
        RunningRozd {
            child,
            addr,
            _dir: dir,
        }
    }
}

impl Drop for RunningRozd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn grpcurl_lists_services_by_reflection_and_starts_a_session() {
    let rozd = RunningRozd::start();
    let grpcurl = common::pyenv_tool("grpcurl");
    let out = Command::new(&grpcurl)
        .args(["-plaintext", &rozd.addr, "list"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.lines().any(|l| l == "roz.v1.AgentService"),
        "{stdout}"
    );
    assert!(
        stdout.lines().any(|l| l == "grpc.health.v1.Health"),
        "{stdout}"
    );

    let out = Command::new(&grpcurl)
        .args(["-plaintext", &rozd.addr, "grpc.health.v1.Health/Check"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("SERVING"));

    let out = Command::new(&grpcurl)
        .args([
            "-plaintext",
            "-d",
            r#"{"start":{"environment_id":"lab"}}"#,
            &rozd.addr,
            "roz.v1.AgentService/StreamSession",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reply: serde_json::Value = serde_json::from_str(&stdout).expect("grpcurl prints JSON");
    assert!(
        reply["sessionStarted"]["sessionId"]
            .as_str()
            .is_some_and(|s| s.len() == 36),
        "{stdout}"
    );
}

#[test]
fn python_grpcio_client_runs_a_session_with_a_client_tool() {
    let rozd = RunningRozd::start();
    let python = common::pyenv_tool("python");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/session_client.py");
    // The script bounds itself (30 s overall) and exits non-zero on any failure.
    let out = Command::new(&python)
        .arg(&script)
        .arg(&rozd.addr)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{} exited with {}\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        script.display(),
        out.status
    );
    assert!(stdout.contains("session_client: OK"), "{stdout}");
}
