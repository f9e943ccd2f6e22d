//! `GET /metrics` read by the real tools: a real Prometheus server (Debian's
//! `prometheus`) scrapes a running rozd with a bearer token, and its HTTP
//! API shows the loop's tick counter increasing and a tool call counted;
//! `promtool check metrics` accepts the output. Every wait polls a condition
//! until a generous deadline; nothing sleeps to synchronise.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::Command;

use crate::common::broker::free_port;
use crate::common::{EXPECT_WITHIN, TestDaemon};
use rozd::api::proto;
use rozd::api::proto::session_request::Request as Req;
use rozd::api::proto::session_response::Response as Resp;

const TOKEN: &str = "metrics-test-token";

const HOST: &str = r#"
[[sensors]]
name = "distance"
source = "sim"
unit = "m"
signal = "constant"
offset = 1.25
rate_hz = 50
warn_max = 2.0

[[actuators]]
name = "speed"
kind = "sim"
unit = "m/s"
min = -1.0
max = 1.0
safe_value = 0.0
"#;

/// Prometheus takes a while to start and to scrape: a bound on a hang.
const PROMETHEUS_WITHIN: Duration = Duration::from_secs(90);

/// One HTTP/1.0 GET (so no chunked answer) over a new connection: status,
/// headers and body.
async fn http_get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> (u16, String, String) {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        let mut request = format!("GET {path} HTTP/1.0\r\nhost: {addr}\r\n");
        for (name, value) in headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str("\r\n");
        stream.write_all(request.as_bytes()).await.expect("send");
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.expect("read");
        let text = String::from_utf8_lossy(&answer).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no status line in {text:?}"));
        (status, head.to_ascii_lowercase(), body.to_string())
    };
    tokio::time::timeout(EXPECT_WITHIN, exchange)
        .await
        .unwrap_or_else(|_| panic!("an answer to GET {path} in time"))
}

/// Percent-encodes a PromQL query for a URL.
fn encode(query: &str) -> String {
    query
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The value of an instant query's first sample, if there is one.
async fn query(prometheus: SocketAddr, promql: &str) -> Option<f64> {
    let (status, _, body) = http_get(
        prometheus,
        &format!("/api/v1/query?query={}", encode(promql)),
        &[],
    )
    .await;
    assert_eq!(status, 200, "query {promql}: {body}");
    let json: serde_json::Value = serde_json::from_str(&body).expect("query answer is JSON");
    json["data"]["result"][0]["value"][1]
        .as_str()
        .and_then(|v| v.parse().ok())
}

/// Polls `promql` until `accept` takes its value; the value.
async fn until(prometheus: SocketAddr, promql: &str, accept: impl Fn(f64) -> bool) -> f64 {
    let deadline = tokio::time::Instant::now() + PROMETHEUS_WITHIN;
    loop {
        if let Some(v) = query(prometheus, promql).await
            && accept(v)
        {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "Prometheus never answered {promql} as expected"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A real Prometheus server scraping `target` every 250 ms with the token.
struct Prometheus {
    child: tokio::process::Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    async fn start(target: SocketAddr) -> Prometheus {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 250ms\n  scrape_timeout: 200ms\n\
                 scrape_configs:\n  - job_name: rozd\n    authorization:\n      credentials: {TOKEN}\n\
                 \x20   static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .expect("write prometheus.yml");
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn prometheus (apt-get install prometheus)");
        let deadline = tokio::time::Instant::now() + PROMETHEUS_WITHIN;
        loop {
            if let Ok(Ok(mut stream)) =
                tokio::time::timeout(Duration::from_secs(1), TcpStream::connect(addr)).await
            {
                let _ = stream.shutdown().await;
                let (status, _, _) = http_get(addr, "/-/ready", &[]).await;
                if status == 200 {
                    break;
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "prometheus did not become ready"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Prometheus {
            child,
            addr,
            _dir: dir,
        }
    }

    async fn stop(mut self) {
        crate::common::broker::terminate(&mut self.child).await;
    }
}

/// One `read distance` turn on the local model: a PURE host tool call, allowed.
async fn read_sensor_in_a_session(daemon: &TestDaemon) {
    let channel = daemon.channel().await;
    let token: tonic::metadata::MetadataValue<_> =
        format!("Bearer {TOKEN}").parse().expect("metadata");
    let mut client = proto::agent_service_client::AgentServiceClient::with_interceptor(
        channel,
        move |mut request: tonic::Request<()>| {
            request
                .metadata_mut()
                .insert("authorization", token.clone());
            Ok(request)
        },
    );
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let mut responses = client
        .stream_session(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .expect("StreamSession accepted")
        .into_inner();
    for request in [
        Req::Start(proto::StartSession::default()),
        Req::UserMessage(proto::UserMessage {
            content: "read distance".into(),
            ..Default::default()
        }),
    ] {
        tx.send(proto::SessionRequest {
            request: Some(request),
        })
        .await
        .expect("request stream open");
    }
    loop {
        let message = tokio::time::timeout(EXPECT_WITHIN, responses.message())
            .await
            .expect("a response in time")
            .expect("stream healthy")
            .expect("stream open");
        if let Some(Resp::TurnComplete(done)) = message.response {
            assert_eq!(done.stop_reason, "end_turn");
            break;
        }
    }
}

#[tokio::test]
async fn prometheus_scrapes_ticks_and_tool_calls() {
    let daemon = TestDaemon::setup(HOST)
        .server(&format!("auth_tokens = [{TOKEN:?}]"))
        .start()
        .await;

    // Like every read route: a token when tokens are configured.
    let (status, _, _) = http_get(daemon.addr, "/metrics", &[]).await;
    assert_eq!(status, 401);
    let bearer = format!("Bearer {TOKEN}");
    let auth = [("authorization", bearer.as_str())];

    read_sensor_in_a_session(&daemon).await;

    // The classic text format by default: what promtool checks.
    let (status, head, text) = http_get(daemon.addr, "/metrics", &auth).await;
    assert_eq!(status, 200, "{text}");
    assert!(
        head.contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    for needle in [
        "rozd_loop_ticks_total ",
        "rozd_tool_calls_total{tool=\"read_sensor\",category=\"pure\",decision=\"allowed\",outcome=\"ok\"} ",
        "rozd_sensor_value{sensor=\"distance\"} 1.25",
        "rozd_actuator_at_safe{actuator=\"speed\"} 1",
        "rozd_protective_stop_active 0",
        "rozd_build_info{version=",
        "rozd_loop_lateness_seconds_bucket{le=",
        "rozd_turns_total{stop_reason=\"end_turn\"}",
        "rozd_model_calls_total{endpoint=\"local\",result=\"ok\"}",
        "rozd_fleet_hosts{status=\"online\"} 1",
        "rozd_store_write_duration_seconds_count{kind=\"turn\"}",
    ] {
        assert!(text.contains(needle), "{needle:?} missing from:\n{text}");
    }
    // Event metrics belong to the process (other suites' daemons run in it too): at least ours.
    let counted: f64 = text
        .lines()
        .find_map(|l| {
            l.strip_prefix(
                "rozd_tool_calls_total{tool=\"read_sensor\",category=\"pure\",decision=\"allowed\",outcome=\"ok\"} ",
            )
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    assert!(counted >= 1.0, "{text}");
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("metrics.txt");
    std::fs::write(&file, &text).expect("write metrics");
    let checked = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::fs::File::open(&file).expect("open metrics"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .await
        .expect("run promtool (apt-get install prometheus)");
    assert!(
        checked.status.success(),
        "promtool check metrics: {}{}\n{text}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );

    // OpenMetrics when asked for (Prometheus asks for it).
    let (status, head, open) = http_get(
        daemon.addr,
        "/metrics",
        &[
            ("authorization", bearer.as_str()),
            ("accept", "application/openmetrics-text;version=1.0.0"),
        ],
    )
    .await;
    assert_eq!(status, 200);
    assert!(
        head.contains("content-type: application/openmetrics-text"),
        "{head}"
    );
    assert!(open.ends_with("# EOF\n"), "{open}");

    let prometheus = Prometheus::start(daemon.addr).await;
    until(prometheus.addr, "up{job=\"rozd\"}", |v| v == 1.0).await;
    let first = until(
        prometheus.addr,
        "rozd_loop_ticks_total{job=\"rozd\"}",
        |v| v > 0.0,
    )
    .await;
    until(
        prometheus.addr,
        "rozd_loop_ticks_total{job=\"rozd\"}",
        |v| v > first,
    )
    .await;
    until(
        prometheus.addr,
        "sum(rozd_tool_calls_total{job=\"rozd\",tool=\"read_sensor\",outcome=\"ok\"})",
        |v| v >= 1.0,
    )
    .await;
    until(prometheus.addr, "rozd_build_info{job=\"rozd\"}", |v| {
        v == 1.0
    })
    .await;
    prometheus.stop().await;
    daemon.shutdown().await;
}
