//! The performance harness of issue 7: each measurement beside a floor
//! measured in the same run on the same machine, so the figures are ratios
//! that hold on a noisy shared machine.
//!
//! `cargo bench --bench rozd` runs it in full (a few minutes);
//! `-- --quick` runs every measurement briefly (what `tests/bench_harness.rs`
//! does in the test suite, asserting the report's shape, never a speed).
//! Output: a markdown table on stdout and the same as JSON in
//! `<target dir>/bench/report.json`.

pub mod cameras;
pub mod control_loop;
pub mod fixtures;
pub mod footprint;
pub mod foxglove;
pub mod host_tool;
pub mod modbus;
pub mod report;
pub mod safe_state;
pub mod soak;
pub mod steps;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};

use report::{Machine, Report};

/// How much of each measurement to do.
#[derive(Debug, Clone)]
pub struct Scale {
    /// 1: sessions x turns x client tool calls per turn.
    pub step_sessions: usize,
    pub step_turns: usize,
    pub step_calls: usize,
    /// 2: concurrent session counts, and how long each runs.
    pub sessions: Vec<usize>,
    pub load_for: Duration,
    /// 3: trials per actuator.
    pub host_trials: usize,
    /// 4: how long each loop rate runs; sessions running turns during the
    /// loaded run; reflex-rule trials per rate.
    pub loop_for: Duration,
    pub loaded_sessions: usize,
    pub reflex_trials: usize,
    /// 5: protective-stop trials per source; stuck calls and their timeout.
    pub safe_trials: usize,
    pub stuck_trials: usize,
    pub stuck_timeout: Duration,
    /// 6: start-ups, the settling time before "idle", sessions and turns.
    pub startups: usize,
    pub settle: Duration,
    pub footprint_sessions: usize,
    pub footprint_turns: usize,
}

impl Scale {
    /// What the issue asks for, in well under 5 minutes on 2 cores.
    pub fn full() -> Scale {
        Scale {
            step_sessions: 20,
            step_turns: 10,
            step_calls: 11,
            sessions: vec![1, 10, 100, 1000],
            load_for: Duration::from_secs(3),
            host_trials: 500,
            loop_for: Duration::from_secs(10),
            loaded_sessions: 100,
            reflex_trials: 200,
            safe_trials: 200,
            stuck_trials: 30,
            stuck_timeout: Duration::from_millis(100),
            startups: 5,
            settle: Duration::from_secs(1),
            footprint_sessions: 100,
            footprint_turns: 10_000,
        }
    }

    /// Every measurement, briefly: checks that the harness works.
    pub fn quick() -> Scale {
        Scale {
            step_sessions: 2,
            step_turns: 2,
            step_calls: 6,
            sessions: vec![1, 10, 50],
            load_for: Duration::from_millis(300),
            host_trials: 10,
            loop_for: Duration::from_millis(500),
            loaded_sessions: 10,
            reflex_trials: 5,
            safe_trials: 5,
            stuck_trials: 3,
            stuck_timeout: Duration::from_millis(50),
            startups: 2,
            settle: Duration::from_millis(100),
            footprint_sessions: 10,
            footprint_turns: 100,
        }
    }
}

/// The measurements, by number and short name (for `--only`).
pub const MEASUREMENTS: [(&str, &str); 9] = [
    ("1", "steps"),
    ("2", "concurrency"),
    ("3", "host-tool"),
    ("4", "loop"),
    ("5", "safe-state"),
    ("6", "footprint"),
    ("7", "cameras"),
    ("8", "foxglove"),
    ("9", "modbus"),
];

#[derive(Debug, Clone, Default)]
pub struct Options {
    pub quick: bool,
    /// Where the JSON goes; default `<target dir>/bench/report.json`.
    pub out: Option<PathBuf>,
    /// Only these measurements (numbers or names); all when empty.
    pub only: Vec<String>,
    /// `--soak SECONDS [--sessions N] [--every SECONDS] [--rounds N]`: the
    /// soak instead of the measurements.
    pub soak: Option<soak::SoakOptions>,
}

pub const USAGE: &str = "usage: cargo bench --bench rozd -- [--quick] [--out FILE] [--only 1,2,...|steps,concurrency,host-tool,loop,safe-state,footprint,cameras,foxglove,modbus] | --soak SECONDS [--sessions N] [--every SECONDS] [--rounds N]";

impl Options {
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Options> {
        let mut options = Options::default();
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--quick" => options.quick = true,
                "--out" => {
                    options.out = Some(args.next().context("--out needs a file")?.into());
                }
                "--only" => {
                    let list = args.next().context("--only needs a list")?;
                    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                        if !MEASUREMENTS
                            .iter()
                            .any(|(n, name)| item == *n || item == *name)
                        {
                            bail!("--only: unknown measurement {item:?}");
                        }
                        options.only.push(item.to_string());
                    }
                }
                "--soak" => {
                    let secs: u64 = args
                        .next()
                        .context("--soak needs seconds")?
                        .parse()
                        .context("--soak: seconds")?;
                    options.soak_mut().duration = Duration::from_secs(secs);
                }
                "--sessions" => {
                    options.soak_mut().sessions = args
                        .next()
                        .context("--sessions needs a number")?
                        .parse()
                        .context("--sessions: a number")?;
                }
                "--every" => {
                    let secs: u64 = args
                        .next()
                        .context("--every needs seconds")?
                        .parse()
                        .context("--every: seconds")?;
                    options.soak_mut().every = Duration::from_secs(secs.max(1));
                }
                "--rounds" => {
                    options.soak_mut().rounds = args
                        .next()
                        .context("--rounds needs a number")?
                        .parse()
                        .context("--rounds: a number")?;
                }
                // cargo bench passes `--bench` to harness = false targets.
                "--bench" => {}
                other => bail!("unknown argument {other:?}"),
            }
        }
        Ok(options)
    }

    fn soak_mut(&mut self) -> &mut soak::SoakOptions {
        self.soak.get_or_insert(soak::SoakOptions {
            duration: Duration::from_secs(600),
            sessions: 1000,
            every: Duration::from_secs(10),
            rounds: 1,
        })
    }

    fn wants(&self, number: &str) -> bool {
        self.only.is_empty()
            || MEASUREMENTS
                .iter()
                .filter(|(n, _)| *n == number)
                .any(|(n, name)| self.only.iter().any(|o| o == n || o == name))
    }

    pub fn out_path(&self) -> PathBuf {
        self.out
            .clone()
            .unwrap_or_else(|| target_dir().join("bench").join("report.json"))
    }
}

/// The target directory this executable was built into (`CARGO_TARGET_DIR`
/// or `target/`): it lives in `<target>/<profile>/deps/`.
fn target_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.ancestors().nth(3).map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("target"))
}

fn notes(options: &Options) -> Vec<String> {
    let mut notes = vec![
        "On a machine shared with other work the absolute figures are noisy: compare the \
         ratios, which were measured side by side, and mind the load averages."
            .to_string(),
        "Measurements 1-5 run the daemon in this process on a multi-thread tokio runtime with \
         one worker per core (as `rozd run`), the clients and the floors on the same runtime; \
         6 runs the `rozd` binary as its own process. Logs are formatted at `info` and discarded."
            .to_string(),
        "Loop lateness p50/p99 cover the last 4096 ticks (as /v1/status reports them); the \
         floors' cover the same window. The maxima cover the whole run."
            .to_string(),
    ];
    if cfg!(debug_assertions) {
        notes.push(
            "Debug build: these figures say nothing about rozd's speed; `cargo bench --bench rozd` \
             measures the optimised build."
                .to_string(),
        );
    }
    if options.quick {
        notes.push("Quick mode: every measurement ran briefly, with few samples.".to_string());
    }
    notes
}

/// Runs the chosen measurements and writes the JSON report.
pub fn run(options: &Options) -> Result<Report> {
    let scale = if options.quick {
        Scale::quick()
    } else {
        Scale::full()
    };
    // The daemon's events are formatted as `rozd run` would, then dropped.
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::sink)
        .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
        .try_init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let mut machine = Machine::read();
    let started = std::time::Instant::now();
    let started_unix_ms = rozd::clock::now_ms();
    let metrics = runtime.block_on(async {
        let mut metrics = Vec::new();
        let section = |number: &str| {
            let wanted = options.wants(number);
            if wanted {
                let name = MEASUREMENTS
                    .iter()
                    .find(|(n, _)| *n == number)
                    .map_or("", |(_, name)| name);
                eprintln!("== {number}. {name}");
            }
            wanted
        };
        if section("1") {
            for group in steps::tool_steps(&scale).await.context("1. steps")? {
                metrics.extend(group.metrics);
            }
        }
        if section("2") {
            metrics.extend(
                steps::concurrency(&scale)
                    .await
                    .context("2. concurrency")?
                    .metrics,
            );
        }
        if section("3") {
            metrics.extend(
                host_tool::host_tool(&scale)
                    .await
                    .context("3. host tool")?
                    .metrics,
            );
        }
        if section("4") {
            metrics.extend(
                control_loop::control_loop(&scale)
                    .await
                    .context("4. control loop")?
                    .metrics,
            );
        }
        if section("5") {
            metrics.extend(
                safe_state::safe_state(&scale)
                    .await
                    .context("5. safe state")?
                    .metrics,
            );
        }
        if section("6") {
            metrics.extend(
                footprint::footprint(&scale)
                    .await
                    .context("6. footprint")?
                    .metrics,
            );
        }
        if section("7") {
            metrics.extend(
                cameras::cameras(&scale)
                    .await
                    .context("7. cameras")?
                    .metrics,
            );
        }
        if section("8") {
            metrics.extend(
                foxglove::foxglove(&scale)
                    .await
                    .context("8. foxglove")?
                    .metrics,
            );
        }
        if section("9") {
            metrics.extend(modbus::modbus(&scale).await.context("9. modbus")?.metrics);
        }
        anyhow::Ok(metrics)
    })?;
    runtime.shutdown_timeout(Duration::from_secs(5));
    machine.loadavg_end = report::loadavg();
    let report = Report {
        rozd_version: rozd::VERSION.to_string(),
        mode: if options.quick { "quick" } else { "full" }.to_string(),
        profile: if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
        .to_string(),
        machine,
        started_unix_ms,
        duration_secs: started.elapsed().as_secs_f64(),
        metrics,
        notes: notes(options),
    };
    let out = options.out_path();
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    std::fs::write(&out, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("write {}", out.display()))?;
    Ok(report)
}

/// When this executable was started as the footprint floor (the bare echo
/// as its own process), serves until SIGTERM and returns its exit code.
pub fn child_role() -> Option<ExitCode> {
    if std::env::var(footprint::ROLE_ENV).ok()? != footprint::ECHO_ROLE {
        return None;
    }
    let served = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|runtime| {
            runtime.block_on(async {
                use tokio::signal::unix::{SignalKind, signal};
                let mut term = signal(SignalKind::terminate())?;
                let server = fixtures::start_echo(fixtures::Echo::default()).await?;
                let status = format!("STATUS=serving roz.v1 on {}", server.addr);
                sd_notify::notify(&[
                    sd_notify::NotifyState::Ready,
                    sd_notify::NotifyState::Custom(&status),
                ])?;
                term.recv().await;
                anyhow::Ok(())
            })
        });
    Some(match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("echo floor process: {e:#}");
            ExitCode::FAILURE
        }
    })
}

/// `cargo bench --bench rozd [-- --quick]`.
pub fn main() -> ExitCode {
    if let Some(code) = child_role() {
        return code;
    }
    let options = match Options::parse(std::env::args().skip(1)) {
        Ok(options) => options,
        Err(e) => {
            eprintln!("{e:#}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if let Some(soak) = options.soak {
        let soaked = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|runtime| runtime.block_on(soak::soak(soak)));
        return match soaked {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("soak failed: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    match run(&options) {
        Ok(report) => {
            print!("{}", report.markdown());
            eprintln!("report written to {}", options.out_path().display());
            for problem in report::problems(&report) {
                eprintln!("warning: {problem}");
            }
            if let Some(worst) = report.worst() {
                eprintln!(
                    "largest ratio: {} ({}) at {:.2}x its floor",
                    worst.name,
                    worst.group,
                    worst.ratio.unwrap_or(f64::NAN)
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("benchmark failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}
