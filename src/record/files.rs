//! The recordings directory: file names, the listing, a name from a request
//! resolved safely, the retention cap, and the recovery of a file that a
//! crash left unfinished. Used by the writer, the REST routes and the CLI.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::Serialize;

use super::read;

/// Every recording ends with this.
pub const EXTENSION: &str = "mcap";
/// A recovery's output before it replaces the file it recovers.
const RECOVERING: &str = "recovering";

#[derive(Debug, thiserror::Error)]
pub enum FilesError {
    #[error(
        "{0:?} is not a recording name (letters, digits, '-', '_', '.', ending in .mcap; no path)"
    )]
    BadName(String),
    #[error("no recording named {0:?}")]
    NotFound(String),
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Read(#[from] read::ReadError),
    #[error("{path}: cannot write the recovered file: {message}")]
    Recover { path: String, message: String },
    #[error("moved aside as {path}: {why}")]
    MovedAside {
        path: String,
        #[source]
        why: read::ReadError,
    },
}

/// Creates `dir` (and its parents) mode 0700 if missing: recordings hold
/// the audit and the sessions' conversations, the operator's business only.
pub fn private_dir(dir: &Path) -> Result<(), FilesError> {
    use std::os::unix::fs::DirBuilderExt as _;
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io(dir))
}

/// Creates (truncating) a recording file, mode 0600.
pub fn create_private(path: &Path) -> Result<std::fs::File, FilesError> {
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(io(path))
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> FilesError + '_ {
    move |source| FilesError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// `<host>-<YYYYMMDD>T<HHMMSS>.<mmm>Z.mcap`, in UTC, so names sort by time.
pub fn file_name(host_id: &str, at: SystemTime) -> String {
    let at: chrono::DateTime<chrono::Utc> = at.into();
    format!("{host_id}-{}.{EXTENSION}", at.format("%Y%m%dT%H%M%S%.3fZ"))
}

/// Whether `name` may name a recording: one path component of safe
/// characters ending in `.mcap` (so no `..`, no `/`, no hidden file).
pub fn valid_name(name: &str) -> bool {
    name.len() <= 255
        && name.ends_with(&format!(".{EXTENSION}"))
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && !name.contains("..")
}

/// The path of the recording `name` in `dir`, if the name is valid and the
/// file exists (a symlink out of the directory is not followed).
pub fn resolve(dir: &Path, name: &str) -> Result<PathBuf, FilesError> {
    if !valid_name(name) {
        return Err(FilesError::BadName(name.to_string()));
    }
    let path = dir.join(name);
    match std::fs::symlink_metadata(&path) {
        Ok(meta) if meta.is_file() => Ok(path),
        Ok(_) => Err(FilesError::NotFound(name.to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(FilesError::NotFound(name.to_string()))
        }
        Err(e) => Err(io(&path)(e)),
    }
}

/// One recording as listed.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Listed {
    pub name: String,
    pub bytes: u64,
    pub modified_unix_ms: i64,
    /// `recording` (being written now), `finished`, or `unfinished` (cut
    /// short and not recovered yet).
    pub state: &'static str,
}

/// Every recording in `dir`, oldest first; `active`: the file being written.
pub fn list(dir: &Path, active: Option<&str>) -> Result<Vec<Listed>, FilesError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(dir)(e)),
    };
    let mut listed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !valid_name(&name) {
            continue;
        }
        let Ok(meta) = entry.metadata() else { continue };
        if !meta.is_file() {
            continue;
        }
        let state = if active == Some(name.as_str()) {
            "recording"
        } else if ends_finished(&entry.path(), meta.len()) {
            "finished"
        } else {
            "unfinished"
        };
        let modified_unix_ms = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        listed.push(Listed {
            name,
            bytes: meta.len(),
            modified_unix_ms,
            state,
        });
    }
    // Names start with the host and the UTC time: they sort by time.
    listed.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(listed)
}

/// Whether the file ends with the MCAP magic (its last 8 bytes only).
fn ends_finished(path: &Path, len: u64) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    let magic = read::MAGIC.len() as u64;
    if len < 2 * magic {
        return false;
    }
    let mut tail = [0u8; 8];
    std::fs::File::open(path)
        .and_then(|mut f| {
            f.seek(SeekFrom::End(-8))?;
            f.read_exact(&mut tail)
        })
        .is_ok()
        && tail == read::MAGIC
}

/// Deletes the oldest finished recordings while there are more than
/// `max_files` (0: no cap) or they hold more than `max_bytes` (0: no cap);
/// never `active`. Returns the names deleted.
pub fn apply_retention(
    dir: &Path,
    active: Option<&str>,
    max_bytes: u64,
    max_files: u32,
) -> Result<Vec<String>, FilesError> {
    let finished: Vec<Listed> = list(dir, active)?
        .into_iter()
        .filter(|l| l.state != "recording")
        .collect();
    let mut total: u64 = finished.iter().map(|l| l.bytes).sum();
    let mut count = finished.len();
    let mut deleted = Vec::new();
    for oldest in finished {
        let over_count = max_files != 0 && count > max_files as usize;
        let over_bytes = max_bytes != 0 && total > max_bytes;
        if !(over_count || over_bytes) {
            break;
        }
        let path = dir.join(&oldest.name);
        std::fs::remove_file(&path).map_err(io(&path))?;
        total -= oldest.bytes;
        count -= 1;
        deleted.push(oldest.name);
    }
    Ok(deleted)
}

/// What a recovery did to one file.
#[derive(Debug, Clone, PartialEq)]
pub struct Recovered {
    pub name: String,
    pub messages: usize,
    /// Why the original broke off, if it did.
    pub broken_off: Option<String>,
}

/// Rewrites every unfinished recording in `dir` (a crash or `kill -9` cut
/// it short) as a finished file under the same name: the messages of its
/// complete chunks, with a summary and an index. The rewrite goes to a
/// temporary file first and replaces the original only once it is whole.
pub fn recover_all(dir: &Path, library: &str) -> Vec<Result<Recovered, FilesError>> {
    let listed = match list(dir, None) {
        Ok(listed) => listed,
        Err(e) => return vec![Err(e)],
    };
    // A recovery's temporary file left by a crash during recovery: the
    // original is still there, so it goes.
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().ends_with(RECOVERING) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
    listed
        .into_iter()
        .filter(|l| l.state == "unfinished")
        .map(|l| {
            let path = dir.join(&l.name);
            recover(&path, library).map_err(|e| match e {
                FilesError::Read(why) => move_aside(&path, why),
                other => other,
            })
        })
        .collect()
}

/// What cannot be read as a recording at all is renamed `<name>.corrupt`
/// (kept for inspection, out of the listings, never read again); the error
/// says so.
fn move_aside(path: &Path, why: read::ReadError) -> FilesError {
    let mut aside = path.as_os_str().to_owned();
    aside.push(CORRUPT);
    let aside = PathBuf::from(aside);
    match std::fs::rename(path, &aside) {
        Ok(()) => FilesError::MovedAside {
            path: aside.display().to_string(),
            why,
        },
        Err(e) => FilesError::Read(read::ReadError::Corrupt {
            path: path.display().to_string(),
            why: format!("{why}; and it cannot be moved aside: {e}"),
        }),
    }
}

/// The suffix of a recording moved aside as unreadable.
pub const CORRUPT: &str = ".corrupt";

/// Rewrites one unfinished file in place (see [`recover_all`]).
pub fn recover(path: &Path, library: &str) -> Result<Recovered, FilesError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let bytes = read::read_file(path)?;
    let scan = read::scan(path, &bytes)?;
    let temp = path.with_extension(format!("{EXTENSION}.{RECOVERING}"));
    let failed = |message: String| FilesError::Recover {
        path: path.display().to_string(),
        message,
    };
    let file = create_private(&temp)?;
    let mut writer = mcap::WriteOptions::new()
        .compression(None)
        .library(library)
        .create(std::io::BufWriter::new(file))
        .map_err(|e| failed(e.to_string()))?;
    for message in &scan.messages {
        writer.write(message).map_err(|e| failed(e.to_string()))?;
    }
    let mut metadata = std::collections::BTreeMap::new();
    metadata.insert("recovered_messages".into(), scan.messages.len().to_string());
    if let Some(why) = &scan.broken_off {
        metadata.insert("broken_off".into(), why.clone());
    }
    writer
        .write_metadata(&mcap::records::Metadata {
            name: "rozd.recovered".into(),
            metadata,
        })
        .map_err(|e| failed(e.to_string()))?;
    writer.finish().map_err(|e| failed(e.to_string()))?;
    let file = writer
        .into_inner()
        .into_inner()
        .map_err(|e| failed(e.to_string()))?;
    file.sync_all().map_err(io(&temp))?;
    std::fs::rename(&temp, path).map_err(io(path))?;
    Ok(Recovered {
        name,
        messages: scan.messages.len(),
        broken_off: scan.broken_off,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_sort_by_time_and_are_valid() {
        let at = SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(1_796_256_000_123);
        let name = file_name("sim-rover", at);
        assert_eq!(name, "sim-rover-20261203T000000.123Z.mcap");
        assert!(valid_name(&name));
        let later = file_name("sim-rover", at + std::time::Duration::from_secs(86_399));
        assert!(later > name);
    }

    #[test]
    fn traversal_and_odd_names_are_refused() {
        for bad in [
            "../rozd.db",
            "..%2Frozd.db",
            "a/b.mcap",
            ".hidden.mcap",
            "x.mcap/..",
            "rozd.db",
            "a..mcap",
            "",
            "/etc/passwd.mcap",
        ] {
            assert!(!valid_name(bad), "{bad}");
        }
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(
            resolve(dir.path(), "../x.mcap"),
            Err(FilesError::BadName(_))
        ));
        assert!(matches!(
            resolve(dir.path(), "missing.mcap"),
            Err(FilesError::NotFound(_))
        ));
    }

    #[test]
    fn retention_deletes_the_oldest_finished_files_first() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        for name in ["h-1.mcap", "h-2.mcap", "h-3.mcap", "h-4.mcap"] {
            std::fs::write(dir.path().join(name), [0u8; 100]).unwrap_or_else(|e| panic!("{e}"));
        }
        // The active file is never deleted, even when it is the oldest.
        let deleted =
            apply_retention(dir.path(), Some("h-1.mcap"), 0, 2).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(deleted, vec!["h-2.mcap".to_string()]);
        let deleted = apply_retention(dir.path(), None, 150, 0).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            deleted,
            vec!["h-1.mcap".to_string(), "h-3.mcap".to_string()]
        );
    }
}
