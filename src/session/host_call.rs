//! The one path every host tool call takes, whoever makes it: a session's
//! or a task worker's turn ([`super::turn`]) or an MCP client
//! ([`crate::mcp`]).
//!
//! In order: validation against the tool's schema (a PHYSICAL value outside
//! the host's limits is refused, never clamped), the protective stop, the
//! permission policy and its approval, execution under the daemon's own
//! deadline (the actuator goes to its safe value when that passes), and the
//! audit of every PHYSICAL call before its caller hears the result. What
//! differs between callers — how an approval is asked for, how activity is
//! reported, when the caller has gone — is a [`CallSite`].

use std::future::Future;

use serde_json::Value;

use super::permissions::PermissionPolicy;
use super::tools::Tool;
use super::turn::HostAccess;
use super::{ErrorCode, SessionError};
use crate::clock::now_ms;
use crate::config::types::{Policy, ToolCategory};
use crate::store::{AuditKind, AuditRecord, Decision};
use crate::tools::ToolError;

/// What differs between the callers of a host tool.
pub(crate) trait CallSite {
    /// Why the caller stopped waiting (a cancelled turn, a client gone).
    type Interrupt;

    /// Asks whoever decides for this caller about a `require_confirmation`
    /// call, and says who answered.
    fn approve(
        &mut self,
        id: &str,
        name: &str,
        input: &Value,
        category: ToolCategory,
    ) -> impl Future<Output = Result<Answer, Self::Interrupt>> + Send;

    /// The call passed its gate and runs now.
    fn running(
        &mut self,
        name: &str,
        category: ToolCategory,
    ) -> impl Future<Output = Result<(), Self::Interrupt>> + Send;

    /// Resolves when the caller gives up on the call.
    fn abandoned(&self) -> impl Future<Output = Self::Interrupt> + Send;

    /// What the gate decided, for a caller that counts its calls.
    fn gated(&mut self, _decision: GateDecision) {}
}

/// What the gate (or a check before it) decided for a call: one of five,
/// each written to the audit as its [`Decision`] (which spells it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateDecision {
    /// The policy allows it.
    Allowed,
    /// An approval said yes.
    Approved,
    /// An approval said no, or none came in time.
    Denied,
    /// The policy blocks it.
    Blocked,
    /// Refused before any gate (limits, the protective stop).
    Refused,
}

impl From<GateDecision> for Decision {
    fn from(decision: GateDecision) -> Decision {
        match decision {
            GateDecision::Allowed => Decision::Allowed,
            GateDecision::Approved => Decision::Approved,
            GateDecision::Denied => Decision::Denied,
            GateDecision::Blocked => Decision::Blocked,
            GateDecision::Refused => Decision::Refused,
        }
    }
}

/// The answer to an approval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Answer {
    /// `Ok(())` approved; `Err(message)` denied or not answered in time
    /// (the message says which, for the caller).
    pub verdict: Result<(), String>,
    /// The credential that answered (the audit's `approved_by`); `None`
    /// when nobody did (the approval timed out) or the daemon has no
    /// credentials.
    pub by: Option<String>,
}

impl Answer {
    /// An operator's answer (dashboard, REST, Foxglove) to the approval of
    /// `name`.
    pub(crate) fn from_operator(answered: super::approvals::Answered, name: &str) -> Answer {
        Answer {
            verdict: if answered.approve {
                Ok(())
            } else {
                Err(format!("an operator denied `{name}`"))
            },
            by: answered.by,
        }
    }

    /// No answer within `timeout`: denied.
    pub(crate) fn timed_out(name: &str, timeout: std::time::Duration) -> Answer {
        Answer {
            verdict: Err(format!(
                "`{name}` was not approved within {} s (session.approval_timeout_secs): denied",
                timeout.as_secs()
            )),
            by: None,
        }
    }
}

/// Why a host tool call did not run, or failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// Parameters a PURE tool cannot take, an unknown sensor or port.
    Invalid,
    /// A PHYSICAL value outside the host's limits: refused, never clamped.
    SafetyViolation,
    /// The protective stop is latched, or latched while the call ran.
    EStop,
    /// A `[[permissions]]` rule blocks the tool.
    Blocked,
    /// The approval was refused or not given in time.
    Denied,
    /// The actuator is held by another owner.
    Held,
    /// The driver did not finish within the deadline; the actuator went safe.
    Timeout,
    /// The driver or device failed; an actuator went safe.
    Failed,
    /// The device could not be reached or refused the write (a Modbus
    /// exception, a link down); the actuator was driven safe.
    Unavailable,
    /// A PHYSICAL call's audit row could not be written (a full disk, the
    /// store's size cap, an I/O error): the command was not sent.
    Unaudited,
}

impl Failure {
    /// The code MCP clients see (see docs/guides/mcp.md).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Failure::Invalid => "invalid_argument",
            Failure::SafetyViolation => "safety_violation",
            Failure::EStop => "e_stop",
            Failure::Blocked => "blocked",
            Failure::Denied => "denied",
            Failure::Held => "held",
            Failure::Timeout => "tool_timeout",
            Failure::Failed => "failed",
            Failure::Unavailable => "host_unavailable",
            Failure::Unaudited => "store_unavailable",
        }
    }

    /// The `SessionError` a session's client hears beside the result; none
    /// for failures the result alone reports.
    pub(crate) fn session_code(self) -> Option<ErrorCode> {
        match self {
            Failure::SafetyViolation => Some(ErrorCode::SafetyViolation),
            Failure::EStop => Some(ErrorCode::EStop),
            Failure::Held => Some(ErrorCode::PermissionDenied),
            Failure::Timeout => Some(ErrorCode::ToolTimeout),
            Failure::Unaudited | Failure::Unavailable => Some(ErrorCode::HostUnavailable),
            Failure::Invalid | Failure::Blocked | Failure::Denied | Failure::Failed => None,
        }
    }

    /// `e_stop` and `safety_violation`: the host refused or stopped a
    /// physical action (a headless turn ends on them).
    pub(crate) fn is_safety(self) -> bool {
        matches!(self, Failure::SafetyViolation | Failure::EStop)
    }
}

impl From<&ToolError> for Failure {
    fn from(e: &ToolError) -> Self {
        match e {
            ToolError::Invalid(_) => Failure::Invalid,
            ToolError::SafetyViolation(_) => Failure::SafetyViolation,
            ToolError::EStop(_) => Failure::EStop,
            ToolError::Held(_) => Failure::Held,
            ToolError::Timeout(_) => Failure::Timeout,
            ToolError::Failed(_) => Failure::Failed,
            ToolError::Unavailable(_) => Failure::Unavailable,
        }
    }
}

/// The result of a host tool call.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Outcome {
    /// The tool's JSON answer, or what went wrong (for the model or client).
    pub content: String,
    /// `None`: the call ran and succeeded.
    pub failure: Option<Failure>,
    /// Images the tool answered with (`capture_image`), for the model.
    pub images: Vec<crate::tools::Image>,
}

impl Outcome {
    fn failed(failure: Failure, content: String) -> Outcome {
        Outcome {
            content,
            failure: Some(failure),
            images: Vec::new(),
        }
    }

    pub(crate) fn is_error(&self) -> bool {
        self.failure.is_some()
    }

    /// The error a session's client hears beside the result of call `id`.
    pub(crate) fn session_error(&self, id: &str) -> Option<SessionError> {
        let code = self.failure?.session_code()?;
        Some(SessionError::new(
            code,
            format!("tool call {id}: {}", self.content),
        ))
    }
}

/// What the gate decided; `decision` is the audit's word for it, and
/// `approved_by` the credential that answered an approval.
pub(crate) enum Gate {
    Pass {
        decision: GateDecision,
        approved_by: Option<String>,
    },
    Refused {
        decision: GateDecision,
        message: String,
        failure: Failure,
        approved_by: Option<String>,
    },
}

/// The gate every tool call passes, host or client: the permission policy,
/// and an approval where it asks for one.
pub(crate) async fn gate<S: CallSite>(
    site: &mut S,
    permissions: &PermissionPolicy,
    id: &str,
    name: &str,
    input: &Value,
    category: ToolCategory,
) -> Result<Gate, S::Interrupt> {
    let verdict = permissions.decide(name, category);
    let gate = match verdict.policy {
        Policy::Block => Gate::Refused {
            decision: GateDecision::Blocked,
            message: format!("`{name}` is blocked by policy: {}", verdict.reason),
            failure: Failure::Blocked,
            approved_by: None,
        },
        Policy::RequireConfirmation => {
            let answer = approve_timed(site, id, name, input, category).await?;
            match answer.verdict {
                Ok(()) => Gate::Pass {
                    decision: GateDecision::Approved,
                    approved_by: answer.by,
                },
                Err(message) => Gate::Refused {
                    decision: GateDecision::Denied,
                    message,
                    failure: Failure::Denied,
                    approved_by: answer.by,
                },
            }
        }
        Policy::Allow => Gate::Pass {
            decision: GateDecision::Allowed,
            approved_by: None,
        },
    };
    site.gated(match &gate {
        Gate::Pass { decision, .. } | Gate::Refused { decision, .. } => *decision,
    });
    Ok(gate)
}

/// [`CallSite::approve`], its wait measured for the metrics.
async fn approve_timed<S: CallSite>(
    site: &mut S,
    id: &str,
    name: &str,
    input: &Value,
    category: ToolCategory,
) -> Result<Answer, S::Interrupt> {
    let asked = std::time::Instant::now();
    let answer = site.approve(id, name, input, category).await;
    let result = match &answer {
        Ok(Answer {
            verdict: Ok(()), ..
        }) => "approved",
        Ok(Answer {
            verdict: Err(_), ..
        }) => "denied",
        Err(_) => "cancelled",
    };
    super::metrics::approval_wait(asked.elapsed(), result);
    answer
}

/// Runs host tool `tool` as call `id` for `host`'s owner. PHYSICAL calls
/// are audited (awaited) before this returns, whatever the outcome; a call
/// the caller abandons while it runs is audited as such and returns the
/// caller's interrupt (a command that reached its driver finishes in its own
/// task and is then undone by the deadman, see `Actuators::command`).
pub(crate) async fn run<S: CallSite>(
    site: &mut S,
    host: &HostAccess,
    permissions: &PermissionPolicy,
    id: &str,
    tool: &Tool,
    input: &Value,
) -> Result<Outcome, S::Interrupt> {
    let name = tool.spec.name.as_str();
    let category = tool.spec.category;
    let physical = category == ToolCategory::Physical;
    let started = now_ms();
    if let Err(why) = tool.validate(input) {
        if !physical {
            return Ok(Outcome::failed(
                Failure::Invalid,
                format!("invalid parameters for `{name}`: {why}"),
            ));
        }
        // The host never applies a value outside its limits: say so plainly.
        let message = format!("`{name}` refused: {why}");
        audit(host, id, name, input, &REFUSED, Err(&message), started).await;
        return Ok(Outcome::failed(Failure::SafetyViolation, message));
    }
    let stop = host.tools.protective_stop();
    if physical && stop.is_active() {
        let message = format!(
            "`{name}` refused: protective stop is active ({})",
            stop.describe()
        );
        audit(host, id, name, input, &REFUSED, Err(&message), started).await;
        return Ok(Outcome::failed(Failure::EStop, message));
    }
    let decision = match gate(site, permissions, id, name, input, category).await? {
        Gate::Pass {
            decision,
            approved_by,
        } => Decided {
            decision,
            approved_by,
        },
        Gate::Refused {
            decision,
            message,
            failure,
            approved_by,
        } => {
            if physical {
                let decided = Decided {
                    decision,
                    approved_by,
                };
                audit(host, id, name, input, &decided, Err(&message), started).await;
            }
            return Ok(Outcome::failed(failure, message));
        }
    };
    let decision = &decision;
    // Audit first: a PHYSICAL command whose row cannot be written is not
    // sent (the actuator does not move); the row is completed afterwards.
    let row = if physical {
        // No outcome, no end yet: a row left like this by a crash is a
        // command that may have been sent and whose outcome is unknown.
        let record = AuditRecord {
            result: None,
            error: None,
            ended_at_ms: None,
            duration_ms: None,
            ..audit_record(host, id, name, input, decision, Ok(""), started)
        };
        match host.store.audit_begin(record).await {
            Ok(row) => Some(row),
            Err(e) => {
                tracing::error!(error = %e, tool_call_id = id, tool = name, "PHYSICAL call refused: its audit row cannot be written");
                return Ok(Outcome::failed(
                    Failure::Unaudited,
                    format!(
                        "`{name}` refused: the store cannot write its audit record ({e}); \
                         a physical action that cannot be audited is not performed, nothing was sent \
                         to the actuator (see `store` in /v1/status)"
                    ),
                ));
            }
        }
    } else {
        None
    };
    site.running(name, category).await?;
    let result = tokio::select! {
        biased;
        interrupt = site.abandoned() => {
            if let Some(row) = row {
                finish(host, row, id, name, input, decision, Err("cancelled while running"), started).await;
            }
            return Err(interrupt);
        }
        result = host.tools.execute(name, input, &host.session_id) => result,
    };
    let outcome = match result {
        Ok(answer) => Outcome {
            content: answer.text,
            failure: None,
            images: answer.images,
        },
        Err(e) => Outcome::failed(Failure::from(&e), format!("`{name}` failed: {e}")),
    };
    if let Some(row) = row {
        let audited = if outcome.is_error() {
            Err(outcome.content.as_str())
        } else {
            Ok(outcome.content.as_str())
        };
        finish(host, row, id, name, input, decision, audited, started).await;
    }
    Ok(outcome)
}

/// What the gate decided for a call, as the audit writes it.
struct Decided {
    decision: GateDecision,
    /// The credential that answered the approval.
    approved_by: Option<String>,
}

/// A call refused before any gate (limits, the protective stop).
const REFUSED: Decided = Decided {
    decision: GateDecision::Refused,
    approved_by: None,
};

/// Completes the audit row `row` of a PHYSICAL call with its outcome
/// (awaited: the record is complete before the caller hears the result).
#[allow(clippy::too_many_arguments)]
async fn finish(
    host: &HostAccess,
    row: i64,
    id: &str,
    tool: &str,
    input: &Value,
    decision: &Decided,
    result: Result<&str, &str>,
    started: i64,
) {
    let record = audit_record(host, id, tool, input, decision, result, started);
    if let Err(e) = host.store.audit_finish(row, record).await {
        tracing::error!(error = %e, tool_call_id = id, "cannot complete the audit record of a PHYSICAL call");
    }
}

fn audit_record(
    host: &HostAccess,
    id: &str,
    tool: &str,
    input: &Value,
    decided: &Decided,
    result: Result<&str, &str>,
    started: i64,
) -> AuditRecord {
    let ended = now_ms();
    AuditRecord {
        at_ms: ended,
        kind: AuditKind::ToolCall,
        session_id: Some(host.session_id.clone()),
        tool_call_id: Some(id.to_string()),
        tool: Some(tool.to_string()),
        parameters: Some(input.clone()),
        decision: Some(decided.decision.into()),
        approved_by: decided.approved_by.clone(),
        result: result.ok().map(str::to_string),
        error: result.err().map(str::to_string),
        origin: Some(host.label.clone()),
        credential: host.credential.clone(),
        started_at_ms: Some(started),
        ended_at_ms: Some(ended),
        duration_ms: Some(ended - started),
        ..Default::default()
    }
}

/// The audit row of an answer refused because the credential answering
/// made the call itself (`approvals.require_other_credential`): `kind`
/// `approval`, `decision` `refused`, `credential` the one that tried,
/// `origin` the way it tried (`POST /v1/approvals`, `ApproveToolUse`, ...).
pub(crate) fn own_approval_refused(
    session_id: &str,
    tool_call_id: &str,
    tool: &str,
    parameters: &Value,
    origin: &str,
    credential: Option<&str>,
    why: &str,
) -> AuditRecord {
    AuditRecord {
        at_ms: now_ms(),
        kind: AuditKind::Approval,
        session_id: Some(session_id.to_string()),
        tool_call_id: Some(tool_call_id.to_string()),
        tool: Some(tool.to_string()),
        parameters: Some(parameters.clone()),
        decision: Some(Decision::Refused),
        error: Some(why.to_string()),
        origin: Some(origin.to_string()),
        credential: credential.map(str::to_string),
        ..Default::default()
    }
}

/// Writes one refused PHYSICAL call to the audit (awaited: the record
/// exists before the caller hears the result; nothing moved, so a write
/// that fails is logged and the refusal stands).
async fn audit(
    host: &HostAccess,
    id: &str,
    tool: &str,
    input: &Value,
    decision: &Decided,
    result: Result<&str, &str>,
    started: i64,
) {
    let record = audit_record(host, id, tool, input, decision, result, started);
    if let Err(e) = host.store.audit(record).await {
        tracing::error!(error = %e, tool_call_id = id, "cannot write the audit record");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_hears_the_codes_it_always_heard_and_mcp_gets_one_per_failure() {
        let outcome = |failure| Outcome::failed(failure, "`arm` refused: /value: 5".into());
        let safety = outcome(Failure::SafetyViolation)
            .session_error("t1")
            .unwrap();
        assert_eq!(safety.code, ErrorCode::SafetyViolation);
        assert_eq!(safety.message, "tool call t1: `arm` refused: /value: 5");
        for (failure, code) in [
            (Failure::EStop, Some(ErrorCode::EStop)),
            (Failure::Held, Some(ErrorCode::PermissionDenied)),
            (Failure::Timeout, Some(ErrorCode::ToolTimeout)),
            (Failure::Invalid, None),
            (Failure::Blocked, None),
            (Failure::Denied, None),
            (Failure::Failed, None),
            (Failure::Unaudited, Some(ErrorCode::HostUnavailable)),
            (Failure::Unavailable, Some(ErrorCode::HostUnavailable)),
        ] {
            assert_eq!(
                outcome(failure).session_error("t").map(|e| e.code),
                code,
                "{failure:?}"
            );
        }
        let ok = Outcome {
            content: "{}".into(),
            failure: None,
            images: Vec::new(),
        };
        assert!(!ok.is_error() && ok.session_error("t").is_none());
        let codes: std::collections::HashSet<&str> = [
            Failure::Invalid,
            Failure::SafetyViolation,
            Failure::EStop,
            Failure::Blocked,
            Failure::Denied,
            Failure::Held,
            Failure::Timeout,
            Failure::Failed,
            Failure::Unaudited,
            Failure::Unavailable,
        ]
        .into_iter()
        .map(Failure::as_str)
        .collect();
        assert_eq!(codes.len(), 10, "distinct codes");
        assert!(Failure::EStop.is_safety() && !Failure::Held.is_safety());
    }
}
