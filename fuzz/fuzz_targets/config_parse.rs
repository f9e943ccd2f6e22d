//! Config loading (`config::Config::parse`): arbitrary UTF-8 loads or is
//! an error naming the file, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rozd::config::{Config, ConfigSource};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(e) = Config::parse(text, ConfigSource::BuiltIn) {
        let message = e.to_string();
        assert!(!message.is_empty());
    }
});
