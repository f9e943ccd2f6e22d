//! `rozd gpio list|set PIN 0|1`: the simulated GPIO backend's pins of a
//! running daemon (`GET /v1/gpio`, `POST /v1/gpio/{pin}`), through its
//! control socket when it can, else over TCP: to rehearse a stop button or
//! a limit switch without a Raspberry Pi. A daemon on real GPIO refuses.

use std::path::Path;

use super::connect::ESTOP_TIMEOUT;
use super::{client, error_chain};

/// Exit statuses of `rozd gpio`.
pub mod exit {
    /// Listed / set.
    pub const OK: u8 = 0;
    /// Cannot connect, no reply in time, or a reply that is not understood.
    pub const NO_ANSWER: u8 = 1;
    /// The daemon refused: not the sim backend, an output pin, a missing or
    /// wrong token.
    pub const REFUSED: u8 = 3;
}

/// Lists the pins (`set`: `None`) or drives input `pin` to `level`.
pub fn gpio(
    addr: &str,
    socket: Option<&Path>,
    token: Option<&str>,
    set: Option<(u8, u8)>,
    raw: bool,
) -> u8 {
    let (method, path, body) = match set {
        Some((pin, level)) => (
            http::Method::POST,
            format!("/v1/gpio/{pin}"),
            Some(serde_json::json!({ "level": level })),
        ),
        None => (http::Method::GET, "/v1/gpio".to_string(), None),
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
                        method,
                        &path,
                        token,
                        body.as_ref(),
                        &mut notes,
                    ),
                )
                .await
            })
            .map_err(|_| format!("no answer within {}s", ESTOP_TIMEOUT.as_secs()))
            .and_then(|sent| sent.map_err(|e| error_chain(&e))),
        Err(e) => Err(error_chain(&e)),
    };
    for note in notes {
        eprintln!("rozd gpio: {note}");
    }
    let (reply, via) = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("rozd gpio: {e}");
            return exit::NO_ANSWER;
        }
    };
    let v: serde_json::Value = match serde_json::from_str(&reply.body) {
        Ok(v) => v,
        Err(e) => {
            eprintln!(
                "rozd gpio: {via} answered something that is not JSON ({e}): {}",
                reply.body
            );
            return exit::NO_ANSWER;
        }
    };
    if !reply.status.is_success() {
        let message = v
            .pointer("/error/message")
            .and_then(|m| m.as_str())
            .unwrap_or(reply.body.trim());
        eprintln!("rozd gpio: {via} answered {}: {message}", reply.status);
        return exit::REFUSED;
    }
    if raw {
        println!("{}", reply.body.trim());
        return exit::OK;
    }
    match set {
        Some((pin, level)) => {
            println!(
                "GPIO {pin} set {} ({level})",
                if level == 1 { "high" } else { "low" }
            );
        }
        None => {
            let pins = v["data"].as_array().cloned().unwrap_or_default();
            if pins.is_empty() {
                println!("no GPIO pins in use (sim backend)");
            }
            for p in pins {
                println!(
                    "GPIO {}: {}, {}",
                    p["pin"],
                    if p["level"] == 1 {
                        "high (1)"
                    } else {
                        "low (0)"
                    },
                    if p["output"] == true {
                        "output (an actuator drives it)"
                    } else {
                        "input"
                    }
                );
            }
        }
    }
    exit::OK
}
