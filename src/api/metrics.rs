//! `/metrics`: the event metrics (each subsystem's, registered by its
//! `metrics::register`), the build's info and the state of the
//! running daemon (loop counters, recordings, sessions, sensors, actuators,
//! cameras, the stop, the fleet) sampled from the [`HostContext`] now.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use crate::HostContext;
use crate::metrics::{Format, encode, register_build};

/// Every metric, the daemon's state sampled now.
pub(super) fn render(ctx: &HostContext, format: Format) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::with_prefix("rozd");
    register_events(&mut registry);
    register_state(&mut registry, ctx);
    encode(&registry, format)
}

/// The event metrics, each subsystem's own, and the build's info.
fn register_events(registry: &mut Registry) {
    crate::ooda::metrics::register(registry);
    crate::session::metrics::register(registry);
    crate::model::metrics::register(registry);
    crate::safety::metrics::register(registry);
    crate::store::metrics::register(registry);
    crate::hw::modbus::metrics::register(registry);
    register_build(registry);
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabels {
    source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SensorLabels {
    sensor: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SensorHealthLabels {
    sensor: String,
    health: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceHealthLabels {
    source: String,
    health: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActuatorLabels {
    actuator: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LinkLabels {
    link: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LinkKindLabels {
    link: String,
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabels {
    status: String,
}

fn gauge(r: &mut Registry, name: &str, help: &str, value: i64) {
    let g: Gauge = Gauge::default();
    g.set(value);
    r.register(name, help, g);
}

fn counter(r: &mut Registry, name: &str, help: &str, value: u64) {
    let c: Counter = Counter::default();
    c.inc_by(value);
    r.register(name, help, c);
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CameraLabels {
    camera: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CameraHealthLabels {
    camera: String,
    health: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CameraReasonLabels {
    camera: String,
    reason: &'static str,
}

/// Each camera's health, rate, frames and refused frames (`[[cameras]]`).
fn register_cameras(r: &mut Registry, ctx: &HostContext) {
    use crate::camera::health::{Health, Rejection};
    if ctx.cameras.is_empty() {
        return;
    }
    let health: Family<CameraHealthLabels, Gauge> = Family::default();
    let fps: Family<CameraLabels, Gauge<f64, std::sync::atomic::AtomicU64>> = Family::default();
    let age: Family<CameraLabels, Gauge<f64, std::sync::atomic::AtomicU64>> = Family::default();
    let frames: Family<CameraLabels, Counter> = Family::default();
    let rejected: Family<CameraReasonLabels, Counter> = Family::default();
    let viewers: Family<CameraLabels, Gauge> = Family::default();
    for view in ctx.cameras.views() {
        let camera = CameraLabels {
            camera: view.name.clone(),
        };
        for h in [
            Health::Starting,
            Health::Ok,
            Health::Stale,
            Health::Disconnected,
            Health::Error,
        ] {
            health
                .get_or_create(&CameraHealthLabels {
                    camera: view.name.clone(),
                    health: h.as_str(),
                })
                .set(i64::from(view.health.health == h));
        }
        fps.get_or_create(&camera).set(view.health.fps);
        if let Some(ms) = view.health.age_ms {
            age.get_or_create(&camera).set(ms as f64 / 1000.0);
        }
        frames.get_or_create(&camera).inc_by(view.health.frames);
        for why in Rejection::ALL {
            rejected
                .get_or_create(&CameraReasonLabels {
                    camera: view.name.clone(),
                    reason: why.as_str(),
                })
                .inc_by(view.health.rejected.get(why));
        }
        viewers.get_or_create(&camera).set(i64::from(view.viewers));
    }
    r.register(
        "camera_health",
        "1 for each camera's current health (starting, ok, stale, disconnected, error), 0 for the others",
        health,
    );
    r.register(
        "camera_fps",
        "Frames per second each camera delivers now",
        fps,
    );
    r.register_with_unit(
        "camera_frame_age",
        "Age of each camera's latest frame",
        Unit::Seconds,
        age,
    );
    r.register("camera_frames", "Frames each camera captured", frames);
    r.register(
        "camera_rejected_frames",
        "Frames a camera sent that rozd refused, by reason (garbage, truncated, oversized, wrong_type)",
        rejected,
    );
    r.register(
        "camera_stream_viewers",
        "Viewers of each camera's stream.mjpeg now",
        viewers,
    );
}

/// The live view's clients and what they were sent or not (`/foxglove`).
fn register_foxglove(r: &mut Registry) {
    use std::sync::atomic::Ordering::Relaxed;
    let c = &crate::live::COUNTS;
    gauge(
        r,
        "foxglove_clients",
        "Foxglove clients connected",
        i64::try_from(c.clients.load(Relaxed)).unwrap_or(i64::MAX),
    );
    counter(
        r,
        "foxglove_messages_sent",
        "Messages sent to Foxglove clients",
        c.sent.load(Relaxed),
    );
    counter(
        r,
        "foxglove_messages_dropped",
        "Messages not sent to a Foxglove client because its send buffer was full (a slow client)",
        c.dropped_full.load(Relaxed),
    );
    counter(
        r,
        "foxglove_messages_too_large",
        "Messages not sent to Foxglove clients because they were over foxglove.max_message_kb",
        c.dropped_too_large.load(Relaxed),
    );
    counter(
        r,
        "foxglove_clients_refused",
        "Foxglove clients refused at the handshake because foxglove.max_clients were connected",
        c.refused.load(Relaxed),
    );
}

fn register_state(r: &mut Registry, ctx: &HostContext) {
    if let Some((written, dropped, lost)) = ctx.recorder.counts() {
        counter(
            r,
            "record_messages",
            "Messages written to recordings",
            written,
        );
        counter(
            r,
            "record_dropped",
            "Events not recorded because the recording's queue was full",
            dropped,
        );
        counter(
            r,
            "record_lost",
            "Events not recorded because a recording file could not be written",
            lost,
        );
    }
    if ctx.config.foxglove.enabled {
        register_foxglove(r);
    }
    let stats = ctx.ooda.stats();
    counter(r, "loop_ticks", "Ticks of the OODA loop", stats.ticks);
    counter(
        r,
        "loop_missed_ticks",
        "Deadlines of the OODA loop that passed without a tick",
        stats.missed_ticks,
    );
    let uptime: Gauge<f64, std::sync::atomic::AtomicU64> = Gauge::default();
    uptime.set(ctx.started_at.elapsed().as_secs_f64());
    r.register_with_unit("uptime", "Time since rozd started", Unit::Seconds, uptime);
    gauge(
        r,
        "sessions_active",
        "Sessions running now",
        i64::try_from(ctx.sessions.active()).unwrap_or(i64::MAX),
    );
    let stop = ctx.ooda.protective_stop().state();
    gauge(
        r,
        "protective_stop_active",
        "1 while the protective stop is latched",
        i64::from(stop.is_active()),
    );
    gauge(
        r,
        "protective_stop_causes",
        "Active causes of the protective stop",
        i64::try_from(stop.causes.len()).unwrap_or(i64::MAX),
    );

    let observation = ctx.ooda.observe_now();
    let value: Family<SensorLabels, Gauge<f64, std::sync::atomic::AtomicU64>> = Family::default();
    let age: Family<SensorLabels, Gauge<f64, std::sync::atomic::AtomicU64>> = Family::default();
    let health: Family<SensorHealthLabels, Gauge> = Family::default();
    let alarm: Family<SensorLabels, Gauge> = Family::default();
    for s in &observation.sensors {
        let sensor = || SensorLabels {
            sensor: s.sensor.name.clone(),
        };
        if let Some(v) = s.sensor.value.filter(|v| v.is_finite()) {
            value.get_or_create(&sensor()).set(v);
        }
        if let Some(ms) = s.sensor.age_ms {
            age.get_or_create(&sensor()).set(ms as f64 / 1000.0);
        }
        for h in crate::hw::HealthKind::ALL {
            health
                .get_or_create(&SensorHealthLabels {
                    sensor: s.sensor.name.clone(),
                    health: h.as_str().to_string(),
                })
                .set(i64::from(s.sensor.health == h));
        }
        alarm
            .get_or_create(&sensor())
            .set(match s.alarm.as_number() {
                n if n >= 2.0 => 2,
                n if n >= 1.0 => 1,
                _ => 0,
            });
    }
    r.register(
        "sensor_value",
        "Each sensor's latest value (absent before the first)",
        value,
    );
    r.register_with_unit(
        "sensor_age",
        "Age of each sensor's latest value",
        Unit::Seconds,
        age,
    );
    r.register(
        "sensor_health",
        "1 for each sensor's current health (ok, stale, disconnected, error), 0 for the others",
        health,
    );
    r.register(
        "sensor_alarm",
        "Each sensor's alarm level: 0 ok, 1 warn, 2 critical",
        alarm,
    );

    let source_health: Family<SourceHealthLabels, Gauge> = Family::default();
    let rejected: Family<SourceLabels, Counter> = Family::default();
    for s in &observation.sources {
        for h in crate::hw::HealthKind::ALL {
            source_health
                .get_or_create(&SourceHealthLabels {
                    source: s.name.clone(),
                    health: h.as_str().to_string(),
                })
                .set(i64::from(s.health == h));
        }
        rejected
            .get_or_create(&SourceLabels {
                source: s.name.clone(),
            })
            .inc_by(s.rejected);
    }
    r.register(
        "source_health",
        "1 for each sensor source's current health (serial:<port>, mqtt, gpio, system, sim, ...), 0 for the others",
        source_health,
    );
    r.register(
        "source_rejected_inputs",
        "Input a sensor source could not use (lines, messages), by source",
        rejected,
    );

    register_cameras(r, ctx);

    let actuator_value: Family<ActuatorLabels, Gauge<f64, std::sync::atomic::AtomicU64>> =
        Family::default();
    let at_safe: Family<ActuatorLabels, Gauge> = Family::default();
    for a in &observation.actuators {
        let labels = ActuatorLabels {
            actuator: a.name.clone(),
        };
        actuator_value.get_or_create(&labels).set(a.value);
        at_safe
            .get_or_create(&labels)
            .set(i64::from(a.at_safe_value));
    }
    r.register(
        "actuator_value",
        "Each actuator's current value",
        actuator_value,
    );
    r.register(
        "actuator_at_safe",
        "1 while the actuator is at its safe value",
        at_safe,
    );
    let mismatch: Family<ActuatorLabels, Gauge> = Family::default();
    let measured: Family<ActuatorLabels, Gauge<f64, std::sync::atomic::AtomicU64>> =
        Family::default();
    for a in &observation.actuators {
        let Some(feedback) = &a.feedback else {
            continue;
        };
        let labels = ActuatorLabels {
            actuator: a.name.clone(),
        };
        mismatch
            .get_or_create(&labels)
            .set(i64::from(feedback.mismatch));
        if let Some(m) = feedback.measured {
            measured.get_or_create(&labels).set(m);
        }
    }
    r.register(
        "actuator_feedback_mismatch",
        "1 while an actuator with feedback has its mismatch alarm raised",
        mismatch,
    );
    r.register(
        "actuator_feedback_measured",
        "What an actuator's feedback sensor measures now",
        measured,
    );

    let modbus = ctx.ooda.modbus_stats();
    if !modbus.is_empty() {
        let connected: Family<LinkLabels, Gauge> = Family::default();
        let requests: Family<LinkLabels, Counter> = Family::default();
        let errors: Family<LinkKindLabels, Counter> = Family::default();
        let missed: Family<LinkLabels, Counter> = Family::default();
        for s in &modbus {
            let link = LinkLabels {
                link: s.link.clone(),
            };
            connected.get_or_create(&link).set(i64::from(s.connected));
            requests.get_or_create(&link).inc_by(s.requests);
            missed.get_or_create(&link).inc_by(s.missed_polls);
            for (kind, n) in &s.errors {
                errors
                    .get_or_create(&LinkKindLabels {
                        link: s.link.clone(),
                        kind: (*kind).to_string(),
                    })
                    .inc_by(*n);
            }
        }
        r.register(
            "modbus_connected",
            "1 while a [[modbus]] link is up",
            connected,
        );
        r.register("modbus_requests", "Modbus requests sent, by link", requests);
        r.register(
            "modbus_errors",
            "Failed Modbus requests, by link and kind (exception, timeout, bad_frame, disconnected, protocol)",
            errors,
        );
        r.register(
            "modbus_missed_polls",
            "Polls not made because the last period's requests still waited, by link",
            missed,
        );
    }

    if let Some(mqtt) = ctx.ooda.mqtt() {
        let s = mqtt.stats();
        gauge(
            r,
            "mqtt_connected",
            "1 while the [mqtt] broker connection is up",
            i64::from(s.connected),
        );
        counter(
            r,
            "mqtt_connections",
            "Connections made to the [mqtt] broker since start",
            s.connections,
        );
        counter(
            r,
            "mqtt_rejected_messages",
            "[mqtt] messages dropped (oversized) or not usable (rejected)",
            s.oversized.saturating_add(s.rejected),
        );
    }

    gauge(
        r,
        "fleet_configured",
        "1 when [fleet] is configured",
        i64::from(ctx.fleet.config().is_some()),
    );
    gauge(
        r,
        "fleet_connected",
        "1 while the fleet broker connection is up",
        i64::from(ctx.fleet.is_connected()),
    );
    // Counts kept by the view as hosts come, go and age: no listing.
    let hosts: Family<StatusLabels, Gauge> = Family::default();
    for (presence, n) in ctx.fleet.presence_counts() {
        hosts
            .get_or_create(&StatusLabels {
                status: presence.as_str().to_string(),
            })
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }
    r.register(
        "fleet_hosts",
        "Hosts in the fleet view (this one included), by status",
        hosts,
    );
    if let Some(dropped) = ctx.fleet.broker_dropped() {
        counter(
            r,
            "fleet_broker_dropped_messages",
            "Messages the fleet broker dropped (for any client, $SYS/broker/publish/messages/dropped) since this host first saw its count",
            dropped,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every event metric is registered, once: a subsystem whose
    /// `register` is no longer called would drop its families silently.
    #[test]
    fn every_event_metric_is_registered() {
        // A family shows once it has a series: one event of each.
        let took = std::time::Duration::from_millis(1);
        crate::ooda::metrics::loop_tick(took, took);
        crate::ooda::metrics::actuator_command("metrics-test", "operator", "applied");
        crate::ooda::metrics::feedback_verdict("metrics-test", "confirmed");
        crate::session::metrics::session_ended("metrics-test");
        crate::session::metrics::turn_ended("metrics-test");
        crate::session::metrics::tool_call("metrics-test", "pure", "allowed", "ok", took);
        crate::session::metrics::approval_wait(took, "metrics-test");
        let tokens = crate::model::metrics::Tokens::default();
        let failed = crate::model::metrics::ModelResult::Error;
        crate::model::metrics::model_call("metrics-test", took, failed, tokens);
        crate::safety::metrics::stop_triggered("metrics-test");
        crate::store::metrics::store_write("metrics-test", took);
        crate::hw::modbus::metrics::modbus_request("metrics-test", took);
        let mut registry = Registry::with_prefix("rozd");
        register_events(&mut registry);
        let text = encode(&registry, Format::Text).unwrap();
        let mut families: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        families.sort_unstable();
        assert_eq!(
            families,
            [
                "rozd_actuator_commands_total",
                "rozd_actuator_feedback_verdicts_total",
                "rozd_approval_wait_seconds",
                "rozd_build_info",
                "rozd_loop_lateness_seconds",
                "rozd_loop_tick_exec_seconds",
                "rozd_modbus_request_duration_seconds",
                "rozd_model_call_duration_seconds",
                "rozd_model_calls_total",
                "rozd_model_errors_total",
                "rozd_model_tokens_total",
                "rozd_protective_stop_triggers_total",
                "rozd_sessions_ended_total",
                "rozd_store_write_duration_seconds",
                "rozd_tool_call_duration_seconds",
                "rozd_tool_calls_total",
                "rozd_turns_total",
            ]
        );
    }
}
