//! Host tools inside a turn: they run in rozd under the daemon's own
//! deadline, never as a `ToolRequest`, and every PHYSICAL call is audited
//! before the model or the client hears its result.

use serde_json::Value;

use super::tool_call::{Gate, error_result, presence_for};
use super::{Interrupt, Turn};
use crate::clock::now_ms;
use crate::config::types::ToolCategory;
use crate::model::Block;
use crate::session::tools::Tool;
use crate::session::{Activity, ErrorCode, ServerEvent, SessionError};
use crate::store::AuditRecord;
use crate::tools::ToolError;

impl Turn {
    /// A host tool: runs inside rozd under the daemon's own deadline, never
    /// as a `ToolRequest`. PHYSICAL calls are audited before the model sees
    /// the result.
    pub(super) async fn host_tool_call(
        &mut self,
        id: &str,
        tool: &Tool,
        input: Value,
    ) -> Result<Block, Interrupt> {
        let name = tool.spec.name.as_str();
        let physical = tool.spec.category == ToolCategory::Physical;
        let presence = presence_for(tool.spec.category);
        let started = now_ms();
        if let Err(why) = tool.validate(&input) {
            if !physical {
                return Ok(error_result(
                    id,
                    name,
                    &format!("invalid parameters for `{name}`: {why}"),
                ));
            }
            // The host never applies a value outside its limits: say so plainly.
            let message = format!("`{name}` refused: {why}");
            self.audit(id, name, &input, "refused", Err(&message), started)
                .await;
            self.safety_error(SessionError::new(
                ErrorCode::SafetyViolation,
                format!("tool call {id}: {message}"),
            ))
            .await?;
            return Ok(error_result(id, name, &message));
        }
        let stop = self.host.tools.protective_stop();
        if physical && stop.is_active() {
            let message = format!(
                "`{name}` refused: protective stop is active ({})",
                stop.describe()
            );
            self.audit(id, name, &input, "refused", Err(&message), started)
                .await;
            self.safety_error(SessionError::new(
                ErrorCode::EStop,
                format!("tool call {id}: {message}"),
            ))
            .await?;
            return Ok(error_result(id, name, &message));
        }
        let decision = match self.gate(id, name, tool.spec.category).await? {
            Gate::Pass { decision } => decision,
            Gate::Refused { decision, message } => {
                if physical {
                    self.audit(id, name, &input, decision, Err(&message), started)
                        .await;
                }
                return Ok(error_result(id, name, &message));
            }
        };
        let reason = if physical {
            "a PHYSICAL host tool is running"
        } else {
            "reading the host"
        };
        self.state(Activity::CallingTool, name, presence, reason)
            .await?;
        // A command that reached its driver finishes in its own task and is
        // then undone by the deadman (see `Actuators::command`).
        let result = tokio::select! {
            biased;
            () = self.cancel.cancelled() => {
                if physical {
                    self.audit(id, name, &input, decision, Err("cancelled while running"), started).await;
                }
                return Err(Interrupt::Cancelled);
            }
            result = self.host.tools.execute(name, &input, &self.host.session_id) => result,
        };
        let (text, is_error) = match &result {
            Ok(text) => (text.clone(), false),
            Err(e) => (format!("`{name}` failed: {e}"), true),
        };
        if physical {
            let audited = if is_error {
                Err(text.as_str())
            } else {
                Ok(text.as_str())
            };
            self.audit(id, name, &input, decision, audited, started)
                .await;
        }
        let code = match &result {
            Ok(_) => None,
            Err(ToolError::Timeout(_)) => Some(ErrorCode::ToolTimeout),
            Err(ToolError::EStop(_)) => Some(ErrorCode::EStop),
            Err(ToolError::SafetyViolation(_)) => Some(ErrorCode::SafetyViolation),
            Err(ToolError::Held(_)) => Some(ErrorCode::PermissionDenied),
            Err(ToolError::Invalid(_) | ToolError::Failed(_)) => None,
        };
        if let Some(code) = code {
            let error = SessionError::new(code, format!("tool call {id}: {text}"));
            if matches!(code, ErrorCode::EStop | ErrorCode::SafetyViolation) {
                self.safety_error(error).await?;
            } else {
                self.send(ServerEvent::Error(error)).await?;
            }
        }
        Ok(Block::ToolResult {
            tool_use_id: id.to_string(),
            name: name.to_string(),
            content: text,
            is_error,
        })
    }

    /// Writes one PHYSICAL call to the audit (awaited: the record exists
    /// before the model or the client hears the result).
    async fn audit(
        &self,
        id: &str,
        tool: &str,
        input: &Value,
        decision: &str,
        result: Result<&str, &str>,
        started: i64,
    ) {
        let ended = now_ms();
        let record = AuditRecord {
            at_ms: ended,
            kind: "tool_call".into(),
            session_id: Some(self.host.session_id.clone()),
            tool_call_id: Some(id.to_string()),
            tool: Some(tool.to_string()),
            parameters: Some(input.clone()),
            decision: Some(decision.to_string()),
            result: result.ok().map(str::to_string),
            error: result.err().map(str::to_string),
            origin: Some(self.host.label.clone()),
            credential: self.host.credential.clone(),
            started_at_ms: Some(started),
            ended_at_ms: Some(ended),
            duration_ms: Some(ended - started),
            ..Default::default()
        };
        if let Err(e) = self.host.store.audit(record).await {
            tracing::error!(error = %e, tool_call_id = id, "cannot write the audit record");
        }
    }
}
