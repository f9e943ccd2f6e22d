//! Fleet scale harness: N simulated hosts against a real mosquitto with its
//! stock settings, then a rozd (in-process, the real fleet code) joins, and
//! we measure what docs/fleet.md reports:
//!
//! 1. the full view: from the start of the rozd to all N + itself;
//! 2. the steady state with nothing changing: record and liveness
//!    deliveries per second into the rozd, and the rozd's CPU;
//! 3. a listing: a page of 100 hosts, at the start and at the end of the view;
//! 4. a mass kill: every simulated host's connection dropped at once
//!    (SIGKILL of their process) until all N are `offline` in the view;
//! 5. the view's own cost per record, without a broker.
//!
//! The simulated hosts behave as a rozd does (each its own MQTT connection,
//! its sealed record retained once with a last will, a sealed liveness
//! message every heartbeat) and run in a child process of their own, so the
//! CPU measured is the rozd's.
//!
//! ```text
//! cargo run --release --example fleet_scale -- [--presences 1000] [--heartbeat-secs 10]
//!                                               [--steady-secs 20] [--no-counter] [--broker mqtt://127.0.0.1:1883]
//! ```
//!
//! Without `--broker` it starts its own mosquitto on a free loopback port
//! with the settings packaging/mosquitto/rozd-fleet.conf ships (mosquitto's
//! stock queue limits; needs `mosquitto` on the PATH). Not part of
//! `cargo test`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rozd::config::{Config, ConfigSource};
use rozd::fleet::record::{
    Alive, HostRecord, Liveness, OfflineCause, RECORD_VERSION, RecordStatus,
};
use rozd::fleet::seal::{self, MessageKey};
use rumqttc::{AsyncClient, Event, LastWill, MqttOptions, Packet, QoS};
use tokio::io::{AsyncBufReadExt, BufReader};

/// The environment variable that makes this executable the simulated hosts.
const ROLE_ENV: &str = "FLEET_SCALE_ROLE";
/// The fleet token of the simulated fleet (its messages are sealed with it).
const TOKEN: &str = "fleet-scale-token";
/// The simulated hosts' environment.
const ENV: &str = "scale";
/// Hosts per listing page.
const PAGE: usize = 100;

struct Args {
    presences: usize,
    heartbeat_secs: u64,
    steady_secs: u64,
    /// Measure the rozd alone: no delivery counter in this process.
    no_counter: bool,
    broker: Option<String>,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        presences: 1000,
        heartbeat_secs: 10,
        steady_secs: 20,
        no_counter: false,
        broker: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--presences" => a.presences = value()?.parse().map_err(|e| format!("{e}"))?,
            "--heartbeat-secs" => {
                a.heartbeat_secs = value()?.parse().map_err(|e| format!("{e}"))?
            }
            "--steady-secs" => a.steady_secs = value()?.parse().map_err(|e| format!("{e}"))?,
            "--broker" => a.broker = Some(value()?),
            "--no-counter" => a.no_counter = true,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(a)
}

fn record_topic(id: &str) -> String {
    format!("roz/v1/hosts/{ENV}/{id}")
}

/// A simulated host's record, sealed for its topic as a rozd publishes it.
fn record(id: &str, status: RecordStatus, heartbeat_secs: u64, now_ms: i64) -> Vec<u8> {
    let r = HostRecord {
        v: RECORD_VERSION,
        id: id.to_string(),
        name: format!("simulated {id}"),
        environment_id: ENV.into(),
        status,
        capabilities: BTreeMap::from([
            ("sensors".into(), "temp,battery,front_distance".into()),
            ("actuators".into(), "drive,arm".into()),
            ("architecture".into(), "aarch64".into()),
            ("version".into(), "0.1.0".into()),
        ]),
        endpoint: Some("http://127.0.0.1:9".into()),
        estop: None,
        heartbeat_secs: Some(heartbeat_secs),
        created_at_ms: now_ms,
        last_heartbeat_ms: Some(now_ms),
        instance: Some(format!("{id}-instance")),
        liveness: Some(Liveness::Will),
        cause: (status == RecordStatus::Offline).then_some(OfflineCause::Will),
        keep_alive_secs: Some(30),
    };
    let body = serde_json::to_string(&r).unwrap_or_default();
    seal::seal(&MessageKey::from_token(TOKEN), &record_topic(id), &body)
}

/// The simulated hosts (the child process): each connects with its last
/// will, publishes its record once, then its liveness every heartbeat.
/// Prints `ready` once all have published; runs until killed.
async fn simulated_hosts(port: u16, presences: usize, heartbeat_secs: u64) -> Result<(), String> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for i in 0..presences {
        let id = format!("sim-{i:05}");
        let now = rozd::clock::now_ms();
        let mut options = MqttOptions::new(format!("sim-{id}"), "127.0.0.1", port);
        options.set_keep_alive(Duration::from_secs(30));
        options.set_clean_session(true);
        options.set_last_will(LastWill::new(
            record_topic(&id),
            record(&id, RecordStatus::Offline, heartbeat_secs, now),
            QoS::AtLeastOnce,
            true,
        ));
        let (client, mut events) = AsyncClient::new(options, 16);
        let connected = tx.clone();
        tokio::spawn(async move {
            let key = MessageKey::from_token(TOKEN);
            let topic = record_topic(&id);
            let alive_topic = format!("roz/v1/alive/{ENV}/{id}");
            let online = record(&id, RecordStatus::Online, heartbeat_secs, now);
            let mut beat = tokio::time::interval(Duration::from_secs(heartbeat_secs));
            beat.tick().await;
            loop {
                tokio::select! {
                    event = events.poll() => match event {
                        Ok(Event::Incoming(Packet::ConnAck(_))) => {
                            let _ = client.try_publish(&topic, QoS::AtLeastOnce, true, online.clone());
                            let _ = connected.send(());
                        }
                        Ok(_) => {}
                        Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                    },
                    _ = beat.tick() => {
                        let alive = Alive { instance: format!("{id}-instance"), at_ms: rozd::clock::now_ms() };
                        let body = serde_json::to_string(&alive).unwrap_or_default();
                        let sealed = seal::seal(&key, &alive_topic, &body);
                        let _ = client.try_publish(&alive_topic, QoS::AtMostOnce, false, sealed);
                    }
                }
            }
        });
    }
    for _ in 0..presences {
        rx.recv().await.ok_or("a simulated host ended")?;
    }
    println!("ready");
    std::future::pending::<()>().await;
    Ok(())
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn start_mosquitto(dir: &std::path::Path) -> Result<(tokio::process::Child, u16), String> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let conf = dir.join("mosquitto.conf");
    std::fs::write(
        &conf,
        // Stock settings (mosquitto's own queue limits: max_queued_messages
        // 1000, max_inflight_messages 20), as packaging/mosquitto/rozd-fleet.conf
        // leaves them: rozd takes the records at QoS 0, which never queue.
        format!("listener {port} 127.0.0.1\nallow_anonymous true\nlog_dest stderr\n"),
    )
    .map_err(|e| e.to_string())?;
    let mut child = tokio::process::Command::new("mosquitto")
        .arg("-c")
        .arg(&conf)
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start mosquitto: {e}"))?;
    let stderr = child.stderr.take().ok_or("no stderr")?;
    let mut lines = BufReader::new(stderr).lines();
    loop {
        match lines.next_line().await {
            Ok(Some(line)) if line.contains(" running") => break,
            Ok(Some(_)) => {}
            _ => return Err("mosquitto did not start".into()),
        }
    }
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok((child, port))
}

/// This process's own CPU time (user + system), from `/proc/self/stat`.
fn cpu_time() -> Duration {
    let ticks = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            // Fields after the command name (which may hold spaces): utime
            // and stime are the 12th and 13th of them.
            let rest = s.rsplit_once(')')?.1;
            let f: Vec<&str> = rest.split_whitespace().collect();
            Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
        })
        .unwrap_or(0);
    // USER_HZ is 100 on Linux.
    Duration::from_millis(ticks * 10)
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

/// Counts what a rozd of the environment receives, by kind, on a
/// connection of its own.
fn count_deliveries(
    host: &str,
    port: u16,
) -> (
    std::sync::Arc<std::sync::atomic::AtomicU64>,
    std::sync::Arc<std::sync::atomic::AtomicU64>,
) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    let (records, alive) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut options = MqttOptions::new("fleet-scale-counter", host, port);
    options.set_keep_alive(Duration::from_secs(30));
    options.set_max_packet_size(1 << 20, 1 << 20);
    let (client, mut events) = AsyncClient::new(options, 16);
    let (r, a) = (records.clone(), alive.clone());
    tokio::spawn(async move {
        loop {
            match events.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    let _ = client.try_subscribe(format!("roz/v1/hosts/{ENV}/+"), QoS::AtMostOnce);
                    let _ = client.try_subscribe(format!("roz/v1/alive/{ENV}/+"), QoS::AtMostOnce);
                }
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    if p.topic.starts_with("roz/v1/alive/") {
                        a.fetch_add(1, Ordering::Relaxed);
                    } else {
                        r.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Ok(_) => {}
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    });
    (records, alive)
}

#[tokio::main]
async fn main() -> Result<(), String> {
    let args = args()?;
    if let Ok(port) = std::env::var(ROLE_ENV) {
        let port = port.parse().map_err(|e| format!("{ROLE_ENV}: {e}"))?;
        return simulated_hosts(port, args.presences, args.heartbeat_secs).await;
    }
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let (_mosquitto, url) = match &args.broker {
        Some(url) => (None, url.clone()),
        None => {
            let (child, port) = start_mosquitto(dir.path()).await?;
            (Some(child), format!("mqtt://127.0.0.1:{port}"))
        }
    };
    let rest = url.trim_start_matches("mqtt://");
    let (host, port) = rest
        .rsplit_once(':')
        .map(|(h, p)| (h.to_string(), p.parse::<u16>().unwrap_or(1883)))
        .unwrap_or((rest.to_string(), 1883));
    println!(
        "broker {url}; {} simulated hosts, heartbeat {} s",
        args.presences, args.heartbeat_secs
    );

    // The simulated fleet, in its own process.
    let started = Instant::now();
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut fleet = tokio::process::Command::new(exe)
        .args(std::env::args().skip(1))
        .env(ROLE_ENV, port.to_string())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start the simulated hosts: {e}"))?;
    let stdout = fleet.stdout.take().ok_or("no stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    loop {
        match lines.next_line().await {
            Ok(Some(line)) if line == "ready" => break,
            Ok(Some(_)) => {}
            _ => return Err("the simulated hosts ended before they were ready".into()),
        }
    }
    println!(
        "{} simulated hosts connected and published in {:?}",
        args.presences,
        started.elapsed()
    );

    // 1. a rozd joins: time to the full view
    let rss_before = rss_kib();
    let token_file = dir.path().join("fleet-token");
    std::fs::write(&token_file, TOKEN).map_err(|e| e.to_string())?;
    let text = format!(
        "[host]\nid = \"observer\"\nenvironment_id = \"{ENV}\"\n[server]\nlisten = \"127.0.0.1:0\"\n\
         [store]\npath = {:?}\n[log]\nlevel = \"warn\"\n[fleet]\nurl = \"{url}\"\nheartbeat_secs = {}\n\
         token_file = {:?}\n",
        dir.path().join("rozd.db").display().to_string(),
        args.heartbeat_secs,
        token_file.display().to_string()
    );
    let config = Config::parse(&text, ConfigSource::BuiltIn).map_err(|e| e.to_string())?;
    let joined = Instant::now();
    let daemon = rozd::daemon::Daemon::bind(config)
        .await
        .map_err(|e| e.to_string())?;
    let ctx = daemon.probe();
    let want = args.presences + 1;
    let mut changes = ctx.fleet().changes();
    let full = tokio::time::timeout(Duration::from_secs(600), async {
        while ctx.fleet().host_count() < want {
            if changes.changed().await.is_err() {
                break;
            }
        }
    })
    .await;
    let view_time = joined.elapsed();
    if full.is_err() || ctx.fleet().host_count() < want {
        return Err(format!(
            "the view has {} of {want} hosts after 600 s",
            ctx.fleet().host_count()
        ));
    }
    println!("1. full view: a new rozd listed all {want} hosts {view_time:?} after it started");
    println!(
        "   resident memory grew by {} KiB with the daemon and its view",
        rss_kib().saturating_sub(rss_before)
    );

    // 2. steady state with nothing changing (the counter's connection
    // receives what the rozd does, in this process: --no-counter leaves it
    // out, for the rozd's own CPU)
    let (records, alive) = if args.no_counter {
        Default::default()
    } else {
        count_deliveries(&host, port)
    };
    // The counter's own retained burst passes first.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let received = || ctx.fleet().link_stats().map_or(0, |s| s.link.received);
    let (records0, alive0) = (
        records.load(std::sync::atomic::Ordering::Relaxed),
        alive.load(std::sync::atomic::Ordering::Relaxed),
    );
    let (received0, cpu0, t0) = (received(), cpu_time(), Instant::now());
    tokio::time::sleep(Duration::from_secs(args.steady_secs)).await;
    let window = t0.elapsed().as_secs_f64();
    let cpu = cpu_time().saturating_sub(cpu0).as_secs_f64();
    let per_s = |n: u64| n as f64 / window;
    let kinds = if args.no_counter {
        "deliveries by kind not counted (--no-counter)".to_string()
    } else {
        format!(
            "{:.1} records/s and {:.0} liveness messages/s per rozd of the environment",
            per_s(records.load(std::sync::atomic::Ordering::Relaxed) - records0),
            per_s(alive.load(std::sync::atomic::Ordering::Relaxed) - alive0)
        )
    };
    println!(
        "2. steady state over {window:.1} s: {kinds}; this rozd received {:.0} messages/s and used \
         {:.2} % of a core {}",
        per_s(received() - received0),
        100.0 * cpu / window,
        if args.no_counter {
            "(the rozd alone)"
        } else {
            "(the delivery counter's connection in this process included)"
        }
    );

    // 3. a page of 100, at the start and at the end of the listing
    for (at, offset) in [("first", 0), ("last", want.saturating_sub(PAGE))] {
        let mut took = Vec::new();
        for _ in 0..200 {
            let t = Instant::now();
            let page = ctx.fleet().page(None, offset, PAGE);
            took.push(t.elapsed());
            std::hint::black_box(page);
        }
        took.sort();
        println!(
            "3. the {at} page of {PAGE} (offset {offset}): p50 {:?}, p99 {:?}",
            percentile(&took, 0.5),
            percentile(&took, 0.99)
        );
    }

    // 4. mass kill: every simulated host's connection drops at once
    let mut changes = ctx.fleet().changes();
    let offline = |ctx: &rozd::testing::Probe| {
        ctx.fleet()
            .presence_counts()
            .iter()
            .find(|(p, _)| p.as_str() == "offline")
            .map_or(0, |(_, n)| *n)
    };
    let killed = Instant::now();
    fleet.start_kill().map_err(|e| e.to_string())?;
    let all_offline = tokio::time::timeout(Duration::from_secs(120), async {
        while offline(&ctx) < args.presences {
            if changes.changed().await.is_err() {
                break;
            }
        }
    })
    .await;
    println!(
        "4. mass kill: {} of {} hosts offline {:?} after their process was killed{}",
        offline(&ctx),
        args.presences,
        killed.elapsed(),
        if all_offline.is_err() {
            " (gave up after 120 s)"
        } else {
            ""
        }
    );

    // 5. the view's own cost per record, without a broker
    let mut view = rozd::fleet::view::FleetView::new(
        "observer",
        Duration::from_secs(10),
        Duration::from_secs(30),
    );
    let now_ms = rozd::clock::now_ms();
    let payloads: Vec<(String, Vec<u8>)> = (0..args.presences)
        .map(|i| {
            let id = format!("sim-{i:05}");
            let p = record(&id, RecordStatus::Online, args.heartbeat_secs, now_ms);
            (id, p)
        })
        .collect();
    let now = tokio::time::Instant::now();
    let key = MessageKey::from_token(TOKEN);
    let t0 = Instant::now();
    for round in 0..10 {
        for (id, p) in &payloads {
            let body = seal::open(&key, &record_topic(id), p).map_err(|e| e.to_string())?;
            view.apply_on(
                ENV,
                id,
                body.as_bytes(),
                now + Duration::from_millis(round),
                rozd::clock::now_ms(),
            )
            .map_err(|e| e.to_string())?;
        }
    }
    let per = t0.elapsed() / (10 * args.presences.max(1) as u32);
    println!(
        "5. FleetView::apply (check the seal, parse, store): {per:?} per record ({} bytes each)",
        payloads.first().map_or(0, |p| p.1.len()),
    );
    drop(daemon);
    Ok(())
}
