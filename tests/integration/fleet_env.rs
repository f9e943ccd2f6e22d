//! The fleet by environment: a host holds the view of its own environment
//! (where its sessions and fleet stops go); hosts of another environment
//! are still found by id (`GetHost`, relayed sessions), a host with
//! `[fleet] view = "fleet"` lists every environment, and a listing this
//! host cannot answer completely is refused, naming the fix. Real `rozd`
//! processes and a real `mosquitto`; every wait polls a condition until a
//! generous deadline.

use rozd::api::proto;
use rozd::api::proto::host_service_client::HostServiceClient;
use serde_json::{Value, json};
use tokio::process::Command;

use crate::common::broker::{Broker, publish};
use crate::fleet::{Rozd, TOKEN, eventually, mkdir, now_ms, sealed, stopped, view_is};

/// Waits until the broker holds a retained record of host `id` (under any
/// environment, or the topic of rozds before per-environment records).
async fn record_retained(port: u16, id: &str) {
    eventually(&format!("the broker holds a record of {id}"), || async {
        let out = Command::new("mosquitto_sub")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "-C",
                "1",
                "-W",
                "5",
            ])
            .args(["-t", &format!("roz/v1/hosts/{id}")])
            .args(["-t", &format!("roz/v1/hosts/+/{id}")])
            .output()
            .await
            .expect("run mosquitto_sub");
        (out.status.success() && !out.stdout.is_empty()).then_some(())
    })
    .await;
}

/// The ids `host` lists (`GET /v1/hosts`), in order.
async fn listed(host: &Rozd) -> Vec<String> {
    host.view().await.into_iter().map(|(id, _, _)| id).collect()
}

/// A host of `lab` holds the view of `lab` only: a host of `field` on the
/// same broker, whose record the broker holds, is not in its listing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lab_host_lists_only_the_hosts_of_lab() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&mkdir(dir.path(), "broker")).await;
    let _field = Rozd::spawn_in("field-1", "field", &broker, "").await;
    record_retained(broker.port, "field-1").await;
    let lab1 = Rozd::spawn_in("lab-1", "lab", &broker, "").await;
    let _lab2 = Rozd::spawn_in("lab-2", "lab", &broker, "").await;
    // lab-2 came after every retained record lab-1 was handed when it
    // subscribed (field-1's among them, had it subscribed to it).
    view_is(&lab1, &[("lab-1", "online"), ("lab-2", "online")]).await;
    assert_eq!(listed(&lab1).await, ["lab-1", "lab-2"]);
}

/// From a host of `lab` (which holds `lab` only), a host of `field` is
/// found by id (`GetHost`, REST) and a session by its host id runs there;
/// an id no environment has is not found; listing `field` is refused
/// naming the fix, while a host with `view = "fleet"` lists every
/// environment; a fleet stop of `lab` latches `lab` hosts only, and one of
/// `field` from the `lab` host latches `field` and says the `lab` host
/// cannot tell who confirmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_environment_is_reached_by_id_and_a_fleet_view_lists_every_one() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&mkdir(dir.path(), "broker")).await;
    let field = Rozd::spawn_in("field-1", "field", &broker, "").await;
    let lab = Rozd::spawn_in("lab-1", "lab", &broker, "").await;
    let dash = Rozd::spawn_in("dash", "lab", &broker, "view = \"fleet\"\n").await;
    view_is(
        &dash,
        &[
            ("dash", "online"),
            ("field-1", "online"),
            ("lab-1", "online"),
        ],
    )
    .await;
    view_is(&lab, &[("dash", "online"), ("lab-1", "online")]).await;
    view_is(&field, &[("field-1", "online")]).await;
    let scope = &lab.get("/v1/hosts").await["fleet"];
    assert_eq!(
        (&scope["view"], &scope["environment_id"]),
        (&json!("environment"), &json!("lab"))
    );

    // GetHost and GET /v1/hosts/{id} of a host of another environment.
    let mut hosts = HostServiceClient::new(lab.channel().await);
    let got = hosts
        .get_host(proto::GetHostRequest {
            id: "field-1".into(),
        })
        .await
        .expect("GetHost field-1 on lab-1")
        .into_inner();
    assert_eq!(
        (got.environment_id.as_str(), got.status.as_str()),
        ("field", "online"),
        "{got:?}"
    );
    assert_eq!(
        got.capabilities["endpoint"],
        format!("http://{}", field.addr())
    );
    let one = lab.get("/v1/hosts/field-1").await;
    assert_eq!(
        (&one["environment_id"], &one["status"]),
        (&json!("field"), &json!("online"))
    );
    // An id no environment has: not found (after the lookup's time).
    let missing = hosts
        .get_host(proto::GetHostRequest {
            id: "nowhere".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound, "{missing:?}");
    // Concurrent lookups of one id (they share one subscription) all answer.
    let lookups = (0..5).map(|_| {
        let mut hosts = hosts.clone();
        async move {
            hosts
                .get_host(proto::GetHostRequest {
                    id: "field-1".into(),
                })
                .await
                .map(|h| h.into_inner().environment_id)
        }
    });
    for answer in futures_util::future::join_all(lookups).await {
        assert_eq!(answer.expect("a concurrent GetHost"), "field");
    }
    // The lookups left nothing in lab-1's view.
    assert_eq!(listed(&lab).await, ["dash", "lab-1"]);

    // A host registered in field from lab-1: published under field, not
    // in lab-1's view, found by id, deregistered from lab-1 (its record
    // cleared in field: the host that holds every environment drops it).
    let camera = hosts
        .register_host(proto::RegisterHostRequest {
            name: "field camera".into(),
            environment_id: "field".into(),
            capabilities: Default::default(),
        })
        .await
        .expect("RegisterHost in field on lab-1")
        .into_inner();
    assert_eq!(camera.environment_id, "field");
    let in_dash = |present: bool| {
        let id = camera.id.clone();
        let dash = &dash;
        async move {
            eventually(&format!("dash lists the camera: {present}"), || async {
                (listed(dash).await.contains(&id) == present).then_some(())
            })
            .await;
        }
    };
    in_dash(true).await;
    assert_eq!(listed(&lab).await, ["dash", "lab-1"]);
    let found = hosts
        .get_host(proto::GetHostRequest {
            id: camera.id.clone(),
        })
        .await
        .expect("GetHost of the camera on lab-1")
        .into_inner();
    assert_eq!(found.status, "registered");
    hosts
        .deregister_host(proto::DeregisterHostRequest {
            id: camera.id.clone(),
        })
        .await
        .expect("DeregisterHost of the camera on lab-1");
    in_dash(false).await;

    // Listing another environment: refused on lab-1, naming the fix;
    // answered by the host that holds every environment.
    let refused = hosts
        .list_hosts(proto::ListHostsRequest {
            environment_id: "field".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    assert!(
        refused.message().contains("view = \"fleet\"") && refused.message().contains("\"field\""),
        "{refused:?}"
    );
    let reply = rozd::cli::client::get(&lab.addr(), "/v1/hosts?environment_id=field", Some(TOKEN))
        .await
        .unwrap();
    assert_eq!(reply.status.as_u16(), 409, "{}", reply.body);
    let body: Value = serde_json::from_str(&reply.body).unwrap();
    assert_eq!(body["error"]["code"], "failed_precondition", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("view = \"fleet\""),
        "{body}"
    );
    let mut whole = HostServiceClient::new(dash.channel().await);
    let of_field: Vec<String> = whole
        .list_hosts(proto::ListHostsRequest {
            environment_id: "field".into(),
            ..Default::default()
        })
        .await
        .expect("ListHosts field on dash")
        .into_inner()
        .data
        .into_iter()
        .map(|h| h.id)
        .collect();
    assert_eq!(of_field, ["field-1"]);

    // A session by host id from lab-1 runs on field-1.
    let mut session = lab.session().await;
    let started = session
        .start(proto::StartSession {
            environment_id: "field".into(),
            host_id: Some("field-1".into()),
            ..Default::default()
        })
        .await;
    let on_field = field.get("/v1/sessions").await;
    assert_eq!(
        on_field["data"][0]["id"],
        started.session_id.as_str(),
        "{on_field}"
    );
    assert_eq!(on_field["data"][0]["host_id"], "field-1");
    drop(session);

    // A fleet stop of lab: lab's hosts latch (dash too, by the broker);
    // then one of field from lab-1, which cannot see field's hosts confirm.
    let (status, answer) = lab
        .post(
            "/v1/fleet/estop",
            json!({"reason": "drill", "wait_ms": 30_000}),
        )
        .await;
    assert_eq!(
        (status.as_u16(), &answer["confirmed"]),
        (200, &json!(true)),
        "{answer}"
    );
    assert!(stopped(&dash).await);
    let (status, answer) = lab
        .post(
            "/v1/fleet/estop",
            json!({"environment_id": "field", "reason": "field drill"}),
        )
        .await;
    assert_eq!(status.as_u16(), 200, "{answer}");
    assert_eq!(
        (&answer["confirmed"], &answer["hosts"]),
        (&json!(false), &json!([])),
        "{answer}"
    );
    assert!(
        answer["unconfirmed"]
            .as_str()
            .unwrap()
            .contains("view = \"fleet\""),
        "{answer}"
    );
    eventually("field-1 latches the fleet stop of field", || async {
        stopped(&field).await.then_some(())
    })
    .await;
    // field-1 latched once, for field: never for lab's stop.
    let causes = field.get("/v1/safety").await;
    let reasons: Vec<String> = causes["causes"]
        .as_array()
        .map(|c| {
            c.iter()
                .map(|c| c["reason"].as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(reasons.len(), 1, "{causes}");
    assert!(reasons[0].contains("environment field"), "{causes}");
}

/// An upgraded rozd clears its record on the topic of rozds before
/// per-environment records, so that it does not linger there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rozd_clears_its_record_on_the_old_topic_when_it_starts() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&mkdir(dir.path(), "broker")).await;
    let old = json!({
        "v": 1, "id": "lab-1", "name": "host lab-1", "environment_id": "lab",
        "status": "offline", "capabilities": {}, "endpoint": "http://127.0.0.1:1",
        "heartbeat_secs": 1, "created_at_ms": now_ms() - 10_000,
        "last_heartbeat_ms": now_ms() - 10_000,
    });
    publish(
        broker.port,
        "roz/v1/hosts/lab-1",
        sealed("roz/v1/hosts/lab-1", &old),
        true,
    )
    .await;
    record_retained(broker.port, "lab-1").await;
    let _lab = Rozd::spawn_in("lab-1", "lab", &broker, "").await;
    eventually("the old topic's record of lab-1 is cleared", || async {
        let out = Command::new("mosquitto_sub")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &broker.port.to_string(),
                "-C",
                "1",
                "-W",
                "2",
            ])
            .args(["--retained-only", "-t", "roz/v1/hosts/lab-1"])
            .output()
            .await
            .expect("run mosquitto_sub");
        out.stdout.is_empty().then_some(())
    })
    .await;
}

/// A host moved to another environment clears its offline record in the
/// one it left, so a lookup of its id finds only the current one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_moved_to_another_environment_clears_its_old_record() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&mkdir(dir.path(), "broker")).await;
    let before = Rozd::spawn_in("mover", "lab", &broker, "").await;
    record_on(broker.port, "roz/v1/hosts/lab/mover", true).await;
    // Gone (kill -9: its last will says offline there), back in field.
    drop(before);
    let _after = Rozd::spawn_in("mover", "field", &broker, "").await;
    record_on(broker.port, "roz/v1/hosts/field/mover", true).await;
    record_on(broker.port, "roz/v1/hosts/lab/mover", false).await;
}

/// Waits until the broker holds (`held`) or does not hold a retained
/// message on `topic`.
async fn record_on(port: u16, topic: &str, held: bool) {
    eventually(&format!("a retained record on {topic}: {held}"), || async {
        let out = Command::new("mosquitto_sub")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "-C",
                "1",
                "-W",
                "2",
            ])
            .args(["--retained-only", "-t", topic])
            .output()
            .await
            .expect("run mosquitto_sub");
        (out.stdout.is_empty() != held).then_some(())
    })
    .await;
}
