//! Measurement 5, time to safe state: the protective stop (REST trigger, simulated GPIO
//! stop input) until every actuator reports its safe value; and a stuck
//! PHYSICAL call with timeout T until the device gets the safe value,
//! reported as the overshoot past T.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow, bail};
use rozd::api::proto::session_response::Response as Resp;
use rozd::config::{Config, ConfigSource};
use rozd::hw::ActuatorDriver;
use rozd::hw::config::Pull;
use rozd::hw::gpio::{GpioBackend, SimGpio};
use rozd::hw::serial::{SerialActuator, SerialPorts};
use rozd::hw::sim::SimActuator;
use rozd::ooda::act::Origin;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Scale;
use super::fixtures::{
    Daemon, Device, Discard, PtyPair, SessionStream, WAIT, changed, connect, settle, user,
};
use super::report::{Group, MAX, P50, P99, Samples};

const ACTUATORS: [&str; 4] = ["drive_left", "drive_right", "arm", "gripper"];
const STOP_PIN: u8 = 5;
const SAFE: f64 = 0.0;
const MOVING: f64 = 0.5;

fn robot() -> String {
    let mut text = format!("[gpio]\nbackend = \"sim\"\n[safety]\nestop_gpio_pin = {STOP_PIN}\n");
    for name in ACTUATORS {
        text.push_str(&format!(
            "\n[[actuators]]\nname = \"{name}\"\nkind = \"sim\"\nmin = -1.0\nmax = 1.0\nsafe_value = {SAFE}\n"
        ));
    }
    text
}

/// Waits until every actuator applied its safe value; when the last did.
async fn all_safe(
    sims: &[Arc<SimActuator>],
    mut armed: Vec<tokio::sync::watch::Receiver<u64>>,
) -> Result<Instant> {
    let waits = sims
        .iter()
        .zip(armed.iter_mut())
        .map(|(sim, rx)| async move {
            loop {
                let at = changed(rx).await?;
                if sim.value() == Some(SAFE) {
                    return anyhow::Ok(at);
                }
            }
        });
    let times = futures_util::future::try_join_all(waits).await?;
    times
        .into_iter()
        .max()
        .ok_or_else(|| anyhow!("no actuators"))
}

fn arm(sims: &[Arc<SimActuator>]) -> Vec<tokio::sync::watch::Receiver<u64>> {
    sims.iter()
        .map(|s| {
            let mut rx = s.applied();
            rx.borrow_and_update();
            rx
        })
        .collect()
}

fn http() -> Result<reqwest::Client> {
    // reqwest is built without a default TLS provider (plain HTTP here).
    let _ = rustls::crypto::ring::default_provider().install_default();
    Ok(reqwest::Client::builder()
        .timeout(WAIT)
        .tcp_nodelay(true)
        .build()?)
}

/// The REST floor: one POST route that drives its own simulated actuators
/// safe by direct driver calls, served by axum on the same runtime.
async fn rest_floor(sims: Vec<Arc<SimActuator>>) -> Result<std::net::SocketAddr> {
    use axum::serve::ListenerExt as _;
    let app = axum::Router::new().route(
        "/estop",
        axum::routing::post(move || {
            let sims = sims.clone();
            async move {
                for sim in &sims {
                    let _ = sim.apply(SAFE).await;
                }
                "stopped"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(addr)
}

/// The GPIO floor: a task watching a simulated input pin that drives its
/// own simulated actuators safe by direct driver calls.
fn gpio_floor(sims: Vec<Arc<SimActuator>>) -> Result<Arc<SimGpio>> {
    let chip = Arc::new(SimGpio::default());
    let mut pin = chip.input(STOP_PIN, Pull::Up)?;
    let mut changes = pin
        .changes()
        .ok_or_else(|| anyhow!("the sim GPIO has edges"))?;
    tokio::spawn(async move {
        while changes.changed().await.is_ok() {
            if !*changes.borrow_and_update() {
                for sim in &sims {
                    let _ = sim.apply(SAFE).await;
                }
            }
        }
    });
    Ok(chip)
}

/// Releases the stop input, clears the stop, and commands every actuator
/// away from its safe value; returns the armed change watchers.
async fn rozd_ready(
    ooda: &rozd::ooda::Ooda,
    chip: &SimGpio,
    sims: &[Arc<SimActuator>],
) -> Result<Vec<tokio::sync::watch::Receiver<u64>>> {
    chip.set_level(STOP_PIN, true);
    let stop = ooda.protective_stop();
    settle("the stop input's release", || stop.held_inputs().is_empty()).await?;
    // Nothing asserts it any more (settled above): the clear cannot be refused.
    let _ = stop
        .clear(rozd::safety::ClearRequest::all("benchmark"))
        .await;
    for name in ACTUATORS {
        ooda.actuators()
            .command(name, MOVING, Origin::Operator("benchmark".into()), None)
            .await
            .with_context(|| format!("command {name}"))?;
    }
    Ok(arm(sims))
}

async fn floor_ready(
    chip: &SimGpio,
    sims: &[Arc<SimActuator>],
) -> Result<Vec<tokio::sync::watch::Receiver<u64>>> {
    chip.set_level(STOP_PIN, true);
    for sim in sims {
        sim.apply(MOVING).await?;
    }
    Ok(arm(sims))
}

async fn post(client: &reqwest::Client, url: &str) -> Result<()> {
    let response = client.post(url).send().await?;
    if !response.status().is_success() {
        bail!("the stop request answered {}", response.status());
    }
    Ok(())
}

async fn protective_stop(scale: &Scale, group: &mut Group) -> Result<()> {
    let daemon = Daemon::start(&robot()).await?;
    let ooda = daemon.host.ooda().clone();
    let sims: Vec<Arc<SimActuator>> = ACTUATORS
        .iter()
        .map(|name| {
            daemon
                .host
                .sim_actuator(name)
                .ok_or_else(|| anyhow!("sim actuator {name}"))
        })
        .collect::<Result<_>>()?;
    let chip = ooda.sim_gpio().ok_or_else(|| anyhow!("sim GPIO"))?;
    let floor_sims: Vec<Arc<SimActuator>> = ACTUATORS.iter().map(|_| SimActuator::new()).collect();
    let floor_addr = rest_floor(floor_sims.clone()).await?;
    let floor_chip = gpio_floor(floor_sims.clone())?;
    let client = http()?;
    let estop_url = format!("http://{}/v1/estop", daemon.addr);
    let floor_url = format!("http://{floor_addr}/estop");

    let (mut rest, mut rest_floor_s) = (Samples::default(), Samples::default());
    let (mut gpio, mut gpio_floor_s) = (Samples::default(), Samples::default());
    for trial in 0..=scale.safe_trials {
        let keep = trial > 0; // trial 0 warms up
        // REST
        let armed = rozd_ready(&ooda, chip, &sims).await?;
        let start = Instant::now();
        let (at, ()) = tokio::try_join!(all_safe(&sims, armed), post(&client, &estop_url))?;
        if keep {
            rest.push(at - start);
        }
        let armed = floor_ready(&floor_chip, &floor_sims).await?;
        let start = Instant::now();
        let (at, ()) = tokio::try_join!(all_safe(&floor_sims, armed), post(&client, &floor_url))?;
        if keep {
            rest_floor_s.push(at - start);
        }
        // GPIO
        let armed = rozd_ready(&ooda, chip, &sims).await?;
        let start = Instant::now();
        chip.set_level(STOP_PIN, false);
        let at = all_safe(&sims, armed).await?;
        if keep {
            gpio.push(at - start);
        }
        let armed = floor_ready(&floor_chip, &floor_sims).await?;
        let start = Instant::now();
        floor_chip.set_level(STOP_PIN, false);
        let at = all_safe(&floor_sims, armed).await?;
        if keep {
            gpio_floor_s.push(at - start);
        }
    }
    chip.set_level(STOP_PIN, true);
    daemon.shutdown().await?;
    group.latencies(
        "safe.rest",
        "POST /v1/estop -> all 4 actuators safe",
        &rest,
        &rest_floor_s,
        &[P50, P99, MAX],
    );
    group.latencies(
        "safe.gpio",
        "GPIO stop input -> all 4 actuators safe",
        &gpio,
        &gpio_floor_s,
        &[P50, P99, MAX],
    );
    Ok(())
}

/// The device is stuck on every command but takes the safe value.
fn stuck(line: &str) -> Option<&'static str> {
    (line == "V 0").then_some("OK\n")
}

fn stuck_valve(port_path: &std::path::Path, timeout: Duration) -> String {
    format!(
        "[[serial]]\nname = \"mcu\"\npath = {:?}\n\n\
         [[actuators]]\nname = \"valve\"\nkind = \"serial\"\nport = \"mcu\"\n\
         template = \"V {{value}}\\n\"\nexpect = \"^OK\"\nreply_timeout_ms = 60000\ntimeout_ms = {}\n\
         min = 0\nmax = 1\nsafe_value = 0\n\n\
         [[permissions]]\ntool_pattern = \"valve\"\npolicy = \"allow\"\n",
        port_path.display().to_string(),
        timeout.as_millis()
    )
}

/// `(command line, safe line)` at the device -> time past `timeout`.
fn overshoot(command: Instant, safe: Instant, timeout: Duration) -> Duration {
    // The deadline starts just before the command is written, so this can
    // come out a few µs short of the truth, never long.
    safe.saturating_duration_since(command)
        .saturating_sub(timeout)
}

async fn expect_line(device: &mut Device, want: &str) -> Result<Instant> {
    let (line, at) = device.line().await?;
    if line != want {
        bail!("the device got {line:?}, expected {want:?}");
    }
    Ok(at)
}

async fn stuck_call(scale: &Scale, group: &mut Group) -> Result<()> {
    let timeout = scale.stuck_timeout;
    let dir = tempfile::tempdir()?;
    let rozd_pty = PtyPair::start(dir.path(), "rozd").await?;
    let floor_pty = PtyPair::start(dir.path(), "floor").await?;
    let mut rozd_device = Device::start(&rozd_pty, stuck)?;
    let mut floor_device = Device::start(&floor_pty, stuck)?;
    let daemon = Daemon::start(&stuck_valve(&rozd_pty.a, timeout)).await?;
    expect_line(&mut rozd_device, "V 0").await?; // start-up drives the safe value

    let floor_config = Config::parse(&stuck_valve(&floor_pty.a, timeout), ConfigSource::BuiltIn)
        .map_err(|e| anyhow!("floor config: {e}"))?;
    let stop_ports = CancellationToken::new();
    let mut ports = SerialPorts::start(
        &floor_config.hardware.serial,
        &floor_config.hardware.sensors,
        Arc::new(Discard),
        stop_ports.clone(),
    );
    ports.first_open_attempts().await;
    let driver = floor_config
        .hardware
        .actuators
        .first()
        .and_then(|spec| SerialActuator::from_spec(spec, &ports))
        .ok_or_else(|| anyhow!("the floor's serial actuator"))?;

    let mut client = connect(daemon.addr).await?;
    let mut session = SessionStream::start(&mut client, vec![]).await?;
    let (mut rozd, mut floor) = (Samples::default(), Samples::default());
    for _ in 0..scale.stuck_trials {
        // rozd: a PHYSICAL host tool call whose device never answers.
        session.send(user("set valve 1")).await?;
        let command = expect_line(&mut rozd_device, "V 1").await?;
        let safe = expect_line(&mut rozd_device, "V 0").await?;
        rozd.push(overshoot(command, safe, timeout));
        loop {
            match session.next().await? {
                Resp::TurnComplete(_) => break,
                Resp::Error(e) if e.code == "tool_timeout" => {}
                Resp::Error(e) => bail!("SessionError {}: {}", e.code, e.message),
                _ => {}
            }
        }
        // The floor: the same driver under a bare tokio timeout, then the safe value.
        let (timed_out, command) = tokio::join!(
            tokio::time::timeout(timeout, driver.apply(1.0)),
            expect_line(&mut floor_device, "V 1")
        );
        if timed_out.is_ok() {
            bail!("the floor's stuck device answered");
        }
        let (applied, safe) =
            tokio::join!(driver.apply(0.0), expect_line(&mut floor_device, "V 0"));
        applied?;
        floor.push(overshoot(command?, safe?, timeout));
    }
    session.close().await?;
    daemon.shutdown().await?;
    stop_ports.cancel();
    group.latencies(
        "safe.stuck",
        &format!(
            "stuck PHYSICAL call, timeout {} ms: safe value past the timeout",
            timeout.as_millis()
        ),
        &rozd,
        &floor,
        &[P50, P99, MAX],
    );
    Ok(())
}

pub async fn safe_state(scale: &Scale) -> Result<Group> {
    let mut group = Group::new(
        "5. time to safe state",
        "the same trigger handled without rozd: an axum POST route, or a task watching \
         the same simulated GPIO input, calling the drivers directly; for the stuck \
         call, the same serial driver under a bare tokio timeout",
    );
    protective_stop(scale, &mut group).await?;
    stuck_call(scale, &mut group).await?;
    Ok(group)
}
