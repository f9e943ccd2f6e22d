//! Which tools may run without asking: `stop_all` always (going safe is
//! never gated by an approval), then configured `[[permissions]]` rules,
//! first match wins, then the defaults (PHYSICAL asks, PURE runs). And who
//! may answer when one asks (`[approvals]`, [`PermissionPolicy::may_answer`]).

use crate::config::types::{ApprovalsConfig, PermissionRuleConfig, Policy, ToolCategory};

use super::PermissionView;

#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub policy: Policy,
    pub reason: String,
}

#[derive(Debug, Clone, Default)]
pub struct PermissionPolicy {
    rules: Vec<PermissionRuleConfig>,
    /// `approvals.require_other_credential`.
    require_other_credential: bool,
}

/// Why a credential may not answer an approval.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "credential {credential:?} cannot approve its own call (approvals.require_other_credential): \
     another credential must approve it; it may still deny it"
)]
pub struct OwnApproval {
    pub credential: String,
}

const PHYSICAL_DEFAULT: &str = "default: PHYSICAL tools move hardware and need confirmation";
const PURE_DEFAULT: &str = "default: PURE tools only read";
const GOING_SAFE: &str = "going safe is never gated by an approval";

impl PermissionPolicy {
    pub fn new(rules: Vec<PermissionRuleConfig>, approvals: &ApprovalsConfig) -> Self {
        PermissionPolicy {
            rules,
            require_other_credential: approvals.require_other_credential,
        }
    }

    /// Whether `approver` may answer `approve` to a call made by `caller`
    /// (credential names; `None`: anonymous). Denying is always allowed;
    /// with `approvals.require_other_credential`, approving one's own call
    /// is not. (The configuration requires credentials for that rule, so
    /// two anonymous callers cannot meet here.)
    pub fn may_answer(
        &self,
        caller: Option<&str>,
        approver: Option<&str>,
        approve: bool,
    ) -> Result<(), OwnApproval> {
        if approve && self.require_other_credential && caller == approver {
            return Err(OwnApproval {
                credential: approver.unwrap_or("anonymous").to_string(),
            });
        }
        Ok(())
    }

    /// Whether a call's own client may approve it (elicitation, a session's
    /// `PermissionDecision`): not with `approvals.require_other_credential`.
    pub fn caller_may_approve(&self) -> bool {
        !self.require_other_credential
    }

    pub fn decide(&self, tool: &str, category: ToolCategory) -> Verdict {
        // Host tool names are reserved, so this is always the host's own
        // stop_all; no rule may make going safe wait for a person or refuse it.
        if tool == crate::tools::STOP_ALL {
            return Verdict {
                policy: Policy::Allow,
                reason: GOING_SAFE.into(),
            };
        }
        for rule in &self.rules {
            if rule.category.is_none_or(|c| c == category) && glob_match(&rule.tool_pattern, tool) {
                return Verdict {
                    policy: rule.policy,
                    reason: rule
                        .reason
                        .clone()
                        .unwrap_or_else(|| format!("rule `{}`", rule.tool_pattern)),
                };
            }
        }
        match category {
            ToolCategory::Physical => Verdict {
                policy: Policy::RequireConfirmation,
                reason: PHYSICAL_DEFAULT.into(),
            },
            ToolCategory::Pure => Verdict {
                policy: Policy::Allow,
                reason: PURE_DEFAULT.into(),
            },
        }
    }

    /// The effective rules, in evaluation order, as `SessionStarted` reports them.
    pub fn views(&self) -> Vec<PermissionView> {
        let mut views: Vec<PermissionView> = self
            .rules
            .iter()
            .map(|r| PermissionView {
                tool_pattern: r.tool_pattern.clone(),
                policy: r.policy.as_str().to_string(),
                category: r.category.map(|c| c.as_str().to_string()),
                reason: r.reason.clone(),
            })
            .collect();
        for (category, policy, reason) in [
            (
                ToolCategory::Physical,
                Policy::RequireConfirmation,
                PHYSICAL_DEFAULT,
            ),
            (ToolCategory::Pure, Policy::Allow, PURE_DEFAULT),
        ] {
            views.push(PermissionView {
                tool_pattern: "*".into(),
                policy: policy.as_str().into(),
                category: Some(category.as_str().into()),
                reason: Some(reason.into()),
            });
        }
        views
    }
}

/// Glob match where `*` matches any run of characters and `?` exactly one.
pub(crate) fn glob_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0, 0);
    let mut backtrack: Option<(usize, usize)> = None;
    while ti < t.len() {
        match p.get(pi) {
            Some('*') => {
                backtrack = Some((pi, ti));
                pi += 1;
            }
            Some(&c) if c == '?' || c == t[ti] => {
                pi += 1;
                ti += 1;
            }
            _ => match backtrack {
                Some((star, matched)) => {
                    pi = star + 1;
                    ti = matched + 1;
                    backtrack = Some((star, matched + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(pattern: &str, policy: Policy, category: Option<ToolCategory>) -> PermissionRuleConfig {
        PermissionRuleConfig {
            tool_pattern: pattern.into(),
            policy,
            category,
            reason: None,
        }
    }

    #[test]
    fn glob() {
        assert!(glob_match("*", ""));
        assert!(glob_match("cam_*", "cam_front"));
        assert!(!glob_match("cam_*", "xcam_front"));
        assert!(glob_match("a?c", "abc"));
        assert!(!glob_match("a?c", "ac"));
        assert!(glob_match("*__read*", "sim__read_sensor"));
        assert!(glob_match("exact", "exact"));
        assert!(!glob_match("exact", "exactly"));
    }

    #[test]
    fn defaults_first_match_and_category_filter() {
        let p = PermissionPolicy::new(
            vec![
                rule("arm_*", Policy::Block, None),
                rule("*", Policy::Allow, Some(ToolCategory::Physical)),
                rule("arm_*", Policy::Allow, None),
            ],
            &ApprovalsConfig::default(),
        );
        assert_eq!(
            p.decide("arm_move", ToolCategory::Physical).policy,
            Policy::Block
        );
        assert_eq!(
            p.decide("wheel", ToolCategory::Physical).policy,
            Policy::Allow
        );
        let empty = PermissionPolicy::default();
        assert_eq!(
            empty.decide("x", ToolCategory::Physical).policy,
            Policy::RequireConfirmation
        );
        assert_eq!(empty.decide("x", ToolCategory::Pure).policy, Policy::Allow);
        let strict = PermissionPolicy::new(
            vec![rule("*", Policy::Block, None)],
            &ApprovalsConfig::default(),
        );
        for p in [&strict, &empty] {
            let going_safe = p.decide("stop_all", ToolCategory::Physical);
            assert_eq!(going_safe.policy, Policy::Allow, "{going_safe:?}");
        }
        assert_eq!(p.views().len(), 5);
    }

    #[test]
    fn with_require_other_credential_nobody_approves_their_own_call() {
        let open = PermissionPolicy::default();
        assert_eq!(open.may_answer(Some("alice"), Some("alice"), true), Ok(()));
        assert!(open.caller_may_approve());
        let strict = PermissionPolicy::new(
            Vec::new(),
            &ApprovalsConfig {
                require_other_credential: true,
            },
        );
        assert!(!strict.caller_may_approve());
        let own = strict
            .may_answer(Some("alice"), Some("alice"), true)
            .unwrap_err();
        assert_eq!(own.credential, "alice");
        assert!(
            own.to_string()
                .contains("approvals.require_other_credential")
        );
        assert_eq!(
            strict.may_answer(Some("alice"), Some("alice"), false),
            Ok(()),
            "denying is fine"
        );
        assert_eq!(strict.may_answer(Some("alice"), Some("bob"), true), Ok(()));
        assert_eq!(strict.may_answer(None, Some("bob"), true), Ok(()));
    }
}
