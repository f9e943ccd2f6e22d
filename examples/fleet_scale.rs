//! Fleet scale harness: N simulated presences against a real mosquitto,
//! then a rozd (in-process, the real fleet code) joins and we measure
//!
//! 1. how long it takes from start to a full view (all N + itself);
//! 2. how long an offline transition takes to reach its view, when a
//!    presence's connection drops without a goodbye (the broker publishes
//!    its last will);
//! 3. what the view costs: time to take in one record (check its MAC, parse,
//!    store; no broker), and the daemon's resident memory with the full view.
//!
//! ```text
//! cargo run --release --example fleet_scale -- [--presences 1000] [--heartbeat-secs 10] [--drops 20]
//!                                               [--broker mqtt://127.0.0.1:1883]
//! ```
//!
//! Without `--broker` it starts its own mosquitto on a free loopback port
//! with its stock queue limits, as the shipped configuration leaves them
//! (needs `mosquitto` on the PATH). Each simulated presence is its own MQTT
//! connection with a retained record and a last will, like a rozd. The
//! figures are recorded in docs/fleet.md. Not part of `cargo test`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rozd::config::{Config, ConfigSource};
use rozd::fleet::record::{HostRecord, RECORD_VERSION, RecordStatus};
use rozd::fleet::seal::{self, MessageKey};
use rumqttc::{AsyncClient, Event, LastWill, MqttOptions, Packet, QoS};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::task::JoinHandle;

struct Args {
    presences: usize,
    heartbeat_secs: u64,
    drops: usize,
    broker: Option<String>,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        presences: 1000,
        heartbeat_secs: 10,
        drops: 20,
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
            "--drops" => a.drops = value()?.parse().map_err(|e| format!("{e}"))?,
            "--broker" => a.broker = Some(value()?),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(a)
}

/// The fleet token of the simulated fleet (its records are sealed with it).
const TOKEN: &str = "fleet-scale-token";

/// A simulated host's record, sealed for its topic as a rozd publishes it.
fn record(id: &str, status: RecordStatus, heartbeat_secs: u64) -> Vec<u8> {
    let r = HostRecord {
        v: RECORD_VERSION,
        id: id.to_string(),
        name: format!("simulated {id}"),
        environment_id: "scale".into(),
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
        created_at_ms: 0,
        last_heartbeat_ms: Some(0),
        instance: None,
        liveness: None,
        cause: None,
        keep_alive_secs: None,
    };
    let body = serde_json::to_string(&r).unwrap_or_default();
    seal::seal(
        &MessageKey::from_token(TOKEN),
        &format!("roz/v1/hosts/scale/{id}"),
        &body,
    )
}

/// One simulated host: its own connection, retained record, last will,
/// heartbeat. Dropping the task drops the TCP connection without DISCONNECT.
fn presence(
    host: &str,
    port: u16,
    id: String,
    heartbeat_secs: u64,
    connected: tokio::sync::mpsc::UnboundedSender<()>,
) -> JoinHandle<()> {
    let mut options = MqttOptions::new(format!("sim-{id}"), host, port);
    options.set_keep_alive(Duration::from_secs(30));
    options.set_clean_session(true);
    options.set_last_will(LastWill::new(
        format!("roz/v1/hosts/scale/{id}"),
        record(&id, RecordStatus::Offline, heartbeat_secs),
        QoS::AtLeastOnce,
        true,
    ));
    let (client, mut events) = AsyncClient::new(options, 16);
    tokio::spawn(async move {
        let topic = format!("roz/v1/hosts/scale/{id}");
        let online = record(&id, RecordStatus::Online, heartbeat_secs);
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
                    let _ = client.try_publish(&topic, QoS::AtLeastOnce, true, online.clone());
                }
            }
        }
    })
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

#[tokio::main]
async fn main() -> Result<(), String> {
    let args = args()?;
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
        "broker {url}; {} presences, heartbeat {} s",
        args.presences, args.heartbeat_secs
    );

    // 1. the simulated fleet
    let started = Instant::now();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::with_capacity(args.presences);
    for i in 0..args.presences {
        tasks.push(presence(
            &host,
            port,
            format!("sim-{i:05}"),
            args.heartbeat_secs,
            tx.clone(),
        ));
    }
    for _ in 0..args.presences {
        rx.recv().await.ok_or("a presence task ended")?;
    }
    println!(
        "{} presences connected and published in {:?}",
        args.presences,
        started.elapsed()
    );

    // 2. a rozd joins: time to the full view
    let rss_before = rss_kib();
    let token_file = dir.path().join("fleet-token");
    std::fs::write(&token_file, TOKEN).map_err(|e| e.to_string())?;
    let text = format!(
        "[host]\nid = \"observer\"\nenvironment_id = \"scale\"\n[server]\nlisten = \"127.0.0.1:0\"\n\
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
    let ctx = daemon.context();
    let bound = joined.elapsed();
    let want = args.presences + 1;
    let mut changes = ctx.fleet.changes();
    let mut connected_after = None;
    let mut first_record_after = None;
    let full = tokio::time::timeout(Duration::from_secs(600), async {
        while ctx.fleet.host_count() < want {
            if connected_after.is_none() && ctx.fleet.is_connected() {
                connected_after = Some(joined.elapsed());
            }
            if first_record_after.is_none() && ctx.fleet.host_count() > 1 {
                first_record_after = Some(joined.elapsed());
            }
            if changes.changed().await.is_err() {
                break;
            }
        }
    })
    .await;
    let view_time = joined.elapsed();
    if full.is_err() || ctx.fleet.host_count() < want {
        return Err(format!(
            "the view has {} of {want} hosts after 600 s",
            ctx.fleet.host_count()
        ));
    }
    println!(
        "a new rozd built the full view ({want} hosts) in {view_time:?} after it started \
         (daemon bound after {bound:?}, broker connected after {:?}, first record after {:?}, \
         so {:?} from the first record to the last)",
        connected_after.unwrap_or_default(),
        first_record_after.unwrap_or_default(),
        view_time.saturating_sub(first_record_after.unwrap_or_default()),
    );
    println!(
        "resident memory grew by {} KiB with the daemon and its view (process: {} KiB)",
        rss_kib().saturating_sub(rss_before),
        rss_kib()
    );

    // 3. offline propagation: drop connections without a goodbye
    let mut latencies = Vec::new();
    for (i, task) in tasks.iter().enumerate().take(args.drops) {
        let id = format!("sim-{i:05}");
        let mut changes = ctx.fleet.changes();
        let t0 = Instant::now();
        task.abort();
        let offline = tokio::time::timeout(Duration::from_secs(60), async {
            loop {
                if ctx
                    .fleet
                    .get(&id)
                    .is_some_and(|h| h.presence.as_str() == "offline")
                {
                    return;
                }
                if changes.changed().await.is_err() {
                    return;
                }
            }
        })
        .await;
        if offline.is_err() {
            return Err(format!("{id} not offline within 60 s"));
        }
        latencies.push(t0.elapsed());
    }
    latencies.sort();
    println!(
        "offline propagation over {} dropped connections: min {:?}, median {:?}, p90 {:?}, max {:?}",
        latencies.len(),
        latencies.first().copied().unwrap_or_default(),
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.9),
        latencies.last().copied().unwrap_or_default()
    );

    // 4. the view's own cost per record, without a broker
    let mut view = rozd::fleet::view::FleetView::new(
        "observer",
        Duration::from_secs(10),
        Duration::from_secs(30),
    );
    let payloads: Vec<(String, Vec<u8>)> = (0..args.presences)
        .map(|i| {
            let id = format!("sim-{i:05}");
            let p = record(&id, RecordStatus::Online, args.heartbeat_secs);
            (id, p)
        })
        .collect();
    let now = tokio::time::Instant::now();
    let key = MessageKey::from_token(TOKEN);
    let t0 = Instant::now();
    for round in 0..10 {
        for (id, p) in &payloads {
            let body = seal::open(&key, &format!("roz/v1/hosts/scale/{id}"), p)
                .map_err(|e| e.to_string())?;
            view.apply_on(
                "scale",
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
        "FleetView::apply: {per:?} per record ({} bytes each); a heartbeat round of {} records costs {:?}",
        payloads.first().map_or(0, |p| p.1.len()),
        args.presences,
        per * args.presences as u32
    );
    println!(
        "steady state: {:.0} records/s reach every rozd",
        args.presences as f64 / args.heartbeat_secs as f64
    );

    for t in tasks {
        t.abort();
    }
    drop(daemon);
    Ok(())
}
