//! `[record]` (MCAP recordings) and `[replay]` (what replayed sensors may
//! run beside): the sections, their defaults and their validation. Imports
//! only `config::types` and the hardware specs.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::config::types::{Invalid, within};
use crate::hw::config::{ActuatorTarget, HardwareSpec, SensorSource};

/// The streams a recording can hold, by their `streams` name.
pub(crate) const STREAMS: &[&str] = &[
    "observation",
    "sensors",
    "actuators",
    "protective_stop",
    "audit",
    "sessions",
    "tasks",
    "cameras",
];

/// `[record]`. Every key has its default, stated once in [`Default`].
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RecordConfig {
    /// `false` keeps the section but records nothing.
    pub enabled: bool,
    /// Where the `.mcap` files go; default: `recordings/` beside the store.
    pub directory: Option<PathBuf>,
    /// A file is finished and a new one started once it holds this many KiB.
    pub max_file_kb: u64,
    /// ... or once it has been open this long (`max_file_secs`).
    #[serde(
        rename = "max_file_secs",
        deserialize_with = "crate::config::units::secs"
    )]
    pub max_file_age: Duration,
    /// The oldest finished files are deleted while all of them together
    /// exceed this many MiB; 0: no cap.
    pub max_total_mb: u64,
    /// ... or while there are more finished files than this; 0: no cap.
    pub max_files: u32,
    /// Which streams are recorded (see [`STREAMS`]); default: all.
    pub streams: Vec<String>,
    /// How often the whole Observation is recorded on `/observation`.
    pub observation_hz: f64,
    /// Frames per second each camera records on `/cameras/<name>` at most.
    pub camera_hz: f64,
    /// Messages waiting for the writer at most; more are dropped and counted.
    pub queue: usize,
    /// The open chunk is closed and flushed to the file this often
    /// (`flush_ms`): what a `kill -9` can lose at most.
    #[serde(rename = "flush_ms", deserialize_with = "crate::config::units::millis")]
    pub flush_every: Duration,
}

impl Default for RecordConfig {
    fn default() -> Self {
        RecordConfig {
            enabled: true,
            directory: None,
            max_file_kb: 64 * 1024,
            max_file_age: Duration::from_secs(3600),
            max_total_mb: 1024,
            max_files: 0,
            streams: STREAMS.iter().map(ToString::to_string).collect(),
            observation_hz: 1.0,
            camera_hz: 1.0,
            queue: 4096,
            flush_every: Duration::from_millis(1000),
        }
    }
}

impl RecordConfig {
    /// The directory, resolved against the store's path when not set.
    pub fn resolved_directory(&self, store_path: &Path) -> PathBuf {
        match &self.directory {
            Some(dir) => dir.clone(),
            None => store_path
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(Path::new("."))
                .join("recordings"),
        }
    }

    /// Whether the named stream is recorded.
    pub fn records(&self, stream: &str) -> bool {
        self.streams.iter().any(|s| s == stream)
    }

    /// One line for `rozd check`.
    pub fn describe(&self, store_path: &Path) -> String {
        if !self.enabled {
            return "off".into();
        }
        format!(
            "{} ({}; files of up to {} KiB or {} s; keep {}; observation at {} Hz)",
            self.resolved_directory(store_path).display(),
            self.streams.join(", "),
            self.max_file_kb,
            self.max_file_age.as_secs(),
            match (self.max_total_mb, self.max_files) {
                (0, 0) => "every file".to_string(),
                (mb, 0) => format!("at most {mb} MiB"),
                (0, n) => format!("at most {n} files"),
                (mb, n) => format!("at most {mb} MiB and {n} files"),
            },
            self.observation_hz
        )
    }
}

/// Checks `[record]`; an error names the key (`record.<key>`) and why.
pub(crate) fn validate(record: &RecordConfig) -> Result<(), Invalid> {
    if let Some(dir) = &record.directory {
        if dir.as_os_str().is_empty() {
            return Err(Invalid::new("record.directory", "must not be empty"));
        }
        if dir.exists() && !dir.is_dir() {
            return Err(Invalid::new(
                "record.directory",
                format!("{} exists and is not a directory", dir.display()),
            ));
        }
    }
    within(
        "record.max_file_kb",
        record.max_file_kb,
        16..=4 * 1024 * 1024,
    )
    .map_err(|e| e.noting("4 GiB"))?;
    within(
        "record.max_file_secs",
        record.max_file_age.as_secs(),
        1..=7 * 86_400,
    )
    .map_err(|e| e.noting("a week"))?;
    // The cap first: below it the size in bytes cannot overflow.
    if record.max_total_mb > 1 << 30 {
        return Err(Invalid::new("record.max_total_mb", "must be at most 2^30"));
    }
    if record.max_total_mb != 0 && record.max_total_mb * 1024 < record.max_file_kb {
        return Err(Invalid::new(
            "record.max_total_mb",
            format!(
                "{} MiB is less than one file of record.max_file_kb ({} KiB); raise it or set 0 (no cap)",
                record.max_total_mb, record.max_file_kb
            ),
        ));
    }
    for (i, stream) in record.streams.iter().enumerate() {
        if !STREAMS.contains(&stream.as_str()) {
            return Err(Invalid::new(
                format!("record.streams[{i}]"),
                format!("unknown stream {stream:?}; known: {}", STREAMS.join(", ")),
            ));
        }
    }
    if record.streams.is_empty() {
        return Err(Invalid::new(
            "record.streams",
            "must name at least one stream (or set record.enabled = false)",
        ));
    }
    let hz = record.observation_hz;
    if !(hz.is_finite() && hz > 0.0 && hz <= 50.0) {
        return Err(Invalid::new(
            "record.observation_hz",
            format!("{hz} is outside 0 < observation_hz <= 50"),
        ));
    }
    let hz = record.camera_hz;
    if !(hz.is_finite() && hz > 0.0 && hz <= 30.0) {
        return Err(Invalid::new(
            "record.camera_hz",
            format!("{hz} is outside 0 < camera_hz <= 30"),
        ));
    }
    within("record.queue", record.queue, 16..=1_048_576)?;
    within(
        "record.flush_ms",
        record.flush_every.as_millis(),
        10..=60_000,
    )?;
    Ok(())
}

/// `[replay]`: how replayed sensors and cameras (`source = "replay"`) play.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReplayConfig {
    /// Playback speed: 1 is real time, 10 ten times faster.
    pub speed: f64,
    /// Start again from the beginning after the last value.
    #[serde(rename = "loop")]
    pub looped: bool,
    /// Let replayed sensors run beside actuators that are not simulated
    /// (a recording would then move real hardware).
    pub allow_real_actuators: bool,
}

impl Default for ReplayConfig {
    fn default() -> Self {
        ReplayConfig {
            speed: 1.0,
            looped: false,
            allow_real_actuators: false,
        }
    }
}

/// Checks `[replay]` against the validated hardware (a replayed sensor
/// beside an actuator that is not simulated is refused unless
/// `replay.allow_real_actuators` says otherwise), then gives every replayed
/// sensor the speed and `loop` of `[replay]`.
pub(crate) fn validate_replay(
    replay: &ReplayConfig,
    hardware: &mut HardwareSpec,
) -> Result<(), Invalid> {
    let s = replay.speed;
    if !(s.is_finite() && (0.01..=1000.0).contains(&s)) {
        return Err(Invalid::new(
            "replay.speed",
            format!("{s} is outside 0.01 <= speed <= 1000"),
        ));
    }
    let replayed = hardware
        .sensors
        .iter()
        .find(|s| matches!(s.source, SensorSource::Replay(_)));
    let real = hardware
        .actuators
        .iter()
        .find(|a| !matches!(a.target, ActuatorTarget::Sim { .. }));
    if let (Some(sensor), Some(actuator), false) = (replayed, real, replay.allow_real_actuators) {
        let i = hardware
            .sensors
            .iter()
            .position(|s| s.name == sensor.name)
            .unwrap_or(0);
        return Err(Invalid::new(
            format!("sensors[{i}].source"),
            format!(
                "sensor {:?} replays a recording but actuator {:?} is not simulated: rules and \
                 sessions acting on recorded data would move real hardware; make the actuators \
                 kind = \"sim\", or set replay.allow_real_actuators = true to accept the risk",
                sensor.name, actuator.name
            ),
        ));
    }
    for sensor in &mut hardware.sensors {
        if let SensorSource::Replay(spec) = &mut sensor.source {
            spec.speed = replay.speed;
            spec.looped = replay.looped;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_record_every_stream() {
        let config = RecordConfig::default();
        assert!(validate(&config).is_ok());
        assert!(STREAMS.iter().all(|s| config.records(s)));
    }

    #[test]
    fn bad_values_name_their_key() {
        let cases: Vec<(RecordConfig, &str)> = vec![
            (
                RecordConfig {
                    max_file_kb: 1,
                    ..Default::default()
                },
                "record.max_file_kb",
            ),
            (
                RecordConfig {
                    streams: vec!["sensors".into(), "video".into()],
                    ..Default::default()
                },
                "record.streams[1]",
            ),
            (
                RecordConfig {
                    observation_hz: 0.0,
                    ..Default::default()
                },
                "record.observation_hz",
            ),
            (
                RecordConfig {
                    camera_hz: 0.0,
                    ..Default::default()
                },
                "record.camera_hz",
            ),
            (
                RecordConfig {
                    max_total_mb: 1,
                    max_file_kb: 4096,
                    ..Default::default()
                },
                "record.max_total_mb",
            ),
            (
                // So large that it overflowed in KiB before the cap was checked.
                RecordConfig {
                    max_total_mb: i64::MAX as u64,
                    ..Default::default()
                },
                "record.max_total_mb",
            ),
            (
                RecordConfig {
                    flush_every: Duration::ZERO,
                    ..Default::default()
                },
                "record.flush_ms",
            ),
        ];
        for (config, key) in cases {
            assert_eq!(validate(&config).map_err(|e| e.key), Err(key.to_string()));
        }
        // The huge one is refused by its cap, not by the comparison with a file.
        let huge = RecordConfig {
            max_total_mb: i64::MAX as u64,
            ..Default::default()
        };
        assert_eq!(
            validate(&huge).map_err(|e| e.message),
            Err("must be at most 2^30".to_string())
        );
    }

    #[test]
    fn a_directory_that_is_a_file_is_refused() {
        let file = tempfile::NamedTempFile::new().unwrap_or_else(|e| panic!("{e}"));
        let config = RecordConfig {
            directory: Some(file.path().to_path_buf()),
            ..Default::default()
        };
        let err = validate(&config).err().map(|e| (e.key, e.message));
        assert!(
            err.as_ref()
                .is_some_and(|(k, m)| k == "record.directory" && m.contains("not a directory")),
            "{err:?}"
        );
    }

    #[test]
    fn the_directory_defaults_beside_the_store() {
        let config = RecordConfig::default();
        assert_eq!(
            config.resolved_directory(Path::new("/var/lib/rozd/rozd.db")),
            PathBuf::from("/var/lib/rozd/recordings")
        );
    }
}
