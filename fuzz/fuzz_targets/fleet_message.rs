//! Fleet messages (`fleet::record`, `fleet::seal`): an arbitrary payload on
//! a host or stop topic is opened (it is never authentic: the MAC cannot be
//! forged), read for its content as an unauthenticated stop is, and parsed
//! as a host record and as a stop command: a record, a command or refused.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use rozd::fleet::{record, seal};

fn key() -> &'static seal::MessageKey {
    static KEY: OnceLock<seal::MessageKey> = OnceLock::new();
    KEY.get_or_init(|| seal::MessageKey::from_token("fuzz-fleet-token"))
}

fuzz_target!(|payload: &[u8]| {
    let topics = record::Topics::new("roz");
    let host_topic = topics.host("lab", "h1");
    if let Ok(body) = seal::open(key(), &host_topic, payload) {
        let _ = record::parse_record("h1", body.as_bytes());
    }
    let _ = topics.host_of(std::str::from_utf8(payload).unwrap_or(""));
    let content = seal::content(payload);
    let _ = record::parse_command(&content);
    let _ = record::parse_command(payload);
    if let Ok(r) = record::parse_record("h1", payload) {
        let _ = r.stamp_ms();
        // A record that parsed is one this host would also write.
        let written = serde_json::to_vec(&r).expect("a record serialises");
        let again = record::parse_record("h1", &written);
        assert!(again.is_ok(), "{r:?} -> {again:?}");
    }
});
