//! The recorder and its writer on a temporary directory: drops counted
//! under a full queue, files finished on finish and on rotation, a file
//! cut short read and recovered under its name.

use std::sync::atomic::Ordering;
use std::sync::mpsc::sync_channel;

use super::*;

fn settings(dir: &Path) -> writer::Settings {
    writer::Settings {
        directory: dir.to_path_buf(),
        host_id: "test-host".into(),
        max_file_bytes: 64 * 1024 * 1024,
        max_file_age: Duration::from_secs(3600),
        max_total_bytes: 0,
        max_files: 0,
        flush_every: Duration::from_millis(10),
    }
}

/// A recorder whose queue nobody drains yet (`bound` items).
fn stalled(dir: &Path, bound: usize) -> (Recorder, std::sync::mpsc::Receiver<Item>) {
    let (queue, receiver) = sync_channel(bound);
    let recorder = Recorder {
        active: Some(Active {
            queue,
            streams: [true; 8],
            shared: Arc::new(Shared::default()),
            directory: dir.to_path_buf(),
            observation_every: Duration::from_secs(1),
            camera_every: Duration::from_secs(1),
            camera_throttles: Mutex::default(),
            thread: Mutex::new(None),
        }),
    };
    (recorder, receiver)
}

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"))
}

/// Runs the writer with `settings` over `events` sensor values (one a
/// microsecond apart from t = 1 s), finishes it and waits for its thread.
fn write_temps(settings: writer::Settings, events: u64) -> Arc<Shared> {
    let (queue, receiver) = sync_channel(1024);
    let shared = Arc::new(Shared::default());
    let thread = {
        let shared = shared.clone();
        std::thread::spawn(move || writer::run(settings, receiver, shared))
    };
    for i in 0..events {
        let _ = queue.send(Item::Record(
            1_000_000 + i,
            Event::Sensor {
                name: Arc::from("temp"),
                value: i as f64,
            },
        ));
    }
    let (done_tx, done_rx) = sync_channel(1);
    let _ = queue.send(Item::Finish(done_tx));
    let _ = done_rx.recv();
    let _ = thread.join();
    shared
}

#[test]
fn a_full_queue_drops_and_counts_instead_of_blocking() {
    let dir = tempdir();
    let (recorder, receiver) = stalled(dir.path(), 16);
    for i in 0..20 {
        recorder.sensor_value("temp", f64::from(i));
    }
    assert_eq!(recorder.counts(), Some((0, 4, 0)));
    assert_eq!(recorder.status()["dropped"], 4);
    // The 16 that fit are written once the writer runs.
    let shared = recorder.active.as_ref().map(|a| a.shared.clone());
    let shared = shared.unwrap_or_default();
    let (done_tx, done_rx) = sync_channel(1);
    let thread = {
        let shared = shared.clone();
        let settings = settings(dir.path());
        std::thread::spawn(move || writer::run(settings, receiver, shared))
    };
    recorder
        .active
        .as_ref()
        .map(|a| a.queue.send(Item::Finish(done_tx)));
    let _ = done_rx.recv();
    let _ = thread.join();
    assert_eq!(shared.written.load(Ordering::Relaxed), 16);
    let listed = files::list(dir.path(), None).unwrap_or_default();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].state, "finished");
    let info = read::info(&dir.path().join(&listed[0].name)).unwrap_or_else(|e| panic!("{e}"));
    assert!(info.finished);
    assert_eq!(info.channels["/sensors/temp"].messages, 16);
    assert_eq!(
        info.channels["/sensors/temp"].schema.as_deref(),
        Some("rozd.SensorValue")
    );
}

#[test]
fn streams_not_configured_are_not_recorded() {
    let dir = tempdir();
    let (mut recorder, receiver) = stalled(dir.path(), 16);
    if let Some(active) = recorder.active.as_mut() {
        active.streams = [false; 8];
        active.streams[Stream::Audit as usize] = true;
    }
    recorder.sensor_value("temp", 1.0);
    recorder.session(|| json!({"event": "turn_started", "session_id": "s"}));
    StoreObserver::audit(&recorder, &AuditRecord::default());
    let queued: Vec<Item> = receiver.try_iter().collect();
    assert_eq!(queued.len(), 1);
    assert!(matches!(&queued[0], Item::Record(_, Event::Audit(_))));
}

#[test]
fn rotation_finishes_each_file_and_retention_keeps_the_newest() {
    let dir = tempdir();
    let mut settings = settings(dir.path());
    settings.max_file_bytes = 4 * 1024;
    settings.max_files = 2;
    let shared = write_temps(settings, 600);
    let finished = shared.files_finished.load(Ordering::Relaxed);
    assert!(finished >= 4, "{finished} files finished");
    assert_eq!(*shared.finished.borrow(), finished);
    // The retention cap ran at each rotation (the last file was finished
    // at shutdown, after the last run): at most 2 + 1 files remain.
    let listed = files::list(dir.path(), None).unwrap_or_default();
    assert!(listed.len() <= 3, "{listed:?}");
    assert!(shared.files_deleted.load(Ordering::Relaxed) >= 1);
    for l in &listed {
        assert_eq!(l.state, "finished", "{l:?}");
        let info = read::info(&dir.path().join(&l.name)).unwrap_or_else(|e| panic!("{e}"));
        assert!(info.messages > 0);
    }
    // Nothing was dropped; every event went to some file.
    assert_eq!(shared.written.load(Ordering::Relaxed), 600);
}

#[test]
fn a_file_cut_short_is_read_up_to_its_last_chunk_and_recovered_under_its_name() {
    let dir = tempdir();
    write_temps(settings(dir.path()), 100);
    let listed = files::list(dir.path(), None).unwrap_or_default();
    let path = dir.path().join(&listed[0].name);
    let whole = std::fs::read(&path).unwrap_or_default();
    // Cut inside the summary: the data section (and its chunks) is whole.
    let summary_start = {
        let footer = mcap::read::footer(&whole).unwrap_or_else(|e| panic!("{e}"));
        usize::try_from(footer.summary_start).unwrap_or(0)
    };
    std::fs::write(&path, &whole[..summary_start + 5]).unwrap_or_else(|e| panic!("{e}"));
    let listed = files::list(dir.path(), None).unwrap_or_default();
    assert_eq!(listed[0].state, "unfinished");
    let cut = read::info(&path).unwrap_or_else(|e| panic!("{e}"));
    assert!(!cut.finished);
    assert_eq!(cut.channels["/sensors/temp"].messages, 100);
    let recovered = files::recover_all(dir.path(), "test");
    assert_eq!(recovered.len(), 1);
    let recovered = recovered
        .into_iter()
        .next()
        .and_then(Result::ok)
        .unwrap_or_else(|| panic!("recovered"));
    assert_eq!(recovered.messages, 100);
    let after = read::info(&path).unwrap_or_else(|e| panic!("{e}"));
    assert!(after.finished);
    assert_eq!(after.channels["/sensors/temp"].messages, 100);
    assert_eq!(files::list(dir.path(), None).unwrap_or_default().len(), 1);
}

#[test]
fn rotation_by_age_finishes_a_file_per_event_when_the_age_is_zero() {
    let dir = tempdir();
    let mut settings = settings(dir.path());
    settings.max_file_age = Duration::ZERO;
    write_temps(settings, 3);
    // Every file reaches its age with its first event: one file per
    // event, each finished, none empty.
    let listed = files::list(dir.path(), None).unwrap_or_default();
    let counts: Vec<u64> = listed
        .iter()
        .map(|l| {
            read::info(&dir.path().join(&l.name))
                .map(|i| i.messages)
                .unwrap_or(u64::MAX)
        })
        .collect();
    assert_eq!(counts.iter().sum::<u64>(), 3, "{listed:?}");
    assert_eq!(counts, vec![1, 1, 1]);
    assert!(listed.iter().all(|l| l.state == "finished"));
}

/// The hostile files of the fuzz corpus (`fuzz/corpus/recording_recovery`):
/// each is refused or read up to its break, never a panic, and start-up's
/// recovery moves an unreadable one aside as `<name>.corrupt`.
#[test]
fn hostile_files_are_refused_or_read_up_to_their_break_never_a_panic() {
    let corpus =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/recording_recovery");
    let mut seen = 0;
    for entry in std::fs::read_dir(&corpus).unwrap() {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        let scanned = read::scan(&path, &bytes);
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("seed-hostile-") {
            assert!(
                matches!(scanned, Err(read::ReadError::Corrupt { .. })),
                "{name}: {scanned:?}"
            );
            let dir = tempfile::tempdir().unwrap();
            let file = dir.path().join("rover-20261201T000000.000Z.mcap");
            std::fs::write(&file, &bytes).unwrap();
            let outcome = files::recover_all(dir.path(), "test");
            assert!(
                matches!(
                    outcome.as_slice(),
                    [Err(files::FilesError::MovedAside { .. })]
                ),
                "{name}: {outcome:?}"
            );
            assert!(!file.exists());
            assert!(
                dir.path()
                    .join("rover-20261201T000000.000Z.mcap.corrupt")
                    .exists()
            );
        }
        seen += 1;
    }
    assert!(seen >= 4, "the corpus is there");
}
