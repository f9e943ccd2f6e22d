//! What the fleet puts on the broker: the host record (JSON, retained on
//! `<prefix>/hosts/<environment_id>/<host_id>`) and the fleet stop command (JSON, retained on
//! `<prefix>/estop/<environment_id>`), each sealed with the fleet key (see
//! [`super::seal`]; this module reads and writes the bodies). Parsing is
//! strict about sizes and shapes, lenient about unknown fields (a newer
//! rozd may add some).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::config::{check_endpoint, topic_level_ok};

/// Largest host record accepted (as published: sealed); larger ones are ignored.
pub const MAX_RECORD_BYTES: usize = 64 * 1024;
/// Largest stop command accepted (as published: sealed).
pub const MAX_COMMAND_BYTES: usize = 8 * 1024;
/// Bounds of a record's capabilities.
pub const MAX_CAPABILITIES: usize = 256;
pub const MAX_CAPABILITY_KEY: usize = 128;
pub const MAX_CAPABILITY_VALUE: usize = 8 * 1024;
pub const MAX_NAME: usize = 256;
/// Version of the record format this rozd writes.
pub const RECORD_VERSION: u32 = 1;

/// What a record says about its host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RecordStatus {
    /// A running rozd (refreshed every heartbeat).
    Online,
    /// A rozd that shut down, or whose connection the broker lost (last will).
    Offline,
    /// A host that is not a rozd, added with `RegisterHost`.
    Registered,
}

/// How the other hosts learn that a rozd is still alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Liveness {
    /// It republishes its record every `heartbeat_secs` (every rozd before
    /// publish-on-change; a record without `liveness` means this): a record
    /// that stops coming ages to `stale`, then `lost`.
    Heartbeat,
    /// Its record is republished only when it changes; its last will (the
    /// broker's keep-alive) says when it is gone, and it says it is alive
    /// on its liveness topic every `heartbeat_secs` for those who watch.
    Will,
    /// A kind a newer rozd may add: judged like `heartbeat` (it ages).
    #[serde(other)]
    Unknown,
}

/// A host saying it is alive (on [`Topics::alive`], every heartbeat, not
/// retained): the process (`instance`) and when (`at_ms`, its clock).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Alive {
    pub instance: String,
    pub at_ms: i64,
}

/// Most bytes a liveness message may have (it is about 150).
pub const MAX_ALIVE_BYTES: usize = 1024;

/// Why an `offline` record is offline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OfflineCause {
    /// The rozd shut down cleanly and said so.
    Shutdown,
    /// Its last will: the broker lost its connection (a crash, `kill -9`,
    /// a network failure, a silent host after 1.5 × its keep-alive).
    Will,
    /// A cause a newer rozd may add.
    #[serde(other)]
    Unknown,
}

/// A host's protective-stop state, as it reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ReportedStop {
    pub active: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_unix_ms: Option<i64>,
}

/// One host's retained record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostRecord {
    #[serde(default = "version_one")]
    pub v: u32,
    pub id: String,
    pub name: String,
    pub environment_id: String,
    pub status: RecordStatus,
    /// rozd: `sensors`, `actuators`, `host_tools`, `models` (comma-separated
    /// names), `architecture`, `version`. Registered hosts: what they were
    /// registered with.
    #[serde(default)]
    pub capabilities: BTreeMap<String, String>,
    /// The gRPC endpoint sessions are relayed to (rozd only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estop: Option<ReportedStop>,
    /// The publisher's heartbeat interval (a record older than three of them is stale).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_secs: Option<u64>,
    #[serde(default)]
    pub created_at_ms: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat_ms: Option<i64>,
    /// Random per rozd process: tells our own record from an older one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// How its liveness is known (absent: [`Liveness::Heartbeat`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub liveness: Option<Liveness>,
    /// Why it is offline (an `offline` record; absent from older rozds').
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<OfflineCause>,
    /// The publisher's MQTT keep-alive: how long the broker may take to
    /// publish its last will after it fell silent (the bound after which a
    /// silent host is `lost`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_alive_secs: Option<u64>,
}

fn version_one() -> u32 {
    1
}

impl HostRecord {
    /// When its publisher wrote it: its heartbeat time, or its creation
    /// time for a record without heartbeats (a registered host). A host's
    /// records only move forward in this (see `view`).
    pub fn stamp_ms(&self) -> i64 {
        self.last_heartbeat_ms.unwrap_or(self.created_at_ms)
    }

    /// Whether it is republished every heartbeat (and so ages when it is
    /// not), as opposed to only on change.
    pub fn refreshed_every_heartbeat(&self) -> bool {
        self.liveness != Some(Liveness::Will)
    }
}

/// Why a message was not taken into the view.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    #[error("{len} bytes, more than the {max} bytes a message there may have")]
    Oversized { len: usize, max: usize },
    #[error("not a valid message: {0}")]
    Malformed(String),
    #[error("the record is for host {record:?} but was published on the topic of {topic:?}")]
    WrongTopic { topic: String, record: String },
    #[error(
        "the record is of environment {record:?} but was published under environment {topic:?}"
    )]
    WrongEnvironment { topic: String, record: String },
    #[error("{field}: {why}")]
    Invalid { field: &'static str, why: String },
    #[error("the view already holds {0} hosts; new ones are ignored")]
    Full(usize),
    #[error("not authenticated: {0}")]
    Unauthenticated(#[from] super::seal::Unauthentic),
    #[error(
        "written at {stamp_ms}, before the newest record already taken from that host \
         ({newest_ms}): a replay (or that host's clock went back)"
    )]
    Replayed { stamp_ms: i64, newest_ms: i64 },
    #[error(
        "written at {stamp_ms}, more than {} s ahead of this host's clock ({now_ms})",
        super::stop::MAX_CLOCK_SKEW_MS / 1000
    )]
    Future { stamp_ms: i64, now_ms: i64 },
}

fn invalid(field: &'static str, why: impl Into<String>) -> Rejected {
    Rejected::Invalid {
        field,
        why: why.into(),
    }
}

/// Whether `id` can be a host id (as `host.id` in the configuration).
pub fn host_id_ok(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Checks a registered host's fields (also used for `RegisterHost`).
pub fn check_host_fields(
    name: &str,
    environment_id: &str,
    capabilities: &BTreeMap<String, String>,
) -> Result<(), Rejected> {
    if name.trim().is_empty() || name.chars().count() > MAX_NAME {
        return Err(invalid(
            "name",
            format!("must be 1-{MAX_NAME} characters, not only spaces"),
        ));
    }
    if !topic_level_ok(environment_id) {
        return Err(invalid(
            "environment_id",
            format!("{environment_id:?} must be 1-128 characters without '/', '+', '#'"),
        ));
    }
    if capabilities.len() > MAX_CAPABILITIES {
        return Err(invalid(
            "capabilities",
            format!("at most {MAX_CAPABILITIES} entries"),
        ));
    }
    for (k, v) in capabilities {
        if k.is_empty() || k.len() > MAX_CAPABILITY_KEY {
            return Err(invalid(
                "capabilities",
                format!("keys must be 1-{MAX_CAPABILITY_KEY} bytes"),
            ));
        }
        if v.len() > MAX_CAPABILITY_VALUE {
            return Err(invalid(
                "capabilities",
                format!("the value of {k:?} is longer than {MAX_CAPABILITY_VALUE} bytes"),
            ));
        }
    }
    Ok(())
}

/// Parses and checks a record published on the topic of `topic_id`.
pub fn parse_record(topic_id: &str, payload: &[u8]) -> Result<HostRecord, Rejected> {
    if payload.len() > MAX_RECORD_BYTES {
        return Err(Rejected::Oversized {
            len: payload.len(),
            max: MAX_RECORD_BYTES,
        });
    }
    let record: HostRecord =
        serde_json::from_slice(payload).map_err(|e| Rejected::Malformed(e.to_string()))?;
    if record.id != topic_id {
        return Err(Rejected::WrongTopic {
            topic: topic_id.to_string(),
            record: record.id,
        });
    }
    if !host_id_ok(&record.id) {
        return Err(invalid("id", format!("{:?} is not a host id", record.id)));
    }
    check_host_fields(&record.name, &record.environment_id, &record.capabilities)?;
    if let Some(endpoint) = &record.endpoint {
        check_endpoint(endpoint).map_err(|why| invalid("endpoint", why))?;
    }
    if let Some(secs) = record.heartbeat_secs
        && !(1..=3600).contains(&secs)
    {
        return Err(invalid("heartbeat_secs", "must be between 1 and 3600"));
    }
    if let Some(secs) = record.keep_alive_secs
        && !(1..=65_535).contains(&secs)
    {
        return Err(invalid("keep_alive_secs", "must be between 1 and 65535"));
    }
    Ok(record)
}

/// A fleet-wide protective-stop command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FleetStopCommand {
    /// `true`: stop every host of the environment; `false`: withdraw the
    /// stop (hosts clear a latch that came from the fleet).
    pub stop: bool,
    #[serde(default)]
    pub reason: String,
    /// The host that published it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// Unique per command: a host applies one command once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_ms: Option<i64>,
}

/// Parses a stop command: JSON `{"stop": bool, ...}`, or a bare `stop`,
/// `true` or `1` (as an operator's `mosquitto_pub` would send). A clear
/// (`"stop": false`) must carry its issue time `at_ms`. The error names the
/// defect (`Rejected::Malformed`) without repeating anything of the
/// message: nothing in a message that is not a valid command is trusted,
/// and the defect goes into the audit.
pub fn parse_command(payload: &[u8]) -> Result<FleetStopCommand, Rejected> {
    if payload.len() > MAX_COMMAND_BYTES {
        return Err(Rejected::Oversized {
            len: payload.len(),
            max: MAX_COMMAND_BYTES,
        });
    }
    if payload.iter().all(u8::is_ascii_whitespace) {
        return Err(Rejected::Malformed("a blank message".into()));
    }
    if crate::safety::inputs::is_stop_payload(payload) {
        return Ok(FleetStopCommand {
            stop: true,
            reason: String::new(),
            by: None,
            id: None,
            at_ms: None,
        });
    }
    // Only an object: serde would also take the fields as an array.
    let object = payload.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    let parsed = serde_json::from_slice(payload).and_then(|command: FleetStopCommand| {
        if object {
            Ok(command)
        } else {
            Err(serde::de::Error::custom("not an object"))
        }
    });
    let command = parsed.map_err(|e| Rejected::Malformed(command_defect(payload, &e)))?;
    if !command.stop && command.at_ms.is_none() {
        return Err(Rejected::Malformed(
            "a clear without its issue time `at_ms`".into(),
        ));
    }
    Ok(command)
}

/// What is wrong with `payload`, which is not a valid command (`e`), in
/// words that repeat nothing of it (serde's data errors quote values).
fn command_defect(payload: &[u8], e: &serde_json::Error) -> String {
    use serde_json::Value;
    fn kind(v: &Value) -> &'static str {
        match v {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Number(_) => "a number",
            Value::String(_) => "a string",
            Value::Array(_) => "an array",
            Value::Object(_) => "an object",
        }
    }
    if e.is_syntax() || e.is_eof() {
        // Syntax errors name what was expected and where, never a value.
        return format!("not JSON: {e}");
    }
    let Ok(value) = serde_json::from_slice::<Value>(payload) else {
        return "not JSON".into();
    };
    let Some(fields) = value.as_object() else {
        return format!("{}, not a JSON object", kind(&value));
    };
    let defect = |name: &str, ok: fn(&Value) -> bool, expected: &str| {
        fields
            .get(name)
            .filter(|v| !ok(v))
            .map(|v| format!("`{name}` is {}, not {expected}", kind(v)))
    };
    let optional_string = |v: &Value| v.is_string() || v.is_null();
    let optional_integer = |v: &Value| v.is_i64() || v.is_null();
    if !fields.contains_key("stop") {
        return "no `stop` field".into();
    }
    defect("stop", Value::is_boolean, "true or false")
        .or_else(|| defect("reason", Value::is_string, "a string"))
        .or_else(|| defect("by", optional_string, "a string"))
        .or_else(|| defect("id", optional_string, "a string"))
        .or_else(|| {
            defect(
                "at_ms",
                optional_integer,
                "an integer (milliseconds since the epoch)",
            )
        })
        // The fields are right, yet it did not parse: a field given twice.
        .unwrap_or_else(|| format!("not a command (at line {} column {})", e.line(), e.column()))
}

/// The topics under the configured prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topics {
    prefix: String,
}

impl Topics {
    pub fn new(prefix: &str) -> Topics {
        Topics {
            prefix: prefix.to_string(),
        }
    }

    /// Where host `id` of `environment_id` keeps its retained record.
    pub fn host(&self, environment_id: &str, id: &str) -> String {
        format!("{}/hosts/{environment_id}/{id}", self.prefix)
    }

    /// Where rozds before per-environment records kept host `id`'s record
    /// (a rozd clears its own there when it starts).
    pub fn legacy_host(&self, id: &str) -> String {
        format!("{}/hosts/{id}", self.prefix)
    }

    /// The subscription that sees the records of `environment_id`.
    pub fn hosts_in(&self, environment_id: &str) -> String {
        format!("{}/hosts/{environment_id}/+", self.prefix)
    }

    /// The subscription that sees every host record of every environment.
    pub fn all_hosts(&self) -> String {
        format!("{}/hosts/+/+", self.prefix)
    }

    /// The subscription that sees host `id`'s record, whatever its
    /// environment (a lookup of a host outside this host's view).
    pub fn host_anywhere(&self, id: &str) -> String {
        format!("{}/hosts/+/{id}", self.prefix)
    }

    pub fn stop(&self, environment_id: &str) -> String {
        format!("{}/estop/{environment_id}", self.prefix)
    }

    /// Where host `id` of `environment_id` says it is alive (not retained).
    pub fn alive(&self, environment_id: &str, id: &str) -> String {
        format!("{}/alive/{environment_id}/{id}", self.prefix)
    }

    /// The subscription that hears the hosts of `environment_id` say they
    /// are alive: only the hosts of one environment, not the whole fleet.
    pub fn alive_in(&self, environment_id: &str) -> String {
        format!("{}/alive/{environment_id}/+", self.prefix)
    }

    /// The environment and host id of a liveness topic.
    pub fn alive_of<'a>(&self, topic: &'a str) -> Option<(&'a str, &'a str)> {
        let rest = topic
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix("/alive/")?;
        let (environment, id) = rest.split_once('/')?;
        (!environment.is_empty() && !id.is_empty() && !id.contains('/'))
            .then_some((environment, id))
    }

    /// The environment and host id of a record topic.
    pub fn host_of<'a>(&self, topic: &'a str) -> Option<(&'a str, &'a str)> {
        let rest = topic
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix("/hosts/")?;
        let (environment, id) = rest.split_once('/')?;
        (!environment.is_empty() && !id.is_empty() && !id.contains('/'))
            .then_some((environment, id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn record(id: &str) -> HostRecord {
        HostRecord {
            v: RECORD_VERSION,
            id: id.to_string(),
            name: format!("host {id}"),
            environment_id: "lab".into(),
            status: RecordStatus::Online,
            capabilities: BTreeMap::from([("sensors".into(), "t,rh".into())]),
            endpoint: Some("http://127.0.0.1:9000".into()),
            estop: None,
            heartbeat_secs: Some(10),
            created_at_ms: 1,
            last_heartbeat_ms: Some(2),
            instance: Some("i".into()),
            liveness: Some(Liveness::Will),
            cause: None,
            keep_alive_secs: Some(15),
        }
    }

    #[test]
    fn records_round_trip_and_unknown_fields_are_tolerated() {
        let r = record("b");
        let json = serde_json::to_vec(&r).unwrap();
        assert_eq!(parse_record("b", &json).unwrap(), r);
        let mut value: serde_json::Value = serde_json::from_slice(&json).unwrap();
        value["from_the_future"] = serde_json::json!({"x": 1});
        let newer = serde_json::to_vec(&value).unwrap();
        assert_eq!(parse_record("b", &newer).unwrap(), r);
        // an older rozd's record: no liveness (it heartbeats), no cause
        value["liveness"] = serde_json::Value::Null;
        let mut old = value.clone();
        old.as_object_mut().unwrap().remove("liveness");
        old.as_object_mut().unwrap().remove("keep_alive_secs");
        let old = parse_record("b", &serde_json::to_vec(&old).unwrap()).unwrap();
        assert!(old.refreshed_every_heartbeat());
        assert_eq!((old.liveness, old.cause), (None, None));
        // a newer rozd's kinds are taken, judged on the safe side
        let mut newer = value.clone();
        newer["liveness"] = serde_json::json!("gossip");
        newer["cause"] = serde_json::json!("meteor");
        newer["status"] = serde_json::json!("offline");
        let newer = parse_record("b", &serde_json::to_vec(&newer).unwrap()).unwrap();
        assert_eq!(newer.liveness, Some(Liveness::Unknown));
        assert!(newer.refreshed_every_heartbeat());
        assert_eq!(newer.cause, Some(OfflineCause::Unknown));
    }

    #[test]
    fn bad_records_are_rejected_with_the_reason() {
        let good = serde_json::to_vec(&record("b")).unwrap();
        assert!(matches!(
            parse_record("c", &good),
            Err(Rejected::WrongTopic { .. })
        ));
        assert!(matches!(
            parse_record("b", b"{not json"),
            Err(Rejected::Malformed(_))
        ));
        assert!(matches!(
            parse_record("b", b"{\"id\":\"b\"}"),
            Err(Rejected::Malformed(_))
        ));
        let mut big = record("b");
        big.capabilities
            .insert("blob".into(), "x".repeat(MAX_RECORD_BYTES));
        assert!(matches!(
            parse_record("b", &serde_json::to_vec(&big).unwrap()),
            Err(Rejected::Oversized { .. })
        ));
        let mut r = record("b");
        r.environment_id = "lab/#".into();
        assert!(matches!(
            parse_record("b", &serde_json::to_vec(&r).unwrap()),
            Err(Rejected::Invalid {
                field: "environment_id",
                ..
            })
        ));
        let mut r = record("b");
        r.endpoint = Some("ftp://x:1".into());
        assert!(matches!(
            parse_record("b", &serde_json::to_vec(&r).unwrap()),
            Err(Rejected::Invalid {
                field: "endpoint",
                ..
            })
        ));
        let mut r = record("b");
        r.heartbeat_secs = Some(0);
        assert!(parse_record("b", &serde_json::to_vec(&r).unwrap()).is_err());
        let mut r = record("b");
        r.name = " ".into();
        assert!(parse_record("b", &serde_json::to_vec(&r).unwrap()).is_err());
        let mut r = record("b");
        r.capabilities = (0..=MAX_CAPABILITIES)
            .map(|i| (i.to_string(), String::new()))
            .collect();
        assert!(parse_record("b", &serde_json::to_vec(&r).unwrap()).is_err());
        let r = record("b c");
        assert!(parse_record("b c", &serde_json::to_vec(&r).unwrap()).is_err());
    }

    #[test]
    fn commands() {
        assert!(parse_command(b"stop").unwrap().stop);
        assert!(parse_command(b" 1\n").unwrap().stop);
        let c = parse_command(br#"{"stop":false,"reason":"done","by":"a","id":"x","at_ms":5}"#)
            .unwrap();
        assert!(!c.stop);
        assert_eq!((c.reason.as_str(), c.id.as_deref()), ("done", Some("x")));
        let c =
            parse_command(br#"{"stop":true,"by":null,"id":null,"at_ms":null,"new":1}"#).unwrap();
        assert!(c.stop && c.by.is_none() && c.at_ms.is_none());
        assert!(matches!(
            parse_command(&vec![b' '; MAX_COMMAND_BYTES + 1]),
            Err(Rejected::Oversized { .. })
        ));
    }

    /// Every command that cannot be used is refused naming its defect, and
    /// nothing of its content (serde's own messages quote values).
    #[test]
    fn bad_commands_name_their_defect_not_their_content() {
        let defect = |payload: &[u8]| match parse_command(payload) {
            Err(Rejected::Malformed(why)) => why,
            other => panic!("{:?}: {other:?}", String::from_utf8_lossy(payload)),
        };
        for (payload, named) in [
            (&b""[..], "blank"),
            (b" \n", "blank"),
            (b"clear", "not JSON: expected value"),
            (b"0", "a number, not a JSON object"),
            (b"[true]", "an array, not a JSON object"),
            (br#"{"reason":"no stop field"}"#, "no `stop` field"),
            (br#"{"stop":true,}"#, "not JSON: trailing comma"),
            (
                br#"{"stop":"SECRET"}"#,
                "`stop` is a string, not true or false",
            ),
            (br#"{"stop":1}"#, "`stop` is a number, not true or false"),
            (br#"{"stop":null}"#, "`stop` is null"),
            (br#"{"stop":true,"reason":7}"#, "`reason` is a number"),
            (br#"{"stop":true,"by":["SECRET"]}"#, "`by` is an array"),
            (br#"{"stop":true,"id":{}}"#, "`id` is an object"),
            (br#"{"stop":true,"at_ms":"SECRET"}"#, "`at_ms` is a string"),
            (
                br#"{"stop":true,"at_ms":1.5}"#,
                "`at_ms` is a number, not an integer",
            ),
            (
                br#"{"stop":true,"at_ms":1e30}"#,
                "`at_ms` is a number, not an integer",
            ),
            (br#"{"stop":true,"stop":"SECRET"}"#, "`stop` is a string"),
            (br#"{"stop":true,"stop":false}"#, "not a command (at line 1"),
            (
                br#"{"stop":false}"#,
                "a clear without its issue time `at_ms`",
            ),
            (
                br#"{"stop":false,"at_ms":null}"#,
                "a clear without its issue time",
            ),
        ] {
            let why = defect(payload);
            assert!(
                why.contains(named) && !why.contains("SECRET"),
                "{:?}: {why}",
                String::from_utf8_lossy(payload)
            );
        }
    }

    #[test]
    fn topics() {
        let t = Topics::new("roz/v1");
        assert_eq!(t.host("lab", "a"), "roz/v1/hosts/lab/a");
        assert_eq!(t.legacy_host("a"), "roz/v1/hosts/a");
        assert_eq!(t.hosts_in("lab"), "roz/v1/hosts/lab/+");
        assert_eq!(t.all_hosts(), "roz/v1/hosts/+/+");
        assert_eq!(t.host_anywhere("a"), "roz/v1/hosts/+/a");
        assert_eq!(t.stop("lab"), "roz/v1/estop/lab");
        assert_eq!(t.host_of("roz/v1/hosts/lab/a"), Some(("lab", "a")));
        // an older rozd's topic, no environment: not a record topic now
        assert_eq!(t.host_of("roz/v1/hosts/a"), None);
        assert_eq!(t.host_of("roz/v1/hosts/lab/"), None);
        assert_eq!(t.host_of("roz/v1/hosts//a"), None);
        assert_eq!(t.host_of("roz/v1/hosts/lab/a/b"), None);
        assert_eq!(t.host_of("roz/v2/hosts/lab/a"), None);
        assert_eq!(t.host_of("roz/v1/estop/lab"), None);
    }
}

/// Whatever arrives on a fleet topic is a record, a command, or refused;
/// never a panic.
#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;

    fn payload() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            prop::collection::vec(any::<u8>(), 0..400),
            // JSON-looking payloads with the fields a record and a command use.
            prop::collection::vec(
                prop::sample::select(vec![
                    "{",
                    "}",
                    "[",
                    "]",
                    ",",
                    ":",
                    "\"id\"",
                    "\"host_id\"",
                    "\"status\"",
                    "\"online\"",
                    "\"stop\"",
                    "true",
                    "false",
                    "\"stamp_ms\"",
                    "1",
                    "-1",
                    "1e400",
                    "null",
                    "\"x\"",
                    "\"endpoint\"",
                    "\"http://a:1\"",
                ]),
                0..60,
            )
            .prop_map(|parts| parts.concat().into_bytes()),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn any_payload_is_a_record_or_refused(id in "[a-z0-9_.-]{0,12}", bytes in payload()) {
            let _ = parse_record(&id, &bytes);
            let _ = parse_command(&bytes);
        }
    }
}
