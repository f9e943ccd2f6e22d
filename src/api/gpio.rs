//! `GET /v1/gpio` and `POST /v1/gpio/{pin}`: the simulated GPIO backend's
//! pins, which an operator may drive to rehearse a stop button or a limit
//! switch without a Raspberry Pi (`rozd gpio set PIN 0|1`). Only the sim
//! backend: on real pins the world sets the levels, never rozd (`409`).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};

use super::reply::{json_body, json_error};
use crate::HostContext;
use crate::hw::gpio::SimGpio;

pub(super) fn routes() -> Router<Arc<HostContext>> {
    Router::new()
        .route("/v1/gpio", get(list))
        .route("/v1/gpio/{pin}", post(set))
}

fn sim(ctx: &HostContext) -> Option<&SimGpio> {
    ctx.ooda.sim_gpio().map(|chip| &**chip)
}

/// The answer on real GPIO.
fn not_sim(ctx: &HostContext) -> Response {
    json_error(
        StatusCode::CONFLICT,
        "failed_precondition",
        &format!(
            "the GPIO backend is {:?}: its pins are set by the hardware, not over the API \
             (only the sim backend's can be, to rehearse)",
            ctx.ooda.gpio().name()
        ),
    )
    .into_response()
}

/// The sim backend's pins in use, each `pin`, `level` (electrical: 1 high,
/// 0 low) and `output` (an actuator drives it).
async fn list(State(ctx): State<Arc<HostContext>>) -> Response {
    match sim(&ctx) {
        Some(gpio) => {
            let data: Vec<Value> = gpio
                .pins()
                .into_iter()
                .map(|(pin, high, output)| json!({"pin": pin, "level": u8::from(high), "output": output}))
                .collect();
            Json(json!({ "backend": "sim", "data": data })).into_response()
        }
        None => not_sim(&ctx),
    }
}

/// The body of `POST /v1/gpio/{pin}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LevelBody {
    level: u64,
}

/// `{"level": 0|1}`: drives input `pin` to that electrical level, as a
/// button or switch wired to it would.
async fn set(
    State(ctx): State<Arc<HostContext>>,
    Path(pin): Path<String>,
    body: Bytes,
) -> Response {
    let invalid = |message: &str| {
        json_error(StatusCode::BAD_REQUEST, "invalid_argument", message).into_response()
    };
    let Ok(pin) = pin.parse::<u8>() else {
        return invalid(&format!("pin {pin:?} is not a GPIO number (0-255)"));
    };
    let high = match json_body::<LevelBody>(&body) {
        Ok(LevelBody { level: 0 }) => false,
        Ok(LevelBody { level: 1 }) => true,
        Ok(_) => return invalid("the body must be {\"level\": 0} or {\"level\": 1}"),
        Err(why) => {
            return invalid(&format!(
                "{why} (the body is {{\"level\": 0}} or {{\"level\": 1}})"
            ));
        }
    };
    let Some(gpio) = sim(&ctx) else {
        return not_sim(&ctx);
    };
    match gpio.set_input(pin, high) {
        Ok(()) => {
            tracing::info!(
                pin,
                level = u8::from(high),
                "simulated GPIO input set over the API"
            );
            Json(json!({"pin": pin, "level": u8::from(high)})).into_response()
        }
        Err(e) => {
            json_error(StatusCode::CONFLICT, "failed_precondition", &e.to_string()).into_response()
        }
    }
}
