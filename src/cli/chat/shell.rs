//! The one tool `rozd chat` offers the model, `shell`: with
//! `--allow-shell` a PHYSICAL tool that runs `sh -c <command>` here under
//! the request's deadline (the daemon asks the user's approval first), else
//! a PURE stub that runs nothing and refuses every call.

use std::process::Stdio;
use std::time::{Duration, Instant};

use prost_types::value::Kind;
use serde_json::json;
use tokio::io::{AsyncRead, AsyncReadExt as _};

use crate::proto;
use crate::proto::json::json_to_struct;

/// The tool this client offers the model.
pub const SHELL_TOOL: &str = "shell";
/// What a `shell` call answers when the client was started without `--allow-shell`.
pub const REFUSAL: &str = "rozd chat executes no tools (start it with --allow-shell)";
/// `shell`'s declared timeout, and the one used when a request carries none.
const SHELL_TIMEOUT_MS: u32 = 30_000;
/// Most bytes of command output returned to the model.
const SHELL_OUTPUT_MAX: usize = 64 * 1024;

/// The `shell` tool: live with `--allow-shell`, else a PURE stub that runs nothing.
pub(super) fn shell_schema(allow_shell: bool) -> proto::ToolSchema {
    let (description, category) = if allow_shell {
        (
            "Runs a command with `sh -c` on the machine where `rozd chat` runs (each call \
             needs the user's approval) and returns its stdout and stderr, at most 64 KiB, \
             and its exit code.",
            proto::ToolCategoryHint::ToolCategoryPhysical,
        )
    } else {
        (
            "Disabled: this `rozd chat` was started without --allow-shell, so it runs no \
             commands and refuses every call.",
            proto::ToolCategoryHint::ToolCategoryPure,
        )
    };
    proto::ToolSchema {
        name: SHELL_TOOL.into(),
        description: description.into(),
        parameters_schema: Some(json_to_struct(&json!({
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        }))),
        timeout_ms: SHELL_TIMEOUT_MS,
        category: category as i32,
    }
}

pub(super) fn string_param(parameters: Option<&prost_types::Struct>, name: &str) -> Option<String> {
    match parameters?.fields.get(name)?.kind.as_ref()? {
        Kind::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

fn refusal(tool_call_id: String, message: impl Into<String>) -> proto::ToolResult {
    proto::ToolResult {
        tool_call_id,
        success: false,
        result: message.into(),
        ..Default::default()
    }
}

/// Answers one `ToolRequest`.
pub(super) async fn run_tool(call: proto::ToolRequest, allow_shell: bool) -> proto::ToolResult {
    if !allow_shell {
        return refusal(call.tool_call_id, REFUSAL);
    }
    if call.tool_name != SHELL_TOOL {
        let message = format!("rozd chat has no tool `{}`", call.tool_name);
        return refusal(call.tool_call_id, message);
    }
    let Some(command) = string_param(call.parameters.as_ref(), "command") else {
        return refusal(
            call.tool_call_id,
            "`shell` needs a string parameter `command`",
        );
    };
    let timeout_ms = if call.timeout_ms == 0 {
        SHELL_TIMEOUT_MS
    } else {
        call.timeout_ms
    };
    run_shell(call.tool_call_id, &command, timeout_ms).await
}

/// Runs `sh -c command`, killing it at the deadline.
pub async fn run_shell(tool_call_id: String, command: &str, timeout_ms: u32) -> proto::ToolResult {
    let started = Instant::now();
    let elapsed =
        |started: Instant| i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX);
    let spawned = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(command)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => return refusal(tool_call_id, format!("cannot start sh: {e}")),
    };
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return refusal(tool_call_id, "cannot capture the output of sh");
    };
    let work = async {
        tokio::join!(
            read_capped(stdout, SHELL_OUTPUT_MAX),
            read_capped(stderr, SHELL_OUTPUT_MAX),
            child.wait()
        )
    };
    let limit = Duration::from_millis(u64::from(timeout_ms));
    let ((out, out_cut), (err, err_cut), status) = match tokio::time::timeout(limit, work).await {
        Ok(finished) => finished,
        Err(_) => {
            let _ = child.kill().await;
            return proto::ToolResult {
                tool_call_id,
                success: false,
                result: format!("`{command}` did not finish within {timeout_ms} ms and was killed"),
                duration_ms: Some(elapsed(started)),
                ..Default::default()
            };
        }
    };
    let status = match status {
        Ok(status) => status,
        Err(e) => return refusal(tool_call_id, format!("cannot wait for sh: {e}")),
    };
    let mut result = String::from_utf8_lossy(&out).into_owned();
    if !err.is_empty() {
        if !result.is_empty() && !result.ends_with('\n') {
            result.push('\n');
        }
        result.push_str(&String::from_utf8_lossy(&err));
    }
    let cut = truncate_utf8(&mut result, SHELL_OUTPUT_MAX);
    let exit_code = status.code();
    if exit_code.is_none() {
        result.push_str("\n(killed by a signal)");
    }
    proto::ToolResult {
        tool_call_id,
        success: exit_code == Some(0),
        result,
        exit_code,
        truncated: out_cut || err_cut || cut,
        duration_ms: Some(elapsed(started)),
    }
}

/// Reads to the end, keeping at most `cap` bytes (and draining the rest so
/// the writer never blocks on a full pipe).
async fn read_capped<R: AsyncRead + Unpin>(mut reader: R, cap: usize) -> (Vec<u8>, bool) {
    let mut kept = Vec::new();
    let mut truncated = false;
    let mut buf = [0u8; 8192];
    loop {
        match reader.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = cap.saturating_sub(kept.len());
                if n > room {
                    truncated = true;
                }
                kept.extend(buf.iter().take(n.min(room)));
            }
        }
    }
    (kept, truncated)
}

/// Truncates to at most `max` bytes on a character boundary; true if it cut.
fn truncate_utf8(text: &mut String, max: usize) -> bool {
    if text.len() <= max {
        return false;
    }
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text.truncate(cut);
    true
}

/// The status line of a finished tool call.
pub(super) fn tool_summary(result: &proto::ToolResult) -> String {
    let mut line = format!("[tool call {} ", result.tool_call_id);
    match (result.exit_code, result.success) {
        (Some(code), _) => line.push_str(&format!("exited {code}")),
        (None, true) => line.push_str("succeeded"),
        (None, false) => line.push_str("failed"),
    }
    if let Some(ms) = result.duration_ms {
        line.push_str(&format!(" in {ms} ms"));
    }
    if result.truncated {
        line.push_str(", output truncated");
    }
    line.push(']');
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_keeps_whole_characters() {
        let mut s = "aé".repeat(10);
        assert!(truncate_utf8(&mut s, 4));
        assert_eq!(s, "aéa");
        let mut short = "abc".to_string();
        assert!(!truncate_utf8(&mut short, 4));
    }

    #[tokio::test]
    async fn shell_reports_output_exit_code_and_timeout() {
        let ok = run_shell("a".into(), "echo out; echo err >&2", 5000).await;
        assert!(ok.success);
        assert_eq!(ok.exit_code, Some(0));
        assert_eq!(ok.result, "out\nerr\n");
        let failed = run_shell("b".into(), "exit 7", 5000).await;
        assert!(!failed.success);
        assert_eq!(failed.exit_code, Some(7));
        let slow = run_shell("c".into(), "sleep 10", 100).await;
        assert!(!slow.success);
        assert_eq!(slow.exit_code, None);
        assert!(slow.result.contains("was killed"), "{}", slow.result);
        let big = run_shell("d".into(), "head -c 100000 /dev/zero | tr '\\0' x", 5000).await;
        assert!(big.truncated);
        assert_eq!(big.result.len(), SHELL_OUTPUT_MAX);
        assert!(big.success);
    }

    #[tokio::test]
    async fn without_allow_shell_nothing_runs() {
        let call = proto::ToolRequest {
            tool_call_id: "x".into(),
            tool_name: SHELL_TOOL.into(),
            parameters: Some(json_to_struct(&json!({"command": "touch /tmp/never"}))),
            timeout_ms: 1000,
        };
        let result = run_tool(call, false).await;
        assert!(!result.success);
        assert_eq!(result.result, REFUSAL);
    }
}
