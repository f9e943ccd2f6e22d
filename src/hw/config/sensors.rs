//! `[[sensors]]`: each sensor's keys checked against its source, then one
//! function per source builds its [`SensorSource`].

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use super::{
    AlarmLimits, Invalid, Level, LineParser, NmeaField, ParserKind, Pull, SensorConfig,
    SensorSource, SensorSourceKind, SensorSpec, SimSignal, SimSpec, SystemMetric, Tables,
    check_name, claim_pin, concrete_topic, misplaced, rate, require,
};

/// Every sensor, in order.
pub(super) fn validate_sensors(
    sensors: &[SensorConfig],
    tables: &Tables<'_>,
    gpio_pins: &mut HashMap<u8, String>,
) -> Result<Vec<SensorSpec>, Invalid> {
    let mut names = HashSet::new();
    let mut specs = Vec::with_capacity(sensors.len());
    for (i, s) in sensors.iter().enumerate() {
        let key = |k: &str| format!("sensors[{i}].{k}");
        check_name(&s.name, "sensor", &mut names, &key)?;
        let alarms = alarm_limits(s, &key)?;
        if s.stale_after_ms == Some(0) {
            return Err(Invalid::new(key("stale_after_ms"), "must be at least 1"));
        }
        check_keys(s, &key)?;
        let source = match s.source {
            SensorSourceKind::Serial => serial_source(s, &key, tables)?,
            SensorSourceKind::Gpio => gpio_source(s, &key, gpio_pins)?,
            SensorSourceKind::Mqtt => mqtt_source(s, &key, tables)?,
            SensorSourceKind::System => system_source(s, &key)?,
            SensorSourceKind::Replay => replay_source(s, &key)?,
            SensorSourceKind::Modbus => modbus_source(s, &key, tables)?,
            SensorSourceKind::Sim => match s.quantity {
                Some(quantity) => SensorSource::World(quantity),
                None => SensorSource::Sim(sim_spec(s, &key)?),
            },
        };
        specs.push(SensorSpec {
            name: s.name.clone(),
            unit: s.unit.clone(),
            alarms,
            stale_after: s.stale_after_ms.map(Duration::from_millis),
            source,
        });
    }
    Ok(specs)
}

/// No key set that does not belong to the sensor's source.
fn check_keys(s: &SensorConfig, key: &dyn Fn(&str) -> String) -> Result<(), Invalid> {
    let set = [
        ("port", s.port.is_some()),
        ("parser", s.parser.is_some()),
        ("pointer", s.pointer.is_some()),
        ("key", s.key.is_some()),
        ("pattern", s.pattern.is_some()),
        ("group", s.group.is_some()),
        ("nmea_field", s.nmea_field.is_some()),
        ("pin", s.pin.is_some()),
        ("pull", s.pull.is_some()),
        ("active", s.active.is_some()),
        ("debounce_ms", s.debounce_ms.is_some()),
        ("topic", s.topic.is_some()),
        ("metric", s.metric.is_some()),
        ("signal", s.signal.is_some()),
        ("amplitude", s.amplitude.is_some()),
        ("offset", s.offset.is_some()),
        ("period_ms", s.period_ms.is_some()),
        ("noise", s.noise.is_some()),
        ("file", s.file.is_some()),
        ("seed", s.seed.is_some()),
        ("rate_hz", s.rate_hz.is_some()),
        ("quantity", s.quantity.is_some()),
        ("channel", s.channel.is_some()),
        ("link", s.link.is_some()),
        ("unit_id", s.unit_id.is_some()),
        ("register", s.register.is_some()),
        ("address", s.address.is_some()),
        ("type", s.value_type.is_some()),
        ("word_order", s.word_order.is_some()),
        ("byte_order", s.byte_order.is_some()),
        ("scale", s.scale.is_some()),
    ];
    let allowed: &[&str] = match s.source {
        SensorSourceKind::Serial => &[
            "port",
            "parser",
            "pointer",
            "key",
            "pattern",
            "group",
            "nmea_field",
        ],
        SensorSourceKind::Gpio => &["pin", "pull", "active", "debounce_ms", "rate_hz"],
        SensorSourceKind::Mqtt => &["topic", "pointer"],
        SensorSourceKind::System => &["metric", "rate_hz"],
        SensorSourceKind::Replay => &["file", "channel"],
        SensorSourceKind::Modbus => &[
            "link",
            "unit_id",
            "register",
            "address",
            "type",
            "word_order",
            "byte_order",
            "scale",
            "offset",
            "rate_hz",
        ],
        SensorSourceKind::Sim if s.quantity.is_some() => &["quantity"],
        SensorSourceKind::Sim => &[
            "signal",
            "amplitude",
            "offset",
            "period_ms",
            "noise",
            "file",
            "seed",
            "rate_hz",
        ],
    };
    if let Some(k) = misplaced(&set, allowed) {
        let why = if s.quantity.is_some() && s.source == SensorSourceKind::Sim {
            "does not apply to a world sensor (with `quantity`, read at every tick)".to_string()
        } else {
            format!("does not apply to a sensor with source = {:?}", s.source)
        };
        return Err(Invalid::new(key(&k), why));
    }
    Ok(())
}

fn serial_source(
    s: &SensorConfig,
    key: &dyn Fn(&str) -> String,
    tables: &Tables<'_>,
) -> Result<SensorSource, Invalid> {
    let require = |is_set: bool, k: &str| require(key, is_set, k, "source");
    let port = s.port.clone().unwrap_or_default();
    require(s.port.is_some(), "port")?;
    if !tables.ports.contains(port.as_str()) {
        return Err(Invalid::new(
            key("port"),
            format!("no [[serial]] port named {port:?}"),
        ));
    }
    require(s.parser.is_some(), "parser")?;
    let parser = match s.parser {
        Some(ParserKind::Json) => {
            require(s.pointer.is_some(), "pointer")?;
            let pointer = s.pointer.clone().unwrap_or_default();
            if !pointer.starts_with('/') {
                return Err(Invalid::new(
                    key("pointer"),
                    "a JSON pointer starts with '/'",
                ));
            }
            LineParser::Json { pointer }
        }
        Some(ParserKind::Kv) => {
            require(s.key.is_some(), "key")?;
            LineParser::Kv {
                key: s.key.clone().unwrap_or_default(),
            }
        }
        Some(ParserKind::Regex) => {
            require(s.pattern.is_some(), "pattern")?;
            let pattern = regex::Regex::new(s.pattern.as_deref().unwrap_or_default())
                .map_err(|e| Invalid::new(key("pattern"), format!("not a valid regex: {e}")))?;
            let group = s.group.clone().unwrap_or_else(|| "value".to_string());
            if !pattern.capture_names().flatten().any(|n| n == group) {
                return Err(Invalid::new(
                    key("pattern"),
                    format!("has no named group `{group}`"),
                ));
            }
            LineParser::Regex { pattern, group }
        }
        Some(ParserKind::Nmea) => {
            require(s.nmea_field.is_some(), "nmea_field")?;
            LineParser::Nmea {
                field: s.nmea_field.unwrap_or(NmeaField::Latitude),
            }
        }
        Some(ParserKind::Number) | None => LineParser::Number,
    };
    Ok(SensorSource::Serial { port, parser })
}

fn gpio_source(
    s: &SensorConfig,
    key: &dyn Fn(&str) -> String,
    gpio_pins: &mut HashMap<u8, String>,
) -> Result<SensorSource, Invalid> {
    require(key, s.pin.is_some(), "pin", "source")?;
    let pin = s.pin.unwrap_or(0);
    claim_pin(gpio_pins, pin, &s.name, key)?;
    Ok(SensorSource::Gpio {
        pin,
        pull: s.pull.unwrap_or(Pull::None),
        active: s.active.unwrap_or(Level::High),
        debounce: Duration::from_millis(s.debounce_ms.unwrap_or(0)),
        poll: s
            .rate_hz
            .map(|hz| rate(&key("rate_hz"), Some(hz), hz))
            .transpose()?,
    })
}

fn mqtt_source(
    s: &SensorConfig,
    key: &dyn Fn(&str) -> String,
    tables: &Tables<'_>,
) -> Result<SensorSource, Invalid> {
    require(key, s.topic.is_some(), "topic", "source")?;
    if !tables.have_mqtt {
        return Err(Invalid::new(
            key("topic"),
            "an mqtt sensor needs an [mqtt] section",
        ));
    }
    let topic = s.topic.clone().unwrap_or_default();
    concrete_topic(key, &topic)?;
    if let Some(p) = &s.pointer
        && !p.starts_with('/')
    {
        return Err(Invalid::new(
            key("pointer"),
            "a JSON pointer starts with '/'",
        ));
    }
    Ok(SensorSource::Mqtt {
        topic,
        pointer: s.pointer.clone(),
    })
}

fn system_source(s: &SensorConfig, key: &dyn Fn(&str) -> String) -> Result<SensorSource, Invalid> {
    require(key, s.metric.is_some(), "metric", "source")?;
    Ok(SensorSource::System {
        metric: s.metric.unwrap_or(SystemMetric::CpuLoad),
        every: rate(&key("rate_hz"), s.rate_hz, 1.0)?,
    })
}

fn replay_source(s: &SensorConfig, key: &dyn Fn(&str) -> String) -> Result<SensorSource, Invalid> {
    require(key, s.file.is_some(), "file", "source")?;
    let file = s.file.clone().unwrap_or_default();
    let channel = s
        .channel
        .clone()
        .unwrap_or_else(|| format!("/sensors/{}", s.name));
    let track = crate::record::read::sensor_track(&file, &channel)
        .map_err(|e| Invalid::new(key("file"), e.to_string()))?;
    if track.values.is_empty() {
        return Err(Invalid::new(
            key("channel"),
            format!(
                "{} has no values on channel {channel:?}; channels with values: {}",
                file.display(),
                track.channels.join(", ")
            ),
        ));
    }
    Ok(SensorSource::Replay(super::ReplaySpec {
        file,
        channel,
        values: std::sync::Arc::new(track.values),
        span: track.span,
        speed: 1.0,
        looped: false,
    }))
}

fn modbus_source(
    s: &SensorConfig,
    key: &dyn Fn(&str) -> String,
    tables: &Tables<'_>,
) -> Result<SensorSource, Invalid> {
    let keys = super::modbus::PointKeys {
        link: s.link.as_deref(),
        unit_id: s.unit_id,
        register: s.register,
        address: s.address,
        value_type: s.value_type,
        word_order: s.word_order,
        byte_order: s.byte_order,
        scale: s.scale,
        offset: s.offset,
    };
    let (link, point) = super::modbus::point(&keys, tables.modbus, key, "source", false)?;
    let poll = tables
        .modbus
        .iter()
        .find(|l| l.name == link)
        .map(|l| l.poll)
        .unwrap_or(Duration::from_millis(100));
    let every = match s.rate_hz {
        Some(hz) => rate(&key("rate_hz"), Some(hz), hz)?,
        None => poll,
    };
    Ok(SensorSource::Modbus { link, point, every })
}

fn alarm_limits(s: &SensorConfig, key: &dyn Fn(&str) -> String) -> Result<AlarmLimits, Invalid> {
    let limits = AlarmLimits {
        warn_min: s.warn_min,
        warn_max: s.warn_max,
        critical_min: s.critical_min,
        critical_max: s.critical_max,
        hysteresis: s.hysteresis.unwrap_or(0.0),
    };
    for (k, v) in [
        ("warn_min", limits.warn_min),
        ("warn_max", limits.warn_max),
        ("critical_min", limits.critical_min),
        ("critical_max", limits.critical_max),
        ("hysteresis", Some(limits.hysteresis)),
    ] {
        if let Some(v) = v
            && !v.is_finite()
        {
            return Err(Invalid::new(key(k), "must be a finite number"));
        }
    }
    if limits.hysteresis < 0.0 {
        return Err(Invalid::new(key("hysteresis"), "must not be negative"));
    }
    if let (Some(c), Some(w)) = (limits.critical_min, limits.warn_min)
        && c > w
    {
        return Err(Invalid::new(
            key("critical_min"),
            "must not be above warn_min",
        ));
    }
    if let (Some(c), Some(w)) = (limits.critical_max, limits.warn_max)
        && c < w
    {
        return Err(Invalid::new(
            key("critical_max"),
            "must not be below warn_max",
        ));
    }
    Ok(limits)
}

fn sim_spec(s: &SensorConfig, key: &dyn Fn(&str) -> String) -> Result<SimSpec, Invalid> {
    let signal = s.signal.unwrap_or(SimSignal::Constant);
    let mut replay = Vec::new();
    if signal == SimSignal::Replay {
        let Some(file) = &s.file else {
            return Err(Invalid::new(
                key("file"),
                "is required for signal = \"replay\"",
            ));
        };
        let text = std::fs::read_to_string(file).map_err(|e| {
            Invalid::new(key("file"), format!("cannot read {}: {e}", file.display()))
        })?;
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty()
                || line.starts_with('#')
                || (n == 0 && line.chars().any(char::is_alphabetic))
            {
                continue;
            }
            let parsed = line
                .split_once(',')
                .and_then(|(t, v)| {
                    Some((t.trim().parse::<u64>().ok()?, v.trim().parse::<f64>().ok()?))
                })
                .filter(|(_, v)| v.is_finite());
            match parsed {
                Some(row) => replay.push(row),
                None => {
                    return Err(Invalid::new(
                        key("file"),
                        format!("{}:{}: expected `elapsed_ms,value`", file.display(), n + 1),
                    ));
                }
            }
        }
        if replay.is_empty() {
            return Err(Invalid::new(
                key("file"),
                format!("{} has no rows", file.display()),
            ));
        }
    } else if s.file.is_some() {
        return Err(Invalid::new(
            key("file"),
            "applies only to signal = \"replay\"",
        ));
    }
    let period = Duration::from_millis(s.period_ms.unwrap_or(10_000));
    if period.is_zero() {
        return Err(Invalid::new(key("period_ms"), "must be at least 1"));
    }
    let noise = s.noise.unwrap_or(0.0);
    if !(noise.is_finite() && noise >= 0.0) {
        return Err(Invalid::new(key("noise"), "must be a non-negative number"));
    }
    for (k, v) in [("amplitude", s.amplitude), ("offset", s.offset)] {
        if let Some(v) = v
            && !v.is_finite()
        {
            return Err(Invalid::new(key(k), "must be a finite number"));
        }
    }
    Ok(SimSpec {
        signal,
        every: rate(&key("rate_hz"), s.rate_hz, 10.0)?,
        amplitude: s.amplitude.unwrap_or(1.0),
        offset: s.offset.unwrap_or(0.0),
        period,
        noise,
        seed: s.seed.unwrap_or(0x5eed),
        replay,
    })
}
