//! The human-readable forms of the daemon's JSON answers (`--json` prints
//! them as they came) and of the team events `rozd task watch` follows.

use serde_json::Value;

use crate::proto;

/// The answer of `/v1/status`, one `key: value` line each.
pub fn status(v: &Value) -> String {
    let s = |k: &str| {
        v.get(k).map_or_else(
            || "?".to_string(),
            |x| x.to_string().trim_matches('"').to_string(),
        )
    };
    let uptime = v.get("uptime_secs").and_then(Value::as_u64).unwrap_or(0);
    let active = v
        .pointer("/sessions/active")
        .map_or_else(|| "?".into(), ToString::to_string);
    let cause = |stop: &Value| {
        format!(
            "{}: {}",
            stop.get("source").and_then(|x| x.as_str()).unwrap_or("?"),
            stop.get("reason").and_then(|x| x.as_str()).unwrap_or("?")
        )
    };
    let stop = match (v.get("protective_stop"), v.get("protective_stop_causes")) {
        (_, Some(Value::Array(causes))) if !causes.is_empty() => format!(
            "ACTIVE ({})",
            causes.iter().map(cause).collect::<Vec<_>>().join("; ")
        ),
        (Some(stop @ Value::Object(_)), _) => format!("ACTIVE ({})", cause(stop)),
        (Some(Value::Null), _) => "not active".to_string(),
        _ => "?".to_string(),
    };
    // Only when recording (`[record]`): the file and what was dropped.
    let recording = match v.get("recording") {
        Some(r @ Value::Object(_)) => format!(
            "recording:    {} ({} written, {} dropped)\n",
            r.get("current_file")
                .and_then(Value::as_str)
                .unwrap_or("between files"),
            r.get("written").and_then(Value::as_u64).unwrap_or(0),
            r.get("dropped").and_then(Value::as_u64).unwrap_or(0)
        ),
        _ => String::new(),
    };
    format!(
        "host:         {} ({})\nenvironment:  {}\nversion:      {}\nlistening:    {}\nuptime:       {}h {:02}m {:02}s\nsessions:     {} active\nsensors:      {}\nactuators:    {}\nstop:         {}\n{recording}",
        s("host_id"),
        s("name"),
        s("environment_id"),
        s("version"),
        s("listen"),
        uptime / 3600,
        (uptime / 60) % 60,
        uptime % 60,
        active,
        s("sensors"),
        s("actuators"),
        stop,
    )
}

/// Why a listed host is not live, in words (`why` of `/v1/hosts`).
fn why_text(h: &Value) -> Option<String> {
    Some(match h["why"].as_str()? {
        "shutdown" => "shut down".to_string(),
        "will" => "last will: connection lost".to_string(),
        "unstated" => "no cause given".to_string(),
        "silent" => "silent, no last will".to_string(),
        "reported" => match h["reported_by"].as_str() {
            Some(by) => format!("reported silent by {by}"),
            None => "reported silent".to_string(),
        },
        other => other.to_string(),
    })
}

/// The answer of `/v1/hosts` as a table.
pub fn hosts(v: &Value) -> String {
    let text = |h: &Value, k: &str| h.get(k).and_then(Value::as_str).unwrap_or("-").to_string();
    let fleet = &v["fleet"];
    let mut out = if fleet["configured"].as_bool() == Some(true) {
        format!(
            "fleet: {} ({})\n",
            fleet["broker"].as_str().unwrap_or("?"),
            if fleet["connected"].as_bool() == Some(true) {
                "connected"
            } else {
                "NOT connected: the list may be out of date"
            }
        )
    } else {
        "fleet: none (no [fleet] configured: this host alone)\n".to_string()
    };
    let mut rows = vec![[
        "ID".to_string(),
        "NAME".to_string(),
        "ENVIRONMENT".to_string(),
        "STATUS".to_string(),
        "STOP".to_string(),
        "ENDPOINT".to_string(),
        "HEARD".to_string(),
    ]];
    for h in v["data"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let heard = if h["this_host"].as_bool() == Some(true) {
            "this host".to_string()
        } else {
            match h["heard_ms_ago"].as_u64() {
                Some(ms) => format!("{}s ago", ms / 1000),
                None => "-".to_string(),
            }
        };
        rows.push([
            text(h, "id"),
            text(h, "name"),
            text(h, "environment_id"),
            match (h["status"].as_str(), why_text(h)) {
                (Some(status), Some(why)) => format!("{status} ({why})"),
                (status, _) => status.unwrap_or("-").to_string(),
            },
            if h["estop_active"].as_bool() == Some(true) {
                "ACTIVE".to_string()
            } else {
                "-".to_string()
            },
            text(h, "endpoint"),
            heard,
        ]);
    }
    let widths: Vec<usize> = (0..7)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    for row in &rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    let total = v["total"].as_u64().unwrap_or(0);
    let shown = rows.len() - 1;
    if total > shown as u64 {
        out.push_str(&format!("({shown} of {total} hosts shown)\n"));
    }
    if let Some(dropped) = fleet["broker_dropped_messages"].as_u64().filter(|n| *n > 0) {
        out.push_str(&format!(
            "the broker dropped {dropped} messages since this host joined (any client's; \
             this host's view may miss hosts or changes)\n"
        ));
    }
    // Messages that anyone with access to the broker can publish, and
    // that this host did not take: worth a look when they are not zero.
    if let Some(ignored) = fleet["ignored"].as_object() {
        let counts: Vec<String> = ignored
            .iter()
            .filter_map(|(k, n)| n.as_u64().filter(|n| *n > 0).map(|n| format!("{k} {n}")))
            .collect();
        if !counts.is_empty() {
            out.push_str(&format!("ignored from the broker: {}\n", counts.join(", ")));
        }
    }
    out
}

/// The answer of `/v1/estop` or `/v1/estop/clear`, readably.
pub fn safety(v: &Value, cleared: bool) -> String {
    let text = |p: &str| {
        v.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("?")
            .to_string()
    };
    let guards: Vec<&str> = v
        .get("active_guards")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut out = String::new();
    if v.get("estop_active").and_then(Value::as_bool) == Some(true) {
        let fresh = v.get("triggered").and_then(Value::as_bool) == Some(true);
        out.push_str(&format!(
            "protective stop: ACTIVE{}\n  source:  {}\n  reason:  {}\n",
            if fresh {
                ""
            } else {
                " (it was already latched; the first cause is kept)"
            },
            text("/stop/source"),
            text("/stop/reason"),
        ));
        out.push_str(
            "  every actuator was sent to its safe value; commands are refused until cleared\n",
        );
    } else if cleared && v.get("cleared").and_then(Value::as_bool) == Some(true) {
        out.push_str("protective stop: cleared (nothing was moved; commands are accepted again)\n");
    } else {
        out.push_str("protective stop: not active\n");
    }
    if !guards.is_empty() {
        out.push_str(&format!("  guards:  {}\n", guards.join(", ")));
    }
    out
}

/// One task of `GET /v1/tasks`: id, status and the start of its prompt.
pub fn task_line(task: &Value) -> String {
    format!(
        "{}  {:<16}  {}",
        text(task, "id"),
        text(task, "status"),
        one_line(&text(task, "prompt"), 60)
    )
}

/// A task as `key: value` lines.
pub fn task(task: &Value) -> String {
    let mut out = String::new();
    for key in [
        "id",
        "status",
        "detail",
        "host_id",
        "environment_id",
        "prompt",
    ] {
        if let Some(v) = task.get(key).and_then(Value::as_str) {
            out.push_str(&format!("{key}: {v}\n"));
        }
    }
    if let Some(t) = task.get("timeout_secs").and_then(Value::as_u64) {
        out.push_str(&format!("timeout_secs: {t}\n"));
    }
    for p in task
        .get("pending_approvals")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        out.push_str(&format!(
            "waiting for approval: {} ({} by {})\n",
            text(p, "tool_call_id"),
            text(p, "tool"),
            text(p, "worker_id")
        ));
    }
    out
}

/// One team event as a line of text.
pub fn event_line(task_id: &str, event: &proto::TeamEvent) -> String {
    use proto::team_event::Event;
    let short = |w: &str| {
        w.strip_prefix(task_id)
            .and_then(|r| r.strip_prefix(':'))
            .unwrap_or(w)
            .to_string()
    };
    match &event.event {
        Some(Event::WorkerStarted(e)) => {
            format!("{} started on {}", short(&e.worker_id), e.host_id)
        }
        Some(Event::WorkerPhase(e)) => {
            format!("{} cycle {} ({})", short(&e.worker_id), e.phase, e.mode)
        }
        Some(Event::WorkerToolCall(e)) => format!("{} calls {}", short(&e.worker_id), e.tool),
        Some(Event::WorkerCompleted(e)) => format!(
            "{} completed: {}",
            short(&e.worker_id),
            one_line(&e.result, 200)
        ),
        Some(Event::WorkerFailed(e)) => format!("{} failed: {}", short(&e.worker_id), e.reason),
        Some(Event::WorkerExited(e)) => format!("{} exited", short(&e.worker_id)),
        None => "(empty event)".into(),
    }
}

fn text(v: &Value, key: &str) -> String {
    v.get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// `s` on one line (runs of whitespace as one space), cut to `max` characters.
pub fn one_line(s: &str, max: usize) -> String {
    let flat: String = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() > max {
        format!("{}…", flat.chars().take(max).collect::<String>())
    } else {
        flat
    }
}
