//! Measurement 9, modbus: against PyPI pymodbus's server on loopback TCP
//! (the tests' device, `tests/integration/hw_support/modbus_server.py`):
//!
//! - one coalesced poll of 32 holding registers (32 sensors read in one
//!   request), its latency as rozd's link times it, beside pymodbus's own
//!   client making the same request back to back in its own process;
//! - four links polled at 100 Hz each, the polls rozd missed, beside four
//!   bare tokio-modbus clients on tokio intervals making the same requests.
//!
//! Both need the tests' Python environment (`ROZD_TEST_PYENV`, else
//! `<target>/pyenv`) with pymodbus; without it the measurement fails
//! naming what is missing.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio_util::sync::CancellationToken;

use super::Scale;
use super::report::{Better, Group};

const SERVER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/integration/hw_support/modbus_server.py"
);

/// Times pymodbus's client reading 32 holding registers (argv: port,
/// trials); prints one duration in µs per line.
const CLIENT: &str = r#"
import asyncio, sys, time
from pymodbus.client import AsyncModbusTcpClient
async def main(port, n):
    c = AsyncModbusTcpClient("127.0.0.1", port=port)
    await c.connect()
    for _ in range(10):
        await c.read_holding_registers(0, count=32, device_id=1)
    for _ in range(n):
        t = time.perf_counter()
        r = await c.read_holding_registers(0, count=32, device_id=1)
        took = time.perf_counter() - t
        assert len(r.registers) == 32
        print(took * 1e6)
    c.close()
asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
"#;

fn python() -> Result<PathBuf> {
    let pyenv = std::env::var_os("ROZD_TEST_PYENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| super::target_dir().join("pyenv"));
    let python = pyenv.join("bin").join("python");
    if !python.exists() {
        bail!(
            "{} is missing: scripts/test.sh installs pymodbus there",
            python.display()
        );
    }
    Ok(python)
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// pymodbus's server on `port`, until dropped.
async fn server(python: &PathBuf, port: u16) -> Result<tokio::process::Child> {
    let mut child = tokio::process::Command::new(python)
        .arg(SERVER)
        .args(["--tcp", &port.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("start the pymodbus server")?;
    let stdout = child.stdout.take().context("its stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let ready = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .context("the pymodbus server did not start")??;
    if ready.as_deref() != Some("{\"ready\": true}") {
        bail!("the pymodbus server said {ready:?} (is pymodbus installed?)");
    }
    Ok(child)
}

/// A sink that only counts.
#[derive(Debug, Default)]
struct Count(std::sync::atomic::AtomicU64);

impl rozd::hw::Readings for Count {
    fn record(&self, _sensor: &str, _value: f64) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    fn source_health(&self, _source: &str, _health: rozd::hw::Health) {}
    fn rejected(&self, _source: &str, _why: &str) {}
}

/// `[[modbus]]` links to `port` polled at `hz`, each with 32 u16 sensors
/// at holding 0-31 (one request).
fn links(port: u16, count: usize, hz: f64) -> Result<rozd::hw::config::HardwareSpec> {
    let mut text = String::new();
    for l in 0..count {
        text.push_str(&format!(
            "[[modbus]]\nname = \"l{l}\"\nurl = \"tcp://127.0.0.1:{port}\"\npoll_hz = {hz}\ntimeout_ms = 1000\n"
        ));
        for a in 0..32 {
            text.push_str(&format!(
                "[[sensors]]\nname = \"l{l}_r{a}\"\nsource = \"modbus\"\nlink = \"l{l}\"\nregister = \"holding\"\naddress = {a}\n"
            ));
        }
    }
    let config = rozd::config::Config::parse(&text, rozd::config::ConfigSource::BuiltIn)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(config.hardware)
}

/// Runs `count` links at `hz` for `run_for`; their counters at the end.
async fn run_links(
    port: u16,
    count: usize,
    hz: f64,
    run_for: Duration,
) -> Result<Vec<rozd::hw::modbus::LinkStats>> {
    let hardware = links(port, count, hz)?;
    let shutdown = CancellationToken::new();
    let (events, _changes) = tokio::sync::mpsc::unbounded_channel();
    let sink = Arc::new(Count::default());
    let mut running = rozd::hw::modbus::ModbusLinks::start(
        &hardware.modbus,
        &hardware.sensors,
        sink.clone(),
        events,
        shutdown.clone(),
    );
    running.first_connection_attempts().await;
    if running.stats().iter().any(|s| !s.connected) {
        bail!("a link did not connect to the pymodbus server");
    }
    // Counters from here on: warm-up excluded.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = running.stats();
    tokio::time::sleep(run_for).await;
    let after = running.stats();
    shutdown.cancel();
    running.join().await;
    Ok(after
        .into_iter()
        .zip(before)
        .map(|(mut a, b)| {
            a.requests -= b.requests;
            a.missed_polls -= b.missed_polls;
            a
        })
        .collect())
}

/// Four bare tokio-modbus clients, each on a 100 Hz tokio interval (missed
/// ticks skipped and counted): (requests, missed).
async fn floor_links(port: u16, count: usize, hz: f64, run_for: Duration) -> Result<(u64, u64)> {
    use tokio_modbus::prelude::*;
    let mut tasks = Vec::new();
    for _ in 0..count {
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        stream.set_nodelay(true)?;
        let mut ctx = tokio_modbus::client::tcp::attach_slave(stream, Slave(1));
        tasks.push(tokio::spawn(async move {
            let period = Duration::from_secs_f64(1.0 / hz);
            let mut ticker = tokio::time::interval(period);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let start = tokio::time::Instant::now();
            let (mut requests, mut missed) = (0u64, 0u64);
            let mut expected = start;
            while start.elapsed() < run_for {
                let at = ticker.tick().await;
                if at > expected + period {
                    missed += ((at - expected).as_secs_f64() / period.as_secs_f64()) as u64 - 1;
                }
                expected = at + period;
                let words = ctx.read_holding_registers(0, 32).await??;
                std::hint::black_box(words);
                requests += 1;
            }
            anyhow::Ok((requests, missed))
        }));
    }
    let (mut requests, mut missed) = (0, 0);
    for task in tasks {
        let (r, m) = task.await??;
        requests += r;
        missed += m;
    }
    Ok((requests, missed))
}

pub async fn modbus(scale: &Scale) -> Result<Group> {
    let python = python()?;
    let port = free_port()?;
    let _server = server(&python, port).await?;
    let mut group = Group::new(
        "modbus",
        "poll of 32 registers: pymodbus's own client making the same request back to back, \
         in its own process, against the same pymodbus server; 4 links at 100 Hz: four bare \
         tokio-modbus clients on tokio intervals making the same requests",
    );

    // One coalesced poll of 32 registers, as the link times its requests.
    let trials = scale.host_trials.max(50);
    let hz = 200.0;
    let run_for = Duration::from_secs_f64(trials as f64 / hz);
    let stats = run_links(port, 1, hz, run_for).await?;
    let link = stats.first().context("the link's counters")?;
    if link.requests == 0 {
        bail!("the link made no requests");
    }
    let started = Instant::now();
    let out = tokio::process::Command::new(&python)
        .arg("-c")
        .arg(CLIENT)
        .args([port.to_string(), trials.to_string()])
        .output()
        .await
        .context("run pymodbus's client")?;
    if !out.status.success() {
        bail!(
            "pymodbus's client failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let mut floor = super::report::Samples::default();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if let Ok(us) = line.trim().parse::<f64>() {
            floor.push_us(us);
        }
    }
    eprintln!(
        "   pymodbus client: {} reads in {:.1} s",
        floor.len(),
        started.elapsed().as_secs_f64()
    );
    let samples = (
        usize::try_from(link.requests.min(1024)).unwrap_or(1024),
        floor.len(),
    );
    for (label, p, rozd) in [
        ("p50", 0.5, link.latency_p50_us),
        ("p99", 0.99, link.latency_p99_us),
    ] {
        group.add(
            &format!("modbus.poll32.{label}_us"),
            &format!("Modbus TCP poll of 32 holding registers {label}"),
            "µs",
            Better::Lower,
            rozd as f64,
            Some(floor.percentile(p)),
            samples,
        );
    }

    // Four links at 100 Hz: the polls rozd missed, beside bare clients.
    let stats = run_links(port, 4, 100.0, scale.loop_for).await?;
    let (requests, missed): (u64, u64) = stats
        .iter()
        .fold((0, 0), |(r, m), s| (r + s.requests, m + s.missed_polls));
    let errors: u64 = stats.iter().flat_map(|s| s.errors.values()).sum();
    if errors > 0 {
        bail!("requests failed while polling 4 links: {stats:?}");
    }
    let (floor_requests, floor_missed) = floor_links(port, 4, 100.0, scale.loop_for).await?;
    group.add(
        "modbus.4links_100hz.missed_polls",
        "Modbus TCP: 4 links at 100 Hz, missed polls",
        "polls",
        Better::Lower,
        missed as f64,
        Some(floor_missed as f64),
        (
            usize::try_from(requests).unwrap_or(usize::MAX),
            usize::try_from(floor_requests).unwrap_or(usize::MAX),
        ),
    );
    Ok(group)
}
