//! A small HTTP/1.1 client for the CLI's REST calls (`rozd status`, `rozd estop`).

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("invalid address {0:?}: expected host:port or http://host:port")]
    Address(String),
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("HTTP error talking to {addr}: {source}")]
    Http {
        addr: String,
        #[source]
        source: hyper::Error,
    },
    #[error("invalid request: {0}")]
    Request(#[from] http::Error),
}

/// `user-agent` of the CLI's requests: `rozd-cli/<version>`.
pub const USER_AGENT_PREFIX: &str = "rozd-cli/";

/// A reply: status code and body text.
#[derive(Debug)]
pub struct Reply {
    pub status: http::StatusCode,
    pub body: String,
}

/// `host:port` from `host:port`, `http://host:port` or `http://host:port/`.
pub fn authority(addr: &str) -> Result<String, ClientError> {
    let rest = addr
        .strip_prefix("http://")
        .unwrap_or(addr)
        .trim_end_matches('/');
    if rest.is_empty() || rest.contains('/') || !rest.contains(':') {
        return Err(ClientError::Address(addr.to_string()));
    }
    Ok(rest.to_string())
}

/// Sends one request and reads the whole reply.
pub async fn request(
    addr: &str,
    method: http::Method,
    path: &str,
    token: Option<&str>,
) -> Result<Reply, ClientError> {
    send(addr, method, path, token, None).await
}

/// `POST path` with a JSON body.
pub async fn post_json(
    addr: &str,
    path: &str,
    token: Option<&str>,
    body: &serde_json::Value,
) -> Result<Reply, ClientError> {
    send(
        addr,
        http::Method::POST,
        path,
        token,
        Some(body.to_string().into_bytes()),
    )
    .await
}

async fn send(
    addr: &str,
    method: http::Method,
    path: &str,
    token: Option<&str>,
    json: Option<Vec<u8>>,
) -> Result<Reply, ClientError> {
    let authority = authority(addr)?;
    let stream = TcpStream::connect(&authority)
        .await
        .map_err(|source| ClientError::Connect {
            addr: authority.clone(),
            source,
        })?;
    let http_err = |source| ClientError::Http {
        addr: authority.clone(),
        source,
    };
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(http_err)?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut builder = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::HOST, &authority)
        .header(http::header::ACCEPT, "application/json")
        .header(
            http::header::USER_AGENT,
            format!("{USER_AGENT_PREFIX}{}", crate::VERSION),
        );
    if json.is_some() {
        builder = builder.header(http::header::CONTENT_TYPE, "application/json");
    }
    if let Some(token) = token {
        builder = builder.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let response = sender
        .send_request(builder.body(Full::new(Bytes::from(json.unwrap_or_default())))?)
        .await
        .map_err(http_err)?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(http_err)?
        .to_bytes();
    Ok(Reply {
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// `GET path`.
pub async fn get(addr: &str, path: &str, token: Option<&str>) -> Result<Reply, ClientError> {
    request(addr, http::Method::GET, path, token).await
}
