//! Raw clients for reachability tests: one HTTP/1.1 request over the local
//! control socket (hyper's client on a Unix stream), one hand-written
//! HTTP/1.1 request over TCP (every header exactly as given), and waiting
//! for the server to close a connection.

use std::path::Path;

use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpStream, UnixStream};

use super::EXPECT_WITHIN;

/// `method path` on the control socket at `socket` with an optional JSON
/// body: the status and the body as JSON.
pub async fn unix_request(
    socket: &Path,
    method: &str,
    path: &str,
    json: Option<&serde_json::Value>,
) -> (u16, serde_json::Value) {
    let exchange = async {
        let stream = UnixStream::connect(socket)
            .await
            .unwrap_or_else(|e| panic!("connect to {}: {e}", socket.display()));
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("HTTP/1 handshake on the control socket");
        tokio::spawn(connection);
        let mut request = http::Request::builder()
            .method(method)
            .uri(path)
            .header("host", "localhost");
        if json.is_some() {
            request = request.header("content-type", "application/json");
        }
        let body = json.map(|v| v.to_string()).unwrap_or_default();
        let response = sender
            .send_request(request.body(Full::new(Bytes::from(body))).unwrap())
            .await
            .expect("an answer on the control socket");
        let status = response.status().as_u16();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{method} {path}: not JSON ({e}): {text:?}"));
        (status, value)
    };
    tokio::time::timeout(EXPECT_WITHIN, exchange)
        .await
        .unwrap_or_else(|_| panic!("{method} {path} on the control socket answers in time"))
}

/// Sends `head` (request line and headers, without the blank line) plus
/// `connection: close` and `body` over a new TCP connection and reads the
/// whole answer: the status and the body as JSON (`Null` when empty or not JSON).
pub async fn raw_http(
    addr: std::net::SocketAddr,
    head: &str,
    body: &str,
) -> (u16, serde_json::Value) {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        let request = format!(
            "{head}\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).await.expect("send");
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.expect("read");
        let text = String::from_utf8_lossy(&answer).into_owned();
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no status line in {text:?}"));
        let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        (
            status,
            serde_json::from_str(body).unwrap_or(serde_json::Value::Null),
        )
    };
    tokio::time::timeout(EXPECT_WITHIN, exchange)
        .await
        .unwrap_or_else(|_| panic!("an answer to {head:?} in time"))
}

/// Reads until the server closes the connection (EOF or a reset); panics if
/// it is still open after `within`. Returns what the server sent.
pub async fn closed_by_server(stream: &mut TcpStream, within: std::time::Duration) -> Vec<u8> {
    let mut seen = Vec::new();
    let mut buf = [0u8; 1024];
    tokio::time::timeout(within, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "the server did not close the connection within {within:?} (it sent {:?})",
            String::from_utf8_lossy(&seen)
        )
    });
    seen
}
