//! `rozd estop`: triggers the protective stop of a running daemon (`POST
//! /v1/estop`), or clears it (`POST /v1/estop/clear`), through its control
//! socket when it can, else over TCP. Its exit statuses: [`exit`] (`rozd estop
//! --help` lists them).

use std::path::Path;

use super::connect::ESTOP_TIMEOUT;
use super::{client, error_chain, format};

/// Exit statuses of `rozd estop`.
pub mod exit {
    /// Triggered: the stop is latched; cleared: it is not latched.
    pub const OK: u8 = 0;
    /// Cannot connect, no reply in time, or a reply that is not understood.
    pub const NO_ANSWER: u8 = 1;
    /// The daemon refused the request (e.g. a missing or wrong token).
    pub const REFUSED: u8 = 3;
    /// `--clear` refused: a stop input still asserts the stop.
    pub const STILL_ASSERTED: u8 = 4;
    /// `--fleet`: the command went out, but not every live host of the
    /// environment reported it in time (the answer lists them).
    pub const UNCONFIRMED: u8 = 5;
}

/// `rozd estop --fleet`: the fleet-wide stop (`POST /v1/fleet/estop`) or
/// its clear (`POST /v1/fleet/estop/clear`, admin) of `environment`
/// (default: the daemon's), over TCP with the token (the fleet turns
/// authentication on); prints each host's state.
pub fn fleet_estop(
    addr: &str,
    token: Option<&str>,
    environment: Option<&str>,
    reason: Option<&str>,
    clear: bool,
    raw: bool,
) -> u8 {
    let (path, what) = if clear {
        ("/v1/fleet/estop/clear", "the fleet stop was NOT cleared")
    } else {
        ("/v1/fleet/estop", "the fleet stop was NOT sent")
    };
    let mut body = serde_json::Map::new();
    if let Some(env) = environment {
        body.insert("environment_id".into(), env.into());
    }
    if let Some(r) = reason {
        body.insert("reason".into(), r.into());
    }
    let body = serde_json::Value::Object(body);
    let mut notes = Vec::new();
    // The daemon waits up to 5 s for the hosts; this waits a little longer.
    let within = ESTOP_TIMEOUT + std::time::Duration::from_secs(5);
    let result = match super::runtime() {
        Ok(rt) => rt
            .block_on(async {
                tokio::time::timeout(
                    within,
                    client::send_local(
                        None,
                        addr,
                        http::Method::POST,
                        path,
                        token,
                        Some(&body),
                        &mut notes,
                    ),
                )
                .await
            })
            .map_err(|_| format!("no answer from {addr} within {}s", within.as_secs()))
            .and_then(|sent| sent.map_err(|e| error_chain(&e))),
        Err(e) => Err(error_chain(&e)),
    };
    for note in notes {
        eprintln!("rozd estop: {note}");
    }
    let (reply, via) = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("rozd estop: {e}\nrozd estop: {what}");
            return exit::NO_ANSWER;
        }
    };
    let v = serde_json::from_str::<serde_json::Value>(&reply.body).ok();
    if !reply.status.is_success() {
        let message = v
            .as_ref()
            .and_then(|v| v.pointer("/error/message").and_then(|m| m.as_str()))
            .map_or_else(|| reply.body.trim().to_string(), str::to_string);
        eprintln!(
            "rozd estop: {via} answered {}: {message}\nrozd estop: {what}",
            reply.status
        );
        return exit::REFUSED;
    }
    let Some(v) = v else {
        eprintln!(
            "rozd estop: {via} answered something that is not JSON: {}",
            reply.body
        );
        return exit::NO_ANSWER;
    };
    if raw {
        println!("{}", reply.body.trim());
    } else {
        print!("{}", format::fleet_stop(&v));
    }
    if v["stop"] != serde_json::Value::Bool(!clear) {
        eprintln!("rozd estop: unexpected answer: {}", reply.body.trim());
        return exit::NO_ANSWER;
    }
    if v["confirmed"] == true {
        exit::OK
    } else {
        eprintln!("rozd estop: not every live host of the environment confirmed it in time");
        exit::UNCONFIRMED
    }
}

/// Triggers the stop (or clears it, `clear`) and prints the resulting
/// state; returns the exit status.
pub fn estop(
    addr: &str,
    socket: Option<&Path>,
    token: Option<&str>,
    reason: Option<&str>,
    clear: bool,
    raw: bool,
) -> u8 {
    let (path, what) = if clear {
        ("/v1/estop/clear", "the protective stop was NOT cleared")
    } else {
        ("/v1/estop", "the protective stop was NOT triggered")
    };
    let body = match reason {
        Some(r) => serde_json::json!({ "reason": r }),
        None => serde_json::json!({}),
    };
    let target = match socket {
        Some(socket) => format!("{} or {addr}", socket.display()),
        None => addr.to_string(),
    };
    let mut notes = Vec::new();
    let result = match super::runtime() {
        Ok(rt) => rt
            .block_on(async {
                tokio::time::timeout(
                    ESTOP_TIMEOUT,
                    client::send_local(
                        socket,
                        addr,
                        http::Method::POST,
                        path,
                        token,
                        Some(&body),
                        &mut notes,
                    ),
                )
                .await
            })
            .map_err(|_| {
                format!(
                    "no answer from {target} within {}s; check the state with `rozd status`",
                    ESTOP_TIMEOUT.as_secs()
                )
            })
            .and_then(|sent| sent.map_err(|e| error_chain(&e))),
        Err(e) => Err(error_chain(&e)),
    };
    for note in notes {
        eprintln!("rozd estop: {note}");
    }
    let (reply, via) = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("rozd estop: {e}\nrozd estop: {what}");
            return exit::NO_ANSWER;
        }
    };
    if !reply.status.is_success() {
        let message = serde_json::from_str::<serde_json::Value>(&reply.body)
            .ok()
            .and_then(|v| {
                v.pointer("/error/message")
                    .and_then(|m| m.as_str())
                    .map(str::to_string)
            })
            .unwrap_or_else(|| reply.body.trim().to_string());
        eprintln!(
            "rozd estop: {via} answered {}: {message}\nrozd estop: {what}",
            reply.status
        );
        return if reply.status == http::StatusCode::CONFLICT {
            exit::STILL_ASSERTED
        } else {
            exit::REFUSED
        };
    }
    let v = match serde_json::from_str::<serde_json::Value>(&reply.body) {
        Ok(v) => v,
        Err(e) => {
            eprintln!(
                "rozd estop: {via} answered something that is not JSON ({e}): {}",
                reply.body
            );
            return exit::NO_ANSWER;
        }
    };
    if raw {
        println!("{}", reply.body.trim());
    } else {
        print!("{}", format::safety(&v, clear));
    }
    let active = v.get("estop_active").and_then(serde_json::Value::as_bool);
    match (clear, active) {
        (false, Some(true)) | (true, Some(false)) => exit::OK,
        _ => {
            eprintln!(
                "rozd estop: unexpected state in the answer: {}",
                reply.body.trim()
            );
            exit::NO_ANSWER
        }
    }
}
