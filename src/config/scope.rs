//! Credential scopes (`read` < `operate` < `admin`): what a bearer token
//! or a client certificate may do. A leaf: it imports nothing of rozd.

use std::fmt;

/// What a credential may do. Each scope includes the ones before it:
/// `operate` may read, `admin` may operate and read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    /// Status, observation, sensors, sessions, audit, hosts, health, metrics.
    Read,
    /// Sessions, tasks, approvals, actuator commands.
    Operate,
    /// Clearing a protective stop, registering hosts, the fleet stop's clear.
    Admin,
}

impl Scope {
    pub const NAMES: &str = "\"read\", \"operate\", \"admin\"";

    pub fn parse(text: &str) -> Option<Scope> {
        match text {
            "read" => Some(Scope::Read),
            "operate" => Some(Scope::Operate),
            "admin" => Some(Scope::Admin),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::Operate => "operate",
            Scope::Admin => "admin",
        }
    }

    /// Whether a credential with this scope may do what `needed` guards.
    pub fn allows(self, needed: Scope) -> bool {
        self >= needed
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
