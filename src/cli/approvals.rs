//! `rozd approvals [list | approve ID | deny ID]`: the calls waiting for an
//! operator's approval on a running daemon (`GET /v1/approvals`) — MCP,
//! gRPC session (e.g. the published roz CLI's, which never answers itself)
//! and task calls alike — and the answer to one (`POST /v1/approvals/{id}`
//! `{"approve": true|false}`), over TCP with the token; the first answer
//! wins and the audit names who gave it.

use super::connect::ESTOP_TIMEOUT;
use super::{client, error_chain};
use serde_json::Value;

/// Exit statuses of `rozd approvals`.
pub mod exit {
    /// Listed / answered.
    pub const OK: u8 = 0;
    /// Cannot connect, no reply in time, or a reply that is not understood.
    pub const NO_ANSWER: u8 = 1;
    /// The daemon refused: a missing or wrong token, a credential that may
    /// not approve its own call.
    pub const REFUSED: u8 = 3;
    /// No call with that id is waiting (answered already, or timed out).
    pub const NOT_WAITING: u8 = 4;
}

/// `answer`: `None` lists; `Some((id, approve))` answers call `id`.
pub fn approvals(addr: &str, token: Option<&str>, answer: Option<(&str, bool)>, raw: bool) -> u8 {
    let (method, path, body) = match answer {
        Some((id, approve)) => (
            http::Method::POST,
            format!("/v1/approvals/{}", percent_encode(id)),
            Some(serde_json::json!({ "approve": approve })),
        ),
        None => (http::Method::GET, "/v1/approvals".to_string(), None),
    };
    let mut notes = Vec::new();
    let result = match super::runtime() {
        Ok(rt) => rt
            .block_on(async {
                tokio::time::timeout(
                    ESTOP_TIMEOUT,
                    client::send_local(None, addr, method, &path, token, body.as_ref(), &mut notes),
                )
                .await
            })
            .map_err(|_| format!("no answer from {addr} within {}s", ESTOP_TIMEOUT.as_secs()))
            .and_then(|sent| sent.map_err(|e| error_chain(&e))),
        Err(e) => Err(error_chain(&e)),
    };
    for note in notes {
        eprintln!("rozd approvals: {note}");
    }
    let (reply, via) = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("rozd approvals: {e}");
            return exit::NO_ANSWER;
        }
    };
    let v: Value = match serde_json::from_str(&reply.body) {
        Ok(v) => v,
        Err(e) => {
            eprintln!(
                "rozd approvals: {via} answered something that is not JSON ({e}): {}",
                reply.body
            );
            return exit::NO_ANSWER;
        }
    };
    if !reply.status.is_success() {
        let message = v
            .pointer("/error/message")
            .and_then(Value::as_str)
            .map_or_else(|| reply.body.trim().to_string(), str::to_string);
        eprintln!("rozd approvals: {via} answered {}: {message}", reply.status);
        return if reply.status == http::StatusCode::NOT_FOUND {
            exit::NOT_WAITING
        } else {
            exit::REFUSED
        };
    }
    if raw {
        println!("{}", reply.body.trim());
    } else if answer.is_some() {
        println!("{}", answered(&v));
    } else {
        print!("{}", listed(&v));
    }
    exit::OK
}

/// An id as one path segment (ids may hold `:`; anything but unreserved
/// characters is escaped).
fn percent_encode(id: &str) -> String {
    id.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b':' => {
                (b as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// The waiting calls, one a line: the id to answer, the tool and its
/// parameters, who asks.
pub fn listed(v: &Value) -> String {
    let calls = v["data"].as_array().cloned().unwrap_or_default();
    if calls.is_empty() {
        return "no calls waiting for approval\n".to_string();
    }
    let mut out = String::new();
    for c in &calls {
        out.push_str(&format!(
            "{}  {} {}  asked by {}\n",
            c["id"].as_str().unwrap_or("?"),
            c["tool"].as_str().unwrap_or("?"),
            c["parameters"],
            c["origin"].as_str().unwrap_or("?"),
        ));
    }
    out.push_str("answer with: rozd approvals approve ID, or rozd approvals deny ID\n");
    out
}

/// The answer of `POST /v1/approvals/{id}`, in words.
pub fn answered(v: &Value) -> String {
    let call = &v["call"];
    format!(
        "{} {} {} (call {}, asked by {})",
        if v["approved"] == true {
            "approved"
        } else {
            "denied"
        },
        call["tool"].as_str().unwrap_or("?"),
        call["parameters"],
        call["id"].as_str().unwrap_or("?"),
        call["origin"].as_str().unwrap_or("?"),
    )
}
