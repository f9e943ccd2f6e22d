//! What a run produces: metrics beside their floors, the machine they were
//! measured on, a markdown table and the same as JSON.

use std::fmt::Write as _;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Which way is better, so the ratio always reads "times worse than the floor".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Better {
    Lower,
    Higher,
}

/// One measured quantity of rozd beside the same quantity of its floor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metric {
    /// Stable key, e.g. `step.p50_us`.
    pub id: String,
    /// The measurement it belongs to, e.g. `1. tool step overhead`.
    pub group: String,
    pub name: String,
    pub unit: String,
    pub rozd: f64,
    /// `None` only where nothing comparable can be measured in the same run
    /// (the binary size); `floor_note` then says why.
    pub floor: Option<f64>,
    pub floor_note: String,
    /// rozd / floor when lower is better, floor / rozd when higher is:
    /// how many times worse than the floor. `None` when the floor is 0.
    pub ratio: Option<f64>,
    pub better: Better,
    /// Samples behind the rozd figure (trials, steps, ticks, turns).
    pub samples: u64,
    pub floor_samples: u64,
}

/// The machine and build a report was measured on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    pub cpu: String,
    pub cores: usize,
    pub kernel: String,
    pub memory_mib: u64,
    /// `/proc/loadavg` when the run started and ended: other work on a shared machine.
    pub loadavg_start: String,
    pub loadavg_end: String,
}

impl Machine {
    pub fn read() -> Machine {
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|text| {
                text.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            })
            .unwrap_or_else(|| std::env::consts::ARCH.to_string());
        let memory_mib = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|text| {
                text.lines()
                    .find(|l| l.starts_with("MemTotal:"))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|kib| kib.parse::<u64>().ok())
            })
            .map_or(0, |kib| kib / 1024);
        Machine {
            cpu,
            cores: std::thread::available_parallelism().map_or(1, usize::from),
            kernel: read_trimmed("/proc/sys/kernel/osrelease"),
            memory_mib,
            loadavg_start: loadavg(),
            loadavg_end: String::new(),
        }
    }
}

pub fn loadavg() -> String {
    read_trimmed("/proc/loadavg")
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".to_string())
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub rozd_version: String,
    /// `full` or `quick`.
    pub mode: String,
    /// `release` (optimised, as `cargo bench` builds) or `debug`.
    pub profile: String,
    pub machine: Machine,
    pub started_unix_ms: i64,
    pub duration_secs: f64,
    pub metrics: Vec<Metric>,
    /// What a reader needs to interpret the figures.
    pub notes: Vec<String>,
}

impl Report {
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let m = &self.machine;
        let _ = writeln!(
            out,
            "## rozd {} benchmark ({} mode, {} build, {:.0} s)\n",
            self.rozd_version, self.mode, self.profile, self.duration_secs
        );
        let _ = writeln!(
            out,
            "Machine: {}, {} cores, {} MiB, Linux {}; load average {} at the start, {} at the end.\n",
            m.cpu, m.cores, m.memory_mib, m.kernel, m.loadavg_start, m.loadavg_end
        );
        let _ = writeln!(
            out,
            "ratio = how many times worse than the floor measured in the same run \
             (rozd / floor where lower is better, floor / rozd where higher is).\n"
        );
        let _ = writeln!(out, "| metric | rozd | floor | ratio |");
        let _ = writeln!(out, "|---|---:|---:|---:|");
        let mut group = "";
        for metric in &self.metrics {
            if metric.group != group {
                group = &metric.group;
                let _ = writeln!(out, "| **{group}** | | | |");
            }
            let _ = writeln!(
                out,
                "| {} ({}) | {} | {} | {} |",
                metric.name,
                metric.unit,
                number(metric.rozd),
                metric.floor.map_or_else(|| "—".to_string(), number),
                metric
                    .ratio
                    .map_or_else(|| "—".to_string(), |r| format!("{r:.2}×")),
            );
        }
        let mut floors: Vec<(&str, &str)> = Vec::new();
        for metric in &self.metrics {
            if !floors.iter().any(|(g, _)| *g == metric.group) {
                floors.push((&metric.group, &metric.floor_note));
            }
        }
        let _ = writeln!(out, "\nFloors:\n");
        for (group, note) in floors {
            let _ = writeln!(out, "- {group}: {note}");
        }
        if !self.notes.is_empty() {
            let _ = writeln!(out, "\nNotes:\n");
            for note in &self.notes {
                let _ = writeln!(out, "- {note}");
            }
        }
        out
    }

    /// The metric with the largest ratio (what to improve first).
    pub fn worst(&self) -> Option<&Metric> {
        self.metrics
            .iter()
            .filter(|m| m.ratio.is_some())
            .max_by(|a, b| {
                a.ratio
                    .partial_cmp(&b.ratio)
                    .unwrap_or(std::cmp::Ordering::Equal)
            })
    }
}

fn number(v: f64) -> String {
    if v == 0.0 {
        "0".to_string()
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Builds the metrics of one group, all against the same floor.
pub struct Group {
    name: String,
    floor_note: String,
    pub metrics: Vec<Metric>,
}

impl Group {
    pub fn new(name: &str, floor_note: &str) -> Group {
        Group {
            name: name.to_string(),
            floor_note: floor_note.to_string(),
            metrics: Vec::new(),
        }
    }

    /// Adds one metric; `samples` are (rozd, floor).
    #[allow(clippy::too_many_arguments)]
    pub fn add(
        &mut self,
        id: &str,
        name: &str,
        unit: &str,
        better: Better,
        rozd: f64,
        floor: Option<f64>,
        samples: (usize, usize),
    ) {
        let ratio = floor.and_then(|f| {
            let r = match better {
                Better::Lower => rozd / f,
                Better::Higher => f / rozd,
            };
            r.is_finite().then_some(r)
        });
        self.metrics.push(Metric {
            id: id.to_string(),
            group: self.name.clone(),
            name: name.to_string(),
            unit: unit.to_string(),
            rozd,
            floor,
            floor_note: self.floor_note.clone(),
            ratio,
            better,
            samples: samples.0 as u64,
            floor_samples: samples.1 as u64,
        });
    }

    /// Percentiles (`pcts`, e.g. [`P50`], [`P99`], [`MAX`]) of two latency
    /// distributions, in µs.
    pub fn latencies(
        &mut self,
        id: &str,
        name: &str,
        rozd: &Samples,
        floor: &Samples,
        pcts: &[(&str, f64)],
    ) {
        let n = (rozd.len(), floor.len());
        for &(label, p) in pcts {
            self.add(
                &format!("{id}.{}_us", label.replace('.', "")),
                &format!("{name} {label}"),
                "µs",
                Better::Lower,
                rozd.percentile(p),
                Some(floor.percentile(p)),
                n,
            );
        }
    }
}

pub const P50: (&str, f64) = ("p50", 0.50);
pub const P99: (&str, f64) = ("p99", 0.99);
pub const P999: (&str, f64) = ("p99.9", 0.999);
pub const MAX: (&str, f64) = ("max", 1.0);

/// Durations in microseconds.
#[derive(Debug, Clone, Default)]
pub struct Samples(Vec<f64>);

impl Samples {
    pub fn push(&mut self, d: Duration) {
        self.0.push(d.as_secs_f64() * 1e6);
    }
    pub fn push_us(&mut self, us: f64) {
        self.0.push(us);
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
    pub fn extend(&mut self, other: Samples) {
        self.0.extend(other.0);
    }
    /// Nearest-rank percentile; NaN without samples (the report check catches it).
    pub fn percentile(&self, p: f64) -> f64 {
        if self.0.is_empty() {
            return f64::NAN;
        }
        let mut sorted = self.0.clone();
        sorted.sort_by(f64::total_cmp);
        let rank = (p * sorted.len() as f64).ceil() as usize;
        sorted[rank.clamp(1, sorted.len()) - 1]
    }
}

/// Checks what the test suite asserts of a report: every metric finite,
/// with samples, a floor (or a reason why none), a consistent ratio.
pub fn problems(report: &Report) -> Vec<String> {
    let mut out = Vec::new();
    if report.metrics.is_empty() {
        out.push("no metrics".to_string());
    }
    for m in &report.metrics {
        let what = &m.id;
        if !m.rozd.is_finite() || m.rozd < 0.0 {
            out.push(format!(
                "{what}: rozd value {} is not a finite, non-negative number",
                m.rozd
            ));
        }
        if m.samples == 0 {
            out.push(format!("{what}: no rozd samples"));
        }
        match m.floor {
            Some(f) => {
                if !f.is_finite() || f < 0.0 {
                    out.push(format!(
                        "{what}: floor {f} is not a finite, non-negative number"
                    ));
                }
                if m.floor_samples == 0 {
                    out.push(format!("{what}: no floor samples"));
                }
                match m.ratio {
                    Some(r) if !r.is_finite() || r < 0.0 => {
                        out.push(format!("{what}: ratio {r} is not finite"))
                    }
                    None if f > 0.0 && m.rozd > 0.0 => {
                        out.push(format!("{what}: floor {f} but no ratio"))
                    }
                    _ => {}
                }
            }
            None if m.floor_note.trim().is_empty() => {
                out.push(format!("{what}: no floor and no note saying why"))
            }
            None => {}
        }
        if m.name.is_empty() || m.unit.is_empty() || m.group.is_empty() {
            out.push(format!("{what}: unnamed, unitless or ungrouped"));
        }
    }
    let mut ids: Vec<&str> = report.metrics.iter().map(|m| m.id.as_str()).collect();
    ids.sort_unstable();
    for pair in ids.windows(2) {
        if pair[0] == pair[1] {
            out.push(format!("{}: reported twice", pair[0]));
        }
    }
    out
}
