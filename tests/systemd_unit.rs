//! The shipped systemd unit: systemd itself accepts it, and it keeps the
//! properties the daemon relies on (notify + watchdog, sandbox, devices).

use std::process::Command;

const UNIT: &str = include_str!("../systemd/rozd.service");

fn directives() -> Vec<(&'static str, &'static str)> {
    UNIT.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#') && !l.starts_with('['))
        .filter_map(|l| l.split_once('='))
        .collect()
}

fn has(key: &str, value: &str) -> bool {
    directives().iter().any(|(k, v)| *k == key && *v == value)
}

#[test]
fn unit_declares_notify_watchdog_restart_and_sandbox() {
    for (key, value) in [
        ("Type", "notify"),
        ("Restart", "on-failure"),
        ("RestartPreventExitStatus", "78"),
        ("User", "rozd"),
        ("SupplementaryGroups", "dialout gpio"),
        ("StateDirectory", "rozd"),
        ("ConfigurationDirectory", "rozd"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("NoNewPrivileges", "yes"),
        ("CapabilityBoundingSet", ""),
        ("DevicePolicy", "closed"),
        ("DeviceAllow", "char-ttyUSB rw"),
        ("DeviceAllow", "char-gpiochip rw"),
    ] {
        assert!(has(key, value), "systemd/rozd.service lacks {key}={value}");
    }
    assert!(directives().iter().any(|(k, _)| *k == "WatchdogSec"));
}

#[test]
fn systemd_analyze_verifies_the_unit() {
    let dir = tempfile::tempdir().unwrap();
    // verify checks that ExecStart exists: point it at the binary under test.
    let unit = UNIT.replace("/usr/bin/rozd", env!("CARGO_BIN_EXE_rozd"));
    let path = dir.path().join("rozd.service");
    std::fs::write(&path, unit).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("systemd-analyze is installed (scripts/test.sh installs the systemd package)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "systemd-analyze verify: {stderr}");
    assert!(
        !stderr.contains("rozd.service:"),
        "warnings about the unit: {stderr}"
    );
}
