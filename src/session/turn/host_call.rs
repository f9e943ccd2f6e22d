//! Host tools inside a turn: they take the shared host call path
//! ([`crate::session::host_call`]) with the turn as its [`CallSite`]: the
//! client approves over the session stream, activity and presence go to
//! the client, and cancelling the turn abandons the call.

use serde_json::Value;

use super::tool_call::presence_for;
use super::{Interrupt, Turn};
use crate::config::types::ToolCategory;
use crate::model::Block;
use crate::session::host_call::{self, Answer, CallSite, GateDecision};
use crate::session::tools::Tool;
use crate::session::{Activity, ServerEvent};

impl Turn {
    /// A host tool: runs inside rozd under the daemon's own deadline, never
    /// as a `ToolRequest`. PHYSICAL calls are audited before the model sees
    /// the result; the client hears of refusals and failures as a session
    /// error beside it.
    pub(super) async fn host_tool_call(
        &mut self,
        id: &str,
        tool: &Tool,
        input: Value,
    ) -> Result<Block, Interrupt> {
        let host = self.host.clone();
        let permissions = self.permissions.clone();
        let outcome = host_call::run(self, &host, &permissions, id, tool, &input).await?;
        if let Some(error) = outcome.session_error(id) {
            if outcome.failure.is_some_and(|f| f.is_safety()) {
                self.safety_error(error).await?;
            } else {
                self.send(ServerEvent::Error(error)).await?;
            }
        }
        // Images follow their tool result (see `Block::Image`).
        let is_error = outcome.is_error();
        self.tool_images
            .extend(outcome.images.into_iter().map(|image| Block::Image {
                media_type: image.media_type,
                data: image.data.to_vec(),
            }));
        Ok(Block::ToolResult {
            tool_use_id: id.to_string(),
            name: tool.spec.name.clone(),
            is_error,
            content: outcome.content,
        })
    }
}

impl CallSite for Turn {
    type Interrupt = Interrupt;

    async fn approve(
        &mut self,
        id: &str,
        name: &str,
        input: &Value,
        category: ToolCategory,
    ) -> Result<Answer, Interrupt> {
        let (approved, by) = self.approval(id, name, input, category).await?;
        Ok(Answer {
            verdict: if approved {
                Ok(())
            } else {
                Err(format!("the user denied `{name}`"))
            },
            by,
        })
    }

    async fn running(&mut self, name: &str, category: ToolCategory) -> Result<(), Interrupt> {
        let reason = match category {
            ToolCategory::Physical => "a PHYSICAL host tool is running",
            ToolCategory::Pure => "reading the host",
        };
        self.state(Activity::CallingTool, name, presence_for(category), reason)
            .await
    }

    async fn abandoned(&self) -> Interrupt {
        self.cancel.cancelled().await;
        Interrupt::Cancelled
    }

    fn gated(&mut self, decision: GateDecision) {
        self.last_gate = Some(decision);
    }
}
