//! Measurement 6, the footprint of the `rozd` binary as a process: start-up (exec ->
//! `READY=1` on a real `NOTIFY_SOCKET`), resident memory idle, with open
//! sessions and after many turns, and the stripped binary's size. The floor
//! process is the bare tonic echo, run from this harness's own executable
//! (see [`super::child_role`]) and driven the same way.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow, bail};
use tokio::net::UnixDatagram;
use tokio::time::Instant;

use super::Scale;
use super::fixtures::{SessionStream, WAIT, builtin_host, connect, step_tool};
use super::report::{Better, Group, P50, Samples};
use super::steps::{Target, one_turn};

/// The environment variable that makes this executable the echo floor process.
pub const ROLE_ENV: &str = "ROZD_BENCH_ROLE";
pub const ECHO_ROLE: &str = "echo-server";

/// A spawned server that said `READY=1`.
pub(super) struct Server {
    child: tokio::process::Child,
    pub(super) pid: u32,
    addr: SocketAddr,
    startup: Duration,
}

impl Server {
    /// Spawns `command` with a fresh `NOTIFY_SOCKET` in `dir` and waits for
    /// `READY=1` (with the address in `STATUS=serving roz.v1 on <addr>`).
    pub(super) async fn spawn(mut command: tokio::process::Command, dir: &Path) -> Result<Server> {
        let socket_path = dir.join(format!("notify-{}.sock", uuid::Uuid::new_v4().simple()));
        let socket = UnixDatagram::bind(&socket_path)?;
        command
            .env("NOTIFY_SOCKET", &socket_path)
            .env_remove("WATCHDOG_USEC")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        let start = Instant::now();
        let child = command.spawn().context("spawn")?;
        let pid = child.id().ok_or_else(|| anyhow!("no pid"))?;
        let mut addr = None;
        let mut buf = vec![0u8; 4096];
        let startup = loop {
            let n = tokio::time::timeout(WAIT, socket.recv(&mut buf))
                .await
                .context("no READY=1 in time")??;
            let at = Instant::now();
            let text = String::from_utf8_lossy(&buf[..n]);
            for line in text.lines() {
                if let Some(a) = line.strip_prefix("STATUS=serving roz.v1 on ") {
                    addr = Some(a.parse::<SocketAddr>()?);
                }
            }
            if text.lines().any(|l| l == "READY=1") {
                break at - start;
            }
        };
        let _ = std::fs::remove_file(&socket_path);
        Ok(Server {
            child,
            pid,
            addr: addr.ok_or_else(|| anyhow!("READY=1 without the address in STATUS"))?,
            startup,
        })
    }

    /// Resident memory now, in MiB.
    fn rss_mib(&self) -> Result<f64> {
        self.status_mib("VmRSS")
    }

    /// A memory figure of `/proc/<pid>/status` (`VmRSS`, `RssAnon`:
    /// private memory, `RssFile`: mapped file pages, mostly the binary's own
    /// code), in MiB.
    pub(super) fn status_mib(&self, field: &str) -> Result<f64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid))?;
        let kib = status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<f64>().ok())
            .ok_or_else(|| anyhow!("no {field} for {}", self.pid))?;
        Ok(kib / 1024.0)
    }

    /// SIGTERM, then waits for a clean exit.
    pub(super) async fn stop(mut self) -> Result<()> {
        let status = tokio::process::Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status()
            .await?;
        if !status.success() {
            bail!("kill -TERM {} failed", self.pid);
        }
        let exit = tokio::time::timeout(WAIT, self.child.wait())
            .await
            .context("no exit after SIGTERM")??;
        if !exit.success() {
            bail!("exited with {exit} after SIGTERM");
        }
        Ok(())
    }
}

pub(super) fn rozd_command(config: &Path) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_rozd"));
    command.arg("run").arg("--config").arg(config);
    command
}

fn echo_command() -> Result<tokio::process::Command> {
    let mut command = tokio::process::Command::new(std::env::current_exe()?);
    command.env(ROLE_ENV, ECHO_ROLE);
    Ok(command)
}

struct Footprint {
    startup: Samples,
    idle: f64,
    idle_anon: f64,
    idle_file: f64,
    open: f64,
    after_turns_open: f64,
    after_turns_closed: f64,
    after_more_turns_closed: f64,
    turns: usize,
}

/// Opens `sessions` sessions on `server`.
pub(super) async fn open_sessions(
    server: &Server,
    target: Target,
    sessions: usize,
) -> Result<Vec<SessionStream>> {
    let mut clients = Vec::new();
    for _ in 0..sessions.div_ceil(100) {
        clients.push(connect(server.addr).await?);
    }
    let mut streams = Vec::new();
    for i in 0..sessions {
        let tools = match target {
            Target::Rozd => vec![step_tool()],
            Target::Echo => vec![],
        };
        streams.push(SessionStream::start(&mut clients[i / 100], tools).await?);
    }
    Ok(streams)
}

/// Every session runs `turns` turns, all sessions at once.
async fn run_turns(
    streams: Vec<SessionStream>,
    target: Target,
    turns: usize,
) -> Result<Vec<SessionStream>> {
    let mut tasks = tokio::task::JoinSet::new();
    for mut stream in streams {
        tasks.spawn(async move {
            for _ in 0..turns {
                one_turn(&mut stream, target).await?;
            }
            anyhow::Ok(stream)
        });
    }
    let mut streams = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        streams.push(joined??);
    }
    Ok(streams)
}

/// Closes the sessions and, for rozd, waits until each recorded its end.
async fn close_sessions(
    server: &Server,
    target: Target,
    streams: Vec<SessionStream>,
) -> Result<()> {
    for stream in streams {
        stream.close().await?;
    }
    if target == Target::Echo {
        return Ok(());
    }
    let addr = server.addr.to_string();
    let deadline = Instant::now() + WAIT;
    loop {
        let reply = rozd::cli::client::get(&addr, "/v1/status", None).await?;
        let status: serde_json::Value = serde_json::from_str(&reply.body)?;
        if status["sessions"]["active"] == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("sessions still active after closing them: {status}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Start-ups, then memory idle, with `sessions` open, after `turns` turns
/// (sessions still open, then closed), and after as many turns again in new
/// sessions (closed): memory that keeps growing would show there.
async fn measure(
    scale: &Scale,
    target: Target,
    dir: &Path,
    command: impl Fn() -> Result<tokio::process::Command>,
) -> Result<Footprint> {
    let mut startup = Samples::default();
    let mut server = None;
    for i in 0..scale.startups {
        let started = Server::spawn(command()?, dir).await?;
        startup.push(started.startup);
        if i + 1 < scale.startups {
            started.stop().await?;
        } else {
            server = Some(started);
        }
    }
    let server = server.ok_or_else(|| anyhow!("no start-ups"))?;
    tokio::time::sleep(scale.settle).await;
    let idle = server.rss_mib()?;
    let idle_anon = server.status_mib("RssAnon")?;
    let idle_file = server.status_mib("RssFile")?;

    let sessions = scale.footprint_sessions;
    let per_session = scale.footprint_turns.div_ceil(sessions);
    let streams = open_sessions(&server, target, sessions).await?;
    let open = server.rss_mib()?;
    let streams = run_turns(streams, target, per_session).await?;
    let after_turns_open = server.rss_mib()?;
    close_sessions(&server, target, streams).await?;
    let after_turns_closed = server.rss_mib()?;

    let streams = open_sessions(&server, target, sessions).await?;
    let streams = run_turns(streams, target, per_session).await?;
    close_sessions(&server, target, streams).await?;
    let after_more_turns_closed = server.rss_mib()?;
    server.stop().await?;
    Ok(Footprint {
        startup,
        idle,
        idle_anon,
        idle_file,
        open,
        after_turns_open,
        after_turns_closed,
        after_more_turns_closed,
        turns: per_session * sessions,
    })
}

/// The binary's size once stripped (`strip` on a copy; a release build is
/// already stripped by its profile).
fn stripped_size(binary: &Path, dir: &Path) -> Result<(f64, bool)> {
    let copy: PathBuf = dir.join("rozd.stripped");
    let stripped = std::process::Command::new("strip")
        .arg("-o")
        .arg(&copy)
        .arg(binary)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let path = if stripped { copy.as_path() } else { binary };
    Ok((
        std::fs::metadata(path)?.len() as f64 / (1024.0 * 1024.0),
        stripped,
    ))
}

pub async fn footprint(scale: &Scale) -> Result<Group> {
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("rozd.toml");
    std::fs::write(&config, builtin_host(&dir.path().join("rozd.db")))?;
    let rozd = measure(scale, Target::Rozd, dir.path(), || {
        Ok(rozd_command(&config))
    })
    .await?;
    let floor = measure(scale, Target::Echo, dir.path(), echo_command).await?;

    let mut group = Group::new(
        "6. footprint",
        "the bare tonic echo as its own process (a multi-thread tokio runtime serving the \
         same streams and turns); no floor for the binary size",
    );
    let n = (rozd.startup.len(), floor.startup.len());
    group.add(
        "footprint.startup_ms",
        "start-up, exec -> READY=1, p50",
        "ms",
        Better::Lower,
        rozd.startup.percentile(P50.1) / 1000.0,
        Some(floor.startup.percentile(P50.1) / 1000.0),
        n,
    );
    let one = (1, 1);
    for (id, name, r, f, n) in [
        (
            "footprint.rss_idle_mib",
            "resident memory, idle (built-in host)".to_string(),
            rozd.idle,
            floor.idle,
            one,
        ),
        (
            "footprint.rss_idle_anon_mib",
            "resident memory, idle: private (RssAnon)".to_string(),
            rozd.idle_anon,
            floor.idle_anon,
            one,
        ),
        (
            "footprint.rss_idle_file_mib",
            "resident memory, idle: mapped file pages, mostly the binary's code (RssFile)"
                .to_string(),
            rozd.idle_file,
            floor.idle_file,
            one,
        ),
        (
            "footprint.rss_sessions_mib",
            format!(
                "resident memory, {} open sessions",
                scale.footprint_sessions
            ),
            rozd.open,
            floor.open,
            (scale.footprint_sessions, scale.footprint_sessions),
        ),
        (
            "footprint.rss_turns_open_mib",
            format!("resident memory after {} turns, sessions open", rozd.turns),
            rozd.after_turns_open,
            floor.after_turns_open,
            (rozd.turns, floor.turns),
        ),
        (
            "footprint.rss_turns_closed_mib",
            format!(
                "resident memory after {} turns, sessions closed",
                rozd.turns
            ),
            rozd.after_turns_closed,
            floor.after_turns_closed,
            (rozd.turns, floor.turns),
        ),
        (
            "footprint.rss_more_turns_closed_mib",
            format!(
                "resident memory after {} more turns in new sessions, closed",
                rozd.turns
            ),
            rozd.after_more_turns_closed,
            floor.after_more_turns_closed,
            (rozd.turns, floor.turns),
        ),
    ] {
        group.add(id, &name, "MiB", Better::Lower, r, Some(f), n);
    }
    let (size, stripped) = stripped_size(Path::new(env!("CARGO_BIN_EXE_rozd")), dir.path())?;
    group.add(
        "footprint.binary_mib",
        if stripped {
            "binary size, stripped"
        } else {
            "binary size (strip unavailable: unstripped)"
        },
        "MiB",
        Better::Lower,
        size,
        None,
        one,
    );
    Ok(group)
}
