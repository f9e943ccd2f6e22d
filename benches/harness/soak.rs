//! The soak (issue 21): the `rozd` binary (release under `cargo bench`) as
//! its own process serving `sessions` sessions for `duration`, each running
//! a turn a second — a client tool call, and every fourth turn a host tool
//! (`read front_distance`) — while its resident memory, open file
//! descriptors, threads and store size are sampled from /proc every
//! `every`. With `--rounds N` the same daemon serves N such rounds, each
//! with new sessions, and is sampled for half a minute after each round's
//! sessions closed: memory a round's sessions leave behind shows as a
//! higher level after every round, memory the allocator keeps for reuse
//! as the same peak again. Prints one CSV row per sample, then a summary:
//! what grew between the first sample after warm-up and the end of the
//! first round's turns, and each round's peak and level after closing.
//!
//! `cargo bench --bench rozd -- --soak SECONDS --sessions N [--rounds N]`
//! (`scripts/soak.sh` runs it).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use tokio::time::Instant;

use super::fixtures::{SessionStream, builtin_host, user};
use super::footprint::{Server, open_sessions, rozd_command};
use super::steps::{Target, one_turn};

/// What `--soak` asks for.
#[derive(Debug, Clone, Copy)]
pub struct SoakOptions {
    pub duration: Duration,
    pub sessions: usize,
    pub every: Duration,
    pub rounds: usize,
}

/// How long the daemon is sampled after a round's sessions closed.
const AFTER_CLOSE: Duration = Duration::from_secs(30);

/// One sample of the process.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Duration,
    rss_mib: f64,
    fds: usize,
    threads: u64,
    store_mib: f64,
    wal_mib: f64,
    turns: u64,
    failed: u64,
    round: usize,
    /// Taken after the round's sessions closed.
    closed: bool,
}

fn proc_status(pid: u32, key: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// The database file and its WAL, each in MiB (the WAL is reused after
/// each checkpoint, so it levels off near SQLite's 1000-page checkpoint).
fn store_mib(db: &Path) -> (f64, f64) {
    let size = |suffix: &str| {
        let mut name = db.as_os_str().to_owned();
        name.push(suffix);
        std::fs::metadata(&name).map_or(0, |m| m.len()) as f64 / (1024.0 * 1024.0)
    };
    (size(""), size("-wal"))
}

fn sample(
    pid: u32,
    db: &Path,
    at: Duration,
    turns: u64,
    failed: u64,
    (round, closed): (usize, bool),
) -> Result<Sample> {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .context("/proc/<pid>/fd")?
        .count();
    let (store_mib, wal_mib) = store_mib(db);
    Ok(Sample {
        at,
        rss_mib: proc_status(pid, "VmRSS:").context("VmRSS")? / 1024.0,
        fds,
        threads: proc_status(pid, "Threads:").context("Threads")? as u64,
        store_mib,
        wal_mib,
        turns,
        failed,
        round,
        closed,
    })
}

/// One session's turns until `until`, a turn a second (late turns are not
/// made up: the pace never exceeds one a second).
async fn session_turns(
    mut stream: SessionStream,
    index: usize,
    until: Instant,
    turns: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
) -> Result<SessionStream> {
    // Spread the sessions' turns over the second.
    let offset = Duration::from_millis((index as u64 * 7919) % 1000);
    let mut tick = tokio::time::interval_at(Instant::now() + offset, Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut n = 0u64;
    loop {
        let at = tick.tick().await;
        if at >= until {
            return Ok(stream);
        }
        let done = if n % 4 == 3 {
            match stream.send(user("read front_distance")).await {
                Ok(()) => stream.turn_complete().await,
                Err(e) => Err(e),
            }
        } else {
            one_turn(&mut stream, Target::Rozd).await.map(drop)
        };
        n += 1;
        match done {
            Ok(()) => turns.fetch_add(1, Ordering::Relaxed),
            Err(e) => {
                // A stream that broke cannot go on; count it and stop.
                failed.fetch_add(1, Ordering::Relaxed);
                return Err(e.context(format!("session {index}, turn {n}")));
            }
        };
    }
}

pub async fn soak(options: SoakOptions) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("rozd.db");
    let config = dir.path().join("rozd.toml");
    std::fs::write(&config, builtin_host(&db))?;
    let server = Server::spawn(rozd_command(&config), dir.path()).await?;
    let pid = server.pid;
    let started = Instant::now();
    let turns = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let mut samples = Vec::new();
    println!("t_s,rss_mib,fds,threads,store_mib,wal_mib,turns,failed_sessions,round,closed");
    let record = |samples: &mut Vec<Sample>, phase: (usize, bool)| -> Result<()> {
        let s = sample(
            pid,
            &db,
            started.elapsed(),
            turns.load(Ordering::Relaxed),
            failed.load(Ordering::Relaxed),
            phase,
        )?;
        println!(
            "{:.0},{:.1},{},{},{:.2},{:.2},{},{},{},{}",
            s.at.as_secs_f64(),
            s.rss_mib,
            s.fds,
            s.threads,
            s.store_mib,
            s.wal_mib,
            s.turns,
            s.failed,
            s.round,
            u8::from(s.closed)
        );
        samples.push(s);
        Ok(())
    };
    record(&mut samples, (0, true))?;
    let mut errors = Vec::new();
    for round in 1..=options.rounds.max(1) {
        let streams = open_sessions(&server, Target::Rozd, options.sessions).await?;
        eprintln!(
            "soak: round {round}: {} sessions open after {:.1} s",
            options.sessions,
            started.elapsed().as_secs_f64()
        );
        let until = Instant::now() + options.duration;
        let mut tasks = tokio::task::JoinSet::new();
        for (index, stream) in streams.into_iter().enumerate() {
            tasks.spawn(session_turns(
                stream,
                index,
                until,
                turns.clone(),
                failed.clone(),
            ));
        }
        let mut every = tokio::time::interval_at(Instant::now() + options.every, options.every);
        let mut finished = Vec::new();
        loop {
            tokio::select! {
                _ = every.tick() => record(&mut samples, (round, false))?,
                joined = tasks.join_next() => match joined {
                    Some(Ok(Ok(stream))) => finished.push(stream),
                    Some(Ok(Err(e))) => errors.push(format!("{e:#}")),
                    Some(Err(e)) => errors.push(e.to_string()),
                    None => break,
                },
            }
        }
        record(&mut samples, (round, false))?;
        for stream in finished {
            stream.close().await?;
        }
        // The sessions' memory after they closed (their histories freed),
        // sampled for a while as the daemon ends them.
        eprintln!("soak: round {round}: sessions closed");
        let closed_at = Instant::now();
        record(&mut samples, (round, true))?;
        while closed_at.elapsed() < AFTER_CLOSE {
            tokio::time::sleep(options.every.min(AFTER_CLOSE)).await;
            record(&mut samples, (round, true))?;
        }
    }
    server.stop().await?;
    summarise(&samples, options);
    if !errors.is_empty() {
        bail!("{} sessions failed; the first: {}", errors.len(), errors[0]);
    }
    Ok(())
}

/// What changed in the first round between the first sample after warm-up
/// (a minute, or a fifth of the run if shorter) and the end of its turns;
/// then each round's turns, peak and level after its sessions closed.
fn summarise(samples: &[Sample], options: SoakOptions) {
    let warm = Duration::from_secs(60).min(options.duration / 5);
    let first_round: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.round == 1 && !s.closed)
        .collect();
    let (Some(first), Some(last)) = (
        first_round.iter().find(|s| s.at >= warm),
        first_round.last(),
    ) else {
        return;
    };
    let secs = (last.at - first.at).as_secs_f64().max(1.0);
    println!();
    println!(
        "soak: {} sessions, {:.0} s of turns a round, {} round(s), {} sessions failed",
        options.sessions,
        options.duration.as_secs_f64(),
        options.rounds.max(1),
        samples.last().map_or(0, |s| s.failed)
    );
    println!(
        "round 1 after warm-up ({:.0} s -> {:.0} s): RSS {:.1} -> {:.1} MiB, fds {} -> {}, threads {} -> {}, store {:.2} -> {:.2} MiB ({:.1} KiB/s, {:.1} KiB a turn), WAL {:.2} -> {:.2} MiB",
        first.at.as_secs_f64(),
        last.at.as_secs_f64(),
        first.rss_mib,
        last.rss_mib,
        first.fds,
        last.fds,
        first.threads,
        last.threads,
        first.store_mib,
        last.store_mib,
        (last.store_mib - first.store_mib) * 1024.0 / secs,
        (last.store_mib - first.store_mib) * 1024.0 / (last.turns - first.turns).max(1) as f64,
        first.wal_mib,
        last.wal_mib
    );
    let mut turns_before = 0;
    for round in 1..=options.rounds.max(1) {
        let of_round: Vec<&Sample> = samples.iter().filter(|s| s.round == round).collect();
        let (Some(end_of_turns), Some(closed)) =
            (of_round.iter().rfind(|s| !s.closed), of_round.last())
        else {
            continue;
        };
        let peak = of_round.iter().map(|s| s.rss_mib).fold(0.0, f64::max);
        let turns = end_of_turns.turns - turns_before;
        turns_before = end_of_turns.turns;
        println!(
            "round {round}: {turns} turns ({:.0}/s), RSS peak {peak:.1} MiB, {:.0} s after its sessions closed {:.1} MiB, fds {}, threads {}",
            turns as f64 / options.duration.as_secs_f64().max(1.0),
            AFTER_CLOSE.as_secs_f64(),
            closed.rss_mib,
            closed.fds,
            closed.threads
        );
    }
}
