//! A small HTTP/1.1 client for the CLI's REST calls (`rozd status`, `rozd
//! estop`, `rozd task`, ...), over TCP or the daemon's local control socket,
//! and how the CLI finds that socket ([`socket_for`], [`control_socket`]).

use std::path::{Path, PathBuf};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpStream, UnixStream};

use crate::config::ControlSocket;
use crate::proto::CLI_USER_AGENT_PREFIX;

/// What [`url_part`] leaves as it is: RFC 3986's unreserved characters.
const UNRESERVED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// `s` as one path segment or query value: every byte but the unreserved
/// ones as `%XX`, so that a `/`, `?` or `#` in a user's argument (a task id,
/// an environment) cannot reach another route.
pub fn url_part(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, UNRESERVED).to_string()
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("invalid address {0:?}: expected host:port, http://host:port or https://host:port")]
    Address(String),
    #[error("TLS to {addr}: {message}")]
    Tls { addr: String, message: String },
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
    #[error("{tcp} (and the control socket {}: {socket})", path.display())]
    Neither {
        path: PathBuf,
        socket: std::io::Error,
        #[source]
        tcp: Box<ClientError>,
    },
}

/// A reply: status code and body text.
#[derive(Debug)]
pub struct Reply {
    pub status: http::StatusCode,
    pub body: String,
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
    let authority =
        super::connect::authority(addr).map_err(|_| ClientError::Address(addr.to_string()))?;
    let connect_error = |source| ClientError::Connect {
        addr: authority.clone(),
        source,
    };
    if super::connect::is_tls(addr) {
        let tls_error = |e: super::connect::ConnectError| ClientError::Tls {
            addr: authority.clone(),
            message: e.to_string(),
        };
        let config =
            super::connect::tls_config(crate::tls::client::ALPN_HTTP1).map_err(tls_error)?;
        let name = super::connect::tls_server_name(&authority).map_err(tls_error)?;
        let stream = crate::tls::client::connect(config, &authority, name)
            .await
            .map_err(connect_error)?;
        return exchange(stream, &authority, &authority, method, path, token, json).await;
    }
    let stream = TcpStream::connect(&authority)
        .await
        .map_err(connect_error)?;
    exchange(stream, &authority, &authority, method, path, token, json).await
}

/// One request and its whole reply on an open connection; `host` is the
/// `Host` header, `name` names the peer in errors.
async fn exchange<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    stream: S,
    host: &str,
    name: &str,
    method: http::Method,
    path: &str,
    token: Option<&str>,
    json: Option<Vec<u8>>,
) -> Result<Reply, ClientError> {
    let http_err = |source| ClientError::Http {
        addr: name.to_string(),
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
        .header(http::header::HOST, host)
        .header(http::header::ACCEPT, "application/json")
        .header(
            http::header::USER_AGENT,
            format!("{CLI_USER_AGENT_PREFIX}{}", crate::VERSION),
        );
    if json.is_some() {
        builder = builder.header(http::header::CONTENT_TYPE, "application/json");
    }
    if let Some(token) = token {
        builder = builder.header(
            http::header::AUTHORIZATION,
            super::connect::authorization(token),
        );
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

/// How a request reached the daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Via {
    ControlSocket(PathBuf),
    Tcp(String),
}

impl std::fmt::Display for Via {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Via::ControlSocket(path) => write!(f, "the control socket {}", path.display()),
            Via::Tcp(addr) => f.write_str(addr),
        }
    }
}

/// One request to a local daemon: over its control socket `socket` first
/// (no token: the socket's file permissions stand for it), else over TCP at
/// `addr` (with `token`). A socket that exists but cannot be used is noted
/// in `notes`; one that does not exist is passed over silently.
pub async fn send_local(
    socket: Option<&Path>,
    addr: &str,
    method: http::Method,
    path: &str,
    token: Option<&str>,
    json: Option<&serde_json::Value>,
    notes: &mut Vec<String>,
) -> Result<(Reply, Via), ClientError> {
    let body = json.map(|v| v.to_string().into_bytes());
    let mut socket_error = None;
    if let Some(socket) = socket {
        let connected = match trusted_socket(socket) {
            Ok(()) => UnixStream::connect(socket).await,
            Err(e) => Err(e),
        };
        match connected {
            Ok(stream) => {
                let name = socket.display().to_string();
                let reply = exchange(stream, "localhost", &name, method, path, None, body).await?;
                return Ok((reply, Via::ControlSocket(socket.to_path_buf())));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                notes.push(format!(
                    "cannot use the control socket {} ({e}); trying {addr}",
                    socket.display()
                ));
                socket_error = Some((socket.to_path_buf(), e));
            }
        }
    }
    match send(addr, method, path, token, body).await {
        Ok(reply) => Ok((reply, Via::Tcp(addr.to_string()))),
        Err(tcp) => Err(match socket_error {
            Some((path, socket)) => ClientError::Neither {
                path,
                socket,
                tcp: Box::new(tcp),
            },
            None => tcp,
        }),
    }
}

/// The user the packaged daemon runs as (the systemd unit's `User=`).
pub const DAEMON_USER: &str = "rozd";

/// A control socket the CLI may believe: a socket owned by root, by the
/// user running the CLI, or by the daemon's user ([`DAEMON_USER`]). Any
/// other owner means someone else put it there (a squatted path in `/tmp`
/// would answer "latched" for a stop that never happened). A missing path
/// is `NotFound`, as from connecting.
fn trusted_socket(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
    let meta = std::fs::symlink_metadata(path)?;
    if !meta.file_type().is_socket() {
        return Err(std::io::Error::other(
            "it is not a socket (a symbolic link or another kind of file)",
        ));
    }
    let owner = meta.uid();
    let daemon = nix::unistd::User::from_name(DAEMON_USER)
        .ok()
        .flatten()
        .map(|u| u.uid.as_raw());
    let trusted = owner == 0 || owner == nix::unistd::geteuid().as_raw() || Some(owner) == daemon;
    if trusted {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "it is owned by uid {owner}, not root, you or the {DAEMON_USER} user: anyone could have put it there"
        )))
    }
}

/// The control socket a command tries first: `flag` (`--socket`,
/// `$ROZD_SOCKET`; empty for none), else [`control_socket`] of `config`
/// (`--config`, else `$ROZD_CONFIG`).
pub fn socket_for(flag: Option<&Path>, config: Option<&Path>, addr_given: bool) -> Option<PathBuf> {
    match flag {
        Some(path) if path.as_os_str().is_empty() => None,
        Some(path) => Some(path.to_path_buf()),
        None => {
            let from_env = std::env::var_os(crate::config::CONFIG_ENV)
                .filter(|p| !p.is_empty())
                .map(PathBuf::from);
            let config = config.map(Path::to_path_buf).or(from_env);
            control_socket(config.as_deref(), addr_given)
        }
    }
}

/// Where the control socket of the daemon a CLI command talks to is, when
/// the command is not told (`--socket`):
///
/// - `config` given (`--config` or `$ROZD_CONFIG`): that file's
///   `server.control_socket`, else its default (`$RUNTIME_DIRECTORY/control.sock`,
///   else `control.sock` beside its store; for `/etc/rozd/rozd.toml` also
///   `/run/rozd/control.sock`, where the systemd unit puts it);
/// - no config and no `--addr`: the same for the configuration the daemon
///   would find (`/etc/rozd/rozd.toml`, else the built-in one);
/// - only `--addr`: none (that address may be another machine).
///
/// Only `server.control_socket` and `store.path` are read from the file,
/// leniently: a file the CLI cannot read or parse does not stop it from
/// trying the default places (a stop must not fail over the configuration).
/// Of several candidates the first that exists is taken.
pub fn control_socket(config: Option<&Path>, addr_given: bool) -> Option<PathBuf> {
    let file = match config {
        Some(path) => Some(path.to_path_buf()),
        None if addr_given => return None,
        None => {
            let system = Path::new(crate::config::SYSTEM_CONFIG_PATH);
            system.exists().then(|| system.to_path_buf())
        }
    };
    let is_system = file
        .as_deref()
        .is_some_and(|f| f == Path::new(crate::config::SYSTEM_CONFIG_PATH));
    let text = file
        .as_deref()
        .and_then(|f| std::fs::read_to_string(f).ok())
        .unwrap_or_default();
    let (socket, store) = lenient_socket_settings(&text);
    match &socket {
        ControlSocket::Disabled => None,
        ControlSocket::At(path) => Some(path.clone()),
        ControlSocket::Default => {
            let mut candidates = Vec::new();
            if std::env::var_os("RUNTIME_DIRECTORY").is_some() {
                candidates.extend(socket.path(&store));
            }
            if is_system {
                candidates.push(PathBuf::from(SYSTEMD_CONTROL_SOCKET));
            }
            candidates.extend(socket.path(&store));
            candidates.iter().find(|p| p.exists()).cloned()
        }
    }
}

/// Where the shipped systemd unit's daemon listens (`RuntimeDirectory=rozd`).
pub const SYSTEMD_CONTROL_SOCKET: &str = "/run/rozd/control.sock";

/// `server.control_socket` and `store.path` of a configuration text, each
/// default when absent or unreadable.
fn lenient_socket_settings(text: &str) -> (ControlSocket, crate::config::StoreConfig) {
    let mut socket = ControlSocket::Default;
    let mut store = crate::config::StoreConfig::default();
    if let Ok(value) = text.parse::<toml::Table>() {
        let string = |table: &str, key: &str| {
            value
                .get(table)
                .and_then(|t| t.get(key))
                .and_then(toml::Value::as_str)
                .map(PathBuf::from)
        };
        socket = ControlSocket::from_setting(string("server", "control_socket"));
        store.path = string("store", "path");
    }
    (socket, store)
}

/// How a client command reaches the daemon of a configuration file: its
/// listen address (an unspecified one, `0.0.0.0` or `[::]`, as loopback),
/// `https://` when it has `[server.tls]`, and the CA to trust then
/// (`[fleet] ca_file`, which signs the fleet's host certificates).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigReach {
    pub addr: String,
    pub ca_file: Option<PathBuf>,
}

/// The configuration file a client command was given: `config`
/// (`--config`), else `$ROZD_CONFIG`.
pub fn given_config(config: Option<&Path>) -> Option<PathBuf> {
    config.map(Path::to_path_buf).or_else(|| {
        std::env::var_os(crate::config::CONFIG_ENV)
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
    })
}

/// [`ConfigReach`] of the configuration text `text`, read leniently (only
/// `server.listen`, `[server.tls]` and `fleet.ca_file`); `Err` says why not.
pub fn config_reach(text: &str) -> Result<ConfigReach, String> {
    let value = text
        .parse::<toml::Table>()
        .map_err(|e| format!("not valid TOML: {}", e.message()))?;
    let server = value.get("server").and_then(toml::Value::as_table);
    let listen = match server.and_then(|s| s.get("listen")) {
        None => super::connect::DEFAULT_ADDR.to_string(),
        Some(toml::Value::String(listen)) => listen.clone(),
        Some(_) => return Err("server.listen is not a string".into()),
    };
    let mut socket: std::net::SocketAddr = listen
        .parse()
        .map_err(|_| format!("server.listen {listen:?} is not an address:port"))?;
    if socket.ip().is_unspecified() {
        socket.set_ip(match socket {
            std::net::SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    let tls = server.is_some_and(|s| s.contains_key("tls"));
    let ca_file = value
        .get("fleet")
        .and_then(|f| f.get("ca_file"))
        .and_then(toml::Value::as_str)
        .filter(|_| tls)
        .map(PathBuf::from);
    Ok(ConfigReach {
        addr: if tls {
            format!("https://{socket}")
        } else {
            socket.to_string()
        },
        ca_file,
    })
}

/// Where a client command talks to the daemon: `addr` when given
/// (`--addr`, `$ROZD_ADDR`), else the configuration's ([`config_reach`] of
/// `--config`, else `$ROZD_CONFIG`), else [`super::connect::DEFAULT_ADDR`].
/// A configuration that cannot be read for it is an error: talking to some
/// other daemon instead could stop or move the wrong robot.
pub fn reach_for(addr: Option<&str>, config: Option<&Path>) -> Result<ConfigReach, String> {
    if let Some(addr) = addr {
        return Ok(ConfigReach {
            addr: addr.to_string(),
            ca_file: None,
        });
    }
    match given_config(config) {
        None => Ok(ConfigReach {
            addr: super::connect::DEFAULT_ADDR.to_string(),
            ca_file: None,
        }),
        Some(path) => {
            let text = std::fs::read_to_string(&path)
                .map_err(|e| format!("cannot read {} for its address: {e}", path.display()))?;
            config_reach(&text).map_err(|e| format!("{}: {e}", path.display()))
        }
    }
}

/// `GET path`.
pub async fn get(addr: &str, path: &str, token: Option<&str>) -> Result<Reply, ClientError> {
    request(addr, http::Method::GET, path, token).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_configuration_gives_its_listen_address_scheme_and_fleet_ca() {
        let reach = |text: &str| config_reach(text).map(|r| (r.addr, r.ca_file));
        assert_eq!(reach(""), Ok(("127.0.0.1:8080".into(), None)));
        assert_eq!(
            reach("[server]\nlisten = \"127.0.0.1:18501\"\n"),
            Ok(("127.0.0.1:18501".into(), None))
        );
        assert_eq!(
            reach(
                "[server]\nlisten = \"0.0.0.0:8443\"\n[server.tls]\ncert_file = \"c\"\n[fleet]\nca_file = \"/etc/rozd/fleet-ca.pem\"\n"
            ),
            Ok((
                "https://127.0.0.1:8443".into(),
                Some(PathBuf::from("/etc/rozd/fleet-ca.pem"))
            ))
        );
        assert_eq!(
            reach("[server]\nlisten = \"[::]:9000\"\n[fleet]\nca_file = \"x\"\n"),
            Ok(("[::1]:9000".into(), None)),
            "the fleet CA only for TLS"
        );
        assert!(
            reach("[server]\nlisten = \"nowhere\"\n")
                .unwrap_err()
                .contains("server.listen")
        );
        assert!(reach("[server\n").unwrap_err().contains("TOML"));
        // --addr wins over any configuration.
        let given = reach_for(Some("10.0.0.2:8080"), Some(Path::new("/nonexistent.toml")));
        assert_eq!(given.map(|r| r.addr), Ok("10.0.0.2:8080".to_string()));
        assert!(reach_for(None, Some(Path::new("/nonexistent/rozd.toml"))).is_err());
    }

    #[test]
    fn url_parts_keep_only_unreserved_characters() {
        assert_eq!(url_part("lab:5f0c-a_b.c~d"), "lab%3A5f0c-a_b.c~d");
        assert_eq!(url_part("a/b?c#d e&f=g%"), "a%2Fb%3Fc%23d%20e%26f%3Dg%25");
        assert_eq!(url_part("ü"), "%C3%BC");
        assert_eq!(url_part(""), "");
    }

    #[test]
    fn socket_settings_are_read_leniently() {
        let (socket, store) = lenient_socket_settings(
            "[server]\ncontrol_socket = \"/tmp/x.sock\"\nunknown = 1\n[store]\npath = \"/var/tmp/r.db\"\n",
        );
        assert_eq!(socket, ControlSocket::At(PathBuf::from("/tmp/x.sock")));
        assert_eq!(store.path, Some(PathBuf::from("/var/tmp/r.db")));
        let (socket, _) = lenient_socket_settings("[server]\ncontrol_socket = \"\"\n");
        assert_eq!(socket, ControlSocket::Disabled);
        let (socket, store) = lenient_socket_settings("not toml [");
        assert_eq!(socket, ControlSocket::Default);
        assert_eq!(store.path, None);
    }

    #[test]
    fn a_config_names_its_socket_and_addr_alone_names_none() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("rozd.toml");
        let socket = dir.path().join("c.sock");
        std::fs::write(
            &config,
            format!(
                "[server]\ncontrol_socket = {:?}\n",
                socket.display().to_string()
            ),
        )
        .unwrap();
        // Named even before the daemon created it: the CLI then falls back to TCP.
        assert_eq!(control_socket(Some(&config), true), Some(socket));
        std::fs::write(&config, "[server]\ncontrol_socket = \"\"\n").unwrap();
        assert_eq!(control_socket(Some(&config), false), None);
        assert_eq!(control_socket(None, true), None);
        // The default beside the store, once it exists.
        let store = dir.path().join("rozd.db");
        std::fs::write(
            &config,
            format!("[store]\npath = {:?}\n", store.display().to_string()),
        )
        .unwrap();
        if std::env::var_os("RUNTIME_DIRECTORY").is_none() {
            assert_eq!(control_socket(Some(&config), true), None);
            let beside = dir.path().join("control.sock");
            let _listener = std::os::unix::net::UnixListener::bind(&beside).unwrap();
            assert_eq!(control_socket(Some(&config), true), Some(beside));
        }
    }
}
