//! The reflex-rule language (`ooda::rules`): parse and type-check an
//! arbitrary condition, then evaluate it (and step a rule with it) on an
//! arbitrary observation: values missing, NaN, infinite, stale, alarmed.
//! Input: the condition text, a NUL byte, then 8-byte values.
#![no_main]

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use rozd::ooda::rules::{self, Action, Facts, Rule, RuleState};

const NAMES: [&str; 4] = ["temp", "distance", "speed", "brake"];

struct Observed {
    values: HashMap<&'static str, f64>,
    stale: HashSet<&'static str>,
    alarms: HashMap<&'static str, f64>,
    ages: HashMap<&'static str, f64>,
}

impl Facts for Observed {
    fn value(&self, name: &str) -> Option<f64> {
        self.values.get(name).copied()
    }
    fn stale(&self, name: &str) -> bool {
        self.stale.contains(name)
    }
    fn alarm(&self, name: &str) -> f64 {
        self.alarms.get(name).copied().unwrap_or(0.0)
    }
    fn age_ms(&self, name: &str) -> Option<f64> {
        self.ages.get(name).copied()
    }
}

fn observed(bytes: &[u8]) -> Observed {
    let mut o = Observed {
        values: HashMap::new(),
        stale: HashSet::new(),
        alarms: HashMap::new(),
        ages: HashMap::new(),
    };
    for (i, chunk) in bytes.chunks_exact(8).enumerate() {
        let word = u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8]));
        let name = NAMES[i % NAMES.len()];
        let v = f64::from_bits(word);
        match (i / NAMES.len()) % 4 {
            0 => {
                o.values.insert(name, v);
            }
            1 => {
                if word & 1 == 1 {
                    o.stale.insert(name);
                }
            }
            2 => {
                o.alarms.insert(name, (word % 3) as f64);
            }
            _ => {
                o.ages.insert(name, v);
            }
        }
    }
    o
}

fuzz_target!(|data: &[u8]| {
    let (text, facts) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let Ok(text) = std::str::from_utf8(text) else {
        return;
    };
    let names: HashSet<String> = NAMES.iter().map(|n| n.to_string()).collect();
    let Ok(condition) = rules::parse_condition(text, &names) else {
        return;
    };
    let facts = observed(facts);
    let _ = rules::eval_bool(&condition, &facts);
    let rule = Rule {
        name: "fuzz".into(),
        when: text.to_string(),
        condition,
        hold: Duration::from_millis(u64::from(data.len() as u8)),
        cooldown: Duration::from_millis(10),
        action: Action::Estop {
            reason: "fuzz".into(),
        },
    };
    let mut state = RuleState::default();
    let start = tokio::time::Instant::now();
    for step in 0..4u64 {
        let _ = rule.step(&mut state, &facts, start + Duration::from_millis(step * 7));
    }
});
