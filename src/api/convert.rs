//! proto <-> session types. The only place that knows both.

use serde_json::{Map, Value};

use crate::config::types::ToolCategory;
use crate::proto;
pub use crate::proto::json::{json_to_struct, struct_to_json};
use crate::session::{
    ClientEvent, ContextBlock, HistoryMessage, HistoryPart, ServerEvent, StartRequest, ToolOutcome,
    ToolSpec, UserTurn,
};

/// Why a request could not be converted; becomes `SessionError{invalid_argument}`.
pub type ConvertError = String;

fn tool_spec(t: &proto::ToolSchema, path: &str) -> Result<ToolSpec, ConvertError> {
    let category = match proto::ToolCategoryHint::try_from(t.category) {
        Ok(proto::ToolCategoryHint::ToolCategoryPure) => ToolCategory::Pure,
        Ok(
            proto::ToolCategoryHint::ToolCategoryPhysical
            | proto::ToolCategoryHint::ToolCategoryUnspecified,
        ) => ToolCategory::Physical,
        Err(_) => {
            return Err(format!(
                "{path}.category: unknown ToolCategoryHint {}",
                t.category
            ));
        }
    };
    if t.name.trim().is_empty() {
        return Err(format!("{path}.name: tool name must not be empty"));
    }
    let parameters_schema = match &t.parameters_schema {
        Some(s) => struct_to_json(s, &format!("{path}.parameters_schema"))?,
        None => Value::Object(Map::new()),
    };
    Ok(ToolSpec {
        name: t.name.clone(),
        description: t.description.clone(),
        parameters_schema,
        timeout_ms: t.timeout_ms,
        category,
    })
}

fn tool_specs(tools: &[proto::ToolSchema], path: &str) -> Result<Vec<ToolSpec>, ConvertError> {
    tools
        .iter()
        .enumerate()
        .map(|(i, t)| tool_spec(t, &format!("{path}[{i}]")))
        .collect()
}

fn history_part(p: &proto::ContentPart, path: &str) -> Result<HistoryPart, ConvertError> {
    use proto::content_part::Part;
    Ok(match &p.part {
        None => HistoryPart::Empty,
        Some(Part::Text(t)) => HistoryPart::Text(t.text.clone()),
        Some(Part::ToolUse(u)) => HistoryPart::ToolUse {
            id: u.id.clone(),
            name: u.name.clone(),
            input: match &u.input {
                Some(s) => struct_to_json(s, &format!("{path}.tool_use.input"))?,
                None => Value::Object(Map::new()),
            },
        },
        Some(Part::ToolResult(r)) => HistoryPart::ToolResult {
            tool_use_id: r.tool_use_id.clone(),
            name: r.name.clone(),
            content: r.content.clone(),
            is_error: r.is_error,
        },
        Some(Part::Thinking(t)) => HistoryPart::Thinking {
            thinking: t.thinking.clone(),
            signature: t.signature.clone(),
        },
        Some(Part::Image(i)) => HistoryPart::Image {
            media_type: i.media_type.clone(),
            data: i.data.clone(),
        },
    })
}

/// Converts one client message. `Err` for malformed input (empty oneof, bad Struct).
pub fn client_event(req: proto::SessionRequest) -> Result<ClientEvent, ConvertError> {
    use proto::session_request::Request;
    let Some(request) = req.request else {
        return Err("SessionRequest has no request set".to_string());
    };
    Ok(match request {
        Request::Start(s) => ClientEvent::Start(StartRequest {
            tools: tool_specs(&s.tools, "start.tools")?,
            history: s
                .history
                .iter()
                .enumerate()
                .map(|(i, m)| {
                    Ok(HistoryMessage {
                        role: m.role.clone(),
                        parts: m
                            .parts
                            .iter()
                            .enumerate()
                            .map(|(j, p)| {
                                history_part(p, &format!("start.history[{i}].parts[{j}]"))
                            })
                            .collect::<Result<_, ConvertError>>()?,
                    })
                })
                .collect::<Result<_, ConvertError>>()?,
            environment_id: s.environment_id,
            host_id: s.host_id,
            model: s.model,
            project_context: s.project_context,
            max_context_tokens: s.max_context_tokens,
        }),
        Request::UserMessage(m) => ClientEvent::UserMessage(UserTurn {
            tools: tool_specs(&m.tools, "user_message.tools")?,
            context: m
                .context
                .into_iter()
                .enumerate()
                .map(|(i, b)| match b.block {
                    Some(proto::content_block::Block::Text(text)) => Ok(ContextBlock::Text {
                        text,
                        label: b.label,
                    }),
                    Some(proto::content_block::Block::Binary(bin)) => Ok(ContextBlock::Binary {
                        mime_type: bin.mime_type,
                        data: bin.data,
                        label: b.label,
                    }),
                    None => Err(format!(
                        "user_message.context[{i}]: ContentBlock has no block set"
                    )),
                })
                .collect::<Result<_, _>>()?,
            content: m.content,
            ai_mode: m.ai_mode,
            message_id: m.message_id,
            system_context: m.system_context,
        }),
        Request::ToolResult(r) => ClientEvent::ToolResult(ToolOutcome {
            tool_call_id: r.tool_call_id,
            success: r.success,
            result: r.result,
            exit_code: r.exit_code,
            truncated: r.truncated,
            duration_ms: r.duration_ms,
        }),
        Request::CancelTurn(c) => ClientEvent::CancelTurn { reason: c.reason },
        Request::CancelSession(c) => ClientEvent::CancelSession { reason: c.reason },
        Request::Ping(_) => ClientEvent::Ping,
        Request::Feedback(f) => ClientEvent::Feedback {
            session_id: f.session_id,
            message_id: f.message_id,
            rating: f.rating,
        },
        Request::PermissionDecision(d) => ClientEvent::PermissionDecision {
            tool_call_id: d.tool_call_id,
            approved: d.approved,
        },
        Request::RegisterTools(r) => ClientEvent::RegisterTools {
            tools: tool_specs(&r.tools, "register_tools.tools")?,
            source: r.source,
            system_context: r.system_context,
        },
    })
}

pub fn server_response(event: ServerEvent) -> proto::SessionResponse {
    use proto::session_response::Response;
    let response = match event {
        ServerEvent::Started {
            session_id,
            model,
            permissions,
        } => Response::SessionStarted(proto::SessionStarted {
            session_id,
            model,
            permissions: permissions
                .into_iter()
                .map(|p| proto::PermissionRule {
                    tool_pattern: p.tool_pattern,
                    policy: p.policy,
                    category: p.category,
                    reason: p.reason,
                })
                .collect(),
        }),
        ServerEvent::TextDelta {
            message_id,
            content,
        } => Response::TextDelta(proto::TextDelta {
            message_id,
            content,
        }),
        ServerEvent::ThinkingDelta {
            message_id,
            content,
        } => Response::ThinkingDelta(proto::ThinkingDelta {
            message_id,
            content,
        }),
        ServerEvent::ToolRequest {
            tool_call_id,
            tool_name,
            parameters,
            timeout_ms,
        } => Response::ToolRequest(proto::ToolRequest {
            tool_call_id,
            tool_name,
            parameters: Some(json_to_struct(&parameters)),
            timeout_ms,
        }),
        ServerEvent::TurnComplete {
            message_id,
            usage,
            stop_reason,
        } => Response::TurnComplete(proto::TurnComplete {
            message_id,
            usage: Some(proto::TokenUsage {
                input_tokens: usage.input_tokens,
                output_tokens: usage.output_tokens,
                cache_read_tokens: usage.cache_read_tokens,
                cache_creation_tokens: usage.cache_creation_tokens,
                estimated: usage.estimated,
            }),
            stop_reason: stop_reason.as_str().to_string(),
        }),
        ServerEvent::Error(e) => Response::Error(proto::SessionError {
            code: e.code.as_str().to_string(),
            message: e.message,
            retryable: e.retryable,
        }),
        ServerEvent::Keepalive {
            tokens_used,
            tokens_max,
        } => Response::Keepalive(proto::Keepalive {
            tokens_used,
            tokens_max,
        }),
        ServerEvent::Pong => Response::Pong(proto::Pong {}),
        ServerEvent::ContextCompacted {
            level,
            messages_before,
            messages_after,
            tokens_before,
            tokens_after,
            summary,
        } => Response::ContextCompacted(proto::ContextCompacted {
            level,
            messages_before,
            messages_after,
            tokens_before,
            tokens_after,
            summary,
        }),
        ServerEvent::Presence { level, reason } => Response::PresenceHint(proto::PresenceHint {
            level: level.as_str().to_string(),
            reason,
        }),
        ServerEvent::Activity { state, detail } => {
            Response::ActivityUpdate(proto::ActivityUpdate {
                state: state.as_str().to_string(),
                detail,
                progress: None,
            })
        }
    };
    proto::SessionResponse {
        response: Some(response),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_request_is_malformed() {
        assert!(client_event(proto::SessionRequest { request: None }).is_err());
    }

    #[test]
    fn unspecified_category_is_physical() {
        let t = proto::ToolSchema {
            name: "t".into(),
            ..Default::default()
        };
        assert_eq!(tool_spec(&t, "t").unwrap().category, ToolCategory::Physical);
    }
}
