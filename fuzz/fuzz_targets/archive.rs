//! Archive intake on arbitrary bytes (as zip, tar and tar.gz): never panics, never writes
//! outside the target directory, and every accepted path obeys the path rules.
#![no_main]
use libfuzzer_sys::fuzz_target;
use skillbox_package::{ArchiveFormat, Limits, intake};
use std::io::Cursor;

fuzz_target!(|data: &[u8]| {
    let root = tempfile::tempdir().unwrap();
    let limits = Limits { max_total_size: 4 << 20, max_file_size: 1 << 20, ..Limits::default() };
    for (i, format) in [ArchiveFormat::Zip, ArchiveFormat::Tar, ArchiveFormat::TarGz].into_iter().enumerate() {
        let target = root.path().join(format!("t{i}"));
        std::fs::create_dir(&target).unwrap();
        let intake = intake::extract_archive(Cursor::new(data), format, &target, &limits).unwrap();
        for f in &intake.files {
            skillbox_package::paths::check_path(&f.path).unwrap();
            assert!(intake.root.join(&f.path).is_file());
        }
    }
    for e in std::fs::read_dir(root.path()).unwrap() {
        let name = e.unwrap().file_name();
        assert!(["t0", "t1", "t2"].iter().any(|t| name == *t), "wrote {name:?} outside the targets");
    }
});
