//! `rozd record list` and `rozd record info FILE`: the recordings on this
//! machine, read from the directory and the files themselves (no daemon
//! needed; the daemon serves the same over `GET /v1/recordings`).

use std::path::Path;

use crate::record::files;
use crate::record::read::{self, FileInfo};

/// Exit status when the directory or the file cannot be read.
pub const EXIT_UNREADABLE: u8 = 1;

/// Prints every recording in `dir`, oldest first.
pub fn list(dir: &Path, json: bool) -> u8 {
    let listed = match files::list(dir, None) {
        Ok(listed) => listed,
        Err(e) => {
            eprintln!("rozd: {}", super::error_chain(&e));
            return EXIT_UNREADABLE;
        }
    };
    if json {
        println!(
            "{}",
            serde_json::json!({ "directory": dir.display().to_string(), "data": listed })
        );
        return 0;
    }
    if listed.is_empty() {
        println!("no recordings in {}", dir.display());
        return 0;
    }
    println!("{:<48} {:>12}  state", "name", "bytes");
    for l in &listed {
        // Without the daemon's word the file being written shows as
        // unfinished: it has no summary yet.
        println!("{:<48} {:>12}  {}", l.name, l.bytes, l.state);
    }
    0
}

/// Prints a file's channels, message counts and time range.
pub fn info(file: &Path, json: bool) -> u8 {
    let info = match read::info(file) {
        Ok(info) => info,
        Err(e) => {
            eprintln!("rozd: {}", super::error_chain(&e));
            return EXIT_UNREADABLE;
        }
    };
    if json {
        println!("{}", serde_json::json!(info));
    } else {
        print!("{}", describe(file, &info));
    }
    0
}

/// The human-readable form of [`info`].
pub fn describe(file: &Path, info: &FileInfo) -> String {
    let time = |ns: Option<u64>| {
        ns.and_then(|ns| i64::try_from(ns).ok())
            .map(chrono::DateTime::from_timestamp_nanos)
            .map_or_else(
                || "-".to_string(),
                |t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            )
    };
    let duration = match (info.start_unix_ns, info.end_unix_ns) {
        (Some(a), Some(b)) => format!("{:.3} s", (b - a) as f64 / 1e9),
        _ => "-".to_string(),
    };
    let mut out = format!(
        "file:      {}\nstate:     {}\nmessages:  {}\nstart:     {}\nend:       {}\nduration:  {}\n",
        file.display(),
        if info.finished {
            "finished (summary and index present)"
        } else {
            "unfinished (cut short; the messages of its complete chunks are shown)"
        },
        info.messages,
        time(info.start_unix_ns),
        time(info.end_unix_ns),
        duration,
    );
    if let Some(why) = &info.broken_off {
        out.push_str(&format!("broke off: {why}\n"));
    }
    out.push_str("channels:\n");
    for (topic, channel) in &info.channels {
        out.push_str(&format!(
            "  {:<32} {:>8} messages  {} ({})\n",
            topic,
            channel.messages,
            channel.schema.as_deref().unwrap_or("no schema"),
            channel.message_encoding
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `rozd record info` gives the times as RFC 3339 (UTC, milliseconds),
    /// not as Unix seconds (issue 35, item 16).
    #[test]
    fn record_info_prints_times_as_rfc3339() {
        let info = FileInfo {
            finished: true,
            messages: 3,
            start_unix_ns: Some(1_764_979_200_123_000_000),
            end_unix_ns: Some(1_764_979_262_623_000_000),
            channels: Default::default(),
            broken_off: None,
        };
        let text = describe(Path::new("a.mcap"), &info);
        assert!(
            text.contains("start:     2025-12-06T00:00:00.123Z\n"),
            "{text}"
        );
        assert!(
            text.contains("end:       2025-12-06T00:01:02.623Z\n"),
            "{text}"
        );
        assert!(text.contains("duration:  62.500 s\n"), "{text}");
        assert!(!text.contains("Unix seconds"), "{text}");
    }
}
