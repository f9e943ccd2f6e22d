//! Measurement 3, the host tool path: the model's tool use -> the actuator's value changing,
//! for a simulated actuator and for a serial actuator over a socat pty pair.
//!
//! The local model issues its tool use as soon as the previous tool result
//! reaches it, so the clock starts when the client sends the result of a
//! marker client tool (`call bench_step {}; set speed 0.5`) and stops when
//! the simulated actuator reports the value, or when the device end of the
//! pty reads the command line. The floor takes the same path without rozd:
//! the same message over a bare tonic stream, straight into a direct call of
//! the same kind of driver.

use std::sync::Arc;

use anyhow::{Result, anyhow, bail};
use rozd::api::proto::agent_service_client::AgentServiceClient;
use rozd::api::proto::session_response::Response as Resp;
use rozd::config::{Config, ConfigSource};
use rozd::hw::serial::{SerialActuator, SerialPorts};
use rozd::hw::sim::SimActuator;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use super::Scale;
use super::fixtures::{
    Daemon, Device, Discard, Echo, PtyPair, SessionStream, changed, connect, start_echo, step_tool,
    tool_result, user,
};
use super::report::{Group, P50, P99, Samples};

/// The serial device answers every command at once.
fn ok(_line: &str) -> Option<&'static str> {
    Some("OK\n")
}

fn serial_actuator_toml(port_path: &std::path::Path) -> String {
    format!(
        "[[serial]]\nname = \"mcu\"\npath = {:?}\n\n\
         [[actuators]]\nname = \"valve\"\nkind = \"serial\"\nport = \"mcu\"\n\
         template = \"V {{value}}\\n\"\nexpect = \"^OK\"\ntimeout_ms = 2000\nmin = 0\nmax = 1\nsafe_value = 0\n",
        port_path.display().to_string()
    )
}

const SIM_ACTUATOR: &str = "\
[[actuators]]
name = \"speed\"
kind = \"sim\"
min = -1.0
max = 1.0
safe_value = 0.0

[[permissions]]
tool_pattern = \"speed\"
policy = \"allow\"

[[permissions]]
tool_pattern = \"valve\"
policy = \"allow\"
";

/// Where a trial's clock stops.
enum Watch<'a> {
    Sim(&'a SimActuator),
    Device(&'a mut Device),
}

impl Watch<'_> {
    fn arm(&mut self) -> Option<tokio::sync::watch::Receiver<u64>> {
        match self {
            Watch::Sim(sim) => {
                let mut rx = sim.applied();
                rx.borrow_and_update();
                Some(rx)
            }
            Watch::Device(device) => {
                device.drain();
                None
            }
        }
    }

    async fn fired(
        &mut self,
        armed: Option<tokio::sync::watch::Receiver<u64>>,
        expect_line: &str,
    ) -> Result<Instant> {
        match (self, armed) {
            (Watch::Sim(_), Some(mut rx)) => changed(&mut rx).await,
            (Watch::Device(device), _) => {
                let (line, at) = device.line().await?;
                if line != expect_line {
                    bail!("the device got {line:?}, expected {expect_line:?}");
                }
                Ok(at)
            }
            (Watch::Sim(_), None) => Err(anyhow!("not armed")),
        }
    }
}

/// What the device reads when `value` is commanded.
fn device_line(value: f64) -> String {
    format!("V {}", rozd::hw::parse::format_value(value))
}

/// Trials per session: a new session every so often keeps the conversation
/// (and so the per-call cost) from growing over the run.
const TRIALS_PER_SESSION: usize = 25;

/// rozd: marker tool result sent -> actuator changed, `trials` times.
async fn rozd_trials(
    client: &mut AgentServiceClient<Channel>,
    actuator: &str,
    values: [f64; 2],
    mut watch: Watch<'_>,
    trials: usize,
) -> Result<Samples> {
    let mut samples = Samples::default();
    let mut session = SessionStream::start(client, vec![step_tool()]).await?;
    for i in 0..=trials {
        if i > 0 && i % TRIALS_PER_SESSION == 0 {
            session.close().await?;
            session = SessionStream::start(client, vec![step_tool()]).await?;
        }
        let value = values[i % 2];
        session
            .send(user(&format!(
                "call {} {{}}; set {actuator} {value}",
                super::fixtures::STEP_TOOL
            )))
            .await?;
        let marker = session.tool_request().await?;
        let armed = watch.arm();
        let start = Instant::now();
        session
            .send(tool_result(&marker.tool_call_id, "ok"))
            .await?;
        let at = watch.fired(armed, &device_line(value)).await?;
        if i > 0 {
            samples.push(at - start);
        }
        session.turn_complete().await?;
    }
    session.close().await?;
    Ok(samples)
}

/// The floor: the value as a tool result over a bare tonic stream, applied
/// by the echo to its driver.
async fn floor_trials(
    stream: &mut SessionStream,
    values: [f64; 2],
    mut watch: Watch<'_>,
    trials: usize,
) -> Result<Samples> {
    let mut samples = Samples::default();
    for i in 0..=trials {
        let value = values[i % 2];
        stream.send(user("go")).await?;
        let Resp::ToolRequest(request) = stream.next().await? else {
            bail!("expected the echo's ToolRequest");
        };
        let armed = watch.arm();
        let start = Instant::now();
        stream
            .send(tool_result(&request.tool_call_id, &value.to_string()))
            .await?;
        let at = watch.fired(armed, &device_line(value)).await?;
        if i > 0 {
            samples.push(at - start);
        }
        let Resp::TurnComplete(_) = stream.next().await? else {
            bail!("expected the echo's TurnComplete");
        };
    }
    Ok(samples)
}

pub async fn host_tool(scale: &Scale) -> Result<Group> {
    let dir = tempfile::tempdir()?;
    let rozd_pty = PtyPair::start(dir.path(), "rozd").await?;
    let floor_pty = PtyPair::start(dir.path(), "floor").await?;
    let mut rozd_device = Device::start(&rozd_pty, ok)?;
    let mut floor_device = Device::start(&floor_pty, ok)?;

    let daemon = Daemon::start(&format!(
        "{}\n{SIM_ACTUATOR}",
        serial_actuator_toml(&rozd_pty.a)
    ))
    .await?;
    let sim = daemon
        .host
        .sim_actuator("speed")
        .ok_or_else(|| anyhow!("no sim actuator"))?;

    // The floor's own serial port and driver, from the same config keys.
    let floor_config = Config::parse(&serial_actuator_toml(&floor_pty.a), ConfigSource::BuiltIn)
        .map_err(|e| anyhow!("floor config: {e}"))?;
    let stop_ports = CancellationToken::new();
    let mut ports = SerialPorts::start(
        &floor_config.hardware.serial,
        &floor_config.hardware.sensors,
        Arc::new(Discard),
        stop_ports.clone(),
    );
    ports.first_open_attempts().await;
    let serial_driver = floor_config
        .hardware
        .actuators
        .first()
        .and_then(|spec| SerialActuator::from_spec(spec, &ports))
        .ok_or_else(|| anyhow!("the floor's serial actuator"))?;
    let floor_sim = SimActuator::new();
    let sim_echo = start_echo(Echo {
        driver: Some(floor_sim.clone()),
        ..Echo::default()
    })
    .await?;
    let serial_echo = start_echo(Echo {
        driver: Some(Arc::new(serial_driver)),
        ..Echo::default()
    })
    .await?;

    let mut rozd_client = connect(daemon.addr).await?;
    let mut sim_stream = SessionStream::start(&mut connect(sim_echo.addr).await?, vec![]).await?;
    let mut serial_stream =
        SessionStream::start(&mut connect(serial_echo.addr).await?, vec![]).await?;

    // In rounds, so rozd and the floor share the machine's moments.
    let rounds = 5;
    let per_round = scale.host_trials.div_ceil(rounds);
    let (mut sim_rozd, mut sim_floor) = (Samples::default(), Samples::default());
    let (mut serial_rozd, mut serial_floor) = (Samples::default(), Samples::default());
    for _ in 0..rounds {
        sim_rozd.extend(
            rozd_trials(
                &mut rozd_client,
                "speed",
                [0.5, -0.5],
                Watch::Sim(&sim),
                per_round,
            )
            .await?,
        );
        sim_floor.extend(
            floor_trials(
                &mut sim_stream,
                [0.5, -0.5],
                Watch::Sim(&floor_sim),
                per_round,
            )
            .await?,
        );
        serial_rozd.extend(
            rozd_trials(
                &mut rozd_client,
                "valve",
                [1.0, 0.5],
                Watch::Device(&mut rozd_device),
                per_round,
            )
            .await?,
        );
        serial_floor.extend(
            floor_trials(
                &mut serial_stream,
                [1.0, 0.5],
                Watch::Device(&mut floor_device),
                per_round,
            )
            .await?,
        );
    }
    daemon.shutdown().await?;
    stop_ports.cancel();

    let mut group = Group::new(
        "3. host tool path",
        "the same tool result over a bare tonic stream, applied by a direct call of \
         the same driver (a SimActuator; a SerialActuator on its own socat pty pair)",
    );
    group.latencies(
        "host_tool.sim",
        "tool use -> simulated actuator changed",
        &sim_rozd,
        &sim_floor,
        &[P50, P99],
    );
    group.latencies(
        "host_tool.serial",
        "tool use -> serial device read the command",
        &serial_rozd,
        &serial_floor,
        &[P50, P99],
    );
    Ok(group)
}
