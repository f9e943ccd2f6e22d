//! A real `mosquitto` broker for the tests: started on a free loopback port
//! with a temporary configuration and persistence directory, stopped with
//! SIGTERM (it saves its persistence file), restartable on the same port.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

/// A bound on a hang, not a synchronisation.
const WITHIN: Duration = Duration::from_secs(15);

/// A free loopback TCP port (bound and released; the caller binds it next).
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("local addr").port()
}

pub struct Broker {
    child: Child,
    pub port: u16,
    conf: PathBuf,
}

impl Broker {
    /// mosquitto on a free port, persistence in `dir`.
    pub async fn start(dir: &Path) -> Broker {
        Self::start_on(dir, free_port(), "").await
    }

    /// mosquitto on `port`, persistence in `dir`, `extra` appended to its
    /// configuration; returns once it says it is running (its listener is
    /// open by then).
    pub async fn start_on(dir: &Path, port: u16, extra: &str) -> Broker {
        let user = std::process::Command::new("id")
            .arg("-un")
            .output()
            .expect("run id -un");
        let user = String::from_utf8_lossy(&user.stdout).trim().to_string();
        let conf = dir.join("mosquitto.conf");
        let text = format!(
            "listener {port} 127.0.0.1\nallow_anonymous true\npersistence true\npersistence_location {}/\n\
             user {user}\nlog_dest stderr\n{extra}\n",
            dir.display()
        );
        std::fs::write(&conf, text).expect("write mosquitto.conf");
        Self::spawn(conf, port).await
    }

    async fn spawn(conf: PathBuf, port: u16) -> Broker {
        let mut child = Command::new("mosquitto")
            .arg("-c")
            .arg(&conf)
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn mosquitto (apt-get install mosquitto)");
        let stderr = child.stderr.take().expect("mosquitto stderr");
        let mut lines = BufReader::new(stderr).lines();
        let mut log = String::new();
        let running = tokio::time::timeout(WITHIN, async {
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
        Broker { child, port, conf }
    }

    pub fn url(&self) -> String {
        format!("mqtt://127.0.0.1:{}", self.port)
    }

    /// SIGTERM: mosquitto saves its persistence file and exits.
    pub async fn stop(&mut self) {
        terminate(&mut self.child).await;
    }

    /// The same broker again (after [`Broker::stop`]): same port,
    /// configuration and persistence.
    pub async fn start_again(&mut self) {
        *self = Self::spawn(self.conf.clone(), self.port).await;
    }

    pub async fn restart(&mut self) {
        self.stop().await;
        self.start_again().await;
    }
}

/// Sends SIGTERM and waits for the exit.
pub async fn terminate(child: &mut Child) {
    if let Some(pid) = child.id() {
        let status = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .await
            .expect("run kill");
        assert!(status.success(), "kill -TERM {pid} failed");
    }
    tokio::time::timeout(WITHIN, child.wait())
        .await
        .expect("the process did not exit after SIGTERM")
        .expect("wait for the process");
}

/// Publishes like any other client would, at QoS 1 (`mosquitto_pub` returns
/// once the broker acknowledged). The payload goes through stdin, so it may
/// be large or binary; an empty retained payload clears the retained message.
pub async fn publish(port: u16, topic: &str, payload: impl AsRef<[u8]>, retain: bool) {
    let payload = payload.as_ref();
    let mut cmd = Command::new("mosquitto_pub");
    cmd.args([
        "-h",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "-q",
        "1",
        "-t",
        topic,
    ]);
    if payload.is_empty() {
        cmd.arg("-n");
    } else {
        cmd.arg("-s");
    }
    if retain {
        cmd.arg("-r");
    }
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .expect("run mosquitto_pub (apt-get install mosquitto-clients)");
    let mut stdin = child.stdin.take().expect("mosquitto_pub stdin");
    stdin.write_all(payload).await.expect("write the payload");
    drop(stdin);
    let out = tokio::time::timeout(WITHIN, child.wait_with_output())
        .await
        .expect("mosquitto_pub hung")
        .expect("wait for mosquitto_pub");
    assert!(
        out.status.success(),
        "mosquitto_pub failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The retained message on `topic`, as any other client would read it
/// (`mosquitto_sub --retained-only`), byte for byte.
pub async fn retained(port: u16, topic: &str) -> Vec<u8> {
    let out = tokio::time::timeout(
        WITHIN,
        Command::new("mosquitto_sub")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "-t",
                topic,
                "-C",
                "1",
                "-N",
                "--retained-only",
                "-W",
                "10",
            ])
            .stdin(Stdio::null())
            .output(),
    )
    .await
    .expect("mosquitto_sub hung")
    .expect("run mosquitto_sub (apt-get install mosquitto-clients)");
    assert!(
        out.status.success() && !out.stdout.is_empty(),
        "no retained message on {topic}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}
