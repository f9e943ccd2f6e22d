//! JPEG files from a directory as a camera: played in name order at the
//! camera's rate, looping (demos, and tests that need known images). The
//! directory is listed again at every loop, so files can come and go; a
//! directory without JPEGs leaves the camera `disconnected`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::Camera;
use super::config::Source;
use super::health::Rejection;
use super::jpeg::FrameError;

pub(super) fn run(camera: Arc<Camera>, shutdown: CancellationToken) {
    let Source::Files { directory, every } = camera.spec.source.clone() else {
        return;
    };
    let mut queue: Vec<PathBuf> = Vec::new();
    let mut next = Instant::now();
    while !shutdown.is_cancelled() {
        if queue.is_empty() {
            queue = list(&directory);
            queue.reverse();
        }
        match queue.pop() {
            None => camera.link_down(format!("no .jpg files in {}", directory.display())),
            Some(path) => {
                let max = camera.spec.max_frame_bytes;
                match std::fs::metadata(&path).map(|m| m.len()) {
                    Ok(n) if n > max as u64 => camera.reject(
                        FrameError::new(
                            Rejection::Oversized,
                            format!("{} has {n} bytes, more than max_frame_kb", path.display()),
                        ),
                        Instant::now(),
                    ),
                    Ok(_) => match std::fs::read(&path) {
                        Ok(data) => camera.offer(data.into(), Instant::now()),
                        Err(e) => camera.link_down(format!("{}: {e}", path.display())),
                    },
                    Err(e) => camera.link_down(format!("{}: {e}", path.display())),
                }
            }
        }
        next += every;
        let now = Instant::now();
        if next < now {
            next = now;
        }
        while Instant::now() < next && !shutdown.is_cancelled() {
            std::thread::sleep(
                next.saturating_duration_since(Instant::now())
                    .min(Duration::from_millis(100)),
            );
        }
    }
}

/// The `.jpg` / `.jpeg` files of `directory`, in name order.
fn list(directory: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(directory) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.is_file()
                && p.extension().and_then(|e| e.to_str()).is_some_and(|e| {
                    e.eq_ignore_ascii_case("jpg") || e.eq_ignore_ascii_case("jpeg")
                })
        })
        .collect();
    files.sort();
    files
}
