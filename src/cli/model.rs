//! `rozd model check NAME`: the model check ([`crate::model::check`])
//! against one model of the configuration, run from here (no daemon
//! needed), printed as a table or as JSON.

use crate::model::ModelRegistry;
use crate::model::check::{self, Step};
use crate::model::config::ModelConfig;

/// Every step passed.
pub const EXIT_OK: u8 = 0;
/// A step failed: the table says which and what the server said.
pub const EXIT_FAILED: u8 = 1;
/// No such model in the configuration.
pub const EXIT_UNKNOWN: u8 = 3;

pub const EXIT_STATUS_HELP: &str = "Exit status:
  0  every step passed
  1  a step failed (the table says which, in the server's own words)
  3  the configuration has no such model
  78 invalid configuration";

/// Checks model `name` of `config`; prints the verdict; its exit status.
pub fn check(config: &ModelConfig, name: &str, json: bool) -> u8 {
    let registry = ModelRegistry::from_config(config);
    let model = match registry.resolve(Some(name)) {
        Ok(model) => model,
        Err(why) => {
            eprintln!("rozd model check: {why}");
            return EXIT_UNKNOWN;
        }
    };
    let steps = match super::runtime() {
        Ok(rt) => rt.block_on(check::run(model.as_ref())),
        Err(e) => {
            eprintln!("rozd model check: {}", super::error_chain(&e));
            return EXIT_FAILED;
        }
    };
    let passed = steps.iter().all(|s| s.ok);
    if json {
        println!(
            "{}",
            serde_json::json!({"model": model.name(), "passed": passed, "steps": steps})
        );
    } else {
        print!("{}", table(model.name(), &steps));
    }
    if passed { EXIT_OK } else { EXIT_FAILED }
}

/// The steps as a table a person reads.
fn table(model: &str, steps: &[Step]) -> String {
    let width = steps.iter().map(|s| s.step.len()).max().unwrap_or(0);
    let mut out = format!("model {model}\n");
    for s in steps {
        out.push_str(&format!(
            "  {:<width$}  {:<6}  {}\n",
            s.step,
            if s.ok { "ok" } else { "FAILED" },
            s.detail
        ));
    }
    let failed = steps.iter().filter(|s| !s.ok).count();
    if failed == 0 {
        out.push_str("every step passed: this server can run rozd's sessions\n");
    } else {
        out.push_str(&format!("{failed} step(s) failed\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_names_each_step_and_what_failed() {
        let text = table(
            "m",
            &[
                Step {
                    step: "streamed answer",
                    ok: true,
                    detail: "\"OK\"".into(),
                },
                Step {
                    step: "usage",
                    ok: false,
                    detail: "HTTP 500: bad".into(),
                },
            ],
        );
        assert!(
            text.contains("  streamed answer  ok      \"OK\"\n"),
            "{text}"
        );
        assert!(
            text.contains("  usage            FAILED  HTTP 500: bad\n"),
            "{text}"
        );
        assert!(text.ends_with("1 step(s) failed\n"), "{text}");
    }
}
