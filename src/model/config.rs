//! The `[model]` section: the default model, shared timeouts and retry
//! budget, and named `[[model.endpoints]]` of the network providers.
//!
//! `config.rs` embeds [`ModelConfig`] and calls [`ModelConfig::validate`],
//! which reports problems as a dotted key plus a message so that the caller
//! can name the file and line.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::config::types::Invalid;

/// The name of the offline command model.
pub(crate) const LOCAL: &str = "local";
/// Anthropic's API, when an endpoint gives no `base_url`.
pub(crate) const ANTHROPIC_BASE_URL: &str = "https://api.anthropic.com";
/// The environment variable an Anthropic endpoint reads its key from by default.
pub(crate) const ANTHROPIC_KEY_ENV: &str = "ANTHROPIC_API_KEY";
/// OpenAI's API, when an `openai` endpoint gives no `base_url`.
pub(crate) const OPENAI_BASE_URL: &str = "https://api.openai.com/v1";
/// Names starting with this go to Anthropic when no endpoint has that name.
pub(crate) const CLAUDE_PREFIX: &str = "claude-";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Provider {
    /// Anthropic Messages API.
    Anthropic,
    /// OpenAI-compatible Chat Completions (OpenAI, Ollama, llama.cpp, vLLM, LM Studio).
    Openai,
}

impl Provider {
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::Anthropic => "anthropic",
            Provider::Openai => "openai",
        }
    }
}

/// Which request field carries the output limit on an OpenAI-compatible server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum MaxTokensField {
    /// `max_tokens`: understood by every local server.
    #[default]
    MaxTokens,
    /// `max_completion_tokens`: required by OpenAI's reasoning models.
    MaxCompletionTokens,
}

impl MaxTokensField {
    pub fn as_str(self) -> &'static str {
        match self {
            MaxTokensField::MaxTokens => "max_tokens",
            MaxTokensField::MaxCompletionTokens => "max_completion_tokens",
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// Model of a session whose `StartSession.model` is absent: `local`, an
    /// endpoint name, an endpoint's model id, or a `claude-*` model id.
    pub default: String,
    /// Most tokens one model call may produce (stop reason `max_tokens`).
    pub max_output_tokens: u32,
    /// Time to establish a connection to a provider.
    pub connect_timeout_ms: u64,
    /// Longest silence allowed while waiting for response headers or between
    /// two pieces of a streamed answer.
    pub idle_timeout_ms: u64,
    /// Total time one model call may spend retrying failures that happened
    /// before any answer arrived (connection errors, 429, 5xx, overload).
    pub retry_budget_ms: u64,
    /// First retry delay; it doubles per attempt, with jitter.
    pub retry_initial_backoff_ms: u64,
    /// Upper bound of one retry delay (a longer `retry-after` is still honoured).
    pub retry_max_backoff_ms: u64,
    /// How often an HTTP 500 (a server error that is not an outage: not
    /// 502/503/504/529) is retried within the budget; a server that
    /// refuses a request with 500 usually refuses it again.
    pub retry_server_errors: u32,
    pub endpoints: Vec<EndpointConfig>,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            default: LOCAL.to_string(),
            max_output_tokens: 4096,
            connect_timeout_ms: 10_000,
            idle_timeout_ms: 120_000,
            retry_budget_ms: 60_000,
            retry_initial_backoff_ms: 500,
            retry_max_backoff_ms: 16_000,
            retry_server_errors: 2,
            endpoints: Vec::new(),
        }
    }
}

/// One `[[model.endpoints]]` entry: a named model on a provider.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointConfig {
    /// What `StartSession.model` and `model.default` call it.
    pub name: String,
    pub provider: Provider,
    /// The provider's model id, e.g. `claude-sonnet-4-5` or `qwen3:8b`.
    pub model: String,
    /// Default: `https://api.anthropic.com` (anthropic) or
    /// `https://api.openai.com/v1` (openai).
    #[serde(default)]
    pub base_url: Option<String>,
    /// Environment variable holding the API key. Default: `ANTHROPIC_API_KEY`
    /// for anthropic, none (no key sent) for openai.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// File holding the API key (e.g. a systemd credential); wins over
    /// `api_key_env`.
    #[serde(default)]
    pub api_key_file: Option<PathBuf>,
    /// Extended thinking budget (anthropic only); 0 disables thinking.
    #[serde(default)]
    pub thinking_budget_tokens: u32,
    /// Overrides `model.max_output_tokens` for this endpoint.
    #[serde(default)]
    pub max_output_tokens: Option<u32>,
    /// The model's usable context (input) window; caps a session's budget.
    #[serde(default)]
    pub max_context_tokens: Option<u32>,
    /// Overrides `model.connect_timeout_ms`.
    #[serde(default)]
    pub connect_timeout_ms: Option<u64>,
    /// Overrides `model.idle_timeout_ms`.
    #[serde(default)]
    pub idle_timeout_ms: Option<u64>,
    /// Overrides `model.retry_budget_ms`.
    #[serde(default)]
    pub retry_budget_ms: Option<u64>,
    /// Anthropic prompt caching (`cache_control` on system prompt, tools and
    /// the newest message).
    #[serde(default = "default_true")]
    pub prompt_cache: bool,
    /// openai only: the request field of the output limit.
    #[serde(default)]
    pub max_tokens_field: MaxTokensField,
}

/// An endpoint with every default applied: what a provider runs with.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedEndpoint {
    pub name: String,
    pub provider: Provider,
    pub model: String,
    /// Without a trailing `/`.
    pub base_url: String,
    pub api_key_env: Option<String>,
    pub api_key_file: Option<PathBuf>,
    pub thinking_budget_tokens: u32,
    pub max_output_tokens: u32,
    pub max_context_tokens: Option<u32>,
    pub connect_timeout: Duration,
    pub idle_timeout: Duration,
    pub retry: RetryPolicy,
    pub prompt_cache: bool,
    pub max_tokens_field: MaxTokensField,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    pub budget: Duration,
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    /// Retries of a server error (HTTP 500) at most.
    pub server_errors: u32,
}

impl ModelConfig {
    pub fn endpoint(&self, name: &str) -> Option<&EndpointConfig> {
        self.endpoints.iter().find(|e| e.name == name)
    }

    /// The endpoint with all defaults applied.
    pub fn resolve(&self, e: &EndpointConfig) -> ResolvedEndpoint {
        let base_url = e.base_url.clone().unwrap_or_else(|| {
            match e.provider {
                Provider::Anthropic => ANTHROPIC_BASE_URL,
                Provider::Openai => OPENAI_BASE_URL,
            }
            .to_string()
        });
        let api_key_env = e.api_key_env.clone().or_else(|| {
            (e.provider == Provider::Anthropic && e.api_key_file.is_none())
                .then(|| ANTHROPIC_KEY_ENV.to_string())
        });
        ResolvedEndpoint {
            name: e.name.clone(),
            provider: e.provider,
            model: e.model.clone(),
            base_url: base_url.trim_end_matches('/').to_string(),
            api_key_env,
            api_key_file: e.api_key_file.clone(),
            thinking_budget_tokens: e.thinking_budget_tokens,
            max_output_tokens: e.max_output_tokens.unwrap_or(self.max_output_tokens),
            max_context_tokens: e.max_context_tokens,
            connect_timeout: Duration::from_millis(
                e.connect_timeout_ms.unwrap_or(self.connect_timeout_ms),
            ),
            idle_timeout: Duration::from_millis(e.idle_timeout_ms.unwrap_or(self.idle_timeout_ms)),
            retry: RetryPolicy {
                budget: Duration::from_millis(e.retry_budget_ms.unwrap_or(self.retry_budget_ms)),
                initial_backoff: Duration::from_millis(self.retry_initial_backoff_ms),
                max_backoff: Duration::from_millis(self.retry_max_backoff_ms),
                server_errors: self.retry_server_errors,
            },
            prompt_cache: e.prompt_cache,
            max_tokens_field: e.max_tokens_field,
        }
    }

    /// The settings of an Anthropic model asked for by a `claude-*` name that
    /// no endpoint defines: those of the first anthropic endpoint (with the
    /// requested model id), else Anthropic's defaults.
    pub fn claude(&self, model: &str) -> ResolvedEndpoint {
        let template = self
            .endpoints
            .iter()
            .find(|e| e.provider == Provider::Anthropic)
            .cloned()
            .unwrap_or_else(|| EndpointConfig {
                name: model.to_string(),
                provider: Provider::Anthropic,
                model: model.to_string(),
                base_url: None,
                api_key_env: None,
                api_key_file: None,
                thinking_budget_tokens: 0,
                max_output_tokens: None,
                max_context_tokens: None,
                connect_timeout_ms: None,
                idle_timeout_ms: None,
                retry_budget_ms: None,
                prompt_cache: true,
                max_tokens_field: MaxTokensField::default(),
            });
        let mut resolved = self.resolve(&template);
        resolved.name = model.to_string();
        resolved.model = model.to_string();
        resolved
    }

    /// Every name a session may ask for, for error messages.
    pub fn known_names(&self) -> Vec<String> {
        let mut names = vec![LOCAL.to_string()];
        names.extend(self.endpoints.iter().map(|e| e.name.clone()));
        names.push(format!("any {CLAUDE_PREFIX}* model id"));
        names
    }

    /// Whether `name` selects a model (see `model.default`).
    pub fn knows(&self, name: &str) -> bool {
        name == LOCAL
            || self
                .endpoints
                .iter()
                .any(|e| e.name == name || e.model == name)
            || is_claude(name)
    }

    /// Checks everything a running daemon relies on. The error is the dotted
    /// key at fault (e.g. `model.endpoints[1].base_url`) and a message.
    pub fn validate(&self) -> Result<(), Invalid> {
        let err = |key: &str, message: String| Err(Invalid::new(key, message));
        if self.max_output_tokens == 0 {
            return err("model.max_output_tokens", "must be at least 1".into());
        }
        for (key, value) in [
            ("connect_timeout_ms", self.connect_timeout_ms),
            ("idle_timeout_ms", self.idle_timeout_ms),
        ] {
            if value == 0 {
                return err(&format!("model.{key}"), "must be at least 1".into());
            }
        }
        if self.retry_initial_backoff_ms == 0 {
            return err(
                "model.retry_initial_backoff_ms",
                "must be at least 1".into(),
            );
        }
        if self.retry_max_backoff_ms < self.retry_initial_backoff_ms {
            return err(
                "model.retry_max_backoff_ms",
                format!(
                    "{} is less than retry_initial_backoff_ms ({})",
                    self.retry_max_backoff_ms, self.retry_initial_backoff_ms
                ),
            );
        }
        let mut seen = std::collections::HashSet::new();
        for (i, e) in self.endpoints.iter().enumerate() {
            let key = |k: &str| format!("model.endpoints[{i}].{k}");
            if !valid_name(&e.name) {
                return err(
                    &key("name"),
                    format!(
                        "{:?} is not a valid endpoint name (1-128 characters of letters, digits, '-', '_', '.', ':', '/')",
                        e.name
                    ),
                );
            }
            if e.name == LOCAL {
                return err(
                    &key("name"),
                    "\"local\" is the offline command model; choose another name".into(),
                );
            }
            if !seen.insert(e.name.as_str()) {
                return err(
                    &key("name"),
                    format!("duplicate endpoint name {:?}", e.name),
                );
            }
            if e.model.trim().is_empty() {
                return err(&key("model"), "must not be empty".into());
            }
            if let Some(url) = &e.base_url {
                match reqwest::Url::parse(url) {
                    Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {
                        if u.query().is_some() || u.fragment().is_some() {
                            return err(
                                &key("base_url"),
                                format!("{url:?} must not have a query or fragment"),
                            );
                        }
                    }
                    Ok(_) => {
                        return err(
                            &key("base_url"),
                            format!("{url:?} is not an http:// or https:// URL with a host"),
                        );
                    }
                    Err(why) => {
                        return err(&key("base_url"), format!("{url:?} is not a URL: {why}"));
                    }
                }
            }
            if let Some(var) = &e.api_key_env
                && (var.is_empty() || var.contains('=') || var.contains('\0'))
            {
                return err(
                    &key("api_key_env"),
                    format!("{var:?} is not an environment variable name"),
                );
            }
            if let Some(path) = &e.api_key_file
                && path.as_os_str().is_empty()
            {
                return err(&key("api_key_file"), "must not be empty".into());
            }
            let max_output = e.max_output_tokens.unwrap_or(self.max_output_tokens);
            if e.max_output_tokens == Some(0) {
                return err(&key("max_output_tokens"), "must be at least 1".into());
            }
            if e.thinking_budget_tokens > 0 {
                if e.provider != Provider::Anthropic {
                    return err(
                        &key("thinking_budget_tokens"),
                        "only the anthropic provider takes a thinking budget; \
                         openai-compatible servers report reasoning on their own"
                            .into(),
                    );
                }
                if e.thinking_budget_tokens < 1024 {
                    return err(
                        &key("thinking_budget_tokens"),
                        format!(
                            "{} is below Anthropic's minimum of 1024 (0 disables thinking)",
                            e.thinking_budget_tokens
                        ),
                    );
                }
                if e.thinking_budget_tokens >= max_output {
                    return err(
                        &key("thinking_budget_tokens"),
                        format!(
                            "{} must be less than the endpoint's max_output_tokens ({max_output}), \
                             which includes the thinking",
                            e.thinking_budget_tokens
                        ),
                    );
                }
            }
            if e.max_context_tokens.is_some_and(|n| n < 1024) {
                return err(&key("max_context_tokens"), "must be at least 1024".into());
            }
            for (k, v) in [
                ("connect_timeout_ms", e.connect_timeout_ms),
                ("idle_timeout_ms", e.idle_timeout_ms),
            ] {
                if v == Some(0) {
                    return err(&key(k), "must be at least 1".into());
                }
            }
            if e.provider == Provider::Anthropic && e.max_tokens_field != MaxTokensField::MaxTokens
            {
                return err(
                    &key("max_tokens_field"),
                    "only applies to the openai provider".into(),
                );
            }
        }
        if !self.knows(&self.default) {
            return err(
                "model.default",
                format!(
                    "unknown model {:?}; known models: {}",
                    self.default,
                    self.known_names().join(", ")
                ),
            );
        }
        Ok(())
    }
}

pub(crate) fn is_claude(name: &str) -> bool {
    name.len() > CLAUDE_PREFIX.len() && name.starts_with(CLAUDE_PREFIX)
}

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':' | '/'))
}

fn default_true() -> bool {
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> ModelConfig {
        toml::from_str(text).unwrap()
    }

    fn fails(text: &str) -> String {
        parse(text).validate().unwrap_err().key
    }

    #[test]
    fn defaults_are_local_and_valid() {
        let c = ModelConfig::default();
        assert_eq!(c.default, "local");
        assert!(c.validate().is_ok());
    }

    #[test]
    fn endpoint_defaults_per_provider() {
        let c = parse(
            "[[endpoints]]\nname = \"claude\"\nprovider = \"anthropic\"\nmodel = \"claude-x\"\n\
             [[endpoints]]\nname = \"box\"\nprovider = \"openai\"\nmodel = \"qwen3:8b\"\nbase_url = \"http://10.0.0.2:11434/v1/\"\n",
        );
        assert!(c.validate().is_ok());
        let a = c.resolve(&c.endpoints[0]);
        assert_eq!(a.base_url, ANTHROPIC_BASE_URL);
        assert_eq!(a.api_key_env.as_deref(), Some(ANTHROPIC_KEY_ENV));
        assert_eq!(a.max_output_tokens, 4096);
        let o = c.resolve(&c.endpoints[1]);
        assert_eq!(o.base_url, "http://10.0.0.2:11434/v1");
        assert_eq!(o.api_key_env, None);
    }

    #[test]
    fn claude_names_borrow_the_first_anthropic_endpoint() {
        let c = parse(
            "[[endpoints]]\nname = \"proxy\"\nprovider = \"anthropic\"\nmodel = \"claude-a\"\n\
             base_url = \"http://127.0.0.1:9/\"\napi_key_env = \"PROXY_KEY\"\n",
        );
        let r = c.claude("claude-b");
        assert_eq!(
            (r.name.as_str(), r.model.as_str(), r.base_url.as_str()),
            ("claude-b", "claude-b", "http://127.0.0.1:9")
        );
        assert_eq!(r.api_key_env.as_deref(), Some("PROXY_KEY"));
        let r = ModelConfig::default().claude("claude-c");
        assert_eq!(r.base_url, ANTHROPIC_BASE_URL);
    }

    #[test]
    fn default_must_name_a_known_model() {
        assert_eq!(fails("default = \"gpt-9\"\n"), "model.default");
        assert!(
            parse("default = \"claude-sonnet-4-5\"\n")
                .validate()
                .is_ok()
        );
        assert!(
            parse("default = \"box\"\n[[endpoints]]\nname = \"box\"\nprovider = \"openai\"\nmodel = \"m\"\n")
                .validate()
                .is_ok()
        );
    }

    #[test]
    fn endpoint_errors_name_the_key() {
        let ep = |extra: &str| {
            format!("[[endpoints]]\nname = \"e\"\nprovider = \"anthropic\"\nmodel = \"m\"\n{extra}")
        };
        assert_eq!(
            fails(&ep("base_url = \"ftp://x\"\n")),
            "model.endpoints[0].base_url"
        );
        assert_eq!(
            fails(&ep("base_url = \"not a url\"\n")),
            "model.endpoints[0].base_url"
        );
        assert_eq!(
            fails(&ep("thinking_budget_tokens = 100\n")),
            "model.endpoints[0].thinking_budget_tokens"
        );
        assert_eq!(
            fails(&ep("thinking_budget_tokens = 8000\n")),
            "model.endpoints[0].thinking_budget_tokens"
        );
        assert!(
            parse(&ep("thinking_budget_tokens = 2048\n"))
                .validate()
                .is_ok()
        );
        assert_eq!(
            fails(&ep("api_key_env = \"\"\n")),
            "model.endpoints[0].api_key_env"
        );
        assert_eq!(
            fails(&ep("idle_timeout_ms = 0\n")),
            "model.endpoints[0].idle_timeout_ms"
        );
        assert_eq!(
            fails(&format!("{}{}", ep(""), ep(""))),
            "model.endpoints[1].name"
        );
        assert_eq!(
            fails("[[endpoints]]\nname = \"local\"\nprovider = \"openai\"\nmodel = \"m\"\n"),
            "model.endpoints[0].name"
        );
        assert_eq!(
            fails(
                "[[endpoints]]\nname = \"o\"\nprovider = \"openai\"\nmodel = \"m\"\nthinking_budget_tokens = 2048\n"
            ),
            "model.endpoints[0].thinking_budget_tokens"
        );
    }
}
