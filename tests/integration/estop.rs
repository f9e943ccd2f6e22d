//! The protective stop from each of its sources — REST, the gRPC
//! `SafetyService`, the `rozd estop` binary, the GPIO stop input (sim
//! backend) and the MQTT stop topic (a real mosquitto) — against a running
//! daemon: each latches the stop, drives a held actuator to its safe value
//! and refuses new commands; clearing needs an authenticated request, moves
//! nothing, and lets commands work again.

use crate::common;
use crate::hw_support;

use std::sync::Arc;

use common::broker::{Broker, publish};
use common::{EXPECT_WITHIN, TestDaemon, rest_get, rest_post, rozd_cli};
use rozd::api::proto;
use rozd::api::proto::safety_service_client::SafetyServiceClient;
use rozd::ooda::act::{ActError, Origin};
use rozd::ooda::{Observation, Ooda};
use serde_json::{Value, json};
use tonic::Code;

const TOKEN: &str = "estop-test-token";

/// A robot with a held actuator, a brake, a sensor in critical alarm and a
/// simulated GPIO chip; `extra` adds to it.
fn robot_toml(extra: &str) -> String {
    format!(
        r#"
[host]
environment_id = "lab"

[gpio]
backend = "sim"

[[sensors]]
name = "distance"
source = "sim"
signal = "constant"
offset = 0.2
rate_hz = 50
critical_min = 0.3

[[actuators]]
name = "speed"
kind = "sim"
min = -1.0
max = 1.0
safe_value = 0.0

[[actuators]]
name = "brake"
kind = "sim"
allowed = [0, 1]
safe_value = 1

{extra}
"#
    )
}

async fn robot(extra: &str) -> TestDaemon {
    TestDaemon::setup(&robot_toml(extra))
        .paused_clock()
        .start()
        .await
}

/// With the auth token [`TOKEN`] (as `server.auth_tokens` gives it) and
/// `safety` in `[safety]`.
async fn robot_with_token(safety: &str) -> TestDaemon {
    TestDaemon::setup(&robot_toml(&format!("[safety]\n{safety}\n")))
        .paused_clock()
        .token(TOKEN)
        .start()
        .await
}

async fn until(ooda: &Ooda, what: &str, pred: impl Fn(&Observation) -> bool) -> Arc<Observation> {
    common::observed(ooda, EXPECT_WITHIN, what, pred).await
}

fn operator() -> Origin {
    Origin::Operator("estop-test".into())
}

/// Commands `speed` to 0.5 (held: no hold_ms) and checks the driver got it.
async fn hold_speed(daemon: &TestDaemon) {
    let ooda = daemon.host.ooda();
    ooda.actuators()
        .command("speed", 0.5, operator(), None)
        .await
        .expect("speed accepted");
    assert_eq!(
        daemon.host.sim_actuator("speed").unwrap().value(),
        Some(0.5)
    );
}

/// The stop is latched from `source`: speed is back at its safe value (the
/// driver was told so, and the next Observation shows it), and commands are
/// refused with `EStop`.
async fn assert_stopped(daemon: &TestDaemon, source: &str) {
    let ooda = daemon.host.ooda();
    let obs = until(ooda, "the stop in an Observation with speed safe", |o| {
        o.protective_stop.is_some()
            && o.actuators
                .iter()
                .any(|a| a.name == "speed" && a.at_safe_value)
    })
    .await;
    assert_eq!(obs.protective_stop.as_ref().unwrap().source, source);
    let speed = daemon.host.sim_actuator("speed").unwrap();
    assert_eq!(speed.value(), Some(0.0), "the held actuator went safe");
    assert_eq!(speed.history().last(), Some(&0.0), "{:?}", speed.history());
    let refused = ooda
        .actuators()
        .command("speed", 0.3, operator(), None)
        .await
        .expect_err("commands are refused while stopped");
    assert!(matches!(refused, ActError::EStop { .. }), "{refused}");
    assert_eq!(speed.value(), Some(0.0));
}

/// Runs `clear`, checks it moved nothing, and that commands work again.
async fn assert_clear_moves_nothing<F: std::future::Future<Output = ()>>(
    daemon: &TestDaemon,
    clear: F,
) {
    let ooda = daemon.host.ooda();
    let speed = daemon.host.sim_actuator("speed").unwrap();
    let brake = daemon.host.sim_actuator("brake").unwrap();
    let before = (speed.history(), brake.history());
    clear.await;
    assert!(ooda.protective_stop().active().is_none(), "cleared");
    until(ooda, "an Observation without the stop", |o| {
        o.protective_stop.is_none()
    })
    .await;
    assert_eq!(
        (speed.history(), brake.history()),
        before,
        "clearing moves nothing"
    );
    ooda.actuators()
        .command("speed", 0.25, operator(), None)
        .await
        .expect("commands work again after clearing");
    assert_eq!(speed.value(), Some(0.25));
}

// ------------------------------------------------------------------ REST

fn http() -> reqwest::Client {
    // reqwest is built without a default TLS provider (plain HTTP here anyway).
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(EXPECT_WITHIN)
        .build()
        .unwrap()
}

async fn json(response: reqwest::Response) -> (u16, serde_json::Value) {
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    let value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (status, value)
}

#[tokio::test]
async fn rest_estop_latches_and_clearing_needs_a_token_and_moves_nothing() {
    let daemon = robot_with_token("").await;
    hold_speed(&daemon).await;
    let url = daemon.url();
    let client = http();

    // Unauthenticated: refused, nothing happens.
    let (status, body) = json(client.post(format!("{url}/v1/estop")).send().await.unwrap()).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["error"]["code"], "unauthenticated");
    assert!(daemon.host.ooda().protective_stop().active().is_none());

    assert_eq!(
        daemon.host.sim_actuator("speed").unwrap().value(),
        Some(0.5)
    );

    let (status, body) = json(
        client
            .post(format!("{url}/v1/estop"))
            .bearer_auth(TOKEN)
            .json(&serde_json::json!({ "reason": "person in the cell" }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["estop_active"], true);
    assert_eq!(body["triggered"], true);
    assert_eq!(body["level"], "protective_stop");
    assert_eq!(body["environment_id"], "lab");
    assert_eq!(body["stop"]["source"], "rest");
    assert_eq!(body["stop"]["reason"], "person in the cell");
    // The answer comes after the actuators were driven: no tick needed.
    assert_eq!(
        daemon.host.sim_actuator("speed").unwrap().value(),
        Some(0.0)
    );
    assert_stopped(&daemon, "rest").await;

    // A second stop (no body) keeps the first cause.
    let (status, body) = json(
        client
            .post(format!("{url}/v1/estop"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["triggered"], false);
    assert_eq!(body["stop"]["reason"], "person in the cell");

    let (status, body) = json(
        client
            .get(format!("{url}/v1/safety"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["estop_active"], true);
    let guards = body["active_guards"].as_array().unwrap();
    assert!(
        guards.contains(&"protective_stop:rest".into()),
        "{guards:?}"
    );
    assert!(
        guards.contains(&"critical_alarm:distance".into()),
        "{guards:?}"
    );

    // Clearing without a token: 401, still latched.
    let (status, body) = json(
        client
            .post(format!("{url}/v1/estop/clear"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 401, "{body}");
    let (status, _) = json(
        client
            .post(format!("{url}/v1/estop/clear"))
            .bearer_auth("wrong-token")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 401);
    assert!(daemon.host.ooda().protective_stop().active().is_some());

    assert_clear_moves_nothing(&daemon, async {
        let (status, body) = json(
            client
                .post(format!("{url}/v1/estop/clear"))
                .bearer_auth(TOKEN)
                .json(&serde_json::json!({ "reason": "cell checked" }))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["cleared"], true);
        assert_eq!(body["estop_active"], false);
        assert_eq!(body["level"], "normal");
        assert!(body["stop"].is_null());
    })
    .await;

    // Clearing again: nothing to clear.
    let (status, body) = json(
        client
            .post(format!("{url}/v1/estop/clear"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((status, &body["cleared"]), (200, &false.into()), "{body}");

    // Wrong methods are JSON 405s.
    let (status, body) = json(
        client
            .get(format!("{url}/v1/estop"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 405, "{body}");
    daemon.shutdown().await;
}

// ------------------------------------------------------------------ gRPC

/// Adds `authorization: Bearer <token>` when it has a token.
#[derive(Clone)]
struct Bearer(Option<&'static str>);

impl tonic::service::Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(token) = self.0 {
            request
                .metadata_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
        }
        Ok(request)
    }
}

type Authed = tonic::service::interceptor::InterceptedService<tonic::transport::Channel, Bearer>;

async fn safety_client(
    daemon: &TestDaemon,
    token: Option<&'static str>,
) -> SafetyServiceClient<Authed> {
    SafetyServiceClient::with_interceptor(daemon.channel().await, Bearer(token))
}

async fn grpc_status(client: &mut SafetyServiceClient<Authed>) -> proto::SafetyStatus {
    client
        .get_safety_status(proto::GetSafetyStatusRequest {
            environment_id: String::new(),
        })
        .await
        .expect("GetSafetyStatus")
        .into_inner()
}

#[tokio::test]
async fn grpc_safety_service_triggers_reports_and_clears() {
    let daemon = robot_with_token("").await;
    let mut client = safety_client(&daemon, Some(TOKEN)).await;
    let mut anonymous = safety_client(&daemon, None).await;

    let status = grpc_status(&mut client).await;
    assert_eq!(status.environment_id, "lab");
    assert!(!status.estop_active);
    assert_eq!(status.level, "normal");
    until(daemon.host.ooda(), "the distance alarm", |o| {
        o.sensor("distance")
            .is_some_and(|s| s.alarm == rozd::ooda::orient::AlarmLevel::Critical)
    })
    .await;
    let status = grpc_status(&mut client).await;
    assert_eq!(status.active_guards, ["critical_alarm:distance"]);

    hold_speed(&daemon).await;
    // Without a token, and for another environment: refused, nothing happens.
    let err = anonymous
        .trigger_estop(proto::TriggerEstopRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    let err = client
        .trigger_estop(proto::TriggerEstopRequest {
            environment_id: "elsewhere".into(),
            reason: "wrong cell".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    let err = client
        .get_safety_status(proto::GetSafetyStatusRequest {
            environment_id: "elsewhere".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert!(daemon.host.ooda().protective_stop().active().is_none());

    client
        .trigger_estop(proto::TriggerEstopRequest {
            environment_id: "lab".into(),
            reason: "gRPC stop".into(),
        })
        .await
        .expect("TriggerEstop");
    assert_stopped(&daemon, "grpc").await;
    assert_eq!(
        daemon
            .host
            .ooda()
            .protective_stop()
            .active()
            .unwrap()
            .reason,
        "gRPC stop"
    );
    let status = grpc_status(&mut client).await;
    assert!(status.estop_active);
    assert_eq!(status.level, "protective_stop");
    assert_eq!(
        status.active_guards,
        ["protective_stop:grpc", "critical_alarm:distance"]
    );

    let err = anonymous
        .clear_estop(proto::ClearEstopRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    assert!(daemon.host.ooda().protective_stop().active().is_some());

    assert_clear_moves_nothing(&daemon, async {
        client
            .clear_estop(proto::ClearEstopRequest {
                environment_id: String::new(),
                reason: "checked".into(),
            })
            .await
            .expect("ClearEstop");
    })
    .await;
    let status = grpc_status(&mut client).await;
    assert!(!status.estop_active);
    assert_eq!(status.level, "normal");
    // Clearing what is not latched is fine.
    client
        .clear_estop(proto::ClearEstopRequest::default())
        .await
        .expect("ClearEstop when clear");
    daemon.shutdown().await;
}

#[tokio::test]
async fn safety_service_is_in_health_and_reflection() {
    use tonic_health::pb::{
        HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
    };
    use tonic_reflection::pb::{v1, v1alpha};
    let daemon = robot("").await;
    let reply = HealthClient::new(daemon.channel().await)
        .check(HealthCheckRequest {
            service: "roz.v1.SafetyService".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.status(), ServingStatus::Serving);

    let mut client =
        v1::server_reflection_client::ServerReflectionClient::new(daemon.channel().await);
    let request = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(
            String::new(),
        )),
    };
    let reply = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner()
        .message()
        .await
        .unwrap()
        .expect("one reply");
    let Some(v1::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        reply.message_response
    else {
        panic!("expected a service list");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    assert!(
        names.contains(&"roz.v1.SafetyService".to_string()),
        "{names:?}"
    );

    let mut client =
        v1alpha::server_reflection_client::ServerReflectionClient::new(daemon.channel().await);
    let request = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            v1alpha::server_reflection_request::MessageRequest::FileContainingSymbol(
                "roz.v1.SafetyService".into(),
            ),
        ),
    };
    let reply = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner()
        .message()
        .await
        .unwrap()
        .expect("one reply");
    let Some(v1alpha::server_reflection_response::MessageResponse::FileDescriptorResponse(files)) =
        reply.message_response
    else {
        panic!(
            "expected file descriptors, got {:?}",
            reply.message_response
        );
    };
    use prost::Message as _;
    let names: Vec<String> = files
        .file_descriptor_proto
        .iter()
        .map(|f| {
            prost_types::FileDescriptorProto::decode(f.as_slice())
                .unwrap()
                .name()
                .to_string()
        })
        .collect();
    assert!(
        names.contains(&"roz/v1/safety.proto".to_string()),
        "{names:?}"
    );
    daemon.shutdown().await;
}

// ------------------------------------------------------------------ CLI

#[tokio::test]
async fn cli_estop_and_clear_against_a_running_daemon() {
    let daemon = robot_with_token("").await;
    let addr = daemon.addr.to_string();
    hold_speed(&daemon).await;

    // No token: exit 3, nothing happens.
    let (code, _, stderr) = rozd_cli(&["estop", "--addr", &addr]).await;
    assert_eq!(code, Some(3), "{stderr}");
    assert!(stderr.contains("NOT triggered"), "{stderr}");
    assert!(daemon.host.ooda().protective_stop().active().is_none());

    let (code, stdout, stderr) = rozd_cli(&[
        "estop",
        "--addr",
        &addr,
        "--token",
        TOKEN,
        "--reason",
        "arm left its envelope",
    ])
    .await;
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("protective stop: ACTIVE"), "{stdout}");
    assert!(stdout.contains("source:  cli"), "{stdout}");
    assert!(stdout.contains("arm left its envelope"), "{stdout}");
    assert_stopped(&daemon, "cli").await;

    // `rozd status` shows it.
    let (code, stdout, stderr) = rozd_cli(&["status", "--addr", &addr, "--token", TOKEN]).await;
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains("stop:         ACTIVE (cli: arm left its envelope)"),
        "{stdout}"
    );

    // Clearing without the token: exit 3, still latched.
    let (code, _, stderr) = rozd_cli(&["estop", "--clear", "--addr", &addr]).await;
    assert_eq!(code, Some(3), "{stderr}");
    assert!(
        stderr.contains("401") && stderr.contains("NOT cleared"),
        "{stderr}"
    );
    assert!(daemon.host.ooda().protective_stop().active().is_some());

    assert_clear_moves_nothing(&daemon, async {
        let (code, stdout, stderr) = rozd_cli(&[
            "estop", "--clear", "--addr", &addr, "--token", TOKEN, "--json",
        ])
        .await;
        assert_eq!(code, Some(0), "{stdout}{stderr}");
        let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(
            (&v["estop_active"], &v["cleared"]),
            (&false.into(), &true.into())
        );
    })
    .await;

    let (code, stdout, _) =
        rozd_cli(&["estop", "--clear", "--addr", &addr, "--token", TOKEN]).await;
    assert_eq!(code, Some(0));
    assert!(stdout.contains("protective stop: not active"), "{stdout}");

    // No daemon there: exit 1, saying the stop did not happen.
    let gone = hw_support::free_port();
    let (code, _, stderr) = rozd_cli(&["estop", "--addr", &format!("127.0.0.1:{gone}")]).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("NOT triggered"), "{stderr}");
    daemon.shutdown().await;
}

// ------------------------------------------------------------------ GPIO

const STOP_PIN: u8 = 5;

#[tokio::test]
async fn gpio_stop_input_latches_and_holds_until_released() {
    let daemon = robot_with_token(&format!("estop_gpio_pin = {STOP_PIN}")).await;
    let ooda = daemon.host.ooda().clone();
    let chip = ooda.sim_gpio().expect("sim GPIO");
    // Active low with the default pull-up: idle high, nothing latched.
    assert_eq!(chip.level(STOP_PIN), Some(true));
    assert!(ooda.protective_stop().active().is_none());
    hold_speed(&daemon).await;

    chip.set_level(STOP_PIN, false); // the button is pressed
    assert_stopped(&daemon, "gpio").await;
    let url = daemon.url();
    let client = http();
    let (_, body) = json(
        client
            .get(format!("{url}/v1/safety"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap(),
    )
    .await;
    let guards = body["active_guards"].as_array().unwrap();
    assert!(guards.contains(&"protective_stop:gpio".into()), "{body}");
    assert!(guards.contains(&"stop_input:gpio:5".into()), "{body}");
    assert_eq!(body["inputs"][0]["name"], "gpio:5");
    assert_eq!(body["inputs"][0]["asserted"], true);

    // Clearing while the button is still pressed: refused (409), still latched.
    let (status, body) = json(
        client
            .post(format!("{url}/v1/estop/clear"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "failed_precondition");
    let err = safety_client(&daemon, Some(TOKEN))
        .await
        .clear_estop(proto::ClearEstopRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(ooda.protective_stop().active().is_some());

    // Released: the stop stays latched until an operator clears it.
    chip.set_level(STOP_PIN, true);
    until(&ooda, "the input released", |_| {
        ooda.protective_stop().held_inputs().is_empty()
    })
    .await;
    assert!(ooda.protective_stop().active().is_some());
    assert_clear_moves_nothing(&daemon, async {
        let (status, body) = json(
            client
                .post(format!("{url}/v1/estop/clear"))
                .bearer_auth(TOKEN)
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(status, 200, "{body}");
    })
    .await;

    // A press shorter than the task takes to look still latches.
    chip.set_level(STOP_PIN, false);
    chip.set_level(STOP_PIN, true);
    assert_stopped(&daemon, "gpio").await;
    daemon.shutdown().await;
}

#[tokio::test]
async fn gpio_stop_input_active_at_start_up_latches_before_anything_moves() {
    // Active high with a pull-up: the idle sim pin reads high, i.e. pressed.
    let daemon = robot(&format!(
        "[safety]\nestop_gpio_pin = {STOP_PIN}\nestop_gpio_active = \"high\"\nestop_gpio_pull = \"up\"\n"
    ))
    .await;
    let ooda = daemon.host.ooda().clone();
    let obs = until(&ooda, "the start-up stop", |o| o.protective_stop.is_some()).await;
    let stop = obs.protective_stop.clone().unwrap();
    assert_eq!(stop.source, "gpio");
    assert!(stop.reason.contains("start-up"), "{}", stop.reason);
    let err = ooda
        .actuators()
        .command("speed", 0.5, operator(), None)
        .await
        .unwrap_err();
    assert!(matches!(err, ActError::EStop { .. }), "{err}");
    let history = daemon.host.sim_actuator("speed").unwrap().history();
    assert!(
        !history.is_empty() && history.iter().all(|v| *v == 0.0),
        "speed never left its safe value: {history:?}"
    );
    daemon.shutdown().await;
}

// ------------------------------------------------------------------ MQTT

#[tokio::test]
async fn mqtt_stop_topic_latches_and_cannot_clear() {
    let dir = tempfile::tempdir().unwrap();
    let mut broker = Broker::start(dir.path()).await;
    let daemon = robot(&format!(
        "[mqtt]\nurl = \"mqtt://127.0.0.1:{}\"\nclient_id = \"rozd-estop-test\"\nreconnect_min_ms = 50\nreconnect_max_ms = 400\n\
         [safety]\nestop_mqtt_topic = \"cell/estop\"\n",
        broker.port
    ))
    .await;
    let ooda = daemon.host.ooda().clone();
    hold_speed(&daemon).await;

    // Retained, so it reaches us whether or not the subscription is in
    // place yet (a retained stop latches whenever rozd subscribes anew).
    publish(broker.port, "cell/estop", "stop", true).await;
    assert_stopped(&daemon, "mqtt").await;
    let status = safety_client(&daemon, None)
        .await
        .get_safety_status(proto::GetSafetyStatusRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(
        status
            .active_guards
            .contains(&"protective_stop:mqtt".to_string()),
        "{status:?}"
    );
    let (_, body) = json(
        http()
            .get(format!("{}/v1/safety", daemon.url()))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(body["inputs"][0]["name"], "mqtt:cell/estop");
    assert_eq!(body["inputs"][0]["connected"], true);

    // Remove the retained stop. Other payloads are ignored: MQTT has no
    // way to clear the stop (payload parsing: unit tests in safety::inputs).
    publish(broker.port, "cell/estop", "", true).await;
    publish(broker.port, "cell/estop", "0", false).await;
    assert_clear_moves_nothing(&daemon, async {
        assert_eq!(
            ooda.protective_stop()
                .clear(rozd::safety::ClearRequest::all("test operator"))
                .await,
            Ok(true)
        );
    })
    .await;

    // The subscription is live now: a plain (not retained) "1" stops too.
    hold_speed(&daemon).await;
    publish(broker.port, "cell/estop", "1", false).await;
    assert_stopped(&daemon, "mqtt").await;
    daemon.shutdown().await;
    broker.stop().await;
}

#[tokio::test]
async fn mqtt_listen_subscribes_before_and_after_the_connection() {
    use hw_support::{Ev, recorder};
    use rozd::hw::Health;
    use rozd::hw::config::MqttConfig;
    use rozd::hw::mqtt::Mqtt;
    let dir = tempfile::tempdir().unwrap();
    let mut broker = Broker::start(dir.path()).await;
    let cfg = MqttConfig {
        url: format!("mqtt://127.0.0.1:{}", broker.port).parse().unwrap(),
        client_id: Some("rozd-listen-test".into()),
        username: None,
        password_env: None,
        ca_file: None,
        cert_file: None,
        key_file: None,
        keep_alive_secs: 5,
        reconnect_min_ms: 50,
        reconnect_max_ms: 400,
        max_packet_size: rozd::hw::mqtt_link::DEFAULT_MAX_PACKET,
    };
    let (readings, mut events) = recorder();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let mqtt = Mqtt::start(&cfg, "h", &[], readings, shutdown.clone());
    // Registered before the connection: subscribed at the ConnAck.
    let mut early = mqtt.listen("a/early").unwrap();
    events
        .wait_for("connected", |e| *e == Ev::Health("mqtt".into(), Health::Ok))
        .await;
    // Registered while connected: subscribed at once.
    let mut late = mqtt.listen("a/late").unwrap();
    assert!(mqtt.listen("a/#").is_err(), "no wildcards");
    publish(broker.port, "a/early", "stop", true).await;
    publish(broker.port, "a/late", "1", true).await;
    let got = tokio::time::timeout(EXPECT_WITHIN, early.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got, b"stop");
    let got = tokio::time::timeout(EXPECT_WITHIN, late.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got, b"1");
    shutdown.cancel();
    tokio::time::timeout(EXPECT_WITHIN, mqtt.join())
        .await
        .unwrap();
    broker.stop().await;
}

#[tokio::test]
async fn a_bad_stop_input_keeps_the_daemon_from_starting() {
    // A sim pin that is already an output cannot be the stop input: the
    // daemon refuses to run without it. (Config validation catches the
    // configured cases; this is the backend refusing at start.)
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n[store]\npath = {:?}\n{}",
        dir.path().join("rozd.db").display().to_string(),
        robot_toml(
            "[safety]\nestop_gpio_pin = 6\n[[actuators]]\nname = \"lamp\"\nkind = \"gpio\"\npin = 7\nsafe_value = 0\n"
        )
    );
    let mut config =
        rozd::config::Config::parse(&text, rozd::config::ConfigSource::BuiltIn).unwrap();
    // Bypass validation the way only a bug could: point the input at the output pin.
    config.safety.estop_gpio_pin = Some(7);
    let err = match rozd::daemon::Daemon::bind(config).await {
        Ok(_) => panic!("the daemon started with an unusable stop input"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("safety.estop_gpio_pin"), "{err}");
}

#[tokio::test]
async fn triggering_and_clearing_the_stop_are_audited() {
    let daemon = robot("").await;
    let (status, reply) = rest_post(
        &daemon,
        "/v1/estop",
        &json!({"reason": "person in the cell"}),
    )
    .await;
    assert_eq!(status, 200, "{reply}");
    let (status, reply) = rest_post(
        &daemon,
        "/v1/estop/clear",
        &json!({"reason": "cell is clear"}),
    )
    .await;
    assert_eq!(status, 200, "{reply}");
    // The audit writer runs beside the request: wait (bounded) for its rows.
    let rows = tokio::time::timeout(EXPECT_WITHIN, async {
        loop {
            let (_, audit) = rest_get(&daemon, "/v1/audit").await;
            let rows: Vec<Value> = audit["data"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|r| {
                    r["kind"]
                        .as_str()
                        .is_some_and(|k| k.starts_with("protective_stop"))
                })
                .cloned()
                .collect();
            if rows.len() >= 2 {
                return rows;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("both changes are audited");
    assert_eq!(rows[0]["kind"], "protective_stop");
    // rozd's own HTTP client identifies itself as the CLI.
    assert_eq!(rows[0]["origin"], "cli");
    assert_eq!(rows[0]["result"], "person in the cell");
    assert_eq!(rows[1]["kind"], "protective_stop_cleared");
    assert_eq!(rows[1]["origin"], "cli: cell is clear");
    daemon.shutdown().await;
}

// ------------------------------------------- every cause, across restarts

/// The protective stop's causes as `/v1/safety` lists them: `source` each.
async fn cause_sources(daemon: &TestDaemon) -> Vec<String> {
    cause_sources_with(daemon, None).await
}

async fn cause_sources_with(daemon: &TestDaemon, token: Option<&str>) -> Vec<String> {
    let reply = rozd::cli::client::get(&daemon.addr.to_string(), "/v1/safety", token)
        .await
        .expect("GET /v1/safety");
    let body: Value = serde_json::from_str(&reply.body).expect("JSON");
    assert_eq!(reply.status.as_u16(), 200, "{body}");
    body["causes"]
        .as_array()
        .unwrap_or_else(|| panic!("causes listed: {body}"))
        .iter()
        .map(|c| c["source"].as_str().unwrap().to_string())
        .collect()
}

/// Audit rows whose kind starts with `protective_stop`, oldest first,
/// waiting (bounded) until there are at least `n`: the audit writer runs
/// beside the request.
async fn stop_audit_rows(addr: &str, n: usize) -> Vec<Value> {
    tokio::time::timeout(EXPECT_WITHIN, async {
        loop {
            let reply = rozd::cli::client::get(addr, "/v1/audit?limit=1000", None)
                .await
                .expect("GET /v1/audit");
            let audit: Value = serde_json::from_str(&reply.body).expect("audit JSON");
            let rows: Vec<Value> = audit["data"]
                .as_array()
                .expect("audit rows")
                .iter()
                .filter(|r| {
                    r["kind"]
                        .as_str()
                        .is_some_and(|k| k.starts_with("protective_stop"))
                })
                .cloned()
                .collect();
            if rows.len() >= n {
                return rows;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{n} protective-stop audit rows"))
}

#[tokio::test]
async fn a_stop_from_a_second_source_adds_a_cause_and_an_operator_clear_removes_all() {
    let daemon = robot(
        "[[sensors]]\nname = \"door\"\nsource = \"gpio\"\npin = 17\npull = \"up\"\nactive = \"high\"\n\n\
         [[rules]]\nname = \"door_open\"\nwhen = \"door == 0\"\nthen = { estop = true, reason = \"door opened\" }\n",
    )
    .await;
    let ooda = daemon.host.ooda().clone();
    let chip = ooda.sim_gpio().expect("sim GPIO");
    let (status, body) = rest_post(&daemon, "/v1/estop", &json!({"reason": "drill"})).await;
    assert_eq!((status, &body["triggered"]), (200, &json!(true)), "{body}");

    // A second source while latched is a cause of its own, with its answer
    // and its audit row.
    let reply = rozd::cli::client::post_json(
        &daemon.addr.to_string(),
        "/v1/estop",
        None,
        &json!({"reason": "person in cell"}),
    )
    .await
    .unwrap();
    // The same source again keeps its first reason and adds nothing.
    let same: Value = serde_json::from_str(&reply.body).unwrap();
    assert_eq!(same["triggered"], false, "{same}");
    let mut grpc = safety_client(&daemon, None).await;
    grpc.trigger_estop(proto::TriggerEstopRequest {
        reason: "person in cell".into(),
        ..Default::default()
    })
    .await
    .expect("TriggerEstop");
    // A reflex rule firing while latched adds its cause too.
    chip.set_level(17, false);
    until(&ooda, "the rule's cause", |o| {
        o.protective_stop_causes
            .iter()
            .any(|c| c.source == "rule:door_open")
    })
    .await;
    assert_eq!(
        cause_sources(&daemon).await,
        ["cli", "grpc", "rule:door_open"]
    );
    let status = grpc_status(&mut grpc).await;
    for guard in [
        "protective_stop:cli",
        "protective_stop:grpc",
        "protective_stop:rule:door_open",
    ] {
        assert!(
            status.active_guards.contains(&guard.to_string()),
            "{status:?}"
        );
    }
    let (_, observation) = rest_get(&daemon, "/v1/observation").await;
    assert_eq!(
        observation["protective_stop_causes"]
            .as_array()
            .map(Vec::len),
        Some(3),
        "{observation}"
    );
    let (code, stdout, stderr) = rozd_cli(&["status", "--addr", &daemon.addr.to_string()]).await;
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains("cli: drill")
            && stdout.contains("grpc: person in cell")
            && stdout.contains("rule:door_open: door opened"),
        "{stdout}"
    );

    // The operator's clear removes every cause, each audited.
    let (status, body) = rest_post(&daemon, "/v1/estop/clear", &json!({})).await;
    assert_eq!((status, &body["cleared"]), (200, &json!(true)), "{body}");
    assert!(cause_sources(&daemon).await.is_empty());
    let rows = stop_audit_rows(&daemon.addr.to_string(), 6).await;
    let kinds: Vec<&str> = rows.iter().map(|r| r["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "protective_stop",
            "protective_stop",
            "protective_stop",
            "protective_stop_cleared",
            "protective_stop_cleared",
            "protective_stop_cleared"
        ],
        "{rows:?}"
    );
    assert_eq!(rows[1]["origin"], "grpc");
    assert_eq!(rows[1]["result"], "person in cell");
    daemon.shutdown().await;
}

#[tokio::test]
async fn a_fleet_clear_never_clears_a_later_local_stop() {
    const FLEET_TOKEN: &str = "fleet-secret-for-estop-tests";
    let broker_dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(broker_dir.path()).await;
    let token = broker_dir.path().join("fleet.token");
    std::fs::write(&token, format!("{FLEET_TOKEN}\n")).unwrap();
    let daemon = robot(&format!(
        "[fleet]\nurl = \"mqtt://127.0.0.1:{}\"\ntoken_file = {:?}\n",
        broker.port,
        token.display().to_string()
    ))
    .await;
    let mut changes = daemon.host.fleet().changes();
    tokio::time::timeout(EXPECT_WITHIN, async {
        while !daemon.host.fleet().is_connected() {
            changes.changed().await.expect("fleet alive");
        }
    })
    .await
    .expect("the fleet link connects");
    // The fleet token is one of the host's accepted tokens.
    let post = |path: &'static str, body: Value| {
        let addr = daemon.addr.to_string();
        async move {
            let reply = rozd::cli::client::post_json(&addr, path, Some(FLEET_TOKEN), &body)
                .await
                .unwrap();
            let body: Value = serde_json::from_str(&reply.body).unwrap();
            (reply.status.as_u16(), body)
        }
    };
    let (status, body) = post("/v1/fleet/estop", json!({"reason": "drill"})).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = post("/v1/estop", json!({"reason": "person in cell"})).await;
    assert_eq!((status, &body["triggered"]), (200, &json!(true)), "{body}");
    let (status, body) = post("/v1/fleet/estop/clear", json!({})).await;
    assert_eq!(status, 200, "{body}");
    // The fleet's cause is gone; the operator's stays, and with it the stop.
    assert_eq!(
        cause_sources_with(&daemon, Some(FLEET_TOKEN)).await,
        ["cli"]
    );
    let reply = rozd::cli::client::get(&daemon.addr.to_string(), "/v1/safety", Some(FLEET_TOKEN))
        .await
        .unwrap();
    let safety: Value = serde_json::from_str(&reply.body).unwrap();
    assert_eq!(safety["level"], "protective_stop", "{safety}");
    assert_eq!(safety["stop"]["reason"], "person in cell");
    let refused = daemon
        .host
        .ooda()
        .actuators()
        .command("speed", 0.3, operator(), None)
        .await
        .expect_err("still stopped");
    assert!(matches!(refused, ActError::EStop { .. }), "{refused}");
    daemon.shutdown().await;
}

#[tokio::test]
async fn the_stop_survives_kill_9_and_only_an_explicit_clear_ends_it() {
    let dir = tempfile::tempdir().unwrap();
    let port = common::broker::free_port();
    let addr = format!("127.0.0.1:{port}");
    let config = dir.path().join("rozd.toml");
    std::fs::write(
        &config,
        format!(
            "{}\n[server]\nlisten = \"{addr}\"\nhttp2_keepalive_secs = 0\n[store]\npath = {:?}\n\
             [[permissions]]\ntool_pattern = \"speed\"\npolicy = \"allow\"\n",
            robot_toml(""),
            dir.path().join("rozd.db").display().to_string()
        ),
    )
    .unwrap();
    let mut rozd = common::spawn_rozd(dir.path(), &config).await;
    let reply = rozd::cli::client::post_json(
        &addr,
        "/v1/estop",
        None,
        &json!({"reason": "person in cell"}),
    )
    .await
    .unwrap();
    assert_eq!(reply.status.as_u16(), 200, "{}", reply.body);
    // The trigger's audit row is written after the stop answers (the stop
    // never waits for the store; the stop file is what survives a kill):
    // let it land, so the rows below are the trigger's and the restart's.
    stop_audit_rows(&addr, 1).await;
    rozd.kill().await.expect("kill -9");

    // Back up latched, as before, with an audit row saying so.
    let mut rozd = common::spawn_rozd(dir.path(), &config).await;
    let reply = rozd::cli::client::get(&addr, "/v1/safety", None)
        .await
        .unwrap();
    let safety: Value = serde_json::from_str(&reply.body).unwrap();
    assert_eq!(safety["level"], "protective_stop", "{safety}");
    assert_eq!(safety["causes"][0]["source"], "cli", "{safety}");
    assert_eq!(safety["causes"][0]["reason"], "person in cell", "{safety}");
    let rows = stop_audit_rows(&addr, 2).await;
    assert_eq!(rows[1]["kind"], "protective_stop_restored", "{rows:?}");
    assert!(
        rows[1]["result"]
            .as_str()
            .unwrap()
            .contains("person in cell"),
        "{rows:?}"
    );

    // A PHYSICAL command is refused until someone clears the stop.
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = proto::agent_service_client::AgentServiceClient::new(channel);
    let mut session = common::Session::open(&mut client).await;
    session.start(proto::StartSession::default()).await;
    session
        .send(proto::session_request::Request::UserMessage(
            proto::UserMessage {
                content: "set speed 0.3".into(),
                ..Default::default()
            },
        ))
        .await;
    let error = loop {
        match session.next_significant().await {
            proto::session_response::Response::Error(e) => break e,
            proto::session_response::Response::TurnComplete(t) => {
                panic!("the command was not refused: {t:?}")
            }
            _ => {}
        }
    };
    assert_eq!(error.code, "e_stop", "{error:?}");
    drop(session);

    let reply = rozd::cli::client::post_json(
        &addr,
        "/v1/estop/clear",
        None,
        &json!({"reason": "cell checked"}),
    )
    .await
    .unwrap();
    assert_eq!(reply.status.as_u16(), 200, "{}", reply.body);
    rozd.kill().await.expect("kill -9");
    // Cleared stays cleared.
    let mut rozd = common::spawn_rozd(dir.path(), &config).await;
    let reply = rozd::cli::client::get(&addr, "/v1/safety", None)
        .await
        .unwrap();
    let safety: Value = serde_json::from_str(&reply.body).unwrap();
    assert_eq!(safety["level"], "normal", "{safety}");
    rozd.kill().await.expect("kill -9");
}

#[tokio::test]
async fn an_unreadable_stop_file_starts_latched() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("rozd.db");
    std::fs::write(dir.path().join("rozd.db-stop.json"), b"\0\0garbage").unwrap();
    let daemon = TestDaemon::start_with_store(&store, &robot_toml("")).await;
    assert_eq!(cause_sources(&daemon).await, ["restore"]);
    let (status, body) = rest_post(&daemon, "/v1/estop/clear", &json!({})).await;
    assert_eq!((status, &body["cleared"]), (200, &json!(true)), "{body}");
    daemon.shutdown().await;
    // The clear repaired the file: the next start is not latched.
    let daemon = TestDaemon::start_with_store(&store, &robot_toml("")).await;
    assert!(cause_sources(&daemon).await.is_empty());
    daemon.shutdown().await;
}

/// Going safe is never gated by the request's form: a malformed body, a
/// body of the wrong shape or one far over any sane size still stops
/// (with the default reason) and the answer says why the body was ignored.
#[tokio::test]
async fn a_stop_request_with_a_bad_body_still_stops() {
    let daemon = robot_with_token("").await;
    hold_speed(&daemon).await;
    let url = daemon.url();
    let client = http();
    // Over what is read, small enough for loopback buffers to take whole.
    let oversized = "x".repeat(256 * 1024);
    for (i, bad) in ["{", "[1]", r#"{"reason": 5}"#, oversized.as_str()]
        .into_iter()
        .enumerate()
    {
        let (status, body) = json(
            client
                .post(format!("{url}/v1/estop"))
                .bearer_auth(TOKEN)
                .header("content-type", "application/json")
                .body(bad.to_string())
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["estop_active"], true, "{body}");
        assert_eq!(body["triggered"], i == 0, "{body}");
        assert_eq!(body["stop"]["reason"], "POST /v1/estop", "{body}");
        let why = body["body_error"].as_str().unwrap_or_default();
        assert!(why.contains("JSON object"), "{body}");
        if bad.len() > 1024 {
            assert!(why.contains("over 65536 bytes"), "{body}");
        }
        assert_eq!(
            daemon.host.sim_actuator("speed").unwrap().value(),
            Some(0.0)
        );
    }
    assert_stopped(&daemon, "rest").await;
}

/// Only a readable, valid "not latched" stop file starts rozd unlatched (or
/// none at all, a fresh install): a dangling symlink, a symlink even to a
/// valid file, a FIFO (which must not hang start-up) and a directory each
/// start the real binary latched (source `restore`).
#[tokio::test]
async fn a_stop_file_that_is_not_a_plain_readable_file_starts_the_binary_latched() {
    /// Makes the stop file (the second path) in the directory (the first).
    type Make = fn(&std::path::Path, &std::path::Path);
    let kinds: [(&str, Make); 4] = [
        ("dangling symlink", |dir, stop| {
            std::os::unix::fs::symlink(dir.join("nowhere.json"), stop).unwrap()
        }),
        ("symlink to a valid unlatched file", |dir, stop| {
            let target = dir.join("elsewhere.json");
            std::fs::write(
                &target,
                br#"{"version":1,"causes":[],"written_at_unix_ms":0}"#,
            )
            .unwrap();
            std::os::unix::fs::symlink(target, stop).unwrap()
        }),
        ("FIFO", |_, stop| {
            let made = std::process::Command::new("mkfifo").arg(stop).status();
            assert!(made.unwrap().success(), "mkfifo");
        }),
        ("directory", |_, stop| std::fs::create_dir(stop).unwrap()),
    ];
    for (what, make) in kinds {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("rozd.db");
        make(dir.path(), &dir.path().join("rozd.db-stop.json"));
        let port = common::broker::free_port();
        let config = dir.path().join("rozd.toml");
        std::fs::write(
            &config,
            format!(
                "[server]\nlisten = \"127.0.0.1:{port}\"\ncontrol_socket = \"\"\n[store]\npath = {:?}\n{}",
                store.display().to_string(),
                robot_toml("")
            ),
        )
        .unwrap();
        let _rozd = common::spawn_rozd(dir.path(), &config).await;
        let body: Value = http()
            .get(format!("http://127.0.0.1:{port}/v1/safety"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(body["estop_active"], true, "{what}: {body}");
        assert_eq!(body["stop"]["source"], "restore", "{what}: {body}");
    }
}

/// `rozd estop` believes a control socket only when root, the user running
/// it or the daemon's user (`rozd`) owns it: a socket squatted by another
/// user (here uid 65534) that answers "latched" is refused, the CLI falls
/// back to TCP (nothing listens there) and exits 1. The same socket owned
/// by root is believed (the check refuses only foreign owners).
#[tokio::test]
async fn rozd_estop_refuses_a_control_socket_another_user_owns() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("squatted.sock");
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let fake = r#"{"environment_id":"lab","estop_active":true,"level":"estop","active_guards":[],"causes":[{"source":"rest","reason":"fake","since_unix_ms":0,"by":null}],"inputs":[],"persisted":true,"stop":{"source":"rest","reason":"fake","since_unix_ms":0,"by":null},"triggered":true}"#;
    let server = tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
            let mut buf = [0u8; 4096];
            let _ = stream.read(&mut buf).await;
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{fake}",
                fake.len()
            );
            let _ = stream.write_all(answer.as_bytes()).await;
        }
    });
    let closed_port = common::broker::free_port();
    let addr = format!("127.0.0.1:{closed_port}");
    let socket = path.display().to_string();
    let args = [
        "estop", "--socket", &socket, "--addr", &addr, "--reason", "x",
    ];

    std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
    let (code, out, err) = rozd_cli(&args).await;
    assert_eq!(code, Some(1), "{out}\n{err}");
    assert!(err.contains("owned by uid 65534"), "{err}");
    assert!(err.contains("NOT triggered"), "{err}");

    std::os::unix::fs::chown(&path, Some(0), Some(0)).unwrap();
    let (code, out, err) = rozd_cli(&args).await;
    assert_eq!(code, Some(0), "{out}\n{err}");
    server.abort();
}
