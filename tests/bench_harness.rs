//! The benchmark harness itself works: every measurement runs in quick mode
//! (debug build), and the report it writes is complete and well-formed —
//! every metric finite, with samples and a floor (or a reason for none), the
//! JSON parseable back into the same report. No speed is asserted.
//!
//! `harness = false`: the footprint measurement re-executes this binary as
//! its floor process (the bare echo server), which libtest's own `main`
//! would not let it do.
#![forbid(unsafe_code)]

#[allow(dead_code)]
#[path = "../benches/harness/mod.rs"]
mod harness;

use std::process::ExitCode;

use harness::report::{Better, Report, problems};

/// Metrics the issue asks for, by id (per group, those whose ids do not
/// depend on the scale).
const EXPECTED: &[&str] = &[
    "step.p50_us",
    "step.p99_us",
    "step.p999_us",
    "concurrency.1.turns_per_s",
    "concurrency.1.turn_p99_us",
    "concurrency.10.turns_per_s",
    "host_tool.sim.p50_us",
    "host_tool.sim.p99_us",
    "host_tool.serial.p50_us",
    "host_tool.serial.p99_us",
    "loop.100hz.lateness_p50_us",
    "loop.100hz.lateness_p99_us",
    "loop.100hz.lateness_max_us",
    "loop.100hz.missed_ticks",
    "loop.1000hz.lateness_p99_us",
    "loop.1000hz.thread.lateness_p99_us",
    "loop.1000hz.missed_ticks",
    "loop.100hz.reflex.p50_us",
    "loop.100hz.reflex.p99_us",
    "loop.1000hz.reflex.p99_us",
    "loop.100hz.feedback16.cost_us",
    "loop.100hz.feedback16.tick_exec_p50_us",
    "loop.100hz.feedback.confirmed.p50_us",
    "loop.100hz.feedback.confirmed.p99_us",
    "safe.rest.p50_us",
    "safe.rest.max_us",
    "safe.gpio.p50_us",
    "safe.gpio.max_us",
    "safe.stuck.p50_us",
    "safe.stuck.max_us",
    "footprint.startup_ms",
    "footprint.rss_idle_mib",
    "footprint.rss_idle_anon_mib",
    "footprint.rss_idle_file_mib",
    "footprint.rss_sessions_mib",
    "footprint.rss_turns_open_mib",
    "footprint.rss_turns_closed_mib",
    "footprint.rss_more_turns_closed_mib",
    "footprint.binary_mib",
    "camera.encode_640x480.p50_us",
    "camera.passthrough_check_640x480.p50_us",
    "camera.yuyv_encode_640x480.p50_us",
    "camera.v4l2_mjpeg_passthrough_640x480.p50_us",
    "camera.capture_image.p50_us",
    "camera.loop_streaming.lateness_p99_us",
    "camera.cpu_per_frame_us",
    "camera.idle_private_mib",
    "foxglove.loop_lateness_p99_us",
    "foxglove.cpu_percent",
    "modbus.poll32.p50_us",
    "modbus.poll32.p99_us",
    "modbus.4links_100hz.missed_polls",
];

fn check() -> Result<usize, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let out = dir.path().join("bench").join("report.json");
    let options = harness::Options::parse([
        "--quick".to_string(),
        "--out".to_string(),
        out.display().to_string(),
    ])
    .map_err(|e| format!("{e:#}"))?;
    let report = harness::run(&options).map_err(|e| format!("the quick run failed: {e:#}"))?;

    let mut failures = problems(&report);
    let written = std::fs::read_to_string(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    match serde_json::from_str::<Report>(&written) {
        Ok(parsed) if parsed == report => {}
        Ok(_) => failures.push("the JSON file differs from the report".into()),
        Err(e) => failures.push(format!("the JSON file does not parse: {e}")),
    }
    for id in EXPECTED {
        if !report.metrics.iter().any(|m| m.id == *id) {
            failures.push(format!("{id}: missing"));
        }
    }
    for suffix in [".lateness_p99_us", ".missed_ticks"] {
        if !report
            .metrics
            .iter()
            .any(|m| m.id.starts_with("loop.loaded.") && m.id.ends_with(suffix))
        {
            failures.push(format!("loop.loaded.<sessions>{suffix}: missing"));
        }
    }
    let groups: std::collections::BTreeSet<&str> =
        report.metrics.iter().map(|m| m.group.as_str()).collect();
    if groups.len() != harness::MEASUREMENTS.len() {
        failures.push(format!(
            "expected {} groups, got {groups:?}",
            harness::MEASUREMENTS.len()
        ));
    }
    // Only the binary size has no floor; everything else is a ratio.
    for m in &report.metrics {
        if m.floor.is_none() && m.id != "footprint.binary_mib" {
            failures.push(format!("{}: no floor", m.id));
        }
        if m.id.ends_with("turns_per_s") && m.better != Better::Higher {
            failures.push(format!("{}: throughput must be higher-is-better", m.id));
        }
    }
    let table = report.markdown();
    for m in &report.metrics {
        if !table.contains(&m.name) {
            failures.push(format!("{}: not in the markdown table", m.id));
        }
    }
    if report.mode != "quick" || report.machine.cores == 0 || report.machine.kernel.is_empty() {
        failures.push(format!(
            "mode/machine not recorded: {} {:?}",
            report.mode, report.machine
        ));
    }
    if failures.is_empty() {
        // The figures say nothing in a debug build, but the table shows
        // what the harness measured (CI's log keeps it).
        println!("{table}");
        Ok(report.metrics.len())
    } else {
        Err(format!("{table}\n{}", failures.join("\n")))
    }
}

fn main() -> ExitCode {
    if let Some(code) = harness::child_role() {
        return code;
    }
    match check() {
        Ok(n) => {
            println!("bench_harness: the quick run reported {n} well-formed metrics");
            println!("1 passed, 0 failed");
            ExitCode::SUCCESS
        }
        Err(why) => {
            eprintln!("bench_harness: {why}");
            println!("0 passed, 1 failed");
            ExitCode::FAILURE
        }
    }
}
