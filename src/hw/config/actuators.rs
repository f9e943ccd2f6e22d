//! `[[actuators]]`: each actuator's keys checked against its kind, its
//! values, then one function per kind builds its [`ActuatorTarget`].

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use super::super::sim_world::Input;
use super::{
    ActuatorConfig, ActuatorKind, ActuatorSpec, ActuatorTarget, CrossCheckConfig, CrossCheckSpec,
    FeedbackConfig, FeedbackSpec, Invalid, Level, SensorSource, SensorSpec, Tables, ValueSet,
    check_name, claim_pin, concrete_topic, misplaced, require,
};

/// The longest `feedback.settle_ms`: a bound on how long a PHYSICAL call
/// waits for its verdict.
pub(super) const MAX_SETTLE_MS: u64 = 60_000;

/// Every actuator, in order, and whether one drives the simulated world.
/// `sensors` are the validated sensors a `feedback` may name.
pub(super) fn validate_actuators(
    actuators: &[ActuatorConfig],
    sensors: &[SensorSpec],
    tables: &Tables<'_>,
    gpio_pins: &mut HashMap<u8, String>,
    default_timeout_ms: u32,
) -> Result<(Vec<ActuatorSpec>, bool), Invalid> {
    let mut names = HashSet::new();
    // An input of the world is driven by one actuator.
    let mut world_inputs: HashMap<Input, String> = HashMap::new();
    let mut specs = Vec::with_capacity(actuators.len());
    let mut written = super::modbus::Written::default();
    for (i, a) in actuators.iter().enumerate() {
        let key = |k: &str| format!("actuators[{i}].{k}");
        check_name(&a.name, "actuator", &mut names, &key)?;
        check_keys(a, &key)?;
        let values = values(a, &key)?;
        let target = match a.kind {
            ActuatorKind::Sim => sim_target(a, &key, &mut world_inputs)?,
            ActuatorKind::Gpio | ActuatorKind::Pwm => pin_target(a, &key, gpio_pins)?,
            ActuatorKind::Serial => serial_target(a, &key, tables)?,
            ActuatorKind::Mqtt => mqtt_target(a, &key, tables)?,
            ActuatorKind::Modbus => modbus_target(a, &values, &key, tables, &mut written)?,
        };
        let feedback = a
            .feedback
            .as_ref()
            .map(|f| feedback(a, f, sensors, &key))
            .transpose()?;
        specs.push(ActuatorSpec {
            name: a.name.clone(),
            unit: a.unit.clone(),
            description: a.description.clone(),
            values,
            safe_value: a.safe_value,
            max_rate_hz: a.max_rate_hz,
            hold: (a.hold_ms > 0).then(|| Duration::from_millis(a.hold_ms)),
            timeout: Duration::from_millis(u64::from(a.timeout_ms.unwrap_or(default_timeout_ms))),
            shared: a.shared,
            target,
            feedback,
        });
    }
    Ok((specs, !world_inputs.is_empty()))
}

/// No key set that does not belong to the actuator's kind.
fn check_keys(a: &ActuatorConfig, key: &dyn Fn(&str) -> String) -> Result<(), Invalid> {
    let set = [
        ("pin", a.pin.is_some()),
        ("active", a.active.is_some()),
        ("frequency_hz", a.frequency_hz.is_some()),
        ("port", a.port.is_some()),
        ("template", a.template.is_some()),
        ("expect", a.expect.is_some()),
        ("reply_timeout_ms", a.reply_timeout_ms.is_some()),
        ("topic", a.topic.is_some()),
        ("payload", a.payload.is_some()),
        ("qos", a.qos.is_some()),
        ("retain", a.retain.is_some()),
        ("input", a.input.is_some()),
        ("link", a.link.is_some()),
        ("unit_id", a.unit_id.is_some()),
        ("register", a.register.is_some()),
        ("address", a.address.is_some()),
        ("type", a.value_type.is_some()),
        ("word_order", a.word_order.is_some()),
        ("byte_order", a.byte_order.is_some()),
        ("scale", a.scale.is_some()),
        ("offset", a.offset.is_some()),
        ("write", a.write.is_some()),
        ("read_back", a.read_back.is_some()),
    ];
    let allowed: &[&str] = match a.kind {
        ActuatorKind::Sim => &["input"],
        ActuatorKind::Gpio => &["pin", "active"],
        ActuatorKind::Pwm => &["pin", "frequency_hz"],
        ActuatorKind::Serial => &["port", "template", "expect", "reply_timeout_ms"],
        ActuatorKind::Mqtt => &["topic", "payload", "qos", "retain"],
        ActuatorKind::Modbus => &[
            "link",
            "unit_id",
            "register",
            "address",
            "type",
            "word_order",
            "byte_order",
            "scale",
            "offset",
            "write",
            "read_back",
        ],
    };
    if let Some(k) = misplaced(&set, allowed) {
        return Err(Invalid::new(
            key(&k),
            format!("does not apply to an actuator with kind = {:?}", a.kind),
        ));
    }
    Ok(())
}

/// The values it accepts (its safe value among them), its rate and deadline.
fn values(a: &ActuatorConfig, key: &dyn Fn(&str) -> String) -> Result<ValueSet, Invalid> {
    let values = match (a.kind, a.min, a.max, &a.allowed) {
        (_, Some(_), _, Some(_)) | (_, _, Some(_), Some(_)) => {
            return Err(Invalid::new(
                key("allowed"),
                "give either min/max or allowed, not both",
            ));
        }
        (_, None, None, Some(list)) => {
            if list.is_empty() || list.iter().any(|v| !v.is_finite()) {
                return Err(Invalid::new(
                    key("allowed"),
                    "must be a non-empty list of finite numbers",
                ));
            }
            ValueSet::Allowed(list.clone())
        }
        (ActuatorKind::Gpio, None, None, None) => ValueSet::Allowed(vec![0.0, 1.0]),
        (ActuatorKind::Pwm, None, None, None) => ValueSet::Range { min: 0.0, max: 1.0 },
        (_, Some(min), Some(max), None) => {
            if !(min.is_finite() && max.is_finite() && min <= max) {
                return Err(Invalid::new(
                    key("max"),
                    format!("[{min}, {max}] is not a finite, ordered range"),
                ));
            }
            ValueSet::Range { min, max }
        }
        (_, None, _, None) => {
            return Err(Invalid::new(key("min"), "is required (or give `allowed`)"));
        }
        (_, _, None, None) => {
            return Err(Invalid::new(key("max"), "is required (or give `allowed`)"));
        }
    };
    if a.kind == ActuatorKind::Gpio
        && !matches!(&values, ValueSet::Allowed(v) if v.iter().all(|x| *x == 0.0 || *x == 1.0))
    {
        return Err(Invalid::new(
            key("allowed"),
            "a gpio output takes only 0 and 1",
        ));
    }
    if a.kind == ActuatorKind::Pwm
        && !matches!(values, ValueSet::Range { min, max } if min >= 0.0 && max <= 1.0)
    {
        return Err(Invalid::new(
            key("max"),
            "a pwm duty cycle lies within [0, 1]",
        ));
    }
    if !a.safe_value.is_finite() || !values.contains(a.safe_value) {
        return Err(Invalid::new(
            key("safe_value"),
            format!("{} is not in {values}", a.safe_value),
        ));
    }
    if let Some(hz) = a.max_rate_hz
        && !(hz.is_finite() && hz > 0.0)
    {
        return Err(Invalid::new(
            key("max_rate_hz"),
            "must be a positive number",
        ));
    }
    Ok(values)
}

/// `feedback`: a configured sensor whose unit is the actuator's (or a
/// `scale`/`offset` converts between them), finite positive tolerance and
/// settle time, a finite non-zero scale and a finite offset.
fn feedback(
    a: &ActuatorConfig,
    f: &FeedbackConfig,
    sensors: &[SensorSpec],
    key: &dyn Fn(&str) -> String,
) -> Result<FeedbackSpec, Invalid> {
    let fkey = |k: &str| key(&format!("feedback.{k}"));
    let Some(sensor) = sensors.iter().find(|s| s.name == f.sensor) else {
        return Err(Invalid::new(
            fkey("sensor"),
            format!("no [[sensors]] named {:?}", f.sensor),
        ));
    };
    let converted = f.scale.is_some() || f.offset.is_some();
    if !converted
        && let (Some(command_unit), Some(sensor_unit)) = (&a.unit, &sensor.unit)
        && command_unit != sensor_unit
    {
        return Err(Invalid::new(
            fkey("sensor"),
            format!(
                "sensor {:?} reads {sensor_unit:?} but actuator {:?} takes {command_unit:?}: \
                 give `scale` (and `offset`) from {command_unit} to {sensor_unit}",
                f.sensor, a.name
            ),
        ));
    }
    if !(f.tolerance.is_finite() && f.tolerance > 0.0) {
        return Err(Invalid::new(
            fkey("tolerance"),
            format!("{} is not a finite positive number", f.tolerance),
        ));
    }
    if !(1..=MAX_SETTLE_MS).contains(&f.settle_ms) {
        return Err(Invalid::new(
            fkey("settle_ms"),
            format!("{} is outside 1-{MAX_SETTLE_MS}", f.settle_ms),
        ));
    }
    let scale = f.scale.unwrap_or(1.0);
    if !(scale.is_finite() && scale != 0.0) {
        return Err(Invalid::new(
            fkey("scale"),
            format!("{scale} is not a finite number other than 0"),
        ));
    }
    let offset = f.offset.unwrap_or(0.0);
    if !offset.is_finite() {
        return Err(Invalid::new(
            fkey("offset"),
            format!("{offset} is not a finite number"),
        ));
    }
    let settle = Duration::from_millis(f.settle_ms);
    let cross_check = f
        .cross_check
        .as_ref()
        .map(|c| cross_check(a, f, c, sensors, key))
        .transpose()?;
    Ok(FeedbackSpec {
        sensor: f.sensor.clone(),
        tolerance: f.tolerance,
        settle,
        scale,
        offset,
        on_mismatch: f.on_mismatch,
        // A sensor without its own staleness bound still goes stale for
        // the watch: a value older than settle_ms is no evidence. Except an
        // input read on its edges: no news there is no change.
        fresh_within: match (&sensor.stale_after, &sensor.source) {
            (Some(bound), _) => Some(*bound),
            (None, SensorSource::Gpio { poll: None, .. }) => None,
            (None, _) => Some(settle),
        },
        cross_check,
    })
}

/// `feedback.cross_check`: another configured sensor whose unit per second
/// is the actuator's unit (or a `scale` converts), finite positive
/// tolerance and window.
fn cross_check(
    a: &ActuatorConfig,
    f: &FeedbackConfig,
    c: &CrossCheckConfig,
    sensors: &[SensorSpec],
    key: &dyn Fn(&str) -> String,
) -> Result<CrossCheckSpec, Invalid> {
    let ckey = |k: &str| key(&format!("feedback.cross_check.{k}"));
    let Some(sensor) = sensors.iter().find(|s| s.name == c.sensor) else {
        return Err(Invalid::new(
            ckey("sensor"),
            format!("no [[sensors]] named {:?}", c.sensor),
        ));
    };
    if c.sensor == f.sensor {
        return Err(Invalid::new(
            ckey("sensor"),
            format!(
                "{:?} is the feedback sensor itself: a cross-check must be an independent measurement",
                c.sensor
            ),
        ));
    }
    if c.scale.is_none()
        && let (Some(command_unit), Some(sensor_unit)) = (&a.unit, &sensor.unit)
        && *command_unit != format!("{sensor_unit}/s")
    {
        return Err(Invalid::new(
            ckey("sensor"),
            format!(
                "the rate of sensor {:?} is in {sensor_unit:?} per second but actuator {:?} \
                 takes {command_unit:?}: give `scale` from {command_unit} to {sensor_unit}/s",
                c.sensor, a.name
            ),
        ));
    }
    let scale = c.scale.unwrap_or(1.0);
    if !(scale.is_finite() && scale != 0.0) {
        return Err(Invalid::new(
            ckey("scale"),
            format!("{scale} is not a finite number other than 0"),
        ));
    }
    if !(c.tolerance.is_finite() && c.tolerance > 0.0) {
        return Err(Invalid::new(
            ckey("tolerance"),
            format!("{} is not a finite positive number", c.tolerance),
        ));
    }
    let window_ms = c.window_ms.unwrap_or(f.settle_ms);
    if !(1..=MAX_SETTLE_MS).contains(&window_ms) {
        return Err(Invalid::new(
            ckey("window_ms"),
            format!("{window_ms} is outside 1-{MAX_SETTLE_MS}"),
        ));
    }
    Ok(CrossCheckSpec {
        sensor: c.sensor.clone(),
        scale,
        magnitude: c.magnitude,
        tolerance: c.tolerance,
        window: Duration::from_millis(window_ms),
    })
}

/// `sim`: records what it is told, and drives the world's `input` if set.
fn sim_target(
    a: &ActuatorConfig,
    key: &dyn Fn(&str) -> String,
    world_inputs: &mut HashMap<Input, String>,
) -> Result<ActuatorTarget, Invalid> {
    if let Some(input) = a.input
        && let Some(other) = world_inputs.insert(input, a.name.clone())
    {
        return Err(Invalid::new(
            key("input"),
            format!("{} is already driven by {other:?}", input.as_str()),
        ));
    }
    Ok(ActuatorTarget::Sim { input: a.input })
}

/// `gpio` (on/off) and `pwm` (duty cycle) outputs on a pin of their own.
fn pin_target(
    a: &ActuatorConfig,
    key: &dyn Fn(&str) -> String,
    gpio_pins: &mut HashMap<u8, String>,
) -> Result<ActuatorTarget, Invalid> {
    require(key, a.pin.is_some(), "pin", "kind")?;
    let pin = a.pin.unwrap_or(0);
    claim_pin(gpio_pins, pin, &a.name, key)?;
    if a.kind == ActuatorKind::Gpio {
        return Ok(ActuatorTarget::Gpio {
            pin,
            active: a.active.unwrap_or(Level::High),
        });
    }
    let frequency_hz = a.frequency_hz.unwrap_or(1_000.0);
    if !(frequency_hz.is_finite() && frequency_hz > 0.0 && frequency_hz <= 100_000.0) {
        return Err(Invalid::new(
            key("frequency_hz"),
            "must be within (0, 100000]",
        ));
    }
    Ok(ActuatorTarget::Pwm { pin, frequency_hz })
}

fn serial_target(
    a: &ActuatorConfig,
    key: &dyn Fn(&str) -> String,
    tables: &Tables<'_>,
) -> Result<ActuatorTarget, Invalid> {
    require(key, a.port.is_some(), "port", "kind")?;
    require(key, a.template.is_some(), "template", "kind")?;
    let port = a.port.clone().unwrap_or_default();
    if !tables.ports.contains(port.as_str()) {
        return Err(Invalid::new(
            key("port"),
            format!("no [[serial]] port named {port:?}"),
        ));
    }
    // Raw text on a port that drives an actuator would move it around its
    // limits, its rate limit, its ownership and the deadman: the two are
    // exclusive.
    if let Some(raw) = tables
        .serial
        .iter()
        .position(|p| p.name == port && p.allow_raw)
    {
        return Err(Invalid::new(
            format!("serial[{raw}].allow_raw"),
            format!(
                "port {port:?} drives actuator {:?}: `serial_query` there could move it \
                 around its limits; remove allow_raw or give the raw device a port of its own",
                a.name
            ),
        ));
    }
    let template = a.template.clone().unwrap_or_default();
    if !template.contains("{value}") {
        return Err(Invalid::new(key("template"), "must contain {value}"));
    }
    let expect = a
        .expect
        .as_deref()
        .map(regex::Regex::new)
        .transpose()
        .map_err(|e| Invalid::new(key("expect"), format!("not a valid regex: {e}")))?;
    if expect.is_none() && a.reply_timeout_ms.is_some() {
        return Err(Invalid::new(key("reply_timeout_ms"), "needs `expect`"));
    }
    Ok(ActuatorTarget::Serial {
        port,
        template,
        expect,
        reply_timeout: Duration::from_millis(a.reply_timeout_ms.unwrap_or(1_000)),
    })
}

/// `modbus`: a holding register or coil of a link, written by no other
/// actuator; every value it accepts (limits in engineering units) fits
/// the register's type once scaled.
fn modbus_target(
    a: &ActuatorConfig,
    values: &ValueSet,
    key: &dyn Fn(&str) -> String,
    tables: &Tables<'_>,
    written: &mut super::modbus::Written,
) -> Result<ActuatorTarget, Invalid> {
    let keys = super::modbus::PointKeys {
        link: a.link.as_deref(),
        unit_id: a.unit_id,
        register: a.register,
        address: a.address,
        value_type: a.value_type,
        word_order: a.word_order,
        byte_order: a.byte_order,
        scale: a.scale,
        offset: a.offset,
    };
    let (link, point) = super::modbus::point(&keys, tables.modbus, key, "kind", true)?;
    let write = super::modbus::write_mode(a.write, &point, key)?;
    let limits: Vec<(&str, f64)> = match values {
        ValueSet::Range { min, max } => vec![("min", *min), ("max", *max)],
        ValueSet::Allowed(list) => list.iter().map(|v| ("allowed", *v)).collect(),
    };
    for (k, v) in limits.into_iter().chain([("safe_value", a.safe_value)]) {
        point
            .codec
            .raw(v)
            .map_err(|e| Invalid::new(key(k), format!("cannot be written to {point}: {e}")))?;
    }
    written.claim(&link, &point, &a.name, key)?;
    Ok(ActuatorTarget::Modbus {
        link,
        point,
        write,
        read_back: a.read_back.unwrap_or(true),
    })
}

fn mqtt_target(
    a: &ActuatorConfig,
    key: &dyn Fn(&str) -> String,
    tables: &Tables<'_>,
) -> Result<ActuatorTarget, Invalid> {
    require(key, a.topic.is_some(), "topic", "kind")?;
    if !tables.have_mqtt {
        return Err(Invalid::new(
            key("topic"),
            "an mqtt actuator needs an [mqtt] section",
        ));
    }
    let qos = a.qos.unwrap_or(1);
    if qos > 2 {
        return Err(Invalid::new(key("qos"), "must be 0, 1 or 2"));
    }
    let topic = a.topic.clone().unwrap_or_default();
    concrete_topic(key, &topic)?;
    Ok(ActuatorTarget::Mqtt {
        topic,
        payload: a.payload.clone().unwrap_or_else(|| "{value}".to_string()),
        qos,
        retain: a.retain.unwrap_or(false),
    })
}
