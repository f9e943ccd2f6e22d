//! The stop file: the protective stop's causes on disk, beside the store
//! (`<store path>-stop.json`, as SQLite keeps `-wal` beside its database).
//!
//! A file of its own rather than a table: a stop must not queue behind the
//! store's writers, and the file is small enough to rewrite whole on every
//! change (write a temporary file, fsync it, rename it over the old one,
//! fsync the directory). A stop or a clear is answered once its state is on
//! disk (bounded by [`DURABLE_WITHIN`]); the latch and the actuators never
//! wait for the disk.

use parking_lot::Mutex;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::StopInfo;

/// How long a stop or a clear waits for its state to reach the disk before
/// it answers anyway (and reports that it was not persisted).
pub(crate) const DURABLE_WITHIN: Duration = Duration::from_secs(2);
/// The file's format version.
const VERSION: u32 = 1;
/// A stop file larger than this is not one of ours.
const MAX_FILE_BYTES: u64 = 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a protective-stop file: {why}")]
    Corrupt { path: PathBuf, why: String },
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct OnDisk {
    version: u32,
    /// Empty: not latched.
    causes: Vec<StopInfo>,
    written_at_unix_ms: i64,
}

/// The stop file and its writer. Cheap to clone.
#[derive(Debug, Clone)]
pub struct StopFile {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    path: PathBuf,
    /// The latest generation written; writers take it in turn.
    written: Mutex<u64>,
    durable: watch::Sender<u64>,
    failed: AtomicBool,
}

impl StopFile {
    pub fn new(path: PathBuf) -> StopFile {
        StopFile {
            shared: Arc::new(Shared {
                path,
                written: Mutex::new(0),
                durable: watch::Sender::new(0),
                failed: AtomicBool::new(false),
            }),
        }
    }

    /// The stop file that belongs to the store at `store_path`.
    pub fn beside_store(store_path: &Path) -> StopFile {
        let mut name = store_path.as_os_str().to_owned();
        name.push("-stop.json");
        StopFile::new(PathBuf::from(name))
    }

    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// The causes on disk; none if there is no file yet (a new install).
    pub fn load(&self) -> Result<Vec<StopInfo>, PersistError> {
        let path = &self.shared.path;
        let io = |source| PersistError::Io {
            path: path.clone(),
            source,
        };
        // Only no file at all is a fresh install (not latched). Anything
        // else must be a plain file that reads as a valid state: a symlink
        // (dangling or not), a FIFO (which would hang start-up), a
        // directory or a device is corrupt, and the caller latches.
        let corrupt = |why: &str| PersistError::Corrupt {
            path: path.clone(),
            why: why.to_string(),
        };
        match std::fs::symlink_metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io(e)),
            Ok(meta) if meta.file_type().is_symlink() => {
                return Err(corrupt("it is a symbolic link, not the file rozd writes"));
            }
            Ok(meta) if !meta.file_type().is_file() => {
                return Err(corrupt("it is not a regular file"));
            }
            Ok(_) => {}
        }
        // O_NOFOLLOW and O_NONBLOCK: a file swapped for a link or a FIFO
        // after the check above fails here instead of being followed or
        // waited on.
        let file = {
            use std::os::unix::fs::OpenOptionsExt as _;
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                .open(path)
                .map_err(io)?
        };
        if !file.metadata().map_err(io)?.file_type().is_file() {
            return Err(corrupt("it is not a regular file"));
        }
        let mut text = Vec::new();
        std::io::Read::read_to_end(
            &mut std::io::Read::take(file, MAX_FILE_BYTES + 1),
            &mut text,
        )
        .map_err(io)?;
        if text.len() as u64 > MAX_FILE_BYTES {
            return Err(PersistError::Corrupt {
                path: path.clone(),
                why: format!("larger than {MAX_FILE_BYTES} bytes"),
            });
        }
        let on_disk: OnDisk = serde_json::from_slice(&text).map_err(|e| PersistError::Corrupt {
            path: path.clone(),
            why: e.to_string(),
        })?;
        if on_disk.version != VERSION {
            return Err(PersistError::Corrupt {
                path: path.clone(),
                why: format!("version {} (this rozd writes {VERSION})", on_disk.version),
            });
        }
        Ok(on_disk.causes)
    }

    /// Writes `causes` now, on this thread (start-up).
    pub fn write_now(&self, causes: &[StopInfo]) -> Result<(), PersistError> {
        let result = write_atomically(&self.shared.path, causes);
        self.shared.failed.store(result.is_err(), Ordering::Release);
        result
    }

    /// Writes `causes` as the state of `generation`, beside the caller (on
    /// tokio's blocking pool when there is a runtime). An older generation
    /// than one already written is skipped.
    pub(super) fn save(&self, generation: u64, causes: Vec<StopInfo>) {
        let shared = self.shared.clone();
        let job = move || {
            let mut written = shared.written.lock();
            if generation <= *written {
                return;
            }
            match write_atomically(&shared.path, &causes) {
                Ok(()) => {
                    *written = generation;
                    shared.failed.store(false, Ordering::Release);
                    shared.durable.send_if_modified(|d| {
                        let newer = generation > *d;
                        if newer {
                            *d = generation;
                        }
                        newer
                    });
                }
                Err(e) => {
                    shared.failed.store(true, Ordering::Release);
                    tracing::error!(error = %e, "cannot write the protective-stop file; the stop holds in memory but would not survive a restart");
                }
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn_blocking(job);
            }
            Err(_) => job(),
        }
    }

    /// Waits until `generation` (or a later one) is on disk, at most
    /// [`DURABLE_WITHIN`].
    pub(super) async fn durable(&self, generation: u64) -> bool {
        let mut rx = self.shared.durable.subscribe();
        tokio::time::timeout(DURABLE_WITHIN, rx.wait_for(|d| *d >= generation))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    pub(super) fn failed(&self) -> bool {
        self.shared.failed.load(Ordering::Acquire)
    }
}

fn write_atomically(path: &Path, causes: &[StopInfo]) -> Result<(), PersistError> {
    let io = |source| PersistError::Io {
        path: path.to_path_buf(),
        source,
    };
    let body = serde_json::to_vec_pretty(&OnDisk {
        version: VERSION,
        causes: causes.to_vec(),
        written_at_unix_ms: crate::clock::now_ms(),
    })
    .map_err(|e| io(std::io::Error::other(e)))?;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io)?;
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(".tmp");
    let tmp = PathBuf::from(tmp_name);
    {
        let mut file = std::fs::File::create(&tmp).map_err(io)?;
        file.write_all(&body).map_err(io)?;
        file.sync_all().map_err(io)?;
    }
    std::fs::rename(&tmp, path).map_err(io)?;
    // The rename itself must reach the disk too.
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cause(source: &str) -> StopInfo {
        StopInfo {
            source: source.into(),
            reason: "r".into(),
            since_unix_ms: 1,
            by: None,
        }
    }

    #[test]
    fn round_trip_missing_and_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let file = StopFile::beside_store(&dir.path().join("rozd.db"));
        assert!(file.path().ends_with("rozd.db-stop.json"));
        assert_eq!(file.load().unwrap(), Vec::new(), "no file: not latched");
        file.write_now(&[cause("rest"), cause("fleet")]).unwrap();
        assert_eq!(file.load().unwrap(), [cause("rest"), cause("fleet")]);
        for bad in [
            &b"{"[..],
            b"[]",
            br#"{"version":2,"causes":[],"written_at_unix_ms":0}"#,
        ] {
            std::fs::write(file.path(), bad).unwrap();
            assert!(matches!(file.load(), Err(PersistError::Corrupt { .. })));
        }
    }

    #[test]
    fn a_restored_latch_comes_back_with_its_causes_and_an_unreadable_file_latches() {
        let dir = tempfile::tempdir().unwrap();
        let file = StopFile::beside_store(&dir.path().join("rozd.db"));
        file.write_now(&[cause("rest")]).unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let observers =
            crate::observe::Observers::new(vec![
                std::sync::Arc::new(super::super::StopEventChannel(tx))
                    as std::sync::Arc<dyn super::super::StopObserver>,
            ]);
        let stop = super::super::ProtectiveStop::restore(file.clone(), observers);
        assert_eq!(stop.state().causes, [cause("rest")]);
        assert_eq!(
            rx.try_recv().unwrap(),
            super::super::StopEvent::Restored {
                causes: vec![cause("rest")]
            }
        );
        // Without a runtime the write happens inline.
        assert_eq!(
            stop.clear_now(super::super::ClearRequest::all("operator")),
            Ok(true)
        );
        assert_eq!(file.load().unwrap(), Vec::new());

        std::fs::write(file.path(), b"garbage").unwrap();
        let stop = super::super::ProtectiveStop::restore(file, Default::default());
        assert_eq!(stop.active().unwrap().source, "restore");
    }
}
