//! Unit tests of the registry, routing and the broker's messages, on a
//! [`Fleet`] that is not connected.

use std::collections::BTreeMap;

use super::inbox::{JudgedCommand, OwnElsewhere, OwnTopic};
use super::record::{FleetStopCommand, HostRecord, RecordStatus, Rejected, ReportedStop};
use super::seal::{self, MessageKey};
use super::stop::{self, Defect, Message, StopKind, Verdict};
use super::view::Presence;
use super::*;
use crate::config::types::Secret;

const TOKEN: &str = "unit-fleet-token";

/// A token file for the tests (kept for the whole test run).
fn token_file() -> &'static std::path::Path {
    static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("fleet-token"), format!("{TOKEN}\n")).unwrap();
        dir
    });
    Box::leak(dir.path().join("fleet-token").into_boxed_path())
}

/// The `[fleet]` table `table` (with the tests' token file) as validation
/// makes it, for `host` on a plaintext loopback listener.
fn built(table: &str, host: &HostConfig) -> FleetConfig {
    let raw: config::RawFleet = toml::from_str(&format!(
        "{table}token_file = {:?}\n",
        token_file().display().to_string()
    ))
    .unwrap();
    let listener = config::Listener {
        listen: "127.0.0.1:8080".parse().unwrap(),
        tls: false,
    };
    raw.build(host, &listener, None).unwrap()
}

/// This host `a` in environment `lab`, offering the `observe` tool, on
/// the broker of `section` (a `[fleet]` table) if it is not empty.
fn fleet(section: &str) -> Fleet {
    let host: HostConfig = toml::from_str("id = \"a\"\nenvironment_id = \"lab\"\n").unwrap();
    let fleet = section
        .strip_prefix("[fleet]\n")
        .map(|table| built(table, &host));
    let offer = Offer {
        host_tools: vec!["observe".into()],
        ..Offer::default()
    };
    Fleet::new(
        &host,
        fleet.as_ref(),
        offer,
        "127.0.0.1:7000".parse().unwrap(),
        ProtectiveStop::default(),
    )
}

const FLEET: &str = "[fleet]\nurl = \"mqtt://127.0.0.1:1\"\nheartbeat_secs = 2\n";

fn key() -> MessageKey {
    MessageKey::from_token(TOKEN)
}

fn record_of(f: &Fleet, id: &str, status: RecordStatus, endpoint: Option<&str>) -> HostRecord {
    let mut r = f.own_record(status);
    r.id = id.into();
    r.endpoint = endpoint.map(str::to_string);
    r.instance = None;
    r
}

fn sealed_record(r: &HostRecord) -> Vec<u8> {
    let topic = format!("roz/v1/hosts/{}/{}", r.environment_id, r.id);
    seal::seal(&key(), &topic, &serde_json::to_string(r).unwrap())
}

fn receive(f: &Fleet, r: &HostRecord) -> Result<(), Rejected> {
    f.record_received(
        &r.environment_id,
        &r.id,
        &format!("roz/v1/hosts/{}/{}", r.environment_id, r.id),
        &sealed_record(r),
    )
}

fn put(f: &Fleet, id: &str, status: RecordStatus, endpoint: Option<&str>) {
    receive(f, &record_of(f, id, status, endpoint)).unwrap();
}

#[test]
fn without_a_fleet_only_this_host_is_known() {
    let f = fleet("");
    let hosts = f.list(None);
    assert_eq!(hosts.len(), 1);
    assert!(hosts[0].this_host);
    assert_eq!(hosts[0].presence, Presence::Online);
    assert_eq!(
        hosts[0].record.endpoint.as_deref(),
        Some("http://127.0.0.1:7000")
    );
    assert_eq!(f.route("", None), Ok(Route::Local));
    assert_eq!(f.route("a", None), Ok(Route::Local));
    assert_eq!(f.route("a", Some("b")), Ok(Route::Local));
    assert!(matches!(f.route("b", None), Err(RouteError::NotFound(m)) if m.contains("[fleet]")));
    assert!(matches!(
        f.register("x", "", BTreeMap::new()),
        Err(FleetError::NotConfigured)
    ));
    assert!(matches!(
        futures_util::FutureExt::now_or_never(f.deregister("a")).unwrap(),
        Err(FleetError::Live(_))
    ));
    assert!(matches!(
        futures_util::FutureExt::now_or_never(f.deregister("b")).unwrap(),
        Err(FleetError::NotFound(_))
    ));
    assert!(matches!(
        f.publish_stop("lab", true, "x"),
        Err(FleetError::NotConfigured)
    ));
    assert!(matches!(
        f.sealed_own_record(RecordStatus::Online, None),
        Err(FleetError::NotConfigured)
    ));
}

#[test]
fn routes_follow_presence() {
    let f = fleet(FLEET);
    put(&f, "b", RecordStatus::Online, Some("http://127.0.0.1:7001"));
    put(
        &f,
        "c",
        RecordStatus::Offline,
        Some("http://127.0.0.1:7002"),
    );
    put(&f, "r", RecordStatus::Registered, None);
    put(&f, "n", RecordStatus::Online, None);
    assert_eq!(
        f.route("b", None),
        Ok(Route::Remote(RemoteHost {
            id: "b".into(),
            endpoint: "http://127.0.0.1:7001".into(),
            token: Some(Secret::new(TOKEN)),
            relayed_by: "a".into(),
            tls: Default::default(),
        }))
    );
    assert!(matches!(
        f.route("c", None),
        Err(RouteError::Unavailable(_))
    ));
    assert!(matches!(f.route("r", None), Err(RouteError::NotFound(_))));
    assert!(matches!(
        f.route("n", None),
        Err(RouteError::Unavailable(_))
    ));
    assert!(matches!(f.route("zz", None), Err(RouteError::NotFound(_))));
    let ids: Vec<String> = f.list(None).into_iter().map(|h| h.record.id).collect();
    assert_eq!(ids, ["a", "b", "c", "n", "r"]);
    assert_eq!(f.list(Some("elsewhere")).len(), 0);
    // a live rozd cannot be deregistered; unconnected, nothing is published
    assert!(matches!(
        futures_util::FutureExt::now_or_never(f.deregister("b")).unwrap(),
        Err(FleetError::Live(_))
    ));
    assert!(matches!(
        futures_util::FutureExt::now_or_never(f.deregister("c")).unwrap(),
        Err(FleetError::Disconnected)
    ));
}

#[test]
fn one_hop_and_never_to_itself() {
    let f = fleet(FLEET);
    put(&f, "b", RecordStatus::Online, Some("http://127.0.0.1:7001"));
    // relayed here by another host: served here or refused, never relayed on
    assert_eq!(f.route("a", Some("b")), Ok(Route::Local));
    assert!(matches!(
        f.route("b", Some("c")),
        Err(RouteError::Unavailable(m)) if m.contains("one hop")
    ));
    assert!(matches!(
        f.route("nowhere", Some("c")),
        Err(RouteError::Unavailable(_))
    ));
    // records that point back at this host
    for (id, endpoint) in [
        ("s1", "http://127.0.0.1:7000"),
        ("s2", "http://127.0.0.1:7000/"),
        ("s3", "http://localhost:7000"),
        ("s4", "http://[::1]:7000"),
        ("s5", "http://0.0.0.0:7000"),
    ] {
        put(&f, id, RecordStatus::Online, Some(endpoint));
        assert!(
            matches!(f.route(id, None), Err(RouteError::Unavailable(m)) if m.contains("itself")),
            "{endpoint}"
        );
    }
    // another port on loopback is another host
    put(&f, "o", RecordStatus::Online, Some("http://localhost:7003"));
    assert!(matches!(f.route("o", None), Ok(Route::Remote(_))));
}

#[test]
fn an_old_record_is_not_routed_to() {
    let f = fleet(FLEET);
    // an older rozd's record, refreshed every heartbeat
    let mut r = record_of(&f, "b", RecordStatus::Online, Some("http://127.0.0.1:7001"));
    r.liveness = None;
    // three heartbeats (2 s) and the clock skew allowance ago, and more
    r.last_heartbeat_ms = Some(crate::clock::now_ms() - 6_000 - stop::MAX_CLOCK_SKEW_MS - 1_000);
    receive(&f, &r).unwrap();
    assert!(matches!(
        f.route("b", None),
        Err(RouteError::Unavailable(m)) if m.contains("has not published")
    ));
    r.last_heartbeat_ms = Some(crate::clock::now_ms());
    receive(&f, &r).unwrap();
    assert!(matches!(f.route("b", None), Ok(Route::Remote(_))));
}

/// A record published on change is as old as its host's connection: an
/// hour-old one of a live host is routed to (its presence decides).
#[test]
fn a_record_published_on_change_is_routed_to_however_old() {
    let f = fleet(FLEET);
    let mut r = record_of(&f, "b", RecordStatus::Online, Some("http://127.0.0.1:7001"));
    assert_eq!(r.liveness, Some(record::Liveness::Will));
    r.last_heartbeat_ms = Some(crate::clock::now_ms() - 3_600_000);
    receive(&f, &r).unwrap();
    assert!(matches!(f.route("b", None), Ok(Route::Remote(_))));
}

/// A record is taken only from the topic of its own environment; listings
/// of another environment (or, on a host holding the whole fleet, none
/// refused) are refused with what to do instead.
#[test]
fn records_belong_to_their_environments_topic_and_listings_to_the_view() {
    let f = fleet(FLEET);
    let r = record_of(&f, "b", RecordStatus::Online, Some("http://127.0.0.1:7001"));
    let moved = seal::seal(
        &key(),
        "roz/v1/hosts/field/b",
        &serde_json::to_string(&r).unwrap(),
    );
    assert!(matches!(
        f.record_received("field", "b", "roz/v1/hosts/field/b", &moved),
        Err(Rejected::WrongEnvironment { .. })
    ));
    assert!(f.get("b").is_none());
    assert_eq!(f.ignored().invalid, 1);
    // clearing another environment's record of an id leaves the one held
    receive(&f, &r).unwrap();
    f.record_received("field", "b", "roz/v1/hosts/field/b", b"")
        .unwrap();
    assert!(f.get("b").is_some());
    f.record_received("lab", "b", "roz/v1/hosts/lab/b", b"")
        .unwrap();
    assert!(f.get("b").is_none());

    assert_eq!(f.view_scope(), ViewScope::Environment);
    assert!(f.holds("lab") && !f.holds("field"));
    assert!(f.listable(None).is_ok() && f.listable(Some("lab")).is_ok());
    match f.listable(Some("field")) {
        Err(FleetError::OutOfView(why)) => {
            assert!(
                why.contains("view = \"fleet\"") && why.contains("\"field\""),
                "{why}"
            );
        }
        other => panic!("{other:?}"),
    }
    let whole = fleet(&format!("{FLEET}view = \"fleet\"\n"));
    assert!(whole.holds("field") && whole.listable(Some("field")).is_ok());
    // a host that holds the whole fleet looks nothing up: its view is complete
    let looked = futures_util::FutureExt::now_or_never(whole.look_up("zz")).unwrap();
    assert!(matches!(looked, Ok(None)));
    // an id that is no host id is never looked up (no wildcard subscription)
    for id in ["+", "#", "a/b", ""] {
        let looked = futures_util::FutureExt::now_or_never(f.look_up(id)).unwrap();
        assert!(matches!(looked, Ok(None)), "{id:?}: {looked:?}");
    }
    // unconnected: a lookup cannot be made
    let looked = futures_util::FutureExt::now_or_never(f.look_up("zz")).unwrap();
    assert!(matches!(looked, Err(FleetError::Disconnected)));
}

#[test]
fn unauthenticated_records_are_ignored_and_counted() {
    let f = fleet(FLEET);
    let r = record_of(&f, "x", RecordStatus::Online, Some("http://127.0.0.1:9"));
    let plain = serde_json::to_vec(&r).unwrap();
    assert!(matches!(
        f.record_received("lab", "x", "roz/v1/hosts/lab/x", &plain),
        Err(Rejected::Unauthenticated(seal::Unauthentic::NotSealed))
    ));
    // sealed with another key, or for another topic
    let other = seal::seal(
        &MessageKey::from_token("not the fleet's"),
        "roz/v1/hosts/lab/x",
        &serde_json::to_string(&r).unwrap(),
    );
    assert!(
        f.record_received("lab", "x", "roz/v1/hosts/lab/x", &other)
            .is_err()
    );
    let moved = sealed_record(&r);
    assert!(
        f.record_received("lab", "y", "roz/v1/hosts/lab/y", &moved)
            .is_err()
    );
    assert!(f.get("x").is_none() && f.get("y").is_none());
    assert!(matches!(f.route("x", None), Err(RouteError::NotFound(_))));
    assert_eq!(f.ignored().unauthenticated_records, 3);
    // garbage is invalid or unauthenticated, never taken
    assert!(
        f.record_received(
            "lab",
            "x",
            "roz/v1/hosts/lab/x",
            &vec![b'x'; record::MAX_RECORD_BYTES + 1]
        )
        .is_err()
    );
    assert_eq!(f.ignored().invalid, 1);
    // an authentic record for this host itself is not kept
    let mut own = record_of(&f, "a", RecordStatus::Online, None);
    own.instance = Some("other".into());
    assert!(receive(&f, &own).is_err());
    assert_eq!(f.ignored().invalid, 2);
}

#[test]
fn records_only_move_forward() {
    let f = fleet(FLEET);
    let mut old = record_of(&f, "b", RecordStatus::Online, Some("http://10.0.0.1:1"));
    old.instance = Some("i1".into());
    old.last_heartbeat_ms = Some(crate::clock::now_ms() - 1_000);
    let mut new = old.clone();
    new.endpoint = Some("http://10.0.0.2:1".into());
    new.last_heartbeat_ms = Some(crate::clock::now_ms());
    receive(&f, &old).unwrap();
    receive(&f, &new).unwrap();
    // the old record replayed
    assert!(matches!(receive(&f, &old), Err(Rejected::Replayed { .. })));
    assert_eq!(
        f.get("b").unwrap().record.endpoint.as_deref(),
        Some("http://10.0.0.2:1")
    );
    // also after the record was cleared from the broker
    f.record_received("lab", "b", "roz/v1/hosts/lab/b", b"")
        .unwrap();
    assert!(f.get("b").is_none());
    assert!(receive(&f, &old).is_err());
    assert!(f.get("b").is_none());
    receive(&f, &new).unwrap();
    // its last will, written when its connection opened, is taken
    let mut will = old.clone();
    will.status = RecordStatus::Offline;
    receive(&f, &will).unwrap();
    assert_eq!(f.get("b").unwrap().presence, Presence::Offline);
    // another process's old will is not
    let mut stranger = will.clone();
    stranger.instance = Some("i0".into());
    assert!(receive(&f, &stranger).is_err());
    // a record from the future
    let mut ahead = new.clone();
    ahead.last_heartbeat_ms = Some(crate::clock::now_ms() + 2 * stop::MAX_CLOCK_SKEW_MS);
    assert!(matches!(receive(&f, &ahead), Err(Rejected::Future { .. })));
    assert_eq!(f.ignored().replayed_records, 4);
}

#[test]
fn own_record_reports_the_stop() {
    let f = fleet(FLEET);
    assert_eq!(
        f.own_record(RecordStatus::Online).estop,
        Some(ReportedStop::default())
    );
    f.protective_stop
        .trigger(crate::safety::StopRequest::new(FLEET_SOURCE, "drill"));
    let estop = f.own_record(RecordStatus::Online).estop.unwrap();
    assert!(estop.active);
    assert_eq!(estop.source.as_deref(), Some("fleet"));
    assert!(f.list(None)[0].stop_active());
    let caps = &f.own.capabilities;
    assert_eq!(caps["host_tools"], "observe");
    assert_eq!(caps["models"], "local");
    assert_eq!(caps["version"], crate::VERSION);
}

fn own_published(payload: &[u8]) -> HostRecord {
    let body = seal::open(&key(), "roz/v1/hosts/lab/a", payload).unwrap();
    serde_json::from_str(&body).unwrap()
}

#[test]
fn own_records_are_sealed_and_their_stamps_only_grow() {
    let f = fleet(FLEET);
    let first = own_published(&f.sealed_own_record(RecordStatus::Online, None).unwrap());
    let second = own_published(&f.sealed_own_record(RecordStatus::Online, None).unwrap());
    assert!(second.stamp_ms() > first.stamp_ms());
    assert_eq!(
        f.own_topic_message(&f.sealed_own_record(RecordStatus::Online, None).unwrap()),
        OwnTopic::Current
    );
    // our previous run's record, published with a clock that was ahead:
    // ours continue after it
    let mut previous = first.clone();
    previous.instance = Some("earlier".into());
    previous.created_at_ms -= 1;
    previous.last_heartbeat_ms = Some(crate::clock::now_ms() + 60_000);
    assert_eq!(
        f.own_topic_message(&sealed_record(&previous)),
        OwnTopic::Replace
    );
    let next = own_published(&f.sealed_own_record(RecordStatus::Online, None).unwrap());
    assert!(next.stamp_ms() > previous.stamp_ms());
    // a forgery on our topic is replaced (and counted)
    let mut forged = first.clone();
    forged.status = RecordStatus::Offline;
    assert_eq!(
        f.own_topic_message(&serde_json::to_vec(&forged).unwrap()),
        OwnTopic::Replace
    );
    assert_eq!(f.ignored().unauthenticated_records, 1);
    // another process with our id, started after us
    let mut twin = first;
    twin.instance = Some("twin".into());
    twin.created_at_ms += 1;
    assert_eq!(
        f.own_topic_message(&sealed_record(&twin)),
        OwnTopic::Impostor {
            instance: Some("twin".into())
        }
    );
}

fn sealed_command(stop: bool, id: &str, at_ms: i64) -> Vec<u8> {
    let c = FleetStopCommand {
        stop,
        reason: "drill".into(),
        by: Some("b".into()),
        id: Some(id.into()),
        at_ms: Some(at_ms),
    };
    seal::seal(
        &key(),
        "roz/v1/estop/lab",
        &serde_json::to_string(&c).unwrap(),
    )
}

fn verdict(f: &Fleet, payload: &[u8]) -> Verdict {
    f.command_received(payload, None).verdict
}

#[test]
fn stop_commands_anyone_may_stop_only_the_fleet_clears() {
    let f = fleet(FLEET);
    let now = crate::clock::now_ms();
    assert_eq!(
        verdict(&f, &sealed_command(true, "s1", now)),
        Verdict::Stop(StopKind::Authentic)
    );
    assert_eq!(
        verdict(&f, &sealed_command(true, "s1", now)),
        Verdict::AlreadyApplied
    );
    // forged clears (plain JSON, a sealed one altered) are not clears: they stop
    let forged = br#"{"stop":false,"id":"x","by":"b","at_ms":99999999999999}"#;
    assert_eq!(verdict(&f, forged), Verdict::Stop(StopKind::Untrusted));
    let mut altered: serde_json::Value =
        serde_json::from_slice(&sealed_command(false, "c0", now + 1)).unwrap();
    altered["body"] = altered["body"]
        .as_str()
        .unwrap()
        .replace("drill", "dril!")
        .into();
    assert_eq!(
        verdict(&f, &serde_json::to_vec(&altered).unwrap()),
        Verdict::Stop(StopKind::Untrusted)
    );
    assert_eq!(f.ignored().unauthenticated_commands, 2);
    // a bare stop, or a stop sealed with the wrong key, latches
    assert_eq!(verdict(&f, b"stop"), Verdict::Stop(StopKind::Untrusted));
    let wrong_key = seal::seal(
        &MessageKey::from_token("old token"),
        "roz/v1/estop/lab",
        r#"{"stop":true,"by":"c"}"#,
    );
    assert_eq!(verdict(&f, &wrong_key), Verdict::Stop(StopKind::Untrusted));
    // so does garbage, and the empty message that deletes the retained command
    assert_eq!(verdict(&f, b"\xff\x00"), Verdict::Stop(StopKind::Untrusted));
    assert_eq!(verdict(&f, b""), Verdict::Stop(StopKind::Untrusted));
    assert_eq!(f.ignored().unauthenticated_commands, 6);
    // a sealed clear moved from another environment's topic is not authentic
    let elsewhere = seal::seal(
        &key(),
        "roz/v1/estop/other",
        &serde_json::to_string(&FleetStopCommand {
            stop: false,
            reason: String::new(),
            by: None,
            id: Some("m".into()),
            at_ms: Some(now + 10),
        })
        .unwrap(),
    );
    assert_eq!(verdict(&f, &elsewhere), Verdict::Stop(StopKind::Untrusted));
    // the fleet's own clear, issued after the stops
    let clear_at = crate::clock::now_ms() + 1;
    assert_eq!(
        verdict(&f, &sealed_command(false, "c1", clear_at)),
        Verdict::Clear
    );
    // replayed after a newer stop: refused, and not a stop either
    assert_eq!(
        verdict(&f, &sealed_command(true, "s2", clear_at + 1)),
        Verdict::Stop(StopKind::Authentic)
    );
    assert!(matches!(
        verdict(&f, &sealed_command(false, "c1", clear_at)),
        Verdict::Refused(stop::Refusal::OlderThanApplied { .. })
    ));
    assert_eq!(f.ignored().stale_commands, 1);
    let oversized = vec![b' '; record::MAX_COMMAND_BYTES + 1];
    assert_eq!(verdict(&f, &oversized), Verdict::Stop(StopKind::Untrusted));
    assert_eq!(f.ignored().invalid, 1);
    assert_eq!(f.link.stats().oversized, 1);
}

/// Issue 32, item 4: five odd messages that ask to stop did nothing, sealed
/// with the fleet key or not. Every one of them latches now, naming its
/// defect and nothing of its content; so do clears that are not valid
/// clears of the fleet. The fleet's valid clear still clears.
#[test]
fn every_message_on_the_stop_topic_but_the_fleets_clear_latches_with_its_defect() {
    let f = fleet(FLEET);
    let topic = "roz/v1/estop/lab";
    let big = format!(r#"{{"stop":true,"reason":"{}"}}"#, "x".repeat(9 * 1024));
    let at = crate::clock::now_ms();
    let bad_clear_at = format!(r#"{{"stop":false,"by":"b","id":"c","at_ms":"{at}"}}"#);
    let odd = [
        (big.as_str(), "more than the 8192 bytes a command may have"),
        (r#"{"stop":true,"at_ms":"now"}"#, "`at_ms` is a string"),
        (
            r#"{"stop":"true"}"#,
            "`stop` is a string, not true or false",
        ),
        (r#"{"stop":1}"#, "`stop` is a number, not true or false"),
        (r#"{"stop":true,}"#, "trailing comma"),
        // clears that are not valid: they do not clear, they stop
        (bad_clear_at.as_str(), "`at_ms` is a string"),
        (
            r#"{"stop":false,"by":"b","id":"d"}"#,
            "without its issue time",
        ),
        (
            r#"{"stop":"false","by":"b","at_ms":1}"#,
            "`stop` is a string",
        ),
    ];
    let mut counted = f.ignored();
    for (body, defect) in odd {
        for sealed in [false, true] {
            let payload = if sealed {
                seal::seal(&key(), topic, body)
            } else {
                body.as_bytes().to_vec()
            };
            let what = format!("{} (sealed: {sealed})", &body[..body.len().min(40)]);
            let judged = f.command_received(&payload, None);
            assert_eq!(
                judged.verdict,
                Verdict::Stop(StopKind::Untrusted),
                "{what}: {judged:?}"
            );
            let reason = judged.stop_reason("lab");
            assert!(reason.contains(defect), "{what}: {reason}");
            assert!(
                !reason.contains("xxxx") && !reason.contains("now") && !reason.contains("host b"),
                "{what}: nothing of it is believed: {reason}"
            );
            assert_eq!(judged.sender(), None, "{what}");
            let oversized = payload.len() > record::MAX_COMMAND_BYTES;
            if sealed || oversized {
                counted.invalid += 1;
                if sealed && !oversized {
                    assert!(
                        reason.contains("from a fleet member (sealed with the fleet key)"),
                        "{what}: {reason}"
                    );
                }
            } else {
                counted.unauthenticated_commands += 1;
                assert!(
                    reason.contains("from an unauthenticated MQTT publisher"),
                    "{what}: {reason}"
                );
            }
            assert_eq!(f.ignored(), counted, "{what}");
        }
    }
    // The empty message that deletes the retained command: not a clear.
    let judged = f.command_received(b"", None);
    assert_eq!(judged.message, Message::Untrusted(Defect::Empty));
    assert_eq!(judged.verdict, Verdict::Stop(StopKind::Untrusted));
    assert!(judged.stop_reason("lab").contains("an empty message"));
    // An unsealed, well-formed clear: not a clear either.
    let judged = f.command_received(
        format!(r#"{{"stop":false,"by":"b","id":"e","at_ms":{at}}}"#).as_bytes(),
        None,
    );
    assert!(
        matches!(judged.message, Message::Untrusted(Defect::UnsealedClear(_))),
        "{judged:?}"
    );
    assert!(judged.stop_reason("lab").contains("without a valid MAC"));
    // The fleet's clear, issued after all of these latched, clears.
    let clear_at = crate::clock::now_ms() + 1;
    let judged = f.command_received(&sealed_command(false, "c1", clear_at), None);
    assert_eq!(judged.verdict, Verdict::Clear);
    assert_eq!(judged.sender(), Some("b"));
}

#[test]
fn the_audit_names_only_authentic_senders() {
    let mut c = FleetStopCommand {
        stop: true,
        reason: "smoke".into(),
        by: Some("mallory".into()),
        id: None,
        at_ms: None,
    };
    let judged = |message: Message, kind: StopKind| JudgedCommand {
        message,
        verdict: Verdict::Stop(kind),
    };
    let unsealed = judged(
        Message::Untrusted(Defect::UnsealedStop(seal::Unauthentic::NotSealed)),
        StopKind::Untrusted,
    );
    assert_eq!(
        unsealed.stop_reason("lab"),
        "fleet stop of environment lab from an unauthenticated MQTT publisher"
    );
    assert_eq!(unsealed.sender(), None);
    c.by = Some("b".into());
    let authentic = judged(Message::Authentic(c.clone()), StopKind::Authentic);
    assert_eq!(
        authentic.stop_reason("lab"),
        "fleet stop of environment lab from host b: smoke"
    );
    assert_eq!(authentic.sender(), Some("b"));
    let replayed = judged(Message::Authentic(c), StopKind::Replayed);
    assert!(replayed.stop_reason("lab").contains("replayed"));
}

/// With host certificates (`fleet.cert_file`) the fleet token goes only
/// over TLS: a record advertising `http://` is not relayed to, and a route
/// to an `https://` one carries the fleet CA and this host's certificate.
#[test]
fn with_host_certificates_only_tls_endpoints_are_routed_to() {
    let host: HostConfig = toml::from_str("id = \"a\"\nenvironment_id = \"lab\"\n").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, "").unwrap();
        path
    };
    let (ca, cert, key) = (file("fleet-ca.pem"), file("a.pem"), file("a.key"));
    let config = built(
        &format!(
            "url = \"mqtts://127.0.0.1:1\"\nca_file = {:?}\ncert_file = {:?}\nkey_file = {:?}\n",
            ca.display().to_string(),
            cert.display().to_string(),
            key.display().to_string()
        ),
        &host,
    );
    let f = Fleet::new(
        &host,
        Some(&config),
        Offer::default(),
        "127.0.0.1:7000".parse().unwrap(),
        ProtectiveStop::default(),
    );
    put(&f, "b", RecordStatus::Online, Some("http://127.0.0.1:7001"));
    put(
        &f,
        "c",
        RecordStatus::Online,
        Some("https://127.0.0.1:7002"),
    );
    match f.route("b", None) {
        Err(RouteError::Unavailable(why)) => assert!(why.contains("not TLS"), "{why}"),
        other => panic!("routed to a plaintext endpoint: {other:?}"),
    }
    match f.route("c", None) {
        Ok(Route::Remote(remote)) => {
            assert_eq!(remote.endpoint, "https://127.0.0.1:7002");
            assert_eq!(
                remote.tls,
                crate::tls::client::ClientTlsFiles {
                    ca_file: Some(ca.clone()),
                    cert_file: Some(cert.clone()),
                    key_file: Some(key.clone()),
                }
            );
        }
        other => panic!("{other:?}"),
    }
}

/// A record a lookup brings (of a host outside the view) is judged like
/// one the view takes: sealed for its exact topic, of its topic's
/// environment, not oversized, not older than one already taken; it is
/// not put into the view.
#[test]
fn a_looked_up_record_is_judged_like_any_record_and_not_held() {
    let f = fleet(FLEET);
    let mut r = record_of(&f, "f", RecordStatus::Online, Some("http://127.0.0.1:7009"));
    r.environment_id = "field".into();
    let topic = "roz/v1/hosts/field/f";
    let sealed = seal::seal(&key(), topic, &serde_json::to_string(&r).unwrap());
    let taken = f.looked_up_received("field", "f", topic, &sealed).unwrap();
    assert_eq!(
        taken.as_ref().map(|t| t.environment_id.as_str()),
        Some("field")
    );
    assert!(f.get("f").is_none(), "a looked-up record is not held");
    assert_eq!(f.list(None).len(), 1);
    // unsealed
    let plain = serde_json::to_vec(&r).unwrap();
    assert!(matches!(
        f.looked_up_received("field", "f", topic, &plain),
        Err(Rejected::Unauthenticated(_))
    ));
    // sealed for another environment's topic, or moved there
    let elsewhere = seal::seal(
        &key(),
        "roz/v1/hosts/lab/f",
        &serde_json::to_string(&r).unwrap(),
    );
    assert!(matches!(
        f.looked_up_received("lab", "f", "roz/v1/hosts/lab/f", &elsewhere),
        Err(Rejected::WrongEnvironment { .. })
    ));
    assert!(
        f.looked_up_received("lab", "f", "roz/v1/hosts/lab/f", &sealed)
            .is_err()
    );
    // oversized
    assert!(matches!(
        f.looked_up_received(
            "field",
            "f",
            topic,
            &vec![b'x'; record::MAX_RECORD_BYTES + 1]
        ),
        Err(Rejected::Oversized { .. })
    ));
    // older than the one taken: a replay
    let mut old = r.clone();
    old.last_heartbeat_ms = Some(r.stamp_ms() - 1_000);
    let old = seal::seal(&key(), topic, &serde_json::to_string(&old).unwrap());
    assert!(matches!(
        f.looked_up_received("field", "f", topic, &old),
        Err(Rejected::Replayed { .. })
    ));
    // a cleared record finds nothing
    assert_eq!(
        f.looked_up_received("field", "f", topic, b"").unwrap(),
        None
    );
    let ignored = f.ignored();
    assert_eq!(
        (
            ignored.unauthenticated_records,
            ignored.replayed_records,
            ignored.invalid
        ),
        (2, 1, 2),
        "{ignored:?}"
    );
}

/// A record with this host's id in another environment: a live one of
/// another process is another rozd with this id; an offline one is this
/// host's own from before it moved (to be cleared); anything unsealed or
/// not of its topic is ignored and counted.
#[test]
fn this_hosts_id_in_another_environment_is_an_impostor_or_its_old_record() {
    let f = fleet(FLEET);
    let topic = "roz/v1/hosts/field/a";
    let mut r = f.own_record(RecordStatus::Online);
    r.environment_id = "field".into();
    let seal_it = |r: &HostRecord| seal::seal(&key(), topic, &serde_json::to_string(r).unwrap());
    // our own instance's record there (cannot be, but is not a stranger)
    assert_eq!(
        f.own_record_elsewhere("field", topic, &seal_it(&r)),
        OwnElsewhere::Nothing
    );
    r.instance = Some("other".into());
    assert_eq!(
        f.own_record_elsewhere("field", topic, &seal_it(&r)),
        OwnElsewhere::Impostor {
            instance: Some("other".into())
        }
    );
    r.status = RecordStatus::Offline;
    assert_eq!(
        f.own_record_elsewhere("field", topic, &seal_it(&r)),
        OwnElsewhere::Left
    );
    // cleared, unsealed, of another environment than its topic: nothing
    assert_eq!(
        f.own_record_elsewhere("field", topic, b""),
        OwnElsewhere::Nothing
    );
    let plain = serde_json::to_vec(&r).unwrap();
    assert_eq!(
        f.own_record_elsewhere("field", topic, &plain),
        OwnElsewhere::Nothing
    );
    r.environment_id = "elsewhere".into();
    assert_eq!(
        f.own_record_elsewhere("field", topic, &seal_it(&r)),
        OwnElsewhere::Nothing
    );
    let ignored = f.ignored();
    assert_eq!((ignored.unauthenticated_records, ignored.invalid), (1, 1));
}
