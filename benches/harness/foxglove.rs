//! Measurement 8, Foxglove live: the 50 Hz control loop of measurement 4's
//! host (20 sensors at 100 Hz, 2 actuators, reflex rules) with a simulated
//! world, while 10 Foxglove clients subscribe to every channel at
//! `foxglove.max_hz = 50`, beside the same host without clients, run just
//! before it: the loop's tick lateness p99 and the process's CPU.
//!
//! Each client is a plain WebSocket over loopback that sends its
//! subscription (a masked text frame, as RFC 6455 asks of clients) and
//! then reads and discards every byte, as fast as it comes.

use std::time::Duration;

use anyhow::{Context, Result};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::Scale;
use super::fixtures::Daemon;
use super::report::{Better, Group};

const CLIENTS: usize = 10;

/// A client's text frame: FIN + text, masked with a fixed key.
fn masked_text(payload: &[u8]) -> Vec<u8> {
    let key = [0x12u8, 0x34, 0x56, 0x78];
    let mut frame = vec![0x81u8];
    match payload.len() {
        n if n < 126 => frame.push(0x80 | n as u8),
        n if n <= 0xffff => {
            frame.push(0x80 | 126);
            frame.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            frame.push(0x80 | 127);
            frame.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    frame.extend_from_slice(&key);
    frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
    frame
}

/// Subscribes to channels 1..=`channels` and reads until `stop`: the bytes received.
async fn client(
    addr: std::net::SocketAddr,
    channels: u32,
    stop: tokio_util::sync::CancellationToken,
) -> Result<u64> {
    let mut tcp = tokio::net::TcpStream::connect(addr).await?;
    tcp.write_all(
        format!(
            "GET /foxglove HTTP/1.1\r\nHost: {addr}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
             Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
             Sec-WebSocket-Protocol: foxglove.websocket.v1\r\n\r\n"
        )
        .as_bytes(),
    )
    .await?;
    let subscriptions: Vec<serde_json::Value> = (1..=channels)
        .map(|id| serde_json::json!({"id": id, "channelId": id}))
        .collect();
    let subscribe = serde_json::json!({"op": "subscribe", "subscriptions": subscriptions});
    tcp.write_all(&masked_text(subscribe.to_string().as_bytes()))
        .await?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0u64;
    loop {
        tokio::select! {
            () = stop.cancelled() => return Ok(total),
            n = tcp.read(&mut buf) => match n? {
                0 => return Ok(total),
                n => total += n as u64,
            },
        }
    }
}

/// The loop's lateness p99 (µs), its ticks, the process CPU and the bytes
/// the clients received over `duration`.
async fn run(text: &str, clients: usize, duration: Duration) -> Result<(u64, u64, Duration, u64)> {
    let daemon = Daemon::start(text).await?;
    let c = &daemon.host.config();
    // Every channel: the five fixed ones, each sensor and actuator, the scene.
    let channels = u32::try_from(5 + c.hardware.sensors.len() + c.hardware.actuators.len() + 1)?;
    let stop = tokio_util::sync::CancellationToken::new();
    let watching: Vec<_> = (0..clients)
        .map(|_| tokio::spawn(client(daemon.addr, channels, stop.clone())))
        .collect();
    // Let the handshakes and subscriptions land before measuring.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let ooda = daemon.host.ooda().clone();
    let before = ooda.stats();
    let cpu = super::steps::process_cpu();
    tokio::time::sleep(duration).await;
    let cpu = super::steps::process_cpu().saturating_sub(cpu);
    let stats = ooda.stats();
    stop.cancel();
    let mut received = 0;
    for w in watching {
        received += w.await.context("a Foxglove client")??;
    }
    daemon.shutdown().await?;
    if clients > 0 && received == 0 {
        anyhow::bail!("the Foxglove clients received nothing");
    }
    Ok((
        stats.lateness_p99_us,
        stats.ticks.saturating_sub(before.ticks),
        cpu,
        received,
    ))
}

pub async fn foxglove(scale: &Scale) -> Result<Group> {
    let mut group = Group::new(
        "foxglove",
        "the same host without Foxglove clients, run just before",
    );
    let text = format!(
        "[sim]\n[foxglove]\nmax_hz = 50\nmax_clients = 16\n{}",
        super::control_loop::host(50.0)
    );
    let (p99_plain, ticks_plain, cpu_plain, _) = run(&text, 0, scale.loop_for).await?;
    let (p99, ticks, cpu, received) = run(&text, CLIENTS, scale.loop_for).await?;
    let n = (
        usize::try_from(ticks).unwrap_or(usize::MAX),
        usize::try_from(ticks_plain).unwrap_or(usize::MAX),
    );
    group.add(
        "foxglove.loop_lateness_p99_us",
        "50 Hz loop while 10 Foxglove clients subscribe to every channel at 50 Hz: tick lateness p99 vs no clients",
        "µs",
        Better::Lower,
        p99 as f64,
        Some(p99_plain as f64),
        n,
    );
    let secs = scale.loop_for.as_secs_f64();
    group.add(
        "foxglove.cpu_percent",
        &format!(
            "process CPU with 10 Foxglove clients ({:.1} MB/s to them) vs without",
            received as f64 / secs / 1e6
        ),
        "%",
        Better::Lower,
        cpu.as_secs_f64() / secs * 100.0,
        Some(cpu_plain.as_secs_f64() / secs * 100.0),
        n,
    );
    Ok(group)
}
