//! Unit tests of loading, validating, locating and summarising.

use std::path::{Path, PathBuf};

use super::types::{ControlSocket, default_store_path};
use super::*;
use crate::hw::config::{ActuatorTarget, SensorSource};

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(
        text,
        ConfigSource::File(PathBuf::from("/etc/rozd/test.toml")),
    )
}

fn invalid(text: &str) -> (String, Option<usize>, String) {
    match parse(text) {
        Err(ConfigError::Invalid {
            file, line, key, ..
        }) => (file, line, key),
        other => panic!("expected an invalid-config error, got {other:?}"),
    }
}

#[test]
fn tasks_section_errors_name_line_and_key() {
    for (text, line, key) in [
        ("[tasks]\nmax_concurrent = 0\n", 2, "tasks.max_concurrent"),
        ("[tasks]\nmax_workers = 1000\n", 2, "tasks.max_workers"),
        (
            "[tasks]\nmax_timeout_secs = 60\ndefault_timeout_secs = 61\n",
            3,
            "tasks.default_timeout_secs",
        ),
        ("[tasks]\nai_mode = \"plan\"\n", 2, "tasks.ai_mode"),
        ("[tasks]\nmodel = \"gpt-nope\"\n", 2, "tasks.model"),
        ("[tasks]\nmax_workers = -1\n", 2, "tasks.max_workers"),
    ] {
        let (_, found_line, found_key) = invalid(text);
        assert_eq!(
            (found_line, found_key.as_str()),
            (Some(line), key),
            "{text}"
        );
    }
    let c = parse("[tasks]\nai_mode = \"react\"\nmax_workers = 0\n").unwrap();
    assert_eq!(c.tasks.ai_mode, AiMode::React);
    assert_eq!(c.tasks.max_workers, 0);
    let c = parse("[tasks]\nai_mode = \"ooda\"\n").unwrap();
    assert_eq!(
        c.tasks.ai_mode,
        AiMode::OodaReAct,
        "the aliases sessions accept"
    );
}

#[test]
fn ooda_loop_settings_are_validated_naming_line_and_key() {
    for (text, line, key) in [
        (
            "[ooda]\ntick_hz = 100\npublish_hz = 200\n",
            3,
            "ooda.publish_hz",
        ),
        (
            "[ooda]\nrealtime_priority = 0\n",
            2,
            "ooda.realtime_priority",
        ),
        ("[ooda]\ncpu_affinity = []\n", 2, "ooda.cpu_affinity"),
        (
            "[ooda]\ntimer = \"runtime\"\nrealtime_priority = 10\n",
            2,
            "ooda.timer",
        ),
        ("[ooda]\ntimer = \"fast\"\n", 2, "ooda.timer"),
    ] {
        let (_, found_line, found_key) = invalid(text);
        assert_eq!(
            (found_line, found_key.as_str()),
            (Some(line), key),
            "{text}"
        );
    }
    let c = parse("[ooda]\ntick_hz = 1000\nrealtime_priority = 50\ncpu_affinity = [1]\n").unwrap();
    let l = c.ooda.loop_config();
    assert_eq!(l.publish_hz, 50.0, "at most 50 Hz by default");
    assert_eq!(l.realtime.priority, Some(50));
}

#[test]
fn one_parser_for_every_ai_mode_spelling() {
    for (text, mode) in [
        ("react", AiMode::React),
        ("ooda_re_act", AiMode::OodaReAct),
        ("ooda", AiMode::OodaReAct),
        ("ooda_react", AiMode::OodaReAct),
    ] {
        assert_eq!(AiMode::parse(text), Some(mode), "{text}");
        assert!(AiMode::SPELLINGS.contains(&text));
    }
    for bad in ["", "React", "plan", "ooda-react"] {
        assert_eq!(AiMode::parse(bad), None, "{bad:?}");
    }
    assert_eq!(AiMode::default(), AiMode::OodaReAct);
    assert_eq!(AiMode::parse(AiMode::React.as_str()), Some(AiMode::React));
}

#[test]
fn builtin_config_is_a_valid_simulated_host() {
    let c = Config::parse(BUILTIN_CONFIG, ConfigSource::BuiltIn).unwrap();
    assert_eq!(c.server.listen, "127.0.0.1:8080".parse().unwrap());
    assert!(!c.auth_required());
    // No hardware needed: only simulated and host-system sources.
    assert!(c.hardware.sensors.iter().all(|s| matches!(
        s.source,
        SensorSource::Sim(_) | SensorSource::World(_) | SensorSource::System { .. }
    )));
    let actuators = &c.hardware.actuators;
    assert!(
        (actuators.iter()).all(|a| matches!(a.target, ActuatorTarget::Sim { .. })),
        "{actuators:?}"
    );
    assert!(c.hardware.sensors.len() >= 3 && !actuators.is_empty());
    assert_eq!(
        Some(c.host.id),
        machine_hostname().or(Some("rozd-host".into()))
    );
}

#[test]
fn documented_example_config_is_valid() {
    let text = include_str!("../../config/rozd.toml");
    let c = parse(text).unwrap();
    assert_eq!(c.host.id, "rover-1");
    assert_eq!(c.permissions.len(), 2);
    assert_eq!(c.permissions[1].policy, Policy::Block);
    let endpoints: Vec<&str> = c.model.endpoints.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(endpoints, ["claude", "lab-box"]);
}

#[test]
fn unknown_key_names_file_line_and_key() {
    let (file, line, key) =
        invalid("[host]\nid = \"a\"\n\n[server]\nlisten = \"127.0.0.1:1\"\nlisen = 3\n");
    assert_eq!(file, "/etc/rozd/test.toml");
    assert_eq!(line, Some(6));
    assert_eq!(key, "server.lisen");
}

#[test]
fn absurd_timeouts_are_refused_not_overflowed() {
    let (_, line, key) = invalid("[session]\napproval_timeout_secs = 18446744073709551615\n");
    assert_eq!(
        (line, key.as_str()),
        (Some(2), "session.approval_timeout_secs")
    );
    let (_, _, key) = invalid("[session]\nkeepalive_secs = 9999999999\n");
    assert_eq!(key, "session.keepalive_secs");
}

#[test]
fn wrong_type_names_line_and_key() {
    let (_, line, key) = invalid("[session]\nkeepalive_secs = \"ten\"\n");
    assert_eq!((line, key.as_str()), (Some(2), "session.keepalive_secs"));
}

#[test]
fn bad_address_names_line_and_key() {
    let (_, line, key) = invalid("\n[server]\nlisten = \"localhost:99999\"\n");
    assert_eq!((line, key.as_str()), (Some(3), "server.listen"));
}

#[test]
fn semantic_errors_point_at_the_key_in_arrays_of_tables() {
    let text = "[[actuators]]\nname = \"a\"\nkind = \"sim\"\nmin = 0\nmax = 1\nsafe_value = 0\n\n\
                [[actuators]]\nname = \"b\"\nkind = \"sim\"\nmin = 0\nmax = 1\nsafe_value = 5\n";
    let (_, line, key) = invalid(text);
    assert_eq!((line, key.as_str()), (Some(13), "actuators[1].safe_value"));
}

#[test]
fn non_loopback_without_tokens_is_refused_unless_allowed() {
    let (_, line, key) = invalid("[server]\nlisten = \"0.0.0.0:8080\"\n");
    assert_eq!((line, key.as_str()), (Some(2), "server.listen"));
    let plaintext = "allow_plaintext_remote = true\n";
    assert!(
        parse(&format!(
            "[server]\nlisten = \"0.0.0.0:8080\"\nauth_tokens = [\"t0ken\"]\n{plaintext}"
        ))
        .is_ok()
    );
    assert!(
        parse(&format!(
            "[server]\nlisten = \"0.0.0.0:8080\"\nallow_unauthenticated_remote = true\n{plaintext}"
        ))
        .is_ok()
    );
}

#[test]
fn non_loopback_without_tls_is_refused_unless_allowed() {
    let c = "[server]\nlisten = \"0.0.0.0:8080\"\nauth_tokens = [\"t0ken\"]\n";
    let (_, line, key) = invalid(c);
    assert_eq!((line, key.as_str()), (Some(2), "server.listen"));
    let message = parse(c).unwrap_err().to_string();
    assert!(message.contains("allow_plaintext_remote"), "{message}");
    assert!(parse(&format!("{c}allow_plaintext_remote = true\n")).is_ok());
    // Loopback needs neither.
    assert!(parse("[server]\nlisten = \"127.0.0.1:8080\"\n").is_ok());
    // [server.tls] with files that are not there names the key.
    let (_, _, key) = invalid(&format!(
        "{c}[server.tls]\ncert_file = \"/nonexistent/c.pem\"\nkey_file = \"/nonexistent/k.pem\"\n"
    ));
    assert_eq!(key, "server.tls.cert_file");
    let (_, _, key) = invalid(
        "[server.tls]\ncert_file = \"/x\"\nkey_file = \"/y\"\nclient_auth = \"required\"\n",
    );
    assert_eq!(key, "server.tls.client_ca_file");
}

#[test]
fn server_limits_hosts_and_socket_errors_name_line_and_key() {
    for (text, line, key) in [
        (
            "[server]\nmax_connections = 0\n",
            2,
            "server.max_connections",
        ),
        (
            "[server]\nmax_connections = -5\n",
            2,
            "server.max_connections",
        ),
        (
            "[server]\n\nheader_read_timeout_secs = 0\n",
            3,
            "server.header_read_timeout_secs",
        ),
        (
            "[server]\nidle_timeout_secs = 86401\n",
            2,
            "server.idle_timeout_secs",
        ),
        (
            "[server]\nshutdown_grace_secs = 3601\n",
            2,
            "server.shutdown_grace_secs",
        ),
        (
            "[server]\nauth_tokens = [\"ok\", \" \"]\n",
            2,
            "server.auth_tokens",
        ),
        (
            "[server.tls]\ncert_file = \"/x\"\nkey_file = \"/y\"\nhandshake_timeout_secs = 0\n",
            4,
            "server.tls.handshake_timeout_secs",
        ),
        (
            "[server.tls]\ncert_file = \"/x\"\nkey_file = \"/y\"\nhandshake_timeout_secs = 301\n",
            4,
            "server.tls.handshake_timeout_secs",
        ),
        (
            "[server.tls]\ncert_file = \"/x\"\nkey_file = \"/y\"\nreload_check_secs = 86401\n",
            4,
            "server.tls.reload_check_secs",
        ),
        (
            "[server]\nhttp2_keepalive_secs = 86401\n",
            2,
            "server.http2_keepalive_secs",
        ),
        (
            "[server]\nallowed_hosts = [\"robot.lab\", \"http://x\"]\n",
            2,
            "server.allowed_hosts",
        ),
        (
            "[server]\ncontrol_socket = \"rel.sock\"\n",
            2,
            "server.control_socket",
        ),
        (
            &format!("[server]\ncontrol_socket = \"/{}\"\n", "x".repeat(200)),
            2,
            "server.control_socket",
        ),
    ] {
        let (_, found_line, found_key) = invalid(text);
        assert_eq!(
            (found_line, found_key.as_str()),
            (Some(line), key),
            "{text}"
        );
    }
    let c =
        parse("[server]\nmax_connections = 32\nallowed_hosts = [\"*\"]\ncontrol_socket = \"\"\n")
            .unwrap();
    assert_eq!(c.server.max_connections, 32);
    assert_eq!(c.server.control_socket, ControlSocket::Disabled);
    assert_eq!(c.server.control_socket.path(&c.store), None);
    let c = parse("[server]\ncontrol_socket = \"/run/x/c.sock\"\n").unwrap();
    assert_eq!(
        c.server.control_socket.path(&c.store),
        Some(PathBuf::from("/run/x/c.sock"))
    );
    let c = parse("[store]\npath = \"/var/tmp/r/rozd.db\"\n").unwrap();
    if std::env::var_os("RUNTIME_DIRECTORY").is_none() {
        assert_eq!(
            c.server.control_socket.path(&c.store),
            Some(PathBuf::from("/var/tmp/r/control.sock"))
        );
    }
}

#[test]
fn server_durations_are_read_as_durations_and_zero_keepalive_as_none() {
    use std::time::Duration;
    let c = parse("").unwrap();
    assert_eq!(c.server.shutdown_grace, Duration::from_secs(5));
    assert_eq!(c.server.http2_keepalive, Some(Duration::from_secs(5)));
    assert_eq!(c.server.header_read_timeout, Duration::from_secs(10));
    assert_eq!(c.server.idle_timeout, Duration::from_secs(120));
    assert_eq!(c.server.control_socket, ControlSocket::Default);
    let c = parse(
        "[server]\nshutdown_grace_secs = 0\nhttp2_keepalive_secs = 0\n\
         header_read_timeout_secs = 3600\nidle_timeout_secs = 1\n",
    )
    .unwrap();
    assert_eq!(c.server.shutdown_grace, Duration::ZERO);
    assert_eq!(c.server.http2_keepalive, None);
    assert_eq!(c.server.header_read_timeout, Duration::from_secs(3600));
    assert_eq!(c.server.idle_timeout, Duration::from_secs(1));
}

#[test]
fn credentials_are_gathered_with_their_secrets_read() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("viewer");
    std::fs::write(&file, "viewer-secret\n").unwrap();
    let c = parse(&format!(
        "[server]\nauth_tokens = [\"admin-secret\"]\n\
         [[server.tokens]]\nname = \"viewer\"\ntoken_file = {:?}\nscopes = [\"read\", \"operate\"]\n\
         [[server.clients]]\nsubject = \"CN=rover-2\"\nscopes = [\"read\"]\n",
        file.display().to_string()
    ))
    .unwrap();
    let admin: Vec<&str> = c.auth.admin_tokens.iter().map(Secret::expose).collect();
    assert_eq!(admin, ["admin-secret"]);
    assert_eq!(c.auth.tokens.len(), 1);
    assert_eq!(c.auth.tokens[0].name, "viewer");
    assert_eq!(c.auth.tokens[0].secret.expose(), "viewer-secret");
    assert_eq!(c.auth.tokens[0].scope, Scope::Operate);
    assert_eq!(c.auth.clients[0].subject, "CN=rover-2");
    assert_eq!(c.auth.clients[0].scope, Scope::Read);
    assert_eq!(c.credential_count(), 3);
    // The same secret as an admin token is refused, naming the entry.
    std::fs::write(&file, "admin-secret\n").unwrap();
    let text = format!(
        "[server]\nauth_tokens = [\"admin-secret\"]\n\
         [[server.tokens]]\nname = \"viewer\"\ntoken_file = {:?}\nscopes = [\"read\"]\n",
        file.display().to_string()
    );
    let (_, line, key) = invalid(&text);
    assert_eq!(
        (line, key.as_str()),
        (Some(3), "server.tokens[0]"),
        "{text}"
    );
}

#[test]
fn token_file_is_read_and_secrets_are_not_printed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens");
    std::fs::write(&path, "# operators\nalpha-token\n\nbeta-token\n").unwrap();
    let c = parse(&format!(
        "[server]\nauth_token_file = {:?}\n",
        path.display().to_string()
    ))
    .unwrap();
    let tokens: Vec<&str> = c.auth.admin_tokens.iter().map(Secret::expose).collect();
    assert_eq!(tokens, ["alpha-token", "beta-token"]);
    let printed = format!("{c:?}{}", c.summary());
    assert!(!printed.contains("alpha-token") && !printed.contains("beta-token"));
}

#[test]
fn missing_token_file_is_an_error_naming_the_key() {
    let (_, line, key) = invalid("[server]\nauth_token_file = \"/nonexistent/rozd-tokens\"\n");
    assert_eq!((line, key.as_str()), (Some(2), "server.auth_token_file"));
}

#[test]
fn missing_file_is_a_read_error_naming_the_file() {
    let err = Config::load_file(Path::new("/nonexistent/rozd.toml")).unwrap_err();
    assert!(err.to_string().contains("/nonexistent/rozd.toml"), "{err}");
}

// ------------------------------------------------------------------ broker sections

use super::broker::{BrokerAddress, BrokerUrl};

fn address(tls: bool, host: &str, port: u16) -> BrokerAddress {
    BrokerAddress {
        tls,
        host: host.to_string(),
        port,
    }
}

#[test]
fn broker_urls_parse_into_one_typed_address() {
    for (url, expected) in [
        ("mqtt://broker.lan", address(false, "broker.lan", 1883)),
        ("mqtt://broker.lan:1884", address(false, "broker.lan", 1884)),
        ("mqtt://broker.lan/", address(false, "broker.lan", 1883)),
        ("mqtts://broker.lan", address(true, "broker.lan", 8883)),
        ("mqtts://broker.lan:9000", address(true, "broker.lan", 9000)),
        ("mqtt://10.0.0.2", address(false, "10.0.0.2", 1883)),
        ("mqtt://[::1]:1883", address(false, "::1", 1883)),
        ("mqtt://[::1]", address(false, "::1", 1883)),
        ("mqtts://[fe80::1]", address(true, "fe80::1", 8883)),
        ("mqtts://[fe80::1]:8884/", address(true, "fe80::1", 8884)),
    ] {
        assert_eq!(BrokerAddress::parse(url), Ok(expected), "{url}");
    }
    for bad in [
        "http://x",
        "mqtt://",
        "mqtt://:1883",
        "mqtt://x:port",
        "mqtt://x:",
        "mqtt://x:70000",
        // unbracketed IPv6: the last colon is not a port separator
        "mqtt://::1",
        "mqtt://fe80::1:1883",
        "mqtt://[::1",
        "mqtt://[::1]1883",
        "mqtt://[not-v6]:1883",
        "mqtt://x:1883/path",
        "mqtt://user@x",
        "mqtt://a b",
    ] {
        assert!(BrokerAddress::parse(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn mqtt_and_fleet_take_bracketed_ipv6_brokers_and_the_mqtts_port() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("fleet-token");
    std::fs::write(&token, "t0ken\n").unwrap();
    let c = parse(&format!(
        "[mqtt]\nurl = \"mqtt://[::1]\"\n[fleet]\nurl = \"mqtts://[fe80::1]\"\n\
         token_file = {:?}\n",
        token.display().to_string()
    ))
    .unwrap();
    let mqtt = c.hardware.mqtt.as_ref().unwrap();
    assert_eq!(mqtt.url.address(), &address(false, "::1", 1883));
    assert_eq!(mqtt.url.to_string(), "mqtt://[::1]");
    let fleet = c.fleet.as_ref().unwrap();
    assert_eq!(fleet.broker.url.address(), &address(true, "fe80::1", 8883));
    // what neither section can connect to is refused naming the key
    for (text, line, key) in [
        ("[mqtt]\nurl = \"mqtt://::1\"\n", 2, "mqtt.url"),
        ("[fleet]\n\nurl = \"mqtt://[::1\"\n", 3, "fleet.url"),
    ] {
        let (_, found_line, found_key) = invalid(text);
        assert_eq!(
            (found_line, found_key.as_str()),
            (Some(line), key),
            "{text}"
        );
    }
    assert!("mqtt://[::1]:1884".parse::<BrokerUrl>().is_ok());
}

#[test]
fn broker_keep_alive_is_bounded_and_the_ca_file_read_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("fleet-token");
    std::fs::write(&token, "t0ken\n").unwrap();
    let token = format!("token_file = {:?}\n", token.display().to_string());
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, "-----BEGIN CERTIFICATE-----\n").unwrap();
    let ca = format!("ca_file = {:?}\n", ca.display().to_string());
    for (text, line, key) in [
        // MQTT sends the keep-alive as 16 bits
        (
            "[mqtt]\nurl = \"mqtt://b\"\nkeep_alive_secs = 65536\n".to_string(),
            3,
            "mqtt.keep_alive_secs",
        ),
        (
            "[mqtt]\nurl = \"mqtt://b\"\nkeep_alive_secs = 4\n".to_string(),
            3,
            "mqtt.keep_alive_secs",
        ),
        (
            "[mqtt]\nurl = \"mqtts://b\"\nca_file = \"/nonexistent/rozd-ca.pem\"\n".to_string(),
            3,
            "mqtt.ca_file",
        ),
        (
            format!(
                "[fleet]\nurl = \"mqtts://b\"\n{token}ca_file = \"/nonexistent/rozd-ca.pem\"\n"
            ),
            4,
            "fleet.ca_file",
        ),
    ] {
        let (_, found_line, found_key) = invalid(&text);
        assert_eq!(
            (found_line, found_key.as_str()),
            (Some(line), key),
            "{text}"
        );
    }
    let c = parse(&format!(
        "[mqtt]\nurl = \"mqtts://b\"\nkeep_alive_secs = 65535\n{ca}\
         [fleet]\nurl = \"mqtts://b\"\n{token}{ca}"
    ))
    .unwrap();
    assert_eq!(c.hardware.mqtt.unwrap().keep_alive_secs, 65535);
    assert!(c.fleet.unwrap().broker.ca_file.is_some());
}

// ------------------------------------------------------------------ locating keys

#[test]
fn errors_inside_inline_tables_name_their_line_and_key() {
    // a value refused by validation, in an array of inline tables
    let text = "permissions = [\n  { tool_pattern = \"a*\", policy = \"allow\" },\n  \
                { tool_pattern = \" \", policy = \"block\" },\n]\n";
    let (_, line, key) = invalid(text);
    assert_eq!(
        (line, key.as_str()),
        (Some(3), "permissions[1].tool_pattern")
    );
    // an unknown key inside an inline table
    let text = "[host]\nid = \"a\"\n[model]\nendpoints = [\n  { name = \"x\", provider = \
                \"openai\", model = \"m\", base_url = \"http://127.0.0.1:1\", bogus = 1 },\n]\n";
    let (_, line, key) = invalid(text);
    assert_eq!((line, key.as_str()), (Some(5), "model.endpoints[0].bogus"));
    // a whole section as an inline table, and dotted keys
    let (_, line, key) = invalid("\nhost = { id = \"a\", environment_id = \" \" }\n");
    assert_eq!((line, key.as_str()), (Some(2), "host.environment_id"));
    let (_, line, key) = invalid("log.level = \"info\"\nserver.listen = \"0.0.0.0:8080\"\n");
    assert_eq!((line, key.as_str()), (Some(2), "server.listen"));
}

#[test]
fn errors_after_a_multi_line_string_name_their_line_and_key() {
    // the string's lines look like a table header and a key
    let text = "[host]\nname = \"\"\"\nrover\n[fake]\nid = 1\n\"\"\"\nid = \"no spaces allowed\"\n";
    let (_, line, key) = invalid(text);
    assert_eq!((line, key.as_str()), (Some(7), "host.id"));
    let text = "[host]\nname = '''\n[fake]\n'''\nsurprise = 1\n";
    let (_, line, key) = invalid(text);
    assert_eq!((line, key.as_str()), (Some(5), "host.surprise"));
}

#[test]
fn sub_modules_do_not_import_the_aggregate() {
    // Sub-modules take the leaf types (`config::types`, `config::broker`,
    // `config::units`);
    // the aggregate calls their validators, so naming it would close a circle
    // (their unit tests too: tests that read a whole configuration live in
    // `config::section_tests`).
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut offenders = Vec::new();
    for dir in [
        "fleet", "safety", "hw", "model", "ooda", "tools", "session", "team", "mcp",
    ] {
        let mut stack = vec![src.join(dir)];
        while let Some(path) = stack.pop() {
            if path.is_dir() {
                stack.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let code = std::fs::read_to_string(&path).unwrap();
            for (n, line) in code.lines().enumerate() {
                let line = line.split("//").next().unwrap_or("");
                for (at, _) in line.match_indices("crate::config") {
                    let rest = &line[at + "crate::config".len()..];
                    let leaf = ["::types::", "::broker::", "::units::", "::units;"];
                    if !leaf.iter().any(|l| rest.starts_with(l)) {
                        offenders.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
                    }
                }
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "import config::types, config::broker or config::units instead:\n{}",
        offenders.join("\n")
    );
}

/// A broken config file is an error naming where, never a panic: arbitrary
/// text, and the built-in config with a line replaced by arbitrary text.
mod properties {
    use proptest::prelude::*;

    use crate::config::{BUILTIN_CONFIG, Config, ConfigSource};

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        #[test]
        fn any_text_loads_or_is_refused(text in "\\PC{0,300}") {
            let _ = Config::parse(&text, ConfigSource::BuiltIn);
        }

        #[test]
        fn a_mangled_built_in_config_loads_or_names_a_line(
            line in any::<prop::sample::Index>(),
            replacement in prop_oneof![
                "\\PC{0,40}",
                "[a-z_]{1,12} = (-?[0-9]{1,12}(\\.[0-9]{1,3})?|\"[a-z:/.]{0,12}\"|\\[[0-9, ]{0,10}\\]|true|1e999|nan|inf)",
                Just("[[sensors]]".to_string()),
                Just("[sim]".to_string()),
            ],
        ) {
            let mut lines: Vec<&str> = BUILTIN_CONFIG.lines().collect();
            let i = line.index(lines.len());
            lines[i] = &replacement;
            let text = lines.join("\n");
            if let Err(e) = Config::parse(&text, ConfigSource::BuiltIn) {
                prop_assert!(!e.to_string().is_empty());
            }
        }
    }
}

#[test]
fn an_empty_or_relative_xdg_state_home_is_ignored() {
    let home = Some("/home/robot".into());
    let in_home = PathBuf::from("/home/robot/.local/state/rozd/rozd.db");
    assert_eq!(default_store_path(Some("".into()), home.clone()), in_home);
    assert_eq!(
        default_store_path(Some("state".into()), home.clone()),
        in_home
    );
    assert_eq!(default_store_path(None, home.clone()), in_home);
    assert_eq!(
        default_store_path(Some("/var/tmp/state".into()), home),
        PathBuf::from("/var/tmp/state/rozd/rozd.db")
    );
    assert_eq!(
        default_store_path(Some("".into()), Some("".into())),
        PathBuf::from("./rozd/rozd.db")
    );
}

/// Every error of reading a file in one run, in line order, each naming
/// its line and key in words: a misspelt key with "did you mean", a
/// fraction for a whole number (issue 35, item 15).
#[test]
fn every_error_of_a_file_in_line_order() {
    let text = "[server]\nlistne = \"127.0.0.1:1\"\nmax_connections = 1.5\n\n\
                [log]\nlevel = 7\n\n[ooda]\ntick_hz = \"fast\"\n";
    let errors = match parse(text) {
        Err(ConfigError::Several(errors)) => errors,
        other => panic!("expected several errors, got {other:?}"),
    };
    let said: Vec<(Option<usize>, String, String)> = errors
        .iter()
        .map(|e| match e {
            ConfigError::Invalid {
                line, key, message, ..
            } => (*line, key.clone(), message.clone()),
            other => panic!("{other:?}"),
        })
        .collect();
    let lines: Vec<_> = said.iter().map(|(l, k, _)| (*l, k.as_str())).collect();
    assert_eq!(
        lines,
        [
            (Some(2), "server.listne"),
            (Some(3), "server.max_connections"),
            (Some(6), "log.level"),
            (Some(9), "ooda.tick_hz"),
        ],
        "{said:?}"
    );
    assert!(said[0].2.contains("did you mean `listen`?"), "{said:?}");
    assert!(said[1].2.contains("expected a whole number"), "{said:?}");
    let shown = ConfigError::Several(errors).to_string();
    assert_eq!(shown.lines().count(), 4, "{shown}");
    assert!(
        shown.starts_with("/etc/rozd/test.toml:2: key `server.listne`"),
        "{shown}"
    );
}

/// `[sensors]` written for `[[sensors]]` says to double the brackets.
#[test]
fn a_single_table_for_a_list_says_to_double_the_brackets() {
    match parse("[sensors]\nname = \"a\"\n") {
        Err(ConfigError::Invalid { line, message, .. }) => {
            assert_eq!(line, Some(1));
            assert!(message.contains("write `[[sensors]]`"), "{message}");
        }
        other => panic!("{other:?}"),
    }
}

/// The checks of what was read report every section's error in one run,
/// in line order, not only the first (issue 35, item 15): here the host
/// id, a reflex rule naming no sensor, and a listener exposed without
/// credentials, in a file whose reading found nothing wrong.
#[test]
fn every_section_checked_reports_its_error_in_one_run() {
    let text = "[host]\nid = \"not a valid id\"\n\n\
                [server]\nlisten = \"0.0.0.0:7878\"\nallow_plaintext_remote = true\n\n\
                [[rules]]\nname = \"r\"\nwhen = \"nosuch > 1\"\nthen = { estop = true }\n";
    let errors = match parse(text) {
        Err(ConfigError::Several(errors)) => errors,
        other => panic!("expected several errors, got {other:?}"),
    };
    let said: Vec<(Option<usize>, String, String)> = errors
        .iter()
        .map(|e| match e {
            ConfigError::Invalid {
                line, key, message, ..
            } => (*line, key.clone(), message.clone()),
            other => panic!("{other:?}"),
        })
        .collect();
    let keys: Vec<&str> = said.iter().map(|(_, k, _)| k.as_str()).collect();
    assert_eq!(keys.len(), 3, "{said:?}");
    assert_eq!(keys[0], "host.id", "{said:?}");
    assert_eq!(keys[1], "server.listen", "{said:?}");
    assert!(keys[2].starts_with("rules[0]"), "{said:?}");
    let lines: Vec<Option<usize>> = said.iter().map(|(l, _, _)| *l).collect();
    let mut sorted = lines.clone();
    sorted.sort();
    assert_eq!(lines, sorted, "in line order: {said:?}");
    assert!(said[2].2.contains("nosuch"), "{said:?}");
}

/// The one bound check words each kind of bound alike, and a value that is
/// not a number is outside every range.
#[test]
fn within_words_each_bound_and_refuses_not_a_number() {
    use crate::config::types::within;
    assert!(within("a.b", 5, 1..=10).is_ok());
    let e = within("a.b", 0, 1..=86_400).unwrap_err();
    assert_eq!(
        (e.key.as_str(), e.message.as_str()),
        ("a.b", "must be between 1 and 86400")
    );
    assert_eq!(
        within("k", 0u32, 1..).unwrap_err().message,
        "must be at least 1"
    );
    assert_eq!(
        within("k", 300u32, ..=256).unwrap_err().message,
        "must be at most 256"
    );
    assert_eq!(
        within("k", f64::NAN, 0.1..=1000.0).unwrap_err().message,
        "must be between 0.1 and 1000"
    );
    assert!(within("k", f64::INFINITY, 0.1..=1000.0).is_err());
    assert_eq!(
        within("k", 0, 1..=31_536_000)
            .map_err(|e| e.noting("a year"))
            .unwrap_err()
            .message,
        "must be between 1 and 31536000 (a year)"
    );
}
