//! What `rozd run` would refuse before serving that the configuration file
//! alone cannot say: facts of this machine (is it a Raspberry Pi, which
//! environment variables are set). `rozd check` reports them, and `rozd run`
//! refuses on the same findings before it opens anything. The checks are
//! plain functions of the configuration and [`HostFacts`]; only
//! [`HostFacts::probe`] looks at the machine.

use std::collections::BTreeSet;

use crate::config::Config;
use crate::hw::config::GpioBackendChoice;

/// What the checks need to know about this machine.
#[derive(Debug, Clone, Default)]
pub struct HostFacts {
    /// `/proc/device-tree/model` names a Raspberry Pi.
    pub raspberry_pi: bool,
    /// Of the environment variables the configuration names, those set
    /// (to valid UTF-8).
    pub env_set: BTreeSet<String>,
}

impl HostFacts {
    /// This machine's facts, for the variables `config` names.
    pub fn probe(config: &Config) -> HostFacts {
        HostFacts {
            raspberry_pi: crate::hw::gpio::is_raspberry_pi(),
            env_set: named_variables(config)
                .into_iter()
                .filter(|var| std::env::var(var).is_ok())
                .collect(),
        }
    }
}

/// The findings: `errors` stop `rozd run` before serving; `warnings` start
/// but leave a part not working.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Findings {
    pub errors: Vec<String>,
    pub warnings: Vec<String>,
}

/// What neither the loader nor these checks can know before `rozd run`
/// opens them, said plainly by `rozd check`.
pub const NOT_CHECKED: &str = "not checked (only `rozd run` finds out): whether the listen address and \
     control socket are free, the serial ports and cameras can be opened, the brokers \
     and Modbus devices answer (and accept the credentials), and the store's directory is writable";

fn named_variables(config: &Config) -> Vec<String> {
    let mut vars = Vec::new();
    if let Some(var) = config
        .fleet
        .as_ref()
        .and_then(|f| f.broker.password_env.clone())
    {
        vars.push(var);
    }
    if let Some(var) = (config.hardware.mqtt.as_ref()).and_then(|m| m.password_env.clone()) {
        vars.push(var);
    }
    vars
}

/// Every finding of `config` on a machine with `facts`, in the file's
/// order of sections.
pub fn check(config: &Config, facts: &HostFacts) -> Findings {
    let mut found = Findings::default();
    if config.hardware.gpio_backend == GpioBackendChoice::Rppal && !facts.raspberry_pi {
        found.errors.push(
            "gpio.backend = \"rppal\": this machine is not a Raspberry Pi (/proc/device-tree/model \
             does not say so), so rozd run would refuse to start; use \"auto\" (rppal on a Pi, \
             simulated elsewhere) or \"sim\" to try this configuration here"
                .to_string(),
        );
    }
    if let Some(var) = (config.hardware.mqtt.as_ref()).and_then(|m| m.password_env.as_deref())
        && !facts.env_set.contains(var)
    {
        found.warnings.push(format!(
            "mqtt.password_env names {var}, which is not set (or not UTF-8): rozd would start, \
             but the [mqtt] link would not connect (its sensors, actuators and stop topic in error)"
        ));
    }
    if let Some(var) = config
        .fleet
        .as_ref()
        .and_then(|f| f.broker.password_env.as_deref())
        && !facts.env_set.contains(var)
    {
        found.errors.push(format!(
            "fleet.password_env names {var}, which is not set (or not UTF-8), so rozd run would \
             refuse to start; set it in rozd's environment (the systemd unit's \
             EnvironmentFile=)"
        ));
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> Config {
        Config::parse(text, crate::config::ConfigSource::BuiltIn).expect("valid")
    }

    /// `rppal` off a Pi and an unset fleet password are errors (run refuses
    /// them), an unset [mqtt] password a warning (run starts, the link does
    /// not connect); on a Pi with the variables set nothing is found
    /// (issue 35, item 13).
    #[test]
    fn finds_what_run_would_refuse_on_this_machine() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("fleet-token");
        std::fs::write(&token, "a-fleet-token-of-some-length\n").unwrap();
        let c = config(&format!(
            "[gpio]\nbackend = \"rppal\"\n\n[mqtt]\nurl = \"mqtt://b\"\nusername = \"u\"\n\
             password_env = \"MQTT_PW\"\n\n[fleet]\nurl = \"mqtt://b\"\nusername = \"u\"\n\
             password_env = \"FLEET_PW\"\ntoken_file = {:?}\n",
            token.display().to_string()
        ));
        let laptop = check(&c, &HostFacts::default());
        assert_eq!(laptop.errors.len(), 2, "{laptop:?}");
        assert!(laptop.errors[0].contains("gpio.backend = \"rppal\""));
        assert!(laptop.errors[0].contains("not a Raspberry Pi"));
        assert!(laptop.errors[1].contains("fleet.password_env names FLEET_PW"));
        assert_eq!(laptop.warnings.len(), 1, "{laptop:?}");
        assert!(laptop.warnings[0].contains("mqtt.password_env names MQTT_PW"));
        let pi = HostFacts {
            raspberry_pi: true,
            env_set: ["MQTT_PW", "FLEET_PW"].map(String::from).into(),
        };
        assert_eq!(check(&c, &pi), Findings::default());
        let auto = config("[gpio]\nbackend = \"auto\"\n");
        assert_eq!(check(&auto, &HostFacts::default()), Findings::default());
    }
}
