//! `rozd chat`, black-box: the built binary as a child process against an
//! in-process daemon running the offline `local` model. Every wait is bounded;
//! the tests synchronise on what the client prints, never on sleeps.

use crate::common;

use std::future::Future;
use std::process::Stdio;
use std::time::Duration;

use common::TestDaemon;
use rozd::config::{Config, ConfigSource};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader, Lines};
use tokio::process::{Child, ChildStderr, ChildStdin, Command};
use tokio::task::JoinHandle;

const ROZD: &str = env!("CARGO_BIN_EXE_rozd");
/// Bound on any one wait: a bug fails the test instead of hanging it.
const BOUND: Duration = Duration::from_secs(20);

async fn bounded<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, f)
        .await
        .unwrap_or_else(|_| panic!("timed out after {BOUND:?} waiting for {what}"))
}

/// A running `rozd chat` with its pipes.
struct ChatProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    stderr: Lines<BufReader<ChildStderr>>,
    /// stderr lines read so far.
    seen: Vec<String>,
    stdout: JoinHandle<String>,
}

struct Finished {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl ChatProcess {
    fn spawn(addr: &str, args: &[&str]) -> ChatProcess {
        let mut child = Command::new(ROZD)
            .arg("chat")
            .arg("--addr")
            .arg(addr)
            .args(args)
            .env_remove("ROZD_ADDR")
            .env_remove("ROZD_TOKEN")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn rozd chat");
        let stdin = child.stdin.take();
        let stderr = BufReader::new(child.stderr.take().expect("stderr piped")).lines();
        let mut stdout = child.stdout.take().expect("stdout piped");
        let stdout = tokio::spawn(async move {
            let mut text = String::new();
            let _ = stdout.read_to_string(&mut text).await;
            text
        });
        ChatProcess {
            child,
            stdin,
            stderr,
            seen: Vec::new(),
            stdout,
        }
    }

    async fn write_line(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin still open");
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .expect("write to rozd chat");
        stdin.flush().await.expect("flush stdin");
    }

    /// Reads stderr line by line until one contains `needle`; returns it.
    async fn stderr_until(&mut self, needle: &str) -> String {
        let what = format!("a stderr line containing {needle:?}");
        let found = bounded(&what, async {
            while let Ok(Some(line)) = self.stderr.next_line().await {
                self.seen.push(line.clone());
                if line.contains(needle) {
                    return Some(line);
                }
            }
            None
        })
        .await;
        found.unwrap_or_else(|| {
            panic!(
                "stderr ended without {needle:?}; it said:\n{}",
                self.seen.join("\n")
            )
        })
    }

    fn pid(&self) -> u32 {
        self.child.id().expect("rozd chat still running")
    }

    /// Closes stdin, waits for exit and collects the rest of the output.
    async fn finish(mut self) -> Finished {
        drop(self.stdin.take());
        let status = bounded("rozd chat to exit", self.child.wait())
            .await
            .expect("wait for rozd chat");
        bounded("the end of stderr", async {
            while let Ok(Some(line)) = self.stderr.next_line().await {
                self.seen.push(line);
            }
        })
        .await;
        let stdout = bounded("the end of stdout", self.stdout)
            .await
            .expect("stdout reader");
        Finished {
            code: status.code(),
            stdout,
            stderr: self.seen.join("\n"),
        }
    }
}

fn interrupt(pid: u32) {
    let status = std::process::Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -INT {pid}");
}

const SHELL_CALL: &str = r#"call shell {"command":"echo hi"}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_prints_the_answer_and_exits_0() {
    let daemon = TestDaemon::start("").await;
    let chat = ChatProcess::spawn(
        &daemon.addr.to_string(),
        &["--prompt", "echo hello from chat"],
    );
    let done = chat.finish().await;
    assert_eq!(done.code, Some(0), "{}", done.stderr);
    assert!(
        done.stdout.contains("hello from chat"),
        "stdout: {:?}",
        done.stdout
    );
    assert!(done.stderr.contains("model local"), "{}", done.stderr);
    assert!(done.stderr.contains("stop: end_turn"), "{}", done.stderr);
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approved_shell_call_runs_and_eof_ends_the_session() {
    let daemon = TestDaemon::start("").await;
    let mut chat = ChatProcess::spawn(&daemon.url(), &["--allow-shell"]);
    chat.write_line(SHELL_CALL).await;
    chat.stderr_until("approve tool call").await;
    chat.write_line("y").await;
    chat.stderr_until("[shell $ echo hi]").await;
    chat.stderr_until("stop: end_turn").await;
    let done = chat.finish().await;
    assert_eq!(done.code, Some(0), "{}", done.stderr);
    assert!(
        done.stdout.contains("shell returned: hi"),
        "stdout: {:?}",
        done.stdout
    );
    assert!(
        done.stdout.contains("exit code 0"),
        "stdout: {:?}",
        done.stdout
    );
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_allow_shell_the_call_is_refused() {
    let daemon = TestDaemon::start("").await;
    let mut chat = ChatProcess::spawn(&daemon.addr.to_string(), &[]);
    chat.write_line(SHELL_CALL).await;
    chat.stderr_until("stop: end_turn").await;
    let done = chat.finish().await;
    assert_eq!(done.code, Some(0), "{}", done.stderr);
    assert!(
        done.stdout.contains("executes no tools"),
        "stdout: {:?}",
        done.stdout
    );
    assert!(!done.stderr.contains("approve"), "{}", done.stderr);
    assert!(!done.stderr.contains("[shell $"), "{}", done.stderr);
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denied_shell_call_does_not_run() {
    let daemon = TestDaemon::start("").await;
    let mut chat = ChatProcess::spawn(&daemon.addr.to_string(), &["--allow-shell"]);
    chat.write_line(SHELL_CALL).await;
    chat.stderr_until("approve tool call").await;
    chat.write_line("n").await;
    chat.stderr_until("stop: end_turn").await;
    let done = chat.finish().await;
    assert_eq!(done.code, Some(0), "{}", done.stderr);
    assert!(done.stdout.contains("denied"), "stdout: {:?}", done.stdout);
    assert!(!done.stderr.contains("[shell $"), "{}", done.stderr);
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_daemon_exits_2_naming_the_address() {
    let free = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = free.local_addr().expect("addr").to_string();
    drop(free);
    let chat = ChatProcess::spawn(&addr, &["--prompt", "echo x"]);
    let done = chat.finish().await;
    assert_eq!(done.code, Some(2), "{}", done.stderr);
    assert!(done.stderr.contains(&addr), "{}", done.stderr);
    assert!(done.stdout.is_empty(), "stdout: {:?}", done.stdout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_during_a_prompt_cancels_the_turn_and_exits_3() {
    let daemon = TestDaemon::start("").await;
    let mut chat = ChatProcess::spawn(
        &daemon.addr.to_string(),
        &["--prompt", "wait 600000; echo x"],
    );
    chat.stderr_until("[thinking").await;
    interrupt(chat.pid());
    let done = chat.finish().await;
    assert_eq!(done.code, Some(3), "{}", done.stderr);
    assert!(done.stderr.contains("stop: cancelled"), "{}", done.stderr);
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_when_idle_ends_the_session_with_0() {
    let daemon = TestDaemon::start("").await;
    let mut chat = ChatProcess::spawn(&daemon.addr.to_string(), &[]);
    chat.stderr_until("type a message").await;
    interrupt(chat.pid());
    let status = bounded("rozd chat to exit", chat.child.wait())
        .await
        .expect("wait");
    assert_eq!(status.code(), Some(0), "{}", chat.seen.join("\n"));
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_limit_exits_4() {
    let daemon = TestDaemon::start("[model]\nmax_output_tokens = 3\n").await;
    let chat = ChatProcess::spawn(
        &daemon.addr.to_string(),
        &["--prompt", "echo one two three four five six seven"],
    );
    let done = chat.finish().await;
    assert_eq!(done.code, Some(4), "{}", done.stderr);
    assert!(done.stderr.contains("stop: max_tokens"), "{}", done.stderr);
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_start_exits_5_with_the_error() {
    let daemon = TestDaemon::start("").await;
    let chat = ChatProcess::spawn(
        &daemon.addr.to_string(),
        &["--host-id", "not-this-host", "--prompt", "echo x"],
    );
    let done = chat.finish().await;
    assert_eq!(done.code, Some(5), "{}", done.stderr);
    assert!(
        done.stderr.contains("error host_not_found:"),
        "{}",
        done.stderr
    );
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_is_sent_as_bearer_and_a_missing_one_exits_2() {
    let dir = tempfile::tempdir().expect("tempdir");
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nauth_tokens = [\"s3cret-token\"]\n[store]\npath = {:?}\n",
        dir.path().join("rozd.db").display().to_string()
    );
    let config = Config::parse(&text, ConfigSource::BuiltIn).expect("config");
    let daemon = TestDaemon::start_with(config, dir).await;
    let addr = daemon.addr.to_string();

    let done = ChatProcess::spawn(&addr, &["--prompt", "echo x"])
        .finish()
        .await;
    assert_eq!(done.code, Some(2), "{}", done.stderr);
    assert!(done.stderr.contains("unauthenticated"), "{}", done.stderr);
    assert!(done.stderr.contains(&addr), "{}", done.stderr);

    let done = ChatProcess::spawn(
        &addr,
        &["--token", "s3cret-token", "--prompt", "echo authorised"],
    )
    .finish()
    .await;
    assert_eq!(done.code, Some(0), "{}", done.stderr);
    assert!(done.stdout.contains("authorised"), "{}", done.stdout);
    assert!(!done.stderr.contains("s3cret-token"), "{}", done.stderr);
    daemon.shutdown().await;
}

/// For a person `rozd chat` shows the answer without the session's
/// bookkeeping: no `[presence …]` lines and none of the local model's notes
/// (both back with `--verbose`); `status` is a table with rounded values;
/// the banner names the host asked for (issue 35, item 14).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_human_view_drops_bookkeeping_and_shows_status_as_a_table() {
    let daemon = TestDaemon::start(
        r#"
[[sensors]]
name = "coolant"
source = "sim"
signal = "constant"
offset = 21.053924732137325
unit = "degC"
"#,
    )
    .await;
    let host = daemon.host.config().host.id.clone();
    let addr = daemon.addr.to_string();
    let quiet = ChatProcess::spawn(&addr, &["--prompt", "status", "--host-id", &host])
        .finish()
        .await;
    assert_eq!(quiet.code, Some(0), "{}", quiet.stderr);
    assert!(!quiet.stderr.contains("[presence"), "{}", quiet.stderr);
    assert!(
        !quiet.stderr.contains("Offline command model"),
        "{}",
        quiet.stderr
    );
    assert!(
        quiet
            .stderr
            .contains(&format!("on host {host} (via {addr})")),
        "{}",
        quiet.stderr
    );
    let row = quiet
        .stdout
        .lines()
        .find(|l| l.starts_with("coolant"))
        .unwrap_or_else(|| panic!("a row for coolant: {}", quiet.stdout));
    assert!(row.contains("21.054 degC"), "{row}");
    assert!(!quiet.stdout.contains("21.0539"), "{}", quiet.stdout);

    let verbose = ChatProcess::spawn(&addr, &["--prompt", "status", "--verbose"])
        .finish()
        .await;
    assert_eq!(verbose.code, Some(0), "{}", verbose.stderr);
    assert!(verbose.stderr.contains("[presence"), "{}", verbose.stderr);
    let notes = format!("{}{}", verbose.stdout, verbose.stderr);
    assert!(notes.contains("Offline command model"), "{notes}");
    daemon.shutdown().await;
}
