//! Reading and recovering recordings (`record::read`, `record::files`):
//! any bytes as a `.mcap` file, scanned and recovered as start-up does.
//! Nothing a file contains may panic, hang or allocate beyond its size:
//! the result is messages, a recovered file, or an error (the file moved
//! aside).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = std::path::Path::new("fuzz.mcap");
    let _ = rozd::record::read::scan(path, data);
    let dir = match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(_) => return,
    };
    let file = dir.path().join("rover-20261201T000000.000Z.mcap");
    if std::fs::write(&file, data).is_ok() {
        let _ = rozd::record::files::recover_all(dir.path(), "fuzz");
    }
});
