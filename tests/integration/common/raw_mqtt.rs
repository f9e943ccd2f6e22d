//! A minimal MQTT 3.1.1 client over one raw TCP stream, for the tests that
//! need thousands of broker connections or a fast burst of retained
//! messages: one socket per connection and no event loop each. It speaks
//! CONNECT (optionally with a last will), PUBLISH at QoS 0 and PINGREQ,
//! which serves as a barrier: a broker handles one connection's packets in
//! order, so its PINGRESP means everything sent before was processed.
//! Dropping a [`RawClient`] closes the socket without DISCONNECT, so the
//! broker publishes its last will (as for a killed rozd).

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A bound on a hang, not a synchronisation.
const WITHIN: Duration = Duration::from_secs(60);

/// A last will: published by the broker, retained, at QoS 1, when the
/// connection ends without DISCONNECT.
pub struct Will<'a> {
    pub topic: &'a str,
    pub payload: &'a [u8],
}

pub struct RawClient {
    stream: TcpStream,
}

fn remaining_length(mut n: usize, out: &mut Vec<u8>) {
    loop {
        let mut byte = (n % 128) as u8;
        n /= 128;
        if n > 0 {
            byte |= 0x80;
        }
        out.push(byte);
        if n == 0 {
            return;
        }
    }
}

fn string(s: &[u8], out: &mut Vec<u8>) {
    let len = u16::try_from(s.len()).expect("an MQTT string is at most 65535 bytes");
    out.extend(len.to_be_bytes());
    out.extend(s);
}

fn packet(first: u8, body: &[u8]) -> Vec<u8> {
    let mut out = vec![first];
    remaining_length(body.len(), &mut out);
    out.extend(body);
    out
}

/// A retained (or not) PUBLISH at QoS 1 with packet id `id` (the broker
/// answers with a PUBACK, which [`RawClient::sync`] skips).
pub fn publish_qos1_packet(topic: &str, payload: &[u8], retain: bool, id: u16) -> Vec<u8> {
    let mut body = Vec::with_capacity(topic.len() + payload.len() + 4);
    string(topic.as_bytes(), &mut body);
    body.extend(id.to_be_bytes());
    body.extend(payload);
    packet(0x32 | u8::from(retain), &body)
}

impl RawClient {
    /// Connects as `client_id` (clean session, no keep-alive: the broker
    /// never times the connection out) and waits for an accepting CONNACK.
    pub async fn connect(port: u16, client_id: &str, will: Option<Will<'_>>) -> RawClient {
        let mut stream = tokio::time::timeout(WITHIN, TcpStream::connect(("127.0.0.1", port)))
            .await
            .expect("connecting to the broker hung")
            .expect("connect to the broker");
        let mut body = Vec::new();
        string(b"MQTT", &mut body);
        body.push(4); // MQTT 3.1.1
        let mut flags = 0x02; // clean session
        if will.is_some() {
            flags |= 0x04 | (1 << 3) | 0x20; // will, QoS 1, retained
        }
        body.push(flags);
        body.extend(0u16.to_be_bytes()); // keep-alive off
        string(client_id.as_bytes(), &mut body);
        if let Some(will) = &will {
            string(will.topic.as_bytes(), &mut body);
            string(will.payload, &mut body);
        }
        stream
            .write_all(&packet(0x10, &body))
            .await
            .expect("send CONNECT");
        let mut ack = [0u8; 4];
        tokio::time::timeout(WITHIN, stream.read_exact(&mut ack))
            .await
            .expect("no CONNACK")
            .expect("read CONNACK");
        assert_eq!(
            ack,
            [0x20, 0x02, 0x00, 0x00],
            "the broker refused {client_id}"
        );
        RawClient { stream }
    }

    /// Sends prepared packets as they are.
    pub async fn send(&mut self, bytes: &[u8]) {
        self.stream
            .write_all(bytes)
            .await
            .expect("send to the broker");
    }

    /// PINGREQ, then waits for PINGRESP: the broker has processed every
    /// packet sent before.
    pub async fn sync(&mut self) {
        self.send(&[0xC0, 0x00]).await;
        tokio::time::timeout(WITHIN, async {
            loop {
                let first = self.stream.read_u8().await.expect("read from the broker");
                let mut len = 0usize;
                let mut shift = 0;
                loop {
                    let byte = self.stream.read_u8().await.expect("read from the broker");
                    len |= usize::from(byte & 0x7f) << shift;
                    shift += 7;
                    if byte & 0x80 == 0 {
                        break;
                    }
                }
                let mut body = vec![0u8; len];
                self.stream
                    .read_exact(&mut body)
                    .await
                    .expect("read from the broker");
                match first >> 4 {
                    13 => return, // PINGRESP
                    4 => {}       // PUBACK of a QoS 1 publish
                    other => panic!("unexpected packet type {other} from the broker"),
                }
            }
        })
        .await
        .expect("no PINGRESP");
    }
}

/// Raises this process's soft limit on open files to at least `want` (the
/// children it starts next, mosquitto among them, inherit it); fails the
/// test if the hard limit does not allow it.
pub fn allow_open_files(want: u64) {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    if soft >= want {
        return;
    }
    assert!(
        hard >= want,
        "this test needs {want} open files; the hard limit is {hard} (raise it: ulimit -Hn)"
    );
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).expect("setrlimit");
}
