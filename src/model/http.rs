//! HTTP plumbing shared by the network providers: the client (rustls with
//! the `ring` provider), API keys, retries with backoff, idle timeouts, and
//! turning a streamed HTTP body into [`ModelEvent`]s through a provider's
//! [`Decoder`].
//!
//! A call is retried while nothing of its answer has been streamed on:
//! connection failures, HTTP 408/409/425/429/5xx (529 is Anthropic's
//! overload), a response that stalls or breaks before its first content,
//! and a provider error event (e.g. `overloaded_error`) before any content.
//! Retries wait an exponential backoff with jitter, at least the provider's
//! `retry-after`, and stop when the next wait would pass the retry budget.
//! Once content has been streamed, a failure ends the stream with an error.

use std::collections::VecDeque;
use std::time::Duration;

use futures_util::StreamExt as _;
use futures_util::stream::BoxStream;
use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use tokio::time::Instant;

use super::config::{ResolvedEndpoint, RetryPolicy};
use super::sse::{SseDecoder, SseEvent};
use super::{ModelError, ModelEvent, ModelStream};

/// Most bytes of an error body that are read.
const ERROR_BODY_LIMIT: usize = 64 * 1024;
/// Longest provider message quoted in an error.
const MESSAGE_LIMIT: usize = 500;
/// Largest event (one SSE event's lines) accepted from a provider.
pub(super) const MAX_EVENT_BYTES: usize = 16 * 1024 * 1024;

/// Why an API key could not be found. Messages name the variable or file,
/// never a value.
#[derive(Debug, thiserror::Error)]
pub(super) enum KeyError {
    #[error(
        "environment variable {var} is not set; it must hold the API key of model endpoint {endpoint:?}"
    )]
    NotSet { var: String, endpoint: String },
    #[error(
        "environment variable {var} (API key of model endpoint {endpoint:?}) is not valid UTF-8"
    )]
    NotUnicode { var: String, endpoint: String },
    #[error("the API key in {origin} (model endpoint {endpoint:?}) is empty")]
    Empty { origin: String, endpoint: String },
    #[error("cannot read the API key file {path} of model endpoint {endpoint:?}: {error}")]
    File {
        path: String,
        endpoint: String,
        error: std::io::Error,
    },
}

/// An API key: never printed.
#[derive(Clone, PartialEq, Eq)]
pub(super) struct ApiKey(String);

impl ApiKey {
    pub(super) fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

/// The endpoint's key: from `api_key_file` if set, else from the environment
/// variable `api_key_env`, else none. Read on every call, so a rotated key
/// file takes effect without a restart.
pub(super) fn api_key(endpoint: &ResolvedEndpoint) -> Result<Option<ApiKey>, KeyError> {
    api_key_from(endpoint, |var| std::env::var(var))
}

fn api_key_from(
    endpoint: &ResolvedEndpoint,
    getenv: impl Fn(&str) -> Result<String, std::env::VarError>,
) -> Result<Option<ApiKey>, KeyError> {
    let name = endpoint.name.clone();
    let (raw, origin) = if let Some(path) = &endpoint.api_key_file {
        let text = std::fs::read_to_string(path).map_err(|error| KeyError::File {
            path: path.display().to_string(),
            endpoint: name.clone(),
            error,
        })?;
        (text, format!("file {}", path.display()))
    } else if let Some(var) = &endpoint.api_key_env {
        match getenv(var) {
            Ok(v) => (v, format!("environment variable {var}")),
            Err(std::env::VarError::NotPresent) => {
                return Err(KeyError::NotSet {
                    var: var.clone(),
                    endpoint: name,
                });
            }
            Err(std::env::VarError::NotUnicode(_)) => {
                return Err(KeyError::NotUnicode {
                    var: var.clone(),
                    endpoint: name,
                });
            }
        }
    } else {
        return Ok(None);
    };
    let key = raw.trim();
    if key.is_empty() {
        return Err(KeyError::Empty {
            origin,
            endpoint: name,
        });
    }
    Ok(Some(ApiKey(key.to_string())))
}

/// Replaces every occurrence of the given secrets, and anything that looks
/// like an API key (`sk-...`, `sk_...`), with `[redacted]`.
pub(super) fn redact(text: &str, secrets: &[&str]) -> String {
    let mut out = text.to_string();
    for secret in secrets.iter().filter(|s| s.len() >= 4) {
        out = out.replace(secret, "[redacted]");
    }
    let mut result = String::with_capacity(out.len());
    let mut rest = out.as_str();
    while let Some(pos) = rest.find("sk") {
        let (before, candidate) = rest.split_at(pos);
        result.push_str(before);
        let boundary = before
            .chars()
            .next_back()
            .is_none_or(|c| !c.is_ascii_alphanumeric());
        let tail_len = candidate
            .char_indices()
            .skip(3)
            .find(|(_, c)| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_')))
            .map_or(candidate.len(), |(i, _)| i);
        let looks_like_key = boundary
            && matches!(candidate.as_bytes().get(2), Some(b'-' | b'_'))
            && tail_len >= 3 + 16;
        if looks_like_key {
            result.push_str("[redacted]");
            rest = &candidate[tail_len..];
        } else {
            result.push_str("sk");
            rest = &candidate[2..];
        }
    }
    result.push_str(rest);
    result
}

/// A reqwest client shared by the calls of one endpoint, or why it could
/// not be built (reported on every call).
#[derive(Debug, Clone)]
pub(crate) struct SharedClient(Result<reqwest::Client, String>);

impl SharedClient {
    pub(crate) fn build(connect_timeout: Duration) -> Self {
        install_crypto_provider();
        let built = reqwest::Client::builder()
            .connect_timeout(connect_timeout)
            .tcp_keepalive(Duration::from_secs(30))
            .pool_idle_timeout(Duration::from_secs(60))
            // API calls never follow redirects: a key is not sent elsewhere.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("rozd/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {}", error_chain(&e)));
        if let Err(e) = &built {
            tracing::error!(error = %e, "model provider HTTP client unavailable");
        }
        SharedClient(built)
    }

    fn get(&self) -> Result<&reqwest::Client, Failure> {
        self.0.as_ref().map_err(|e| Failure::fatal(e.clone()))
    }
}

/// rustls needs one process-wide crypto provider; rozd uses `ring` (no C
/// toolchain, cross-compiles to aarch64).
fn install_crypto_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Err means another part of the process installed one first: fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// Why one attempt failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub(super) struct Failure {
    pub message: String,
    pub retryable: bool,
    pub retry_after: Option<Duration>,
    /// An HTTP 500 (or another server error that is not a known outage):
    /// as likely the request's fault as the server's, so retried at most
    /// [`RetryPolicy::server_errors`] times, not for the whole budget.
    pub server_error: bool,
}

impl Failure {
    pub(super) fn retryable(message: impl Into<String>) -> Self {
        Failure {
            message: message.into(),
            retryable: true,
            retry_after: None,
            server_error: false,
        }
    }
    pub(super) fn fatal(message: impl Into<String>) -> Self {
        Failure {
            message: message.into(),
            retryable: false,
            retry_after: None,
            server_error: false,
        }
    }
}

/// Turns one provider's event stream into model events.
pub(super) trait Decoder: Send + 'static {
    /// One server-sent event.
    fn event(&mut self, event: SseEvent) -> Result<Vec<ModelEvent>, Failure>;
    /// The body ended (cleanly) before [`Decoder::finished`].
    fn end(&mut self) -> Result<Vec<ModelEvent>, Failure>;
    /// The provider's final event was seen; the rest of the body is not read.
    fn finished(&self) -> bool;
}

/// Extracts the provider's message from an error body.
pub(super) type ErrorMessage = fn(&[u8]) -> Option<String>;

/// One streaming call: what to send, how to decode it, how to retry.
pub(super) struct Call<D> {
    pub client: SharedClient,
    pub url: String,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
    pub idle_timeout: Duration,
    pub retry: RetryPolicy,
    /// Values that never appear in an error message (the API key).
    pub secrets: Vec<String>,
    pub new_decoder: Box<dyn Fn() -> D + Send + Sync>,
    pub error_message: ErrorMessage,
}

impl<D: Decoder> Call<D> {
    pub(super) fn into_stream(self) -> ModelStream {
        let running = Running {
            call: self,
            body: None,
            sse: SseDecoder::new(),
            decoder: None,
            pending: VecDeque::new(),
            error: None,
            committed: false,
            done: false,
            attempt: 0,
            server_errors: 0,
            started: Instant::now(),
        };
        futures_util::stream::unfold(running, |mut running| async move {
            running.next().await.map(|item| (item, running))
        })
        .boxed()
    }
}

/// A stream that yields one error.
pub(super) fn failed(error: ModelError) -> ModelStream {
    futures_util::stream::once(std::future::ready(Err(error))).boxed()
}

struct Running<D> {
    call: Call<D>,
    body: Option<BoxStream<'static, reqwest::Result<Vec<u8>>>>,
    sse: SseDecoder,
    decoder: Option<D>,
    pending: VecDeque<ModelEvent>,
    /// The error that ends the stream once `pending` is drained.
    error: Option<ModelError>,
    /// Events have been produced: failures are no longer retried.
    committed: bool,
    done: bool,
    attempt: u32,
    /// Server errors ([`Failure::server_error`]) retried so far.
    server_errors: u32,
    started: Instant,
}

impl<D: Decoder> Running<D> {
    async fn next(&mut self) -> Option<Result<ModelEvent, ModelError>> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Some(Ok(event));
            }
            if let Some(error) = self.error.take() {
                return Some(Err(error));
            }
            if self.done {
                return None;
            }
            if let Err(failure) = self.advance().await
                && let Err(error) = self.recover(failure).await
            {
                self.error = Some(error);
                self.done = true;
                self.body = None;
            }
        }
    }

    fn push(&mut self, events: Vec<ModelEvent>) {
        if !events.is_empty() {
            self.committed = true;
            self.pending.extend(events);
        }
    }

    /// Connects, or reads and decodes the next chunk of the body.
    async fn advance(&mut self) -> Result<(), Failure> {
        if self.body.is_none() {
            return self.connect().await;
        }
        let idle = self.call.idle_timeout;
        let (Some(body), Some(decoder)) = (self.body.as_mut(), self.decoder.as_mut()) else {
            return Err(Failure::fatal("internal: stream state lost"));
        };
        let chunk = match tokio::time::timeout(idle, body.next()).await {
            Err(_) => {
                return Err(Failure::retryable(format!(
                    "the stream stalled: nothing arrived for {} ms",
                    idle.as_millis()
                )));
            }
            Ok(None) => {
                self.sse.finish();
                let events = decoder.end()?;
                self.done = true;
                self.body = None;
                self.push(events);
                return Ok(());
            }
            Ok(Some(Err(e))) => {
                return Err(Failure::retryable(format!(
                    "the connection broke: {}",
                    error_chain(&e)
                )));
            }
            Ok(Some(Ok(bytes))) => bytes,
        };
        let mut produced = Vec::new();
        let mut outcome = Ok(());
        for event in self.sse.push(&chunk) {
            match decoder.event(event) {
                Ok(events) => produced.extend(events),
                Err(failure) => {
                    outcome = Err(failure);
                    break;
                }
            }
            if decoder.finished() {
                self.done = true;
                break;
            }
        }
        if self.done {
            self.body = None;
        }
        if outcome.is_ok() && self.sse.buffered() > MAX_EVENT_BYTES {
            outcome = Err(Failure::fatal(format!(
                "the provider sent an event larger than {MAX_EVENT_BYTES} bytes"
            )));
        }
        let had_events = !produced.is_empty();
        self.push(produced);
        match outcome {
            // Events decoded before the failure are delivered first.
            Err(failure) if had_events => {
                self.error = Some(self.final_error(failure));
                self.done = true;
                self.body = None;
                Ok(())
            }
            other => other,
        }
    }

    async fn connect(&mut self) -> Result<(), Failure> {
        let idle = self.call.idle_timeout;
        let client = self.call.client.get()?;
        let request = client
            .post(&self.call.url)
            .headers(self.call.headers.clone())
            .body(self.call.body.clone());
        let response = match tokio::time::timeout(idle, request.send()).await {
            Err(_) => {
                return Err(Failure::retryable(format!(
                    "no response from {} within {} ms",
                    self.call.url,
                    idle.as_millis()
                )));
            }
            Ok(Err(e)) => {
                let retryable = !e.is_builder();
                return Err(Failure {
                    message: format!("request to {} failed: {}", self.call.url, error_chain(&e)),
                    retryable,
                    retry_after: None,
                    server_error: false,
                });
            }
            Ok(Ok(r)) => r,
        };
        let status = response.status();
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_ascii_lowercase();
        if !status.is_success() {
            let retry_after = retry_after(response.headers(), std::time::SystemTime::now());
            let body = read_capped(response, idle).await;
            let detail = self.detail(&body);
            return Err(Failure {
                message: format!("{} answered HTTP {status}: {detail}", self.call.url),
                retryable: retryable_status(status) || retry_after.is_some(),
                server_error: status.is_server_error() && !outage_status(status),
                retry_after,
            });
        }
        if content_type.starts_with("application/json") {
            let body = read_capped(response, idle).await;
            let detail = self.detail(&body);
            return Err(Failure::fatal(format!(
                "{} answered with JSON instead of an event stream: {detail}",
                self.call.url
            )));
        }
        self.body = Some(
            response
                .bytes_stream()
                .map(|chunk| chunk.map(Vec::from))
                .boxed(),
        );
        self.sse = SseDecoder::new();
        self.decoder = Some((self.call.new_decoder)());
        Ok(())
    }

    /// The provider's message from an error body, or the body itself, shortened.
    fn detail(&self, body: &[u8]) -> String {
        let text = (self.call.error_message)(body)
            .unwrap_or_else(|| String::from_utf8_lossy(body).trim().to_string());
        let text = if text.is_empty() {
            "(no message)".to_string()
        } else {
            text
        };
        shorten(&text, MESSAGE_LIMIT)
    }

    fn final_error(&self, failure: Failure) -> ModelError {
        let secrets: Vec<&str> = self.call.secrets.iter().map(String::as_str).collect();
        ModelError::new(redact(&failure.message, &secrets), failure.retryable)
    }

    /// Waits and arranges a new attempt, or turns the failure into the
    /// stream's error.
    async fn recover(&mut self, failure: Failure) -> Result<(), ModelError> {
        if self.committed || !failure.retryable {
            return Err(self.final_error(failure));
        }
        let policy = self.call.retry;
        if failure.server_error {
            if self.server_errors >= policy.server_errors {
                let attempts = self.attempt + 1;
                let mut error = self.final_error(failure);
                error.message = format!(
                    "{} (the same kind of answer after {attempts} attempt(s); a server error is retried at most {} time(s): model.retry_server_errors)",
                    error.message, policy.server_errors
                );
                return Err(error);
            }
            self.server_errors += 1;
        }
        let delay =
            backoff(self.attempt, &policy, jitter()).max(failure.retry_after.unwrap_or_default());
        let elapsed = self.started.elapsed();
        if elapsed + delay > policy.budget {
            let attempts = self.attempt + 1;
            let mut error = self.final_error(failure);
            error.message = format!(
                "{} (gave up after {attempts} attempt(s) in {:.1} s; retry budget {} ms)",
                error.message,
                elapsed.as_secs_f64(),
                policy.budget.as_millis()
            );
            error.retryable = true;
            return Err(error);
        }
        let secrets: Vec<&str> = self.call.secrets.iter().map(String::as_str).collect();
        tracing::warn!(
            url = %self.call.url,
            attempt = self.attempt + 1,
            delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
            error = %redact(&failure.message, &secrets),
            "model call failed before any answer; retrying"
        );
        self.body = None;
        self.decoder = None;
        self.sse = SseDecoder::new();
        tokio::time::sleep(delay).await;
        self.attempt += 1;
        Ok(())
    }
}

/// Worth retrying: a timeout, a rate limit, or a server error. Any other
/// 4xx is the request's fault and would fail again.
fn retryable_status(status: StatusCode) -> bool {
    matches!(status.as_u16(), 408 | 429) || status.is_server_error()
}

/// A server error that says the server is busy or away (a gateway, an
/// overload), not that it could not handle this request: retried within
/// the whole retry budget, unlike a 500.
fn outage_status(status: StatusCode) -> bool {
    matches!(status.as_u16(), 502 | 503 | 504 | 529)
}

/// The wait a provider asks for: `retry-after-ms`, else `retry-after` in
/// seconds or as an HTTP date.
fn retry_after(headers: &HeaderMap, now: std::time::SystemTime) -> Option<Duration> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    if let Some(ms) = header("retry-after-ms").and_then(|v| v.parse::<f64>().ok())
        && ms.is_finite()
        && ms >= 0.0
    {
        return Some(Duration::from_secs_f64((ms / 1000.0).min(86_400.0)));
    }
    let value = header("retry-after")?;
    if let Ok(secs) = value.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0)
            .then(|| Duration::from_secs_f64(secs.min(86_400.0)));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or_default())
}

/// Exponential backoff with equal jitter: half the step is fixed, half random.
fn backoff(attempt: u32, policy: &RetryPolicy, jitter: f64) -> Duration {
    let step = policy
        .initial_backoff
        .saturating_mul(1u32 << attempt.min(20))
        .min(policy.max_backoff);
    step.mul_f64(0.5 + 0.5 * jitter.clamp(0.0, 1.0))
}

/// A number in [0, 1), different on every call.
fn jitter() -> f64 {
    use std::hash::{BuildHasher as _, Hasher as _};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64
}

async fn read_capped(response: reqwest::Response, idle: Duration) -> Vec<u8> {
    let mut body = Vec::new();
    let mut stream = response.bytes_stream();
    while body.len() < ERROR_BODY_LIMIT {
        match tokio::time::timeout(idle, stream.next()).await {
            Ok(Some(Ok(chunk))) => body.extend_from_slice(&chunk),
            _ => break,
        }
    }
    body.truncate(ERROR_BODY_LIMIT);
    body
}

/// An error and its sources, as one line.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}

pub(super) fn shorten(text: &str, limit: usize) -> String {
    if text.chars().count() <= limit {
        return text.to_string();
    }
    let mut out: String = text.chars().take(limit).collect();
    out.push('…');
    out
}

/// The `error.message` (or `error` string, or `message`) of a JSON error body.
pub(super) fn json_error_message(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let error = v.get("error");
    let message = error
        .and_then(|e| e.get("message"))
        .and_then(|m| m.as_str())
        .or_else(|| error.and_then(|e| e.as_str()))
        .or_else(|| v.get("message").and_then(|m| m.as_str()))?;
    let kind = error
        .and_then(|e| e.get("type"))
        .and_then(|t| t.as_str())
        .filter(|t| !t.is_empty());
    Some(match kind {
        Some(kind) => format!("{kind}: {message}"),
        None => message.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::config::{ModelConfig, Provider};

    fn endpoint(env: Option<&str>, file: Option<std::path::PathBuf>) -> ResolvedEndpoint {
        let mut e = ModelConfig::default().claude("claude-x");
        e.provider = Provider::Anthropic;
        e.api_key_env = env.map(str::to_string);
        e.api_key_file = file;
        e
    }

    #[test]
    fn key_comes_from_the_named_variable_or_the_file() {
        let vars = |v: &str| match v {
            "GOOD" => Ok("  sk-ant-123  \n".to_string()),
            "EMPTY" => Ok(String::new()),
            _ => Err(std::env::VarError::NotPresent),
        };
        let key = api_key_from(&endpoint(Some("GOOD"), None), vars).unwrap();
        assert_eq!(key.unwrap().expose(), "sk-ant-123");
        let e = api_key_from(&endpoint(Some("MISSING"), None), vars).unwrap_err();
        assert!(e.to_string().contains("MISSING"), "{e}");
        assert!(matches!(
            api_key_from(&endpoint(Some("EMPTY"), None), vars),
            Err(KeyError::Empty { .. })
        ));
        assert_eq!(api_key_from(&endpoint(None, None), vars).unwrap(), None);

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        std::fs::write(&path, "from-file\n").unwrap();
        let key = api_key_from(&endpoint(Some("GOOD"), Some(path)), vars).unwrap();
        assert_eq!(key.unwrap().expose(), "from-file");
        assert!(matches!(
            api_key_from(&endpoint(None, Some(dir.path().join("nope"))), vars),
            Err(KeyError::File { .. })
        ));
        assert_eq!(
            format!("{:?}", ApiKey("secret".into())),
            "ApiKey(<redacted>)"
        );
    }

    #[test]
    fn redaction_hides_keys_and_key_lookalikes() {
        assert_eq!(
            redact("bad key my-secret-value here", &["my-secret-value"]),
            "bad key [redacted] here"
        );
        assert_eq!(
            redact(
                "Incorrect API key provided: sk-proj-abcdefghijklmnopqrstuvwx. See",
                &[]
            ),
            "Incorrect API key provided: [redacted]. See"
        );
        assert_eq!(
            redact("key sk_live_0123456789abcdef0123 ok", &[]),
            "key [redacted] ok"
        );
        // Words that merely contain "sk" stay.
        assert_eq!(redact("task skipped: ask-me", &[]), "task skipped: ask-me");
        assert_eq!(redact("sk-short", &[]), "sk-short");
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_with_jitter() {
        let p = RetryPolicy {
            budget: Duration::from_secs(60),
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(4),
            server_errors: 2,
        };
        assert_eq!(backoff(0, &p, 0.0), Duration::from_millis(250));
        assert_eq!(backoff(0, &p, 1.0), Duration::from_millis(500));
        assert_eq!(backoff(2, &p, 1.0), Duration::from_secs(2));
        assert_eq!(backoff(10, &p, 1.0), Duration::from_secs(4));
        assert_eq!(backoff(u32::MAX, &p, 0.5), Duration::from_secs(3));
        let j = jitter();
        assert!((0.0..1.0).contains(&j));
    }

    #[test]
    fn retry_after_in_ms_seconds_or_http_date() {
        let now = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        let headers = |pairs: &[(&'static str, &str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.insert(*k, v.parse().unwrap());
            }
            h
        };
        assert_eq!(
            retry_after(&headers(&[("retry-after", "7")]), now),
            Some(Duration::from_secs(7))
        );
        assert_eq!(
            retry_after(
                &headers(&[("retry-after", "7"), ("retry-after-ms", "1500")]),
                now
            ),
            Some(Duration::from_millis(1500))
        );
        let date = httpdate::fmt_http_date(now + Duration::from_secs(30));
        assert_eq!(
            retry_after(&headers(&[("retry-after", &date)]), now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(retry_after(&headers(&[("retry-after", "soon")]), now), None);
        assert_eq!(retry_after(&HeaderMap::new(), now), None);
    }

    #[test]
    fn the_client_builds_with_the_ring_provider() {
        // reqwest panics while building a rustls client without a provider.
        let client = SharedClient::build(Duration::from_secs(1));
        assert!(client.get().is_ok(), "{client:?}");
        assert!(rustls::crypto::CryptoProvider::get_default().is_some());
    }

    #[test]
    fn retryable_statuses() {
        for s in [408, 429, 500, 502, 503, 504, 529] {
            assert!(retryable_status(StatusCode::from_u16(s).unwrap()), "{s}");
        }
        for s in [400, 401, 403, 404, 409, 413, 422, 425] {
            assert!(!retryable_status(StatusCode::from_u16(s).unwrap()), "{s}");
        }
    }

    #[test]
    fn error_messages_of_both_providers_and_ollama() {
        assert_eq!(
            json_error_message(
                br#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#
            )
            .as_deref(),
            Some("authentication_error: invalid x-api-key")
        );
        assert_eq!(
            json_error_message(
                br#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#
            )
            .as_deref(),
            Some("requests: Rate limit reached")
        );
        assert_eq!(
            json_error_message(br#"{"error":"model 'x' not found"}"#).as_deref(),
            Some("model 'x' not found")
        );
        assert_eq!(json_error_message(b"<html>502</html>"), None);
    }
}
