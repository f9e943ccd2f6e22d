//! `rozd status` and `rozd hosts`: one `GET` each, printed as JSON
//! (`--json`) or readably ([`super::format`]).

use std::path::Path;

use super::{client, error_chain, format};

/// `rozd status`: `GET /v1/status`, over the control socket `socket` first,
/// and for people also `GET /v1/observation`: every sensor's value, health
/// and alarm and every actuator's state beside the daemon's.
pub fn status(addr: &str, socket: Option<&Path>, token: Option<&str>, raw: bool) -> u8 {
    if raw {
        return show_json(
            "status",
            addr,
            socket,
            "/v1/status",
            token,
            raw,
            format::status,
        );
    }
    const FAILURE: u8 = 1;
    let rt = match super::runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rozd status: {}", error_chain(&e));
            return FAILURE;
        }
    };
    let mut notes = Vec::new();
    let mut get = |path: &str| {
        rt.block_on(client::send_local(
            socket,
            addr,
            http::Method::GET,
            path,
            token,
            None,
            &mut notes,
        ))
        .map_err(|e| error_chain(&e))
        .and_then(|(reply, via)| {
            if !reply.status.is_success() {
                return Err(format!(
                    "{via} answered {}: {}",
                    reply.status,
                    reply.body.trim()
                ));
            }
            serde_json::from_str::<serde_json::Value>(&reply.body).map_err(|e| {
                format!(
                    "{via} answered something that is not JSON ({e}): {}",
                    reply.body
                )
            })
        })
    };
    let status = get("/v1/status");
    let observation = status.as_ref().ok().map(|_| get("/v1/observation"));
    for note in notes {
        eprintln!("rozd status: {note}");
    }
    let status = match status {
        Ok(v) => v,
        Err(e) => {
            eprintln!("rozd status: {e}");
            return FAILURE;
        }
    };
    print!("{}", format::status(&status));
    match observation {
        Some(Ok(observation)) => print!("{}", format::health(&status, &observation)),
        Some(Err(e)) => eprintln!("rozd status: no sensors and actuators shown: {e}"),
        None => {}
    }
    0
}

/// `rozd manual`: `GET /v1/embodiment`, the text a session starting now
/// is told (the embodiment, then the operator's manual) and its version.
pub fn manual(addr: &str, socket: Option<&Path>, token: Option<&str>, raw: bool) -> u8 {
    show_json(
        "manual",
        addr,
        socket,
        "/v1/embodiment",
        token,
        raw,
        briefing_text,
    )
}

fn briefing_text(v: &serde_json::Value) -> String {
    let text = v["briefing"].as_str().unwrap_or_default();
    let version = v["version"].as_str().unwrap_or("?");
    let source = v["manual"]["path"].as_str().map_or_else(
        || "no operator's manual".to_string(),
        |p| format!("manual {p}"),
    );
    let omitted = v["embodiment"]["sensors_omitted"].as_u64().unwrap_or(0);
    let tokens = v["embodiment"]["tokens"].as_u64().unwrap_or(0);
    let mut out = format!(
        "{}
",
        text.trim_end()
    );
    out.push_str(&format!(
        "\n-- version {version}; {source}; embodiment ~{tokens} tokens"
    ));
    if omitted > 0 {
        out.push_str(&format!(", {omitted} sensors summarised"));
    }
    out.push('\n');
    out
}

/// `rozd hosts`: `GET /v1/hosts`, all of them (or those of `environment`).
pub fn hosts(addr: &str, token: Option<&str>, environment: Option<&str>, raw: bool) -> u8 {
    let mut path = format!("/v1/hosts?limit={}", crate::api::MAX_HOSTS_LIMIT);
    if let Some(env) = environment {
        path.push_str("&environment_id=");
        path.push_str(&super::client::url_part(env));
    }
    show_json("hosts", addr, None, &path, token, raw, format::hosts)
}

/// `GET path` on the daemon (over `socket` first, if any), printed raw
/// (`--json`) or by `format`; exit status 1 when there is no answer, an
/// error, or no JSON.
fn show_json(
    command: &str,
    addr: &str,
    socket: Option<&Path>,
    path: &str,
    token: Option<&str>,
    raw: bool,
    format: fn(&serde_json::Value) -> String,
) -> u8 {
    const FAILURE: u8 = 1;
    let mut notes = Vec::new();
    let result = match super::runtime() {
        Ok(rt) => rt
            .block_on(client::send_local(
                socket,
                addr,
                http::Method::GET,
                path,
                token,
                None,
                &mut notes,
            ))
            .map_err(|e| error_chain(&e)),
        Err(e) => Err(error_chain(&e)),
    };
    for note in notes {
        eprintln!("rozd {command}: {note}");
    }
    let (reply, via) = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("rozd {command}: {e}");
            return FAILURE;
        }
    };
    if !reply.status.is_success() {
        eprintln!(
            "rozd {command}: {via} answered {}: {}",
            reply.status,
            reply.body.trim()
        );
        return FAILURE;
    }
    if raw {
        println!("{}", reply.body.trim());
        return 0;
    }
    match serde_json::from_str::<serde_json::Value>(&reply.body) {
        Ok(v) => {
            print!("{}", format(&v));
            0
        }
        Err(e) => {
            eprintln!(
                "rozd {command}: {via} answered something that is not JSON ({e}): {}",
                reply.body
            );
            FAILURE
        }
    }
}
