//! What a turn reports to the metrics ([`crate::session::metrics`],
//! [`crate::model::metrics`]): model calls, tool calls and
//! approvals, with bounded labels (a client's tool is `client`, never its name).

use std::time::Duration;

use super::{Interrupt, ModelReply, Turn, TurnError};
use crate::config::types::ToolCategory;
use crate::model::Block;
use crate::model::metrics::{ModelResult, Tokens};
use crate::session::host_call::GateDecision;
use crate::store::Decision;

pub(super) fn model_result(reply: &Result<ModelReply, TurnError>) -> ModelResult {
    match reply {
        Ok(_) => ModelResult::Ok,
        Err(TurnError::Failed(_)) => ModelResult::Error,
        Err(TurnError::Interrupted(_)) => ModelResult::Cancelled,
    }
}

pub(super) fn model_tokens(reply: &Result<ModelReply, TurnError>) -> Tokens {
    match reply {
        Ok(r) => Tokens {
            input: u64::from(r.usage.input_tokens),
            output: u64::from(r.usage.output_tokens),
            cache_read: u64::from(r.usage.cache_read_tokens),
            cache_creation: u64::from(r.usage.cache_creation_tokens),
        },
        Err(_) => Tokens::default(),
    }
}

/// Which tool a call names, as a label: a host tool by name, a client's tool
/// as `client`, anything else `unknown`; and its category.
#[derive(Debug, Clone, Copy)]
pub(super) struct ToolKind {
    host_tool: bool,
    category: Option<ToolCategory>,
}

impl Turn {
    pub(super) fn category_of(&self, name: &str) -> ToolKind {
        // The same precedence as the call itself: this turn's tools first.
        if let Some(tool) = self.tools.get(name) {
            return ToolKind {
                host_tool: false,
                category: Some(tool.spec.category),
            };
        }
        ToolKind {
            host_tool: true,
            category: self.host.registry.get(name).map(|t| t.spec.category),
        }
    }

    pub(super) fn count_tool_call(
        &self,
        name: &str,
        kind: ToolKind,
        result: &Result<Block, Interrupt>,
        took: Duration,
    ) {
        let tool = match kind.category {
            None => "unknown",
            Some(_) if kind.host_tool => name,
            Some(_) => "client",
        };
        let category = match kind.category {
            Some(ToolCategory::Physical) => "physical",
            Some(ToolCategory::Pure) => "pure",
            None => "unknown",
        };
        let outcome = match result {
            Ok(Block::ToolResult { is_error: true, .. }) => "error",
            Ok(_) => "ok",
            Err(_) => "cancelled",
        };
        crate::session::metrics::tool_call(
            tool,
            category,
            Decision::from(self.last_gate.unwrap_or(GateDecision::Refused)).as_str(),
            outcome,
            took,
        );
    }
}
