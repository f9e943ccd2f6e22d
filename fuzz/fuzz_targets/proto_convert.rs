//! Proto -> domain (`api::convert`): arbitrary bytes decoded with prost as
//! the roz.v1 `SessionRequest` a client sends, then converted: a client
//! event or a precise error, never a panic. What converts also answers
//! (the server's response conversion of an error about it).
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message as _;
use rozd::api::convert;
use rozd::api::proto;

fuzz_target!(|data: &[u8]| {
    let Ok(request) = proto::SessionRequest::decode(data) else {
        return;
    };
    let _ = convert::client_event(request);
});
