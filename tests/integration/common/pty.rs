//! A serial device for tests: a pty pair made by `socat`. rozd opens link
//! `a` as its serial port; the test plays the device on link `b`.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio_serial::{SerialPortBuilderExt, SerialStream};

use super::EXPECT_WITHIN;
use super::broker::terminate;

pub struct PtyPair {
    child: Child,
    /// rozd's end.
    pub a: PathBuf,
    /// The device's end.
    pub b: PathBuf,
}

impl PtyPair {
    /// Starts socat in `dir` and waits until it reports both ptys and enters
    /// its transfer loop (the links exist by then).
    pub async fn start(dir: &Path) -> PtyPair {
        let a = dir.join("A");
        let b = dir.join("B");
        let mut child = Command::new("socat")
            .arg("-d")
            .arg("-d")
            .arg(format!("pty,raw,echo=0,link={}", a.display()))
            .arg(format!("pty,raw,echo=0,link={}", b.display()))
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn socat (scripts/test.sh installs it)");
        let stderr = child.stderr.take().expect("socat stderr");
        let mut lines = BufReader::new(stderr).lines();
        let mut ptys = 0;
        let mut log = String::new();
        let ready = tokio::time::timeout(EXPECT_WITHIN, async {
            while let Ok(Some(line)) = lines.next_line().await {
                log.push_str(&line);
                log.push('\n');
                if line.contains(" N PTY is ") {
                    ptys += 1;
                }
                if ptys == 2 && line.contains("starting data transfer loop") {
                    return true;
                }
            }
            false
        })
        .await;
        assert_eq!(ready, Ok(true), "socat did not start:\n{log}");
        assert!(a.exists() && b.exists(), "socat links missing:\n{log}");
        // Keep draining its log so socat never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        PtyPair { child, a, b }
    }

    /// Opens the device end.
    pub fn device(&self) -> Device {
        let port = tokio_serial::new(self.b.to_string_lossy(), 115_200)
            .open_native_async()
            .expect("open the device end of the pty pair");
        let (r, w) = tokio::io::split(port);
        Device {
            lines: BufReader::new(r).lines(),
            w,
        }
    }

    /// The device vanishes: socat exits and closes both ptys (and removes
    /// the links).
    pub async fn stop(&mut self) {
        terminate(&mut self.child).await;
    }
}

/// The device end of a [`PtyPair`].
pub struct Device {
    lines: tokio::io::Lines<BufReader<tokio::io::ReadHalf<SerialStream>>>,
    w: tokio::io::WriteHalf<SerialStream>,
}

impl Device {
    pub async fn send(&mut self, bytes: impl AsRef<[u8]>) {
        self.w
            .write_all(bytes.as_ref())
            .await
            .expect("write to the device end");
        self.w.flush().await.expect("flush the device end");
    }

    /// The next line rozd wrote to the device.
    pub async fn line(&mut self) -> String {
        tokio::time::timeout(EXPECT_WITHIN, self.lines.next_line())
            .await
            .expect("rozd wrote nothing to the device")
            .expect("read the device end")
            .expect("the device end closed")
    }

    /// Expects the command `want` and answers `reply` (a whole line).
    pub async fn answer(&mut self, want: &str, reply: &str) {
        assert_eq!(self.line().await, want);
        self.send(format!("{reply}\n")).await;
    }
}
