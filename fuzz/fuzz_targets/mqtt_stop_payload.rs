//! The MQTT protective-stop input's payloads (`safety::inputs`): any
//! payload is a stop or not, and a stop word stays one with whitespace
//! around it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rozd::safety::inputs::is_stop_payload;

fuzz_target!(|payload: &[u8]| {
    let stop = is_stop_payload(payload);
    let mut padded = b" \t".to_vec();
    padded.extend_from_slice(payload);
    padded.extend_from_slice(b"\r\n");
    assert_eq!(is_stop_payload(&padded), stop, "{payload:?}");
});
