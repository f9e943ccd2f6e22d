//! Durations as the configuration writes them: a whole number of seconds
//! (a key ending `_secs`) or of milliseconds (`_ms`), read straight into a
//! [`Duration`], so that no reader converts units and a section whose
//! validation derives nothing is its own typed form:
//!
//! ```text
//! #[serde(rename = "keepalive_secs", deserialize_with = "units::secs")]
//! pub keepalive: Duration,
//! ```
//!
//! A wrong value gets serde's own error for the number (`expected u64`),
//! reported at its line and key as every other.

use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// A whole number of seconds.
pub(crate) fn secs<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    u64::deserialize(d).map(Duration::from_secs)
}

/// A whole number of milliseconds.
pub(crate) fn millis<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    u64::deserialize(d).map(Duration::from_millis)
}

/// A whole number of seconds, where 0 turns the thing off (`None`).
pub(crate) fn secs_or_off<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    u64::deserialize(d).map(|secs| (secs > 0).then(|| Duration::from_secs(secs)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Section {
        #[serde(rename = "wait_secs", deserialize_with = "secs")]
        wait: Duration,
        #[serde(rename = "flush_ms", deserialize_with = "millis")]
        flush: Duration,
        #[serde(rename = "check_secs", deserialize_with = "secs_or_off", default)]
        check: Option<Duration>,
    }

    #[test]
    fn seconds_and_milliseconds_are_read_as_durations() {
        let s: Section = toml::from_str("wait_secs = 3\nflush_ms = 250\n").unwrap();
        assert_eq!(s.wait, Duration::from_secs(3));
        assert_eq!(s.flush, Duration::from_millis(250));
        assert_eq!(s.check, None, "absent");
        let s: Section = toml::from_str("wait_secs = 0\nflush_ms = 0\ncheck_secs = 0\n").unwrap();
        assert_eq!(
            (s.wait, s.flush, s.check),
            (Duration::ZERO, Duration::ZERO, None)
        );
        let s: Section = toml::from_str("wait_secs = 0\nflush_ms = 0\ncheck_secs = 7\n").unwrap();
        assert_eq!(s.check, Some(Duration::from_secs(7)));
    }

    #[test]
    fn a_wrong_number_is_refused_at_its_value_and_the_keys_are_as_written() {
        for (text, value) in [
            ("wait_secs = -1\nflush_ms = 1\n", "-1"),
            ("wait_secs = \"ten\"\nflush_ms = 1\n", "\"ten\""),
        ] {
            let e = toml::from_str::<Section>(text).unwrap_err();
            assert!(e.message().contains("u64"), "{text}: {e}");
            assert_eq!(e.span().map(|s| &text[s]), Some(value), "{text}: {e}");
        }
        let e = toml::from_str::<Section>("wait_secs = 1\nwaits = 2\nflush_ms = 1\n").unwrap_err();
        assert!(
            e.message().contains("`wait_secs`") && e.message().contains("`flush_ms`"),
            "the keys as written: {e}"
        );
    }
}
