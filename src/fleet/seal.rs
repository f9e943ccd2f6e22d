//! Authenticated fleet messages: every host record and fleet stop/clear
//! command a rozd publishes is sealed in an envelope with an HMAC-SHA256
//! tag under a key that only fleet members hold. Plain data and functions,
//! no I/O.
//!
//! - **Key.** `K = HMAC-SHA256(key = fleet token, message = "roz fleet
//!   message key v1")`: derived from the fleet token every member already
//!   has, domain-separated, so the bearer token itself never serves as the
//!   MAC key (and a tag reveals nothing usable as a token).
//! - **Envelope.** The JSON object `{"v": 1, "body": "<the record or
//!   command as JSON text>", "mac": "<base64 tag>"}` (standard base64 with
//!   padding; unknown fields are ignored).
//! - **Tag.** `HMAC-SHA256(K, topic || 0x00 || body)`, `topic` being the
//!   MQTT topic the message is published on (which never contains a NUL) and
//!   `body` the UTF-8 bytes of the `body` string. Binding the topic means a
//!   sealed message cannot be moved to another host's record topic or to
//!   another environment's stop topic.
//!
//! Authenticity only: freshness (replays of an old, authentic message) is
//! judged where messages are applied (`view` for records, `stop` for
//! commands).

use std::borrow::Cow;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use ring::hmac;
use serde::{Deserialize, Serialize};

/// The version of the envelope this rozd writes and reads.
pub const ENVELOPE_VERSION: u32 = 1;
/// The label of the key derivation.
const KEY_LABEL: &[u8] = b"roz fleet message key v1";

/// The key fleet messages are sealed with. Its `Debug` shows nothing of it.
#[derive(Clone)]
pub struct MessageKey(hmac::Key);

impl std::fmt::Debug for MessageKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MessageKey(..)")
    }
}

impl MessageKey {
    /// The message key of the fleet whose members share `token`.
    pub fn from_token(token: &str) -> MessageKey {
        let derive = hmac::Key::new(hmac::HMAC_SHA256, token.as_bytes());
        let derived = hmac::sign(&derive, KEY_LABEL);
        MessageKey(hmac::Key::new(hmac::HMAC_SHA256, derived.as_ref()))
    }

    fn context(&self, topic: &str, body: &[u8]) -> hmac::Context {
        let mut ctx = hmac::Context::with_key(&self.0);
        ctx.update(topic.as_bytes());
        ctx.update(&[0]);
        ctx.update(body);
        ctx
    }
}

/// Why a message is not an authentic fleet message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unauthentic {
    #[error("it is not a sealed fleet message (no MAC)")]
    NotSealed,
    #[error("its envelope version {0} is not one this rozd reads")]
    Version(u32),
    #[error("its MAC is not valid base64 of 32 bytes")]
    MalformedMac,
    #[error(
        "its MAC does not verify (forged, altered, moved to another topic, or another fleet's key)"
    )]
    BadMac,
}

#[derive(Serialize)]
struct Sealing<'a> {
    v: u32,
    body: &'a str,
    mac: String,
}

#[derive(Deserialize)]
struct Envelope<'a> {
    v: u32,
    #[serde(borrow)]
    body: Cow<'a, str>,
    #[serde(borrow)]
    mac: Cow<'a, str>,
}

/// `body` (a record or command as JSON text) sealed for `topic`.
pub fn seal(key: &MessageKey, topic: &str, body: &str) -> Vec<u8> {
    let tag = key.context(topic, body.as_bytes()).sign();
    let envelope = Sealing {
        v: ENVELOPE_VERSION,
        body,
        mac: STANDARD.encode(tag.as_ref()),
    };
    // A struct of a number and two strings always serialises.
    serde_json::to_vec(&envelope).unwrap_or_default()
}

/// The envelope in `payload`, if it is one (authentic or not).
fn envelope(payload: &[u8]) -> Option<Envelope<'_>> {
    // Only an object can be an envelope; skip the parse for bare payloads.
    let first = payload.iter().find(|b| !b.is_ascii_whitespace())?;
    if *first != b'{' {
        return None;
    }
    serde_json::from_slice(payload).ok()
}

/// The body of `payload` if it is an authentic message for `topic`.
pub fn open(key: &MessageKey, topic: &str, payload: &[u8]) -> Result<String, Unauthentic> {
    let envelope = envelope(payload).ok_or(Unauthentic::NotSealed)?;
    if envelope.v != ENVELOPE_VERSION {
        return Err(Unauthentic::Version(envelope.v));
    }
    let tag = STANDARD
        .decode(envelope.mac.as_bytes())
        .map_err(|_| Unauthentic::MalformedMac)?;
    if tag.len() != hmac::HMAC_SHA256.digest_algorithm().output_len() {
        return Err(Unauthentic::MalformedMac);
    }
    let expected = key.context(topic, envelope.body.as_bytes()).sign();
    // Constant time: the comparison leaks nothing about the expected tag.
    if subtle::ConstantTimeEq::ct_eq(expected.as_ref(), tag.as_slice()).into() {
        Ok(envelope.body.into_owned())
    } else {
        Err(Unauthentic::BadMac)
    }
}

/// What `payload` says, whether or not it is authentic: the body of an
/// envelope, or the payload itself. Used only to see whether an
/// unauthenticated stop command asks to stop (anyone may stop).
pub fn content(payload: &[u8]) -> Cow<'_, [u8]> {
    match envelope(payload) {
        Some(e) => Cow::Owned(e.body.into_owned().into_bytes()),
        None => Cow::Borrowed(payload),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOPIC: &str = "roz/v1/estop/lab";
    const BODY: &str = r#"{"stop":false,"reason":"done","by":"a","id":"x","at_ms":5}"#;

    fn key() -> MessageKey {
        MessageKey::from_token("fleet-test-token")
    }

    #[test]
    fn round_trip() {
        let sealed = seal(&key(), TOPIC, BODY);
        assert_eq!(open(&key(), TOPIC, &sealed).as_deref(), Ok(BODY));
        assert_eq!(content(&sealed).as_ref(), BODY.as_bytes());
        let value: serde_json::Value = serde_json::from_slice(&sealed).unwrap();
        assert_eq!(value["v"], 1);
        assert_eq!(value["body"], BODY);
        // an envelope with fields from a newer rozd still opens
        let mut newer = value.clone();
        newer["note"] = "x".into();
        let newer = serde_json::to_vec(&newer).unwrap();
        assert_eq!(open(&key(), TOPIC, &newer).as_deref(), Ok(BODY));
    }

    #[test]
    fn the_documented_construction() {
        // K = HMAC(token, label); tag = HMAC(K, topic || 0 || body), base64.
        let k0 = hmac::Key::new(hmac::HMAC_SHA256, b"fleet-test-token");
        let k = hmac::sign(&k0, b"roz fleet message key v1");
        let k = hmac::Key::new(hmac::HMAC_SHA256, k.as_ref());
        let mut input = TOPIC.as_bytes().to_vec();
        input.push(0);
        input.extend(BODY.as_bytes());
        let mac = STANDARD.encode(hmac::sign(&k, &input).as_ref());
        let sealed: serde_json::Value = serde_json::from_slice(&seal(&key(), TOPIC, BODY)).unwrap();
        assert_eq!(sealed["mac"], mac.as_str());
        // the key is not the token itself
        let with_token_as_key = STANDARD.encode(hmac::sign(&k0, &input).as_ref());
        assert_ne!(sealed["mac"], with_token_as_key.as_str());
    }

    #[test]
    fn tampering_with_any_byte_is_detected() {
        let sealed = seal(&key(), TOPIC, BODY);
        for i in 0..sealed.len() {
            for flip in [0x01u8, 0x20, 0x80] {
                let mut t = sealed.clone();
                t[i] ^= flip;
                assert!(open(&key(), TOPIC, &t).is_err(), "byte {i} ^ {flip:#x}");
            }
        }
    }

    #[test]
    fn a_changed_body_or_mac_is_rejected() {
        let sealed: serde_json::Value = serde_json::from_slice(&seal(&key(), TOPIC, BODY)).unwrap();
        let mut forged = sealed.clone();
        forged["body"] = BODY.replace("false", "true").into();
        let forged = serde_json::to_vec(&forged).unwrap();
        assert_eq!(open(&key(), TOPIC, &forged), Err(Unauthentic::BadMac));
        // anyone can still read what it asks for
        assert!(String::from_utf8_lossy(&content(&forged)).contains("\"stop\":true"));
        let mut bad = sealed.clone();
        bad["mac"] = "not base64!".into();
        let bad = serde_json::to_vec(&bad).unwrap();
        assert_eq!(open(&key(), TOPIC, &bad), Err(Unauthentic::MalformedMac));
        let mut short = sealed.clone();
        short["mac"] = STANDARD.encode([0u8; 16]).into();
        let short = serde_json::to_vec(&short).unwrap();
        assert_eq!(open(&key(), TOPIC, &short), Err(Unauthentic::MalformedMac));
        let mut v2 = sealed;
        v2["v"] = 2.into();
        let v2 = serde_json::to_vec(&v2).unwrap();
        assert_eq!(open(&key(), TOPIC, &v2), Err(Unauthentic::Version(2)));
    }

    #[test]
    fn the_wrong_key_or_topic_is_rejected() {
        let sealed = seal(&key(), TOPIC, BODY);
        let other = MessageKey::from_token("another fleet");
        assert_eq!(open(&other, TOPIC, &sealed), Err(Unauthentic::BadMac));
        assert_eq!(
            open(&key(), "roz/v1/estop/other", &sealed),
            Err(Unauthentic::BadMac)
        );
        // topic and body are separated: moving a byte across does not verify
        let moved = seal(&key(), "roz/v1/estop/la", &format!("b{BODY}"));
        assert_eq!(open(&key(), TOPIC, &moved), Err(Unauthentic::BadMac));
    }

    #[test]
    fn garbage_never_panics_and_is_never_authentic() {
        let mut samples: Vec<Vec<u8>> = vec![
            b"".to_vec(),
            b"stop".to_vec(),
            b"{".to_vec(),
            b"{}".to_vec(),
            b"[1,2]".to_vec(),
            b"{\"v\":1}".to_vec(),
            b"{\"v\":1,\"body\":5,\"mac\":\"\"}".to_vec(),
            b"{\"v\":1,\"body\":\"x\",\"mac\":\"\"}".to_vec(),
            b"{\"v\":-1,\"body\":\"x\",\"mac\":\"AAAA\"}".to_vec(),
            b"{\"v\":1,\"body\":\"\\ud800\",\"mac\":\"AAAA\"}".to_vec(),
            vec![0xff, 0x00, 0x13],
            vec![b'{'; 10_000],
        ];
        // a deterministic pseudo-random spread of lengths and bytes
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for len in 0..200 {
            let mut v = Vec::with_capacity(len);
            for _ in 0..len {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                v.push(x.to_le_bytes()[0]);
            }
            if let Some(b) = v.first_mut() {
                *b = b'{';
            }
            samples.push(v);
        }
        for s in &samples {
            assert!(open(&key(), TOPIC, s).is_err(), "{s:?}");
            let _ = content(s);
        }
    }

    #[test]
    fn the_key_does_not_show_in_debug() {
        assert_eq!(format!("{:?}", key()), "MessageKey(..)");
    }
}

/// Sealing round-trips, and any change to a sealed message is caught.
#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn a_sealed_body_opens_and_a_changed_one_does_not(
            token in "[ -~]{1,40}",
            topic in "[a-z/]{1,30}",
            body in "\\PC{0,100}",
            flip in any::<prop::sample::Index>(),
            garbage in prop::collection::vec(any::<u8>(), 0..200),
        ) {
            let key = MessageKey::from_token(&token);
            let sealed = seal(&key, &topic, &body);
            prop_assert_eq!(open(&key, &topic, &sealed).unwrap(), body.clone());
            let other_topic = format!("{topic}x");
            prop_assert!(open(&key, &other_topic, &sealed).is_err());
            let other_key = MessageKey::from_token(&format!("{token}x"));
            prop_assert!(open(&other_key, &topic, &sealed).is_err());
            let mut changed = sealed.clone();
            let i = flip.index(changed.len());
            changed[i] ^= 0x01;
            // A flipped bit may still be the same JSON (e.g. in whitespace
            // escapes); it must never open to a different body.
            if let Ok(opened) = open(&key, &topic, &changed) {
                prop_assert_eq!(opened, body);
            }
            let _ = open(&key, &topic, &garbage);
            let _ = content(&garbage);
        }
    }
}
