//! Keeping a turn's context inside its budget, between model calls: first
//! old tool results are elided, then old thinking is removed, then the
//! oldest turns are summarised by the model, and as a last resort (over the
//! budget, no summary possible) the oldest turns are dropped. Each step that
//! changed something is reported with `ContextCompacted`; the current turn's
//! messages are never summarised or dropped.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures_util::StreamExt as _;

use super::{Conversation, Interrupt, Turn, TurnError};
use crate::model::{Block, Message, Model, ModelEvent, ModelRequest};
use crate::session::context;
use crate::session::{Activity, ErrorCode, Presence, ServerEvent, SessionError};

/// Longest summary a compaction asks the model for.
const SUMMARY_MAX_TOKENS: u32 = 1024;

/// Messages and (scaled) tokens before or after a compaction step.
type Size = (usize, u32);

impl Turn {
    /// Fits `conversation` into the context budget beside `fixed_tokens`
    /// (the system prompt and the tools); the request's estimated size.
    pub(super) async fn fit_budget(
        &mut self,
        model: &dyn Model,
        conversation: &mut Conversation,
        fixed_tokens: u32,
    ) -> Result<u32, TurnError> {
        let budget = self.limits.context_budget;
        let limits = self.limits.compaction;
        let at = |fraction: f64| -> u32 { (f64::from(budget) * fraction).floor() as u32 };
        let estimate = fixed_tokens.saturating_add(conversation.tokens);
        if self.meter.scaled(estimate) <= at(limits.tool_results_at).min(budget) {
            return Ok(estimate);
        }
        // Compaction (rare): measure the conversation afresh after each step.
        conversation.uncounted = true;
        let full = |c: &Conversation| fixed_tokens.saturating_add(context::estimate(&c.messages));
        let size = |turn: &Turn, c: &Conversation| (c.messages.len(), turn.meter.scaled(full(c)));
        let target = self.meter.unscaled(at(limits.target));

        // Level 1: old tool results, their images first.
        let mut estimate = full(conversation);
        let tail = context::working_tail(&conversation.messages);
        let before = size(self, conversation);
        let images = context::elide_tool_images(
            Arc::make_mut(&mut conversation.messages).as_mut_slice(),
            tail,
            &mut estimate,
            target,
        );
        if images > 0 {
            let after = size(self, conversation);
            self.compacted(
                "tool_images",
                before,
                after,
                format!("dropped {images} old image(s) from tool results"),
            )
            .await?;
        }
        let before = size(self, conversation);
        let mut estimate = full(conversation);
        let elided = context::elide_tool_results(
            Arc::make_mut(&mut conversation.messages).as_mut_slice(),
            tail,
            &mut estimate,
            target,
        );
        if elided > 0 {
            let after = size(self, conversation);
            self.compacted(
                "tool_results",
                before,
                after,
                format!("elided {elided} old tool result(s)"),
            )
            .await?;
        }

        // Level 2: old thinking (never the current turn's: providers verify it).
        if self.meter.scaled(full(conversation)) > at(limits.thinking_at) {
            let before = size(self, conversation);
            let mut estimate = full(conversation);
            let (blocks, removed) = context::strip_thinking(
                Arc::make_mut(&mut conversation.messages),
                conversation.turn_start,
                &mut estimate,
                target,
            );
            conversation.turn_start -= removed;
            if blocks > 0 {
                let after = size(self, conversation);
                self.compacted(
                    "thinking",
                    before,
                    after,
                    format!("removed {blocks} old thinking block(s)"),
                )
                .await?;
            }
        }

        // Level 3: summarise the oldest turns with the model itself.
        if self.meter.scaled(full(conversation)) > at(limits.summary_at) && model.can_summarize() {
            self.summarize_old_turns(model, conversation, fixed_tokens, target)
                .await?;
        }

        // Level 4: over the budget and nothing else helped: drop the oldest turns.
        if self.meter.scaled(full(conversation)) > budget {
            let before = size(self, conversation);
            if let Some(cut) = context::cut_old_turns(
                &conversation.messages,
                conversation.turn_start,
                full(conversation),
                target,
                0,
            ) {
                Arc::make_mut(&mut conversation.messages).drain(..cut);
                conversation.turn_start -= cut;
                let after = size(self, conversation);
                self.compacted(
                    "truncate",
                    before,
                    after,
                    format!("dropped the {cut} oldest message(s) to fit {budget} tokens"),
                )
                .await?;
            }
        }
        conversation.tokens = context::estimate(&conversation.messages);
        conversation.uncounted = false;
        let estimate = fixed_tokens.saturating_add(conversation.tokens);
        let tokens = self.meter.scaled(estimate);
        if tokens > budget {
            return Err(TurnError::Failed(SessionError::new(
                ErrorCode::BudgetExceeded,
                format!(
                    "this turn needs about {tokens} tokens of context, more than the budget of {budget}"
                ),
            )));
        }
        Ok(estimate)
    }

    /// Level 3: replaces the oldest turns by the model's summary of them,
    /// when that is worth a model call.
    async fn summarize_old_turns(
        &mut self,
        model: &dyn Model,
        conversation: &mut Conversation,
        fixed_tokens: u32,
        target: u32,
    ) -> Result<(), TurnError> {
        let full = |c: &Conversation| fixed_tokens.saturating_add(context::estimate(&c.messages));
        let before = (
            conversation.messages.len(),
            self.meter.scaled(full(conversation)),
        );
        let summary_budget = self.limits.max_output_tokens.min(SUMMARY_MAX_TOKENS);
        let Some(cut) = context::cut_old_turns(
            &conversation.messages,
            conversation.turn_start,
            full(conversation),
            target,
            summary_budget,
        )
        // Only worth a model call when the summary is much smaller than
        // what it replaces (never re-summarise a lone summary).
        .filter(|&cut| {
            context::estimate(&conversation.messages[..cut]) > summary_budget.saturating_mul(2)
        }) else {
            return Ok(());
        };
        self.check_session_budget()?;
        let Some(summary) = self
            .summarize(model, &conversation.messages[..cut], summary_budget)
            .await?
        else {
            return Ok(());
        };
        Arc::make_mut(&mut conversation.messages)
            .splice(..cut, [context::summary_message(&summary)]);
        conversation.turn_start = conversation.turn_start + 1 - cut;
        let after = (
            conversation.messages.len(),
            self.meter.scaled(full(conversation)),
        );
        self.compacted("summary", before, after, summary).await?;
        Ok(())
    }

    async fn compacted(
        &mut self,
        level: &str,
        (messages_before, tokens_before): Size,
        (messages_after, tokens_after): Size,
        summary: String,
    ) -> Result<(), Interrupt> {
        tracing::info!(
            level,
            messages_before,
            messages_after,
            tokens_before,
            tokens_after,
            "context compacted"
        );
        self.live_tokens.store(tokens_after, Ordering::Relaxed);
        self.send(ServerEvent::ContextCompacted {
            level: level.to_string(),
            messages_before: u32::try_from(messages_before).unwrap_or(u32::MAX),
            messages_after: u32::try_from(messages_after).unwrap_or(u32::MAX),
            tokens_before,
            tokens_after,
            summary: Some(summary),
        })
        .await
    }

    /// Asks the model for a summary of old turns; `None` when it fails (the
    /// caller then falls back to dropping them).
    async fn summarize(
        &mut self,
        model: &dyn Model,
        old: &[Message],
        max_output_tokens: u32,
    ) -> Result<Option<String>, Interrupt> {
        self.state(
            Activity::Thinking,
            "compacting the context",
            Presence::Mini,
            "the model is summarising old turns",
        )
        .await?;
        let request = ModelRequest {
            system: context::SUMMARY_SYSTEM.to_string(),
            messages: vec![Message::user(vec![Block::Text(context::transcript(old))])].into(),
            tools: Arc::default(),
            max_output_tokens,
            estimated_input_tokens: None,
            tool_choice: None,
        };
        let mut stream = model.stream(request);
        let mut text = String::new();
        let mut stopped = false;
        loop {
            let event = tokio::select! {
                biased;
                () = self.cancel.cancelled() => return Err(Interrupt::Cancelled),
                event = stream.next() => event,
            };
            match event {
                None => break,
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "the model could not summarise old turns");
                    return Ok(None);
                }
                Some(Ok(ModelEvent::TextDelta(delta))) => text.push_str(&delta),
                Some(Ok(ModelEvent::Usage(u))) => self.usage.add(u),
                Some(Ok(ModelEvent::Stop(_))) => stopped = true,
                Some(Ok(_)) => {}
            }
        }
        let text = text.trim();
        if !stopped || text.is_empty() {
            tracing::warn!("the model gave no summary of old turns");
            return Ok(None);
        }
        Ok(Some(text.to_string()))
    }
}
