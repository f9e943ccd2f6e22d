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

/// A measured value for people: at most 3 decimals, trailing zeros
/// dropped (1 decimal from 100 on).
pub fn number(v: f64) -> String {
    let text = if v.abs() >= 100.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    };
    let text = if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    };
    if text == "-0" { "0".into() } else { text }
}

/// A span of milliseconds for people: `45 s`, `3 min 12 s`, `2 h 05 min`.
fn span(ms: i64) -> String {
    let secs = ms.max(0) / 1000;
    match secs {
        0..60 => format!("{secs} s"),
        60..3600 => format!("{} min {:02} s", secs / 60, secs % 60),
        _ => format!("{} h {:02} min", secs / 3600, (secs / 60) % 60),
    }
}

/// What `rozd status` adds for people from `/v1/observation` (and the
/// status): every sensor's value, health and alarm (with the limit crossed
/// and for how long), every actuator's value, safe value, owner and hold,
/// then the calls waiting for approval, MCP, the fleet and the recording.
pub fn health(status: &Value, observation: &Value) -> String {
    let at = observation["at_unix_ms"].as_i64().unwrap_or(0);
    let unit = |x: &Value| {
        x["unit"]
            .as_str()
            .map(|u| format!(" {u}"))
            .unwrap_or_default()
    };
    let value = |x: &Value| match x["value"].as_f64() {
        Some(v) => format!("{}{}", number(v), unit(x)),
        None => "—".into(),
    };
    let sensors = observation["sensors"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let actuators = observation["actuators"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let width = sensors
        .iter()
        .chain(&actuators)
        .filter_map(|x| x["name"].as_str())
        .map(str::len)
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    if !sensors.is_empty() {
        out.push_str("sensors:\n");
    }
    for s in &sensors {
        let alarm = match s["alarm"].as_str().unwrap_or("?") {
            "ok" => "alarm ok".to_string(),
            level => {
                let mut text = format!("alarm {}", level.to_uppercase());
                if let Some(limit) = s["alarm_limit"]["limit"].as_str() {
                    let side = if limit.ends_with("_min") {
                        "below"
                    } else {
                        "above"
                    };
                    let bound = s["alarm_limit"]["value"]
                        .as_f64()
                        .map(number)
                        .unwrap_or_default();
                    text.push_str(&format!(": {side} {limit} {bound}{}", unit(s)));
                }
                if let Some(since) = s["alarm_since_unix_ms"].as_i64() {
                    text.push_str(&format!(", for {}", span(at - since)));
                }
                text
            }
        };
        let mut line = format!(
            "  {:width$}  {:>12}  {:12}  {alarm}",
            s["name"].as_str().unwrap_or("?"),
            value(s),
            s["health"].as_str().unwrap_or("?"),
        );
        if let Some(error) = s["error"].as_str() {
            line.push_str(&format!("  ({error})"));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    if !actuators.is_empty() {
        out.push_str("actuators:\n");
    }
    for a in &actuators {
        let state = if a["at_safe_value"] == true {
            "at its safe value".to_string()
        } else {
            format!(
                "moved (safe {})",
                a["safe_value"].as_f64().map(number).unwrap_or_default()
            )
        };
        let mut line = format!(
            "  {:width$}  {:>12}  {state}",
            a["name"].as_str().unwrap_or("?"),
            value(a),
        );
        if let Some(owner) = a["owner"].as_str() {
            line.push_str(&format!(", by {owner}"));
        }
        if let Some(hold) = a["hold_remaining_ms"].as_i64() {
            line.push_str(&format!(", held {} more", span(hold + 999)));
        }
        out.push_str(&line);
        out.push('\n');
    }
    let waiting = status["pending_approvals"].as_u64().unwrap_or(0);
    out.push_str(&format!(
        "approvals:    {}\n",
        if waiting == 0 {
            "none waiting".to_string()
        } else {
            format!("{waiting} call(s) waiting (answer at GET /v1/approvals, or on the dashboard)")
        }
    ));
    out.push_str(&format!(
        "mcp:          {}\n",
        match &status["mcp"] {
            Value::Object(m) => format!(
                "{} session(s) of {}",
                m.get("sessions").and_then(Value::as_u64).unwrap_or(0),
                m.get("max_sessions").and_then(Value::as_u64).unwrap_or(0)
            ),
            _ => "off".to_string(),
        }
    ));
    out.push_str(&format!(
        "fleet:        {}\n",
        match &status["fleet"] {
            Value::Object(f) => format!(
                "{} to the broker ({} message(s) received)",
                if f.get("connected") == Some(&Value::Bool(true)) {
                    "connected"
                } else {
                    "NOT connected"
                },
                f.get("received").and_then(Value::as_u64).unwrap_or(0)
            ),
            _ => "not configured (this host only)".to_string(),
        }
    ));
    if !status["recording"].is_object() {
        out.push_str("recording:    off\n");
    }
    out
}

/// The answer of `POST /v1/fleet/estop` (or its clear): the command,
/// whether every live host confirmed it, and each host's state.
pub fn fleet_stop(v: &Value) -> String {
    let text = |k: &str| v[k].as_str().unwrap_or("?").to_string();
    let mut out = format!(
        "fleet stop:   {} in environment {} ({})\nconfirmed:    {}\n",
        if v["stop"] == true { "SENT" } else { "CLEARED" },
        text("environment_id"),
        v["reason"].as_str().unwrap_or("no reason given"),
        if v["confirmed"] == true {
            "yes, by every live host"
        } else {
            "NO: not every live host reported it in time"
        },
    );
    if let Some(why) = v["body_error"].as_str() {
        out.push_str(&format!("body ignored: {why}\n"));
    }
    if let Some(why) = v["unconfirmed"].as_str() {
        out.push_str(&format!("not seen:     {why}\n"));
    }
    for h in v["hosts"].as_array().into_iter().flatten() {
        let stop = match (h["estop_active"].as_bool(), h["estop_source"].as_str()) {
            (Some(true), Some(source)) => format!("stopped ({source})"),
            (Some(true), None) => "stopped".to_string(),
            (Some(false), _) => "not stopped".to_string(),
            _ => "?".to_string(),
        };
        out.push_str(&format!(
            "  {:<24} {:<8} {stop}\n",
            h["id"].as_str().unwrap_or("?"),
            h["status"].as_str().unwrap_or("?"),
        ));
    }
    out
}

/// The answer of `/v1/hosts` as a table.
pub fn hosts(v: &Value) -> String {
    let text = |h: &Value, k: &str| h.get(k).and_then(Value::as_str).unwrap_or("-").to_string();
    let fleet = &v["fleet"];
    let mut out = if fleet["configured"].as_bool() == Some(true) {
        let view = match (fleet["view"].as_str(), fleet["environment_id"].as_str()) {
            (Some("environment"), Some(env)) => format!(
                "; view: environment {env} (a host of another environment is listed by a host \
                 of it, or one with view = \"fleet\", and reached by id from here)"
            ),
            (Some("fleet"), _) => "; view: every environment".to_string(),
            _ => String::new(),
        };
        format!(
            "fleet: {} ({}){view}\n",
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
