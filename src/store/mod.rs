//! The embedded SQLite store (WAL mode): sessions, their turns, feedback,
//! the audit of physical actions, tasks and their event logs ([`tasks`]).
//!
//! Writes happen before the response they back is sent, so what a client was
//! told survives a crash. SQLite calls are blocking; each runs on tokio's
//! blocking pool behind one connection mutex (writes are a few per turn).

use crate::clock::now_ms;
use crate::observe::Observers;
use parking_lot::Mutex;
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod health;
pub(crate) mod metrics;
mod retention;
mod tasks;

pub use health::StoreHealth;
pub use retention::{Pruned, Retention};
pub use tasks::{StoredTaskEvent, TaskRow};

use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot create store directory {path}: {source}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("store {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error(
        "store {path} has schema version {found}, newer than this rozd knows ({known}); refusing to touch it"
    )]
    TooNew {
        path: PathBuf,
        found: i64,
        known: i64,
    },
    #[error("cannot make the store {path} private (mode 0600): {source}")]
    Private {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("store query failed: {0}")]
    Sql(#[from] rusqlite::Error),
    #[error("store task failed: {0}")]
    Task(String),
}

/// Schema migrations, applied in order; `PRAGMA user_version` records how many ran.
const MIGRATIONS: &[&str] = &[
    // 1: sessions, turns, feedback
    "CREATE TABLE sessions (
        id             TEXT PRIMARY KEY,
        host_id        TEXT NOT NULL,
        environment_id TEXT NOT NULL,
        model          TEXT NOT NULL,
        started_at_ms  INTEGER NOT NULL,
        ended_at_ms    INTEGER,
        end_reason     TEXT
    );
    CREATE TABLE turns (
        session_id            TEXT NOT NULL REFERENCES sessions(id),
        seq                   INTEGER NOT NULL,
        message_id            TEXT NOT NULL,
        ai_mode               TEXT NOT NULL,
        user_content          TEXT NOT NULL,
        messages_json         TEXT NOT NULL,
        stop_reason           TEXT NOT NULL,
        input_tokens          INTEGER NOT NULL,
        output_tokens         INTEGER NOT NULL,
        cache_read_tokens     INTEGER NOT NULL,
        cache_creation_tokens INTEGER NOT NULL,
        started_at_ms         INTEGER NOT NULL,
        ended_at_ms           INTEGER NOT NULL,
        PRIMARY KEY (session_id, seq)
    );
    CREATE TABLE feedback (
        id            INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id    TEXT NOT NULL,
        message_id    TEXT NOT NULL,
        rating        TEXT NOT NULL,
        created_at_ms INTEGER NOT NULL
    );
    CREATE INDEX sessions_started ON sessions(started_at_ms);",
    // 2: audit of physical actions
    "CREATE TABLE audit (
        id            INTEGER PRIMARY KEY AUTOINCREMENT,
        at_ms         INTEGER NOT NULL,
        kind          TEXT NOT NULL,
        session_id    TEXT,
        tool_call_id  TEXT,
        tool          TEXT,
        actuator      TEXT,
        parameters    TEXT,
        decision      TEXT,
        result        TEXT,
        error         TEXT,
        origin        TEXT,
        started_at_ms INTEGER,
        ended_at_ms   INTEGER,
        duration_ms   INTEGER
    );
    CREATE INDEX audit_at ON audit(at_ms);
    CREATE INDEX audit_session ON audit(session_id);",
    // 3: tasks and their event log (status changes and team events)
    "CREATE TABLE tasks (
        id             TEXT PRIMARY KEY,
        prompt         TEXT NOT NULL,
        environment_id TEXT NOT NULL,
        host_id        TEXT NOT NULL,
        status         TEXT NOT NULL,
        detail         TEXT,
        timeout_secs   INTEGER NOT NULL,
        created_at_ms  INTEGER NOT NULL,
        updated_at_ms  INTEGER NOT NULL
    );
    CREATE INDEX tasks_created ON tasks(created_at_ms);
    CREATE TABLE task_events (
        task_id   TEXT NOT NULL REFERENCES tasks(id),
        seq       INTEGER NOT NULL,
        at_ms     INTEGER NOT NULL,
        kind      TEXT NOT NULL,
        worker_id TEXT,
        body      TEXT NOT NULL,
        PRIMARY KEY (task_id, seq)
    );",
    // 4: the credential (token name or certificate subject) behind an
    // audited action; never the secret
    "ALTER TABLE audit ADD COLUMN credential TEXT;",
    // 5: the credential that answered an approval (approved or denied);
    // rows written before read it as NULL
    "ALTER TABLE audit ADD COLUMN approved_by TEXT;",
    // 6: the version (a hash) of the embodiment and manual a session was
    // told; rows written before read it as NULL
    "ALTER TABLE sessions ADD COLUMN briefing_version TEXT;",
];

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SessionRecord {
    pub id: String,
    pub host_id: String,
    pub environment_id: String,
    pub model: String,
    pub started_at_ms: i64,
    pub ended_at_ms: Option<i64>,
    pub end_reason: Option<String>,
    pub turns: u32,
    /// The version of the embodiment and manual the session was told.
    pub briefing_version: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TurnRecord {
    pub session_id: String,
    pub seq: u32,
    pub message_id: String,
    pub ai_mode: String,
    pub user_content: String,
    /// The messages this turn added to the conversation, as JSON.
    pub messages: serde_json::Value,
    pub stop_reason: String,
    pub input_tokens: u32,
    pub output_tokens: u32,
    pub cache_read_tokens: u32,
    pub cache_creation_tokens: u32,
    pub started_at_ms: i64,
    pub ended_at_ms: i64,
}

/// The order of [`Store::audit_records_ordered`] (`order=` of `GET /v1/audit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuditOrder {
    /// By id ascending (`order=asc`, the default).
    OldestFirst,
    /// By id descending (`order=desc`): the latest rows.
    NewestFirst,
}

/// An audit vocabulary, declared once as its variants and their spellings:
/// the enum (with `Other(String)` for a spelling this version does not
/// write, a row of another version of rozd, kept as written rather than
/// failing the read), `as_str`, `KNOWN`, `parse`, and its display,
/// serialization and SQLite conversions, all as its spelling.
macro_rules! audit_vocabulary {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$variant_meta:meta])* $variant:ident => $word:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub enum $name {
            $( $(#[$variant_meta])* $variant, )+
            /// A spelling this version does not write (a row of another
            /// version of rozd), kept as it was written.
            Other(String),
        }

        impl $name {
            /// Its spelling: what is stored, served and recorded.
            pub fn as_str(&self) -> &str {
                match self {
                    $( $name::$variant => $word, )+
                    $name::Other(word) => word,
                }
            }

            /// Every value this version writes.
            pub const KNOWN: &'static [$name] = &[$( $name::$variant ),+];

            /// The value spelled `text` (as `as_str` writes it).
            pub fn parse(text: &str) -> $name {
                $name::KNOWN
                    .iter()
                    .find(|known| known.as_str() == text)
                    .cloned()
                    .unwrap_or_else(|| $name::Other(text.to_string()))
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.as_str() == *other
            }
        }

        impl rusqlite::types::ToSql for $name {
            fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
                Ok(self.as_str().into())
            }
        }

        impl rusqlite::types::FromSql for $name {
            fn column_result(
                value: rusqlite::types::ValueRef<'_>,
            ) -> rusqlite::types::FromSqlResult<Self> {
                value.as_str().map($name::parse)
            }
        }
    };
}

audit_vocabulary! {
    /// What an audit row records (`GET /v1/audit`'s `kind`).
    pub enum AuditKind {
        /// A PHYSICAL tool call.
        ToolCall => "tool_call",
        /// An actuator change: a command, a hold's expiry, a drive to safe.
        Actuator => "actuator",
        /// A verdict of an actuator's feedback.
        Feedback => "feedback",
        /// An approval answer refused (`[approvals] require_other_credential`).
        Approval => "approval",
        /// A cause added to the protective stop.
        ProtectiveStop => "protective_stop",
        /// A cause removed from the protective stop.
        ProtectiveStopCleared => "protective_stop_cleared",
        /// A clear refused because a stop input still asserts the stop.
        ProtectiveStopClearRefused => "protective_stop_clear_refused",
        /// The stop latched again at start-up, as before the restart.
        ProtectiveStopRestored => "protective_stop_restored",
        /// A stop that latched before its body arrived got its reason.
        ProtectiveStopReason => "protective_stop_reason",
    }
}

/// A row says its kind; the default is the most common one, a tool call.
impl Default for AuditKind {
    fn default() -> Self {
        AuditKind::ToolCall
    }
}

audit_vocabulary! {
    /// What the gate (or a check before it) decided for a tool call: the
    /// audit's `decision` column and the metrics' `decision` label.
    pub enum Decision {
        /// The policy allows it.
        Allowed => "allowed",
        /// An approval said yes.
        Approved => "approved",
        /// An approval said no, or none came in time.
        Denied => "denied",
        /// The policy blocks it.
        Blocked => "blocked",
        /// Refused before any gate (limits, the protective stop), or an
        /// approval answer refused.
        Refused => "refused",
    }
}

/// One audited physical action: a PHYSICAL tool call (`kind = "tool_call"`)
/// or an actuator change (`kind = "actuator"`: commands, safe-state drives),
/// and the other [`AuditKind`]s.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AuditRecord {
    pub id: i64,
    pub at_ms: i64,
    pub kind: AuditKind,
    pub session_id: Option<String>,
    pub tool_call_id: Option<String>,
    pub tool: Option<String>,
    pub actuator: Option<String>,
    pub parameters: Option<serde_json::Value>,
    pub decision: Option<Decision>,
    pub result: Option<String>,
    pub error: Option<String>,
    pub origin: Option<String>,
    pub started_at_ms: Option<i64>,
    pub ended_at_ms: Option<i64>,
    pub duration_ms: Option<i64>,
    /// The credential (a token's name, a certificate subject) that asked
    /// for the action, where one did; never a secret.
    pub credential: Option<String>,
    /// The credential that answered the call's approval (`approved` or
    /// `denied` by someone; `None` for a call that needed none, or one
    /// denied because nobody answered in time).
    pub approved_by: Option<String>,
}

/// Told of what the store writes, as it is asked to write it (a
/// recording). Calls must not block: they run on the writer's task (see
/// [`crate::observe`]).
pub trait StoreObserver: Send + Sync + std::fmt::Debug {
    fn audit(&self, _record: &AuditRecord) {}
    fn session_started(&self, _session: &SessionRecord) {}
    fn session_ended(&self, _id: &str, _reason: &str) {}
    fn turn_completed(&self, _turn: &TurnRecord) {}
    /// A task created, a status change or a team event, as JSON
    /// (`event`: `created`, `status`, `team_event`).
    fn task(&self, _body: serde_json::Value) {}
}

#[derive(Debug, Clone)]
pub struct Store {
    conn: Arc<Mutex<Connection>>,
    /// Shared by every clone.
    observers: Observers<dyn StoreObserver>,
    /// One call on the blocking pool at a time: the others wait here, as
    /// tasks, instead of each taking a pool thread to queue on `conn`
    /// (with many sessions that was a thread and a futex wake per write).
    gate: Arc<tokio::sync::Semaphore>,
    path: PathBuf,
    health: Arc<health::Health>,
}

impl Store {
    /// Opens (creating if needed) the database and applies migrations.
    /// Sessions left open by a previous run are closed as `daemon_restart`.
    /// The directory it creates is 0700 and the database 0600 whatever the
    /// umask (an existing database is made 0600 too): sessions and the
    /// audit are the operator's business only. `observers` hear of every
    /// write it is asked for.
    pub fn open(path: &Path, observers: Observers<dyn StoreObserver>) -> Result<Store, StoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            private_dir(dir).map_err(|source| StoreError::CreateDir {
                path: dir.to_path_buf(),
                source,
            })?;
        }
        private_file(path).map_err(|source| StoreError::Private {
            path: path.to_path_buf(),
            source,
        })?;
        let open_err = |source| StoreError::Open {
            path: path.to_path_buf(),
            source,
        };
        let mut conn = Connection::open(path).map_err(open_err)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(open_err)?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(open_err)?;
        conn.pragma_update(None, "foreign_keys", "ON")
            .map_err(open_err)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(open_err)?;
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(open_err)?;
        let known = MIGRATIONS.len() as i64;
        if version > known {
            return Err(StoreError::TooNew {
                path: path.to_path_buf(),
                found: version,
                known,
            });
        }
        for (i, sql) in MIGRATIONS
            .iter()
            .enumerate()
            .skip(usize::try_from(version).unwrap_or(0))
        {
            let tx = conn.transaction().map_err(open_err)?;
            tx.execute_batch(sql).map_err(open_err)?;
            tx.pragma_update(None, "user_version", i as i64 + 1)
                .map_err(open_err)?;
            tx.commit().map_err(open_err)?;
        }
        conn.execute(
            "UPDATE sessions SET ended_at_ms = ?1, end_reason = 'daemon_restart' WHERE ended_at_ms IS NULL",
            params![now_ms()],
        )
        .map_err(open_err)?;
        Ok(Store {
            conn: Arc::new(Mutex::new(conn)),
            observers,
            gate: Arc::new(tokio::sync::Semaphore::new(1)),
            path: path.to_path_buf(),
            health: Arc::default(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn observers(&self) -> impl Iterator<Item = &dyn StoreObserver> {
        self.observers.iter()
    }

    async fn with_conn<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, rusqlite::Error> + Send + 'static,
    ) -> Result<T, StoreError> {
        // Never closed; FIFO, so calls keep their order.
        let _turn = self
            .gate
            .acquire()
            .await
            .map_err(|e| StoreError::Task(e.to_string()))?;
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            // A panic while holding the lock poisons it; the connection itself
            // is still consistent (SQLite rolled back), so keep using it.
            let mut guard = conn.lock();
            f(&mut guard)
        })
        .await
        .map_err(|e| StoreError::Task(e.to_string()))?
        .map_err(StoreError::from)
    }

    /// [`Store::with_conn`] for a write, timed for the metrics (queueing included).
    async fn with_write<T: Send + 'static>(
        &self,
        kind: &'static str,
        f: impl FnOnce(&mut Connection) -> Result<T, rusqlite::Error> + Send + 'static,
    ) -> Result<T, StoreError> {
        let started = std::time::Instant::now();
        let result = self.with_conn(f).await;
        metrics::store_write(kind, started.elapsed());
        self.health.wrote(&result);
        result
    }

    /// Whether the store writes, for `/v1/status`.
    pub fn health(&self) -> StoreHealth {
        self.health.snapshot()
    }

    /// Caps the database at `mb` MiB (SQLite's `max_page_count`; 0: no cap
    /// but SQLite's own). A write that needs a page beyond it fails as on a
    /// full disk. A cap below the current size holds it at that size.
    pub async fn set_hard_cap_mb(&self, mb: u32) -> Result<(), StoreError> {
        let pages = self
            .with_conn(move |c| {
                let page_size: i64 = c.pragma_query_value(None, "page_size", |r| r.get(0))?;
                // SQLite's own ceiling when uncapped (its default max_page_count).
                let pages = if mb == 0 {
                    0xffff_fffe_i64
                } else {
                    (i64::from(mb) * 1024 * 1024 / page_size.max(512)).max(1)
                };
                c.pragma_update_and_check(None, "max_page_count", pages, |r| r.get::<_, i64>(0))
            })
            .await?;
        self.health.set_hard_cap_mb(mb);
        tracing::info!(
            hard_cap_mb = mb,
            max_page_count = pages,
            "store size cap set"
        );
        Ok(())
    }

    pub async fn session_started(&self, s: SessionRecord) -> Result<(), StoreError> {
        for observer in self.observers() {
            observer.session_started(&s);
        }
        self.with_write("session", move |c| {
            c.execute(
                "INSERT INTO sessions (id, host_id, environment_id, model, started_at_ms, briefing_version) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![s.id, s.host_id, s.environment_id, s.model, s.started_at_ms, s.briefing_version],
            )
            .map(drop)
        })
        .await
    }

    pub async fn session_ended(&self, id: String, reason: String) -> Result<(), StoreError> {
        for observer in self.observers() {
            observer.session_ended(&id, &reason);
        }
        self.with_write("session", move |c| {
            c.execute(
                "UPDATE sessions SET ended_at_ms = ?1, end_reason = ?2 WHERE id = ?3 AND ended_at_ms IS NULL",
                params![now_ms(), reason, id],
            )
            .map(drop)
        })
        .await
    }

    pub async fn turn_completed(&self, t: TurnRecord) -> Result<(), StoreError> {
        for observer in self.observers() {
            observer.turn_completed(&t);
        }
        self.with_write("turn", move |c| {
            c.execute(
                "INSERT INTO turns (session_id, seq, message_id, ai_mode, user_content, messages_json, stop_reason,
                    input_tokens, output_tokens, cache_read_tokens, cache_creation_tokens, started_at_ms, ended_at_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
                params![
                    t.session_id,
                    t.seq,
                    t.message_id,
                    t.ai_mode,
                    t.user_content,
                    t.messages.to_string(),
                    t.stop_reason,
                    t.input_tokens,
                    t.output_tokens,
                    t.cache_read_tokens,
                    t.cache_creation_tokens,
                    t.started_at_ms,
                    t.ended_at_ms
                ],
            )
            .map(drop)
        })
        .await
    }

    pub async fn feedback(
        &self,
        session_id: String,
        message_id: String,
        rating: String,
    ) -> Result<(), StoreError> {
        self.with_write("feedback", move |c| {
            c.execute(
                "INSERT INTO feedback (session_id, message_id, rating, created_at_ms) VALUES (?1, ?2, ?3, ?4)",
                params![session_id, message_id, rating, now_ms()],
            )
            .map(drop)
        })
        .await
    }

    /// Most recent sessions first.
    pub async fn sessions(
        &self,
        limit: u32,
        offset: u32,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        self.with_conn(move |c| {
            let mut stmt = c.prepare(
                "SELECT s.id, s.host_id, s.environment_id, s.model, s.started_at_ms, s.ended_at_ms, s.end_reason,
                        (SELECT COUNT(*) FROM turns t WHERE t.session_id = s.id), s.briefing_version
                 FROM sessions s ORDER BY s.started_at_ms DESC, s.rowid DESC LIMIT ?1 OFFSET ?2",
            )?;
            let rows = stmt.query_map(params![limit, offset], session_row)?;
            rows.collect()
        })
        .await
    }

    pub async fn session(
        &self,
        id: String,
    ) -> Result<Option<(SessionRecord, Vec<TurnRecord>)>, StoreError> {
        self.with_conn(move |c| {
            let session = c
                .query_row(
                    "SELECT s.id, s.host_id, s.environment_id, s.model, s.started_at_ms, s.ended_at_ms, s.end_reason,
                            (SELECT COUNT(*) FROM turns t WHERE t.session_id = s.id), s.briefing_version
                     FROM sessions s WHERE s.id = ?1",
                    params![id],
                    session_row,
                )
                .optional()?;
            let Some(session) = session else { return Ok(None) };
            let mut stmt = c.prepare(
                "SELECT session_id, seq, message_id, ai_mode, user_content, messages_json, stop_reason,
                        input_tokens, output_tokens, cache_read_tokens, cache_creation_tokens, started_at_ms, ended_at_ms
                 FROM turns WHERE session_id = ?1 ORDER BY seq",
            )?;
            let turns = stmt
                .query_map(params![id], |r| {
                    let messages: String = r.get(5)?;
                    Ok(TurnRecord {
                        session_id: r.get(0)?,
                        seq: r.get(1)?,
                        message_id: r.get(2)?,
                        ai_mode: r.get(3)?,
                        user_content: r.get(4)?,
                        messages: serde_json::from_str(&messages).unwrap_or(serde_json::Value::Null),
                        stop_reason: r.get(6)?,
                        input_tokens: r.get(7)?,
                        output_tokens: r.get(8)?,
                        cache_read_tokens: r.get(9)?,
                        cache_creation_tokens: r.get(10)?,
                        started_at_ms: r.get(11)?,
                        ended_at_ms: r.get(12)?,
                    })
                })?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Some((session, turns)))
        })
        .await
    }

    /// Appends one audit record.
    pub async fn audit(&self, r: AuditRecord) -> Result<(), StoreError> {
        for observer in self.observers() {
            observer.audit(&r);
        }
        self.with_write("audit", move |c| insert_audit(c, &r)).await
    }

    /// Writes the row of a PHYSICAL call before its command runs; its id,
    /// for [`Store::audit_finish`]. When this fails the command must not
    /// run: an action that cannot be audited does not happen. (The
    /// recording sees the row once, complete, from `audit_finish`.)
    pub async fn audit_begin(&self, r: AuditRecord) -> Result<i64, StoreError> {
        self.with_write("audit", move |c| {
            insert_audit(c, &r)?;
            Ok(c.last_insert_rowid())
        })
        .await
    }

    /// Completes the row `id` written by [`Store::audit_begin`] with the
    /// call's outcome (`r`'s fields replace the row's).
    pub async fn audit_finish(&self, id: i64, r: AuditRecord) -> Result<(), StoreError> {
        for observer in self.observers() {
            observer.audit(&r);
        }
        self.with_write("audit", move |c| {
            c.execute(
                "UPDATE audit SET at_ms = ?1, kind = ?2, session_id = ?3, tool_call_id = ?4, tool = ?5,
                    actuator = ?6, parameters = ?7, decision = ?8, result = ?9, error = ?10, origin = ?11,
                    started_at_ms = ?12, ended_at_ms = ?13, duration_ms = ?14, credential = ?15,
                    approved_by = ?16
                 WHERE id = ?17",
                params![
                    r.at_ms,
                    r.kind,
                    r.session_id,
                    r.tool_call_id,
                    r.tool,
                    r.actuator,
                    r.parameters.as_ref().map(ToString::to_string),
                    r.decision,
                    r.result,
                    r.error,
                    r.origin,
                    r.started_at_ms,
                    r.ended_at_ms,
                    r.duration_ms,
                    r.credential,
                    r.approved_by,
                    id
                ],
            )
            .map(drop)
        })
        .await
    }

    /// Audit records, oldest first, optionally since a time and for one session.
    pub async fn audit_records(
        &self,
        since_ms: Option<i64>,
        session_id: Option<String>,
        limit: u32,
    ) -> Result<Vec<AuditRecord>, StoreError> {
        self.audit_records_ordered(since_ms, session_id, limit, AuditOrder::OldestFirst)
            .await
    }

    /// Audit records in `order` (the `limit` keeps the first in that
    /// order), optionally since a time and for one session.
    pub async fn audit_records_ordered(
        &self,
        since_ms: Option<i64>,
        session_id: Option<String>,
        limit: u32,
        order: AuditOrder,
    ) -> Result<Vec<AuditRecord>, StoreError> {
        let direction = match order {
            AuditOrder::OldestFirst => "ASC",
            AuditOrder::NewestFirst => "DESC",
        };
        self.with_conn(move |c| {
            let mut stmt = c.prepare(&format!(
                "SELECT id, at_ms, kind, session_id, tool_call_id, tool, actuator, parameters, decision, result,
                        error, origin, started_at_ms, ended_at_ms, duration_ms, credential, approved_by
                 FROM audit WHERE at_ms >= ?1 AND (?2 IS NULL OR session_id = ?2)
                 ORDER BY id {direction} LIMIT ?3"
            ))?;
            let rows = stmt.query_map(params![since_ms.unwrap_or(0), session_id, limit], |r| {
                let parameters: Option<String> = r.get(7)?;
                Ok(AuditRecord {
                    id: r.get(0)?,
                    at_ms: r.get(1)?,
                    kind: r.get(2)?,
                    session_id: r.get(3)?,
                    tool_call_id: r.get(4)?,
                    tool: r.get(5)?,
                    actuator: r.get(6)?,
                    parameters: parameters.and_then(|p| serde_json::from_str(&p).ok()),
                    decision: r.get(8)?,
                    result: r.get(9)?,
                    error: r.get(10)?,
                    origin: r.get(11)?,
                    started_at_ms: r.get(12)?,
                    ended_at_ms: r.get(13)?,
                    duration_ms: r.get(14)?,
                    credential: r.get(15)?,
                    approved_by: r.get(16)?,
                })
            })?;
            rows.collect()
        })
        .await
    }

    pub async fn feedback_count(&self, session_id: String) -> Result<u32, StoreError> {
        self.with_conn(move |c| {
            c.query_row(
                "SELECT COUNT(*) FROM feedback WHERE session_id = ?1",
                params![session_id],
                |r| r.get(0),
            )
        })
        .await
    }
}

fn insert_audit(c: &Connection, r: &AuditRecord) -> Result<(), rusqlite::Error> {
    c.execute(
        "INSERT INTO audit (at_ms, kind, session_id, tool_call_id, tool, actuator, parameters, decision,
            result, error, origin, started_at_ms, ended_at_ms, duration_ms, credential, approved_by)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
        params![
            r.at_ms,
            r.kind,
            r.session_id,
            r.tool_call_id,
            r.tool,
            r.actuator,
            r.parameters.as_ref().map(ToString::to_string),
            r.decision,
            r.result,
            r.error,
            r.origin,
            r.started_at_ms,
            r.ended_at_ms,
            r.duration_ms,
            r.credential,
            r.approved_by
        ],
    )
    .map(drop)
}

/// Creates `dir` (and its missing parents) when it does not exist; the
/// directory itself gets mode 0700 whatever the umask.
fn private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

/// Creates the database file with mode 0600 before SQLite opens it (SQLite
/// gives its -wal and -shm files the database's mode), and makes an
/// existing one 0600.
fn private_file(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)?;
    let mode = std::fs::metadata(path)?.permissions().mode() & 0o777;
    if mode != 0o600 {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(())
}

fn session_row(r: &rusqlite::Row<'_>) -> Result<SessionRecord, rusqlite::Error> {
    Ok(SessionRecord {
        id: r.get(0)?,
        host_id: r.get(1)?,
        environment_id: r.get(2)?,
        model: r.get(3)?,
        started_at_ms: r.get(4)?,
        ended_at_ms: r.get(5)?,
        end_reason: r.get(6)?,
        turns: r.get(7)?,
        briefing_version: r.get(8)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str) -> SessionRecord {
        SessionRecord {
            id: id.into(),
            host_id: "h".into(),
            environment_id: "e".into(),
            model: "local".into(),
            started_at_ms: now_ms(),
            ended_at_ms: None,
            end_reason: None,
            turns: 0,
            briefing_version: None,
        }
    }

    #[tokio::test]
    async fn migrates_in_wal_mode_and_closes_sessions_left_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested/rozd.db");
        let store = Store::open(&path, Default::default()).unwrap();
        store.session_started(record("s1")).await.unwrap();
        let mode: String = store
            .conn
            .lock()
            .pragma_query_value(None, "journal_mode", |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        drop(store);
        let store = Store::open(&path, Default::default()).unwrap();
        let (s, turns) = store.session("s1".into()).await.unwrap().unwrap();
        assert_eq!(s.end_reason.as_deref(), Some("daemon_restart"));
        assert!(turns.is_empty());
        let version: i64 = store
            .conn
            .lock()
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(version, MIGRATIONS.len() as i64);
    }

    #[tokio::test]
    async fn a_full_store_refuses_the_audit_row_and_writes_again_when_the_cap_is_raised() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("rozd.db"), Default::default()).unwrap();
        store.set_hard_cap_mb(1).await.unwrap();
        let big = "x".repeat(64 * 1024);
        let mut full = None;
        for i in 0..64 {
            let record = AuditRecord {
                kind: AuditKind::ToolCall,
                tool: Some(format!("fill {i}")),
                result: Some(big.clone()),
                ..Default::default()
            };
            if let Err(e) = store.audit_begin(record).await {
                full = Some(e);
                break;
            }
        }
        let full = full.expect("a 1 MiB store fills up");
        assert!(full.to_string().contains("full"), "{full}");
        let health = store.health();
        assert!(!health.writable && health.hard_cap_mb == 1);
        assert!(health.last_error.unwrap().contains("full"));
        // Reads still work.
        assert!(
            !store
                .audit_records(None, None, 10)
                .await
                .unwrap()
                .is_empty()
        );
        store.set_hard_cap_mb(0).await.unwrap();
        let id = store.audit_begin(AuditRecord::default()).await.unwrap();
        store
            .audit_finish(
                id,
                AuditRecord {
                    kind: AuditKind::ToolCall,
                    result: Some("done".into()),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert!(store.health().writable);
        let rows = store.audit_records(None, None, 1000).await.unwrap();
        let last = rows.last().unwrap();
        assert_eq!((last.id, last.result.as_deref()), (id, Some("done")));
    }

    /// Every kind is stored as its spelling and read back as itself; a
    /// kind this version does not know (another version's row) reads as
    /// written instead of failing the read.
    #[tokio::test]
    async fn audit_kinds_are_stored_as_their_spelling_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rozd.db");
        let store = Store::open(&path, Default::default()).unwrap();
        let kinds = AuditKind::KNOWN;
        for kind in kinds {
            let record = AuditRecord {
                kind: kind.clone(),
                ..Default::default()
            };
            store.audit(record).await.unwrap();
        }
        store
            .with_write("audit", |c| {
                c.execute(
                    "INSERT INTO audit (at_ms, kind) VALUES (1, 'from_a_later_rozd')",
                    [],
                )
                .map(drop)
            })
            .await
            .unwrap();
        let rows = store.audit_records(None, None, 100).await.unwrap();
        let read: Vec<AuditKind> = rows.iter().map(|r| r.kind.clone()).collect();
        let mut expected = kinds.to_vec();
        expected.push(AuditKind::Other("from_a_later_rozd".into()));
        assert_eq!(read, expected);
        let spelled: Vec<String> = rows
            .iter()
            .map(|r| {
                serde_json::to_value(r).unwrap()["kind"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect();
        assert_eq!(
            spelled,
            [
                "tool_call",
                "actuator",
                "feedback",
                "approval",
                "protective_stop",
                "protective_stop_cleared",
                "protective_stop_clear_refused",
                "protective_stop_restored",
                "protective_stop_reason",
                "from_a_later_rozd"
            ]
        );
        let raw: Vec<String> = store
            .with_conn(|c| {
                let mut stmt = c.prepare("SELECT kind FROM audit ORDER BY id")?;
                let rows = stmt.query_map([], |r| r.get(0))?;
                rows.collect()
            })
            .await
            .unwrap();
        assert_eq!(raw, spelled);
    }

    /// Every decision is stored as its spelling (the words audit rows have
    /// always carried) and read back as itself; a word this version does
    /// not write reads as written, and a row without one reads as none.
    #[tokio::test]
    async fn decisions_are_stored_as_their_spelling_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("rozd.db"), Default::default()).unwrap();
        for decision in Decision::KNOWN {
            let record = AuditRecord {
                decision: Some(decision.clone()),
                ..Default::default()
            };
            store.audit(record).await.unwrap();
        }
        store
            .with_write("audit", |c| {
                c.execute(
                    "INSERT INTO audit (at_ms, kind, decision) VALUES (1, 'tool_call', 'escalated')",
                    [],
                )?;
                c.execute("INSERT INTO audit (at_ms, kind) VALUES (2, 'actuator')", [])
                    .map(drop)
            })
            .await
            .unwrap();
        let rows = store.audit_records(None, None, 100).await.unwrap();
        let read: Vec<Option<Decision>> = rows.iter().map(|r| r.decision.clone()).collect();
        let mut expected: Vec<_> = Decision::KNOWN.iter().cloned().map(Some).collect();
        expected.extend([Some(Decision::Other("escalated".into())), None]);
        assert_eq!(read, expected);
        let raw: Vec<Option<String>> = store
            .with_conn(|c| {
                let mut stmt = c.prepare("SELECT decision FROM audit ORDER BY id")?;
                let rows = stmt.query_map([], |r| r.get(0))?;
                rows.collect()
            })
            .await
            .unwrap();
        let served: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| serde_json::to_value(r).unwrap()["decision"].clone())
            .collect();
        let words = [
            "allowed",
            "approved",
            "denied",
            "blocked",
            "refused",
            "escalated",
        ];
        let mut spelled: Vec<Option<String>> = words.iter().map(|w| Some(w.to_string())).collect();
        spelled.push(None);
        assert_eq!(raw, spelled);
        let mut json: Vec<serde_json::Value> = words.iter().map(|w| serde_json::json!(w)).collect();
        json.push(serde_json::Value::Null);
        assert_eq!(served, json);
    }

    /// A store written before `approved_by` existed (schema 4) opens, its
    /// rows read with `approved_by` null, and new rows carry it.
    #[tokio::test]
    async fn an_audit_row_from_before_approved_by_reads_and_new_ones_carry_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rozd.db");
        {
            let conn = Connection::open(&path).unwrap();
            for sql in &MIGRATIONS[..4] {
                conn.execute_batch(sql).unwrap();
            }
            conn.pragma_update(None, "user_version", 4).unwrap();
            conn.execute(
                "INSERT INTO audit (at_ms, kind, tool, decision, credential)
                 VALUES (1, 'tool_call', 'arm', 'approved', 'alice')",
                [],
            )
            .unwrap();
        }
        let store = Store::open(&path, Default::default()).unwrap();
        store
            .audit(AuditRecord {
                at_ms: 2,
                kind: AuditKind::ToolCall,
                decision: Some(Decision::Approved),
                credential: Some("alice".into()),
                approved_by: Some("bob".into()),
                ..Default::default()
            })
            .await
            .unwrap();
        let rows = store.audit_records(None, None, 10).await.unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(
            (
                rows[0].credential.as_deref(),
                rows[0].approved_by.as_deref()
            ),
            (Some("alice"), None)
        );
        assert_eq!(rows[1].approved_by.as_deref(), Some("bob"));
    }

    /// `GET /v1/audit?order=desc` reads the newest rows first, so a
    /// `limit` keeps the latest (issue 35, item 16); since and session
    /// still filter.
    #[tokio::test]
    async fn audit_records_newest_first_keep_the_latest_rows() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("rozd.db"), Default::default()).unwrap();
        for at_ms in 1..=5 {
            store
                .audit(AuditRecord {
                    at_ms,
                    kind: AuditKind::Actuator,
                    session_id: Some(if at_ms % 2 == 0 { "even" } else { "odd" }.into()),
                    ..Default::default()
                })
                .await
                .unwrap();
        }
        let at = |rows: Vec<AuditRecord>| rows.iter().map(|r| r.at_ms).collect::<Vec<_>>();
        let newest = store
            .audit_records_ordered(None, None, 3, AuditOrder::NewestFirst)
            .await
            .unwrap();
        assert_eq!(at(newest), vec![5, 4, 3]);
        let oldest = store
            .audit_records_ordered(None, None, 3, AuditOrder::OldestFirst)
            .await
            .unwrap();
        assert_eq!(at(oldest), vec![1, 2, 3]);
        let odd = store
            .audit_records_ordered(Some(2), Some("odd".into()), 10, AuditOrder::NewestFirst)
            .await
            .unwrap();
        assert_eq!(at(odd), vec![5, 3]);
    }

    #[test]
    fn refuses_a_newer_schema() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rozd.db");
        let conn = Connection::open(&path).unwrap();
        conn.pragma_update(None, "user_version", 99).unwrap();
        drop(conn);
        assert!(matches!(
            Store::open(&path, Default::default()),
            Err(StoreError::TooNew { found: 99, .. })
        ));
    }
}
