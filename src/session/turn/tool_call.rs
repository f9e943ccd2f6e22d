//! A model's tool call: look-up, validation, the one gate every call passes
//! (permission, then approval when asked: [`crate::session::host_call::gate`],
//! with the turn asking its client), and a client tool's round trip under
//! its deadline. Host tools leave for [`super::host_call`] before the gate:
//! the shared host call path runs it for them.

use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;

use super::{Interrupt, Turn, TurnInput, TurnNote};
use crate::clock::now_ms;
use crate::config::types::ToolCategory;
use crate::model::Block;
use crate::session::approvals::ApprovalView;
use crate::session::host_call::{Gate, gate, own_approval_refused};
use crate::session::{Activity, ErrorCode, Presence, ServerEvent, SessionError, ToolOutcome};

impl Turn {
    /// Runs one tool call of the model: look-up, validation, permission,
    /// approval, then the client round trip under the tool's deadline.
    pub(super) async fn tool_call(
        &mut self,
        id: &str,
        name: &str,
        input: Value,
    ) -> Result<Block, Interrupt> {
        if self.cancel.is_cancelled() {
            return Err(Interrupt::Cancelled);
        }
        self.note(TurnNote::ToolCall {
            id: id.to_string(),
            name: name.to_string(),
            parameters: input.clone(),
        });
        if self.tools.get(name).is_none()
            && let Some(tool) = self.host.registry.get(name).cloned()
        {
            return self.host_tool_call(id, &tool, input).await;
        }
        let Some(tool) = self.tools.get(name) else {
            tracing::info!(tool = name, "model called a tool this turn does not have");
            return Ok(error_result(
                id,
                name,
                &format!(
                    "unknown tool `{name}`; available: {}",
                    self.tools.names().join(", ")
                ),
            ));
        };
        if let Err(why) = tool.validate(&input) {
            return Ok(error_result(
                id,
                name,
                &format!("invalid parameters for `{name}`: {why}"),
            ));
        }
        let (category, timeout_ms) = (tool.spec.category, tool.spec.timeout_ms);
        let physical = category == ToolCategory::Physical;
        let presence = presence_for(category);
        let permissions = self.permissions.clone();
        if let Gate::Refused { message, .. } =
            gate(self, &permissions, id, name, &input, category).await?
        {
            return Ok(error_result(id, name, &message));
        }
        let timeout_ms = if timeout_ms == 0 {
            self.limits.default_tool_timeout_ms
        } else {
            timeout_ms
        };
        let reason = if physical {
            "a PHYSICAL tool is running"
        } else {
            "a tool is running"
        };
        self.state(Activity::CallingTool, name, presence, reason)
            .await?;
        self.send(ServerEvent::ToolRequest {
            tool_call_id: id.to_string(),
            tool_name: name.to_string(),
            parameters: input,
            timeout_ms,
        })
        .await?;
        let deadline = Instant::now() + Duration::from_millis(u64::from(timeout_ms));
        loop {
            let input = tokio::select! {
                biased;
                () = self.cancel.cancelled() => return Err(Interrupt::Cancelled),
                input = self.inbox.recv() => input,
                () = tokio::time::sleep_until(deadline) => {
                    self.expired.push(id.to_string());
                    tracing::warn!(tool_call_id = id, tool = name, timeout_ms, "client tool timed out");
                    self.send(ServerEvent::Error(SessionError::new(
                        ErrorCode::ToolTimeout,
                        format!("tool call {id} ({name}) got no result within {timeout_ms} ms"),
                    )))
                    .await?;
                    return Ok(error_result(id, name, &format!("`{name}` timed out after {timeout_ms} ms without a result")));
                }
            };
            match input {
                Some(TurnInput::ToolResult(result)) if result.tool_call_id == id => {
                    self.completed.insert(id.to_string());
                    return Ok(describe_outcome(name, result));
                }
                Some(other) => self.ignore(other, id),
                None => return Err(Interrupt::Cancelled),
            }
        }
    }

    /// Asks the client for a decision and lists the call for an operator
    /// (`/v1/approvals`): the first answer wins; `false` on denial or
    /// timeout, with the credential that answered (`None` on timeout). An
    /// approval the rules do not let its credential give (its own call,
    /// with `approvals.require_other_credential`) is refused, told to the
    /// client, audited, and the call keeps waiting (an operator's such
    /// answer is refused before it gets here).
    pub(super) async fn approval(
        &mut self,
        id: &str,
        name: &str,
        input: &Value,
        category: ToolCategory,
    ) -> Result<(bool, Option<String>), Interrupt> {
        let reason = format!("`{name}` needs your approval");
        self.state(
            Activity::WaitingApproval,
            id,
            presence_for(category),
            &reason,
        )
        .await?;
        let timeout = self.limits.approval_timeout;
        let deadline = Instant::now() + timeout;
        let since = now_ms();
        // Withdrawn from the list when this returns, however it does.
        let mut listed = self.host.approvals.ask(ApprovalView {
            id: id.to_string(),
            tool_call_id: id.to_string(),
            kind: self.host.asker,
            tool: name.to_string(),
            category: category.as_str(),
            parameters: input.clone(),
            session_id: self.host.session_id.clone(),
            origin: self.host.label.clone(),
            credential: self.host.credential.clone(),
            since_unix_ms: since,
            expires_unix_ms: since
                .saturating_add(i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX)),
        });
        loop {
            let received = tokio::select! {
                biased;
                () = self.cancel.cancelled() => return Err(Interrupt::Cancelled),
                answered = listed.decided() => {
                    tracing::info!(
                        tool_call_id = id,
                        tool = name,
                        approved = answered.approve,
                        approved_by = answered.by.as_deref().unwrap_or(""),
                        "permission decision by an operator (/v1/approvals)"
                    );
                    return Ok((answered.approve, answered.by));
                }
                input = self.inbox.recv() => input,
                () = tokio::time::sleep_until(deadline) => {
                    tracing::info!(tool_call_id = id, tool = name, "approval timed out; treated as denied");
                    return Ok((false, None));
                }
            };
            match received {
                Some(TurnInput::Decision {
                    tool_call_id,
                    approved,
                    by,
                }) if tool_call_id == id => {
                    if let Err(own) = self.permissions.may_answer(
                        self.host.credential.as_deref(),
                        by.as_deref(),
                        approved,
                    ) {
                        self.own_approval_refused(id, name, input, by.as_deref(), &own.to_string())
                            .await?;
                        continue;
                    }
                    tracing::info!(
                        tool_call_id = id,
                        tool = name,
                        approved,
                        approved_by = by.as_deref().unwrap_or(""),
                        "permission decision"
                    );
                    return Ok((approved, by));
                }
                Some(other) => self.ignore(other, id),
                None => return Err(Interrupt::Cancelled),
            }
        }
    }

    /// Tells the client its approval of call `id` was refused (its own
    /// call, `approvals.require_other_credential`) and audits the attempt.
    async fn own_approval_refused(
        &mut self,
        id: &str,
        name: &str,
        input: &Value,
        by: Option<&str>,
        why: &str,
    ) -> Result<(), Interrupt> {
        tracing::warn!(
            tool_call_id = id,
            tool = name,
            credential = by.unwrap_or(""),
            "refused: a credential approving its own call"
        );
        let record = own_approval_refused(
            &self.host.session_id,
            id,
            name,
            input,
            "PermissionDecision",
            by,
            why,
        );
        if let Err(e) = self.host.store.audit(record).await {
            tracing::error!(error = %e, "cannot write the audit record of a refused approval");
        }
        self.send(ServerEvent::Error(SessionError::new(
            ErrorCode::PermissionDenied,
            format!("PermissionDecision for {id}: {why}"),
        )))
        .await
    }

    pub(super) fn ignore(&self, input: TurnInput, awaited: &str) {
        match input {
            TurnInput::ToolResult(r) if self.completed.contains(&r.tool_call_id) => {
                tracing::warn!(tool_call_id = %r.tool_call_id, "duplicate ToolResult ignored");
            }
            TurnInput::ToolResult(r) if self.expired.contains(&r.tool_call_id) => {
                tracing::warn!(tool_call_id = %r.tool_call_id, "late ToolResult for a timed-out call ignored");
            }
            TurnInput::ToolResult(r) => {
                tracing::warn!(tool_call_id = %r.tool_call_id, awaited, "ToolResult for an unknown tool_call_id ignored");
            }
            TurnInput::Decision { tool_call_id, .. } => {
                tracing::warn!(%tool_call_id, awaited, "PermissionDecision for a call not awaiting approval ignored");
            }
        }
    }
}

/// How present the user should be while a tool of `category` runs.
pub(super) fn presence_for(category: ToolCategory) -> Presence {
    match category {
        ToolCategory::Physical => Presence::Full,
        ToolCategory::Pure => Presence::Mini,
    }
}

pub(super) fn error_result(id: &str, name: &str, message: &str) -> Block {
    Block::ToolResult {
        tool_use_id: id.to_string(),
        name: name.to_string(),
        content: message.to_string(),
        is_error: true,
    }
}

/// Everything the client reported reaches the model: output, success, exit
/// code, truncation and duration.
fn describe_outcome(name: &str, outcome: ToolOutcome) -> Block {
    let mut notes = Vec::new();
    if let Some(code) = outcome.exit_code {
        notes.push(format!("exit code {code}"));
    }
    if outcome.truncated {
        notes.push("output truncated".to_string());
    }
    if let Some(ms) = outcome.duration_ms {
        notes.push(format!("took {ms} ms"));
    }
    let mut content = outcome.result;
    if !notes.is_empty() {
        content.push_str(&format!("\n[{}]", notes.join("; ")));
    }
    Block::ToolResult {
        tool_use_id: outcome.tool_call_id,
        name: name.to_string(),
        content,
        is_error: !outcome.success,
    }
}
