//! Archive intake: every format gives the same package, and hostile archives are refused
//! with the expected problem and nothing written outside the target directory.

mod common;
use common::*;
use skillbox_package::{CheckOptions, Limits, Rejection, check, intake, write};
use std::io::Write;
use std::path::Path;
use tar::EntryType;

fn pkg_files() -> Vec<Spec<'static>> {
    vec![
        ("SKILL.md", SKILL_MD_OK.as_bytes(), false),
        ("scripts/run.py", b"print('hi')\n", true),
        ("reference/notes.md", b"notes\n", false),
        ("reference/deep/x.bin", &[0u8, 1, 2, 255], false),
    ]
}

fn opts() -> CheckOptions {
    CheckOptions {
        expected_name: Some("demo".into()),
        ..Default::default()
    }
}

/// Extracts `bytes` (saved as an upload in a fresh root) into `root/target` and validates.
fn run_archive(
    bytes: &[u8],
) -> (
    tempfile::TempDir,
    Result<skillbox_package::Package, Rejection>,
) {
    let root = tempfile::tempdir().unwrap();
    let upload = root.path().join("upload");
    std::fs::write(&upload, bytes).unwrap();
    let target = root.path().join("target");
    std::fs::create_dir(&target).unwrap();
    let intake = intake::extract_archive_file(&upload, &target, &Limits::default()).unwrap();
    let result = check(intake, &opts());
    (root, result)
}

fn assert_contained(root: &Path) {
    for p in list_all(root) {
        assert!(
            p == "upload" || p == "target" || p.starts_with("target/"),
            "written outside the target: {p}"
        );
    }
}

#[test]
fn same_digest_from_dir_zip_tar_and_tgz() {
    let files = pkg_files();
    let dir = tempfile::tempdir().unwrap();
    write_tree(dir.path(), &files);
    let from_dir = check(
        intake::scan_dir(dir.path(), &Limits::default()).unwrap(),
        &opts(),
    )
    .unwrap();

    let zip_entries: Vec<(&str, &[u8], u32)> = files
        .iter()
        .map(|(p, c, x)| (*p, *c, if *x { 0o100755 } else { 0o100644 }))
        .collect();
    let zip_prefixed: Vec<(String, &[u8], u32)> = zip_entries
        .iter()
        .map(|(p, c, m)| (format!("demo/{p}"), *c, *m))
        .collect();
    let zip_prefixed: Vec<(&str, &[u8], u32)> = zip_prefixed
        .iter()
        .map(|(p, c, m)| (p.as_str(), *c, *m))
        .collect();

    let variants: Vec<(&str, Vec<u8>)> = vec![
        ("tar", tar_of(&files, "")),
        ("tar with top dir", tar_of(&files, "demo/")),
        ("tar with ./", tar_of(&files, "./")),
        ("tar.gz", gzip(&tar_of(&files, ""))),
        ("tar.gz with top dir", gzip(&tar_of(&files, "demo/"))),
        ("zip", zip_of(&zip_entries)),
        ("zip with top dir", zip_of(&zip_prefixed)),
    ];
    for (label, bytes) in variants {
        let (_root, result) = run_archive(&bytes);
        let pkg = result.unwrap_or_else(|e| panic!("{label}: {e}"));
        assert_eq!(pkg.digest, from_dir.digest, "{label}");
        assert_eq!(pkg.manifest, from_dir.manifest, "{label}");
        assert!(pkg.root.join("scripts/run.py").is_file(), "{label}");
    }
}

/// Streams a tar.gz of `count` zero-filled files of `each` bytes straight to disk.
fn zero_bomb_tgz(path: &Path, count: usize, each: u64) {
    let f = std::fs::File::create(path).unwrap();
    let mut gz =
        flate2::write::GzEncoder::new(std::io::BufWriter::new(f), flate2::Compression::fast());
    gz.write_all(&raw_tar(&[file("SKILL.md", SKILL_MD_OK.as_bytes())])[..1024])
        .unwrap();
    let zeros = vec![0u8; 1 << 20];
    for i in 0..count {
        let mut h = tar::Header::new_ustar();
        h.set_path(format!("zero{i}.bin")).unwrap();
        h.set_size(each);
        h.set_mode(0o644);
        h.set_cksum();
        gz.write_all(h.as_bytes()).unwrap();
        let mut left = each;
        while left > 0 {
            let n = left.min(zeros.len() as u64) as usize;
            gz.write_all(&zeros[..n]).unwrap();
            left -= n as u64;
        }
    }
    gz.write_all(&[0u8; 1024]).unwrap();
    gz.finish().unwrap();
}

#[test]
fn hostile_archives_are_refused_and_contained() {
    use EntryType as T;
    let ok_md = SKILL_MD_OK.as_bytes();
    let skill = || file("SKILL.md", ok_md);
    let ten_k: Vec<RawEntry> = (0..10_000).map(|i| file(&format!("f{i}"), b"")).collect();
    let many_dirs: Vec<RawEntry> = (0..5_000)
        .map(|i| entry(format!("d{i}/").as_bytes(), T::Directory, b""))
        .collect();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "zip-slip tar",
            raw_tar(&[skill(), file("../evil.txt", b"x")]),
            "'..'",
        ),
        (
            "zip-slip nested tar",
            raw_tar(&[skill(), file("a/../../evil.txt", b"x")]),
            "'..'",
        ),
        (
            "zip-slip zip",
            zip_of(&[
                ("SKILL.md", ok_md, 0o100644),
                ("../evil.txt", b"x", 0o100644),
            ]),
            "'..'",
        ),
        (
            "absolute tar",
            raw_tar(&[skill(), file("/tmp/evil.txt", b"x")]),
            "absolute",
        ),
        (
            "absolute zip",
            zip_of(&[("SKILL.md", ok_md, 0o100644), ("/evil.txt", b"x", 0o100644)]),
            "absolute",
        ),
        (
            "symlink out tar",
            raw_tar(&[skill(), entry(b"link", T::Symlink, b"../../../etc/passwd")]),
            "symbolic link",
        ),
        (
            "symlink zip",
            zip_of(&[
                ("SKILL.md", ok_md, 0o100644),
                ("link", b"../../etc/passwd", 0o120777),
            ]),
            "symbolic link",
        ),
        (
            "hardlink tar",
            raw_tar(&[skill(), entry(b"hl", T::Link, b"SKILL.md")]),
            "hard link",
        ),
        (
            "char device tar",
            raw_tar(&[skill(), entry(b"dev", T::Char, b"")]),
            "device",
        ),
        (
            "block device tar",
            raw_tar(&[skill(), entry(b"blk", T::Block, b"")]),
            "device",
        ),
        (
            "fifo tar",
            raw_tar(&[skill(), entry(b"fifo", T::Fifo, b"")]),
            "FIFO",
        ),
        (
            "duplicate tar",
            raw_tar(&[skill(), file("a.txt", b"1"), file("a.txt", b"2")]),
            "duplicate entry",
        ),
        (
            "case-fold collision",
            raw_tar(&[skill(), file("README.md", b"1"), file("readme.md", b"2")]),
            "case folding",
        ),
        (
            "file and dir",
            raw_tar(&[skill(), file("x", b"1"), file("x/y", b"2")]),
            "both a file and a directory",
        ),
        ("10k files", raw_tar(&ten_k), "more than 2000 files"),
        (
            "5k directory entries",
            raw_tar(&many_dirs),
            "more than 4000 entries",
        ),
        (
            "invalid UTF-8 name",
            raw_tar(&[skill(), file_raw(b"bad\xff.txt")]),
            "not valid UTF-8",
        ),
        (
            "control character",
            raw_tar(&[skill(), file("a\x01b.txt", b"")]),
            "U+0001",
        ),
        (
            "newline in name",
            raw_tar(&[skill(), file("a\nb.txt", b"")]),
            "U+000A",
        ),
        (
            "backslash",
            raw_tar(&[skill(), file("a\\..\\b", b"")]),
            "backslash",
        ),
        (
            "missing SKILL.md",
            raw_tar(&[file("README.md", b"x")]),
            "missing",
        ),
        (
            "frontmatter not closed",
            raw_tar(&[file("SKILL.md", b"---\nname: demo\ndescription: x\n")]),
            "not closed",
        ),
        (
            "no frontmatter",
            raw_tar(&[file("SKILL.md", b"# just markdown\n")]),
            "first line",
        ),
        (
            "wrong name",
            raw_tar(&[file("SKILL.md", b"---\nname: other\ndescription: x\n---\n")]),
            "published as",
        ),
        (
            "description too long",
            raw_tar(&[file(
                "SKILL.md",
                format!("---\nname: demo\ndescription: {}\n---\n", "d".repeat(1025)).as_bytes(),
            )]),
            "limit is 1024",
        ),
        (
            "not an archive",
            b"hello, this is plain text".to_vec(),
            "not a zip, tar or tar.gz",
        ),
        (
            "truncated tar.gz",
            {
                let full = gzip(&tar_of(&pkg_files(), ""));
                full[..full.len() / 2].to_vec()
            },
            "truncated or corrupt",
        ),
        (
            "entry larger than its data",
            {
                let mut t = raw_tar(&[skill(), file("big.txt", &[b'a'; 600])]);
                t.truncate(512 + 512 + 512 + 100);
                t
            },
            "declares 600 bytes but holds 100",
        ),
        (
            "zip bomb",
            zip_of(&[
                ("SKILL.md", ok_md, 0o100644),
                ("zeros.bin", &vec![0u8; 20 << 20], 0o100644),
            ]),
            "compression ratio",
        ),
    ];
    for (label, bytes, want) in cases {
        let (root, result) = run_archive(&bytes);
        let rejection = match result {
            Ok(p) => panic!("{label}: accepted as {}", p.digest),
            Err(r) => r,
        };
        assert!(
            rejection
                .problems
                .iter()
                .any(|p| p.to_string().contains(want)),
            "{label}: expected a problem containing {want:?}, got {:?}",
            rejection.problems
        );
        assert_contained(root.path());
        assert!(
            !root.path().join("evil.txt").exists() && !Path::new("/tmp/evil.txt").exists(),
            "{label}"
        );
    }
}

fn file_raw(name: &[u8]) -> RawEntry {
    entry(name, EntryType::Regular, b"")
}

#[test]
fn gigabyte_bombs_are_stopped_early() {
    // 1 GiB of zeros in 32 files under the per-file limit: the ratio check stops it.
    let root = tempfile::tempdir().unwrap();
    let upload = root.path().join("bomb.tgz");
    zero_bomb_tgz(&upload, 32, 32 << 20);
    assert!(std::fs::metadata(&upload).unwrap().len() < 8 << 20);
    let target = root.path().join("target");
    std::fs::create_dir(&target).unwrap();
    let intake = intake::extract_archive_file(&upload, &target, &Limits::default()).unwrap();
    assert!(
        intake
            .problems
            .iter()
            .any(|p| p.message.contains("compression ratio")),
        "{:?}",
        intake.problems
    );
    let written: u64 = list_all(&target)
        .iter()
        .map(|p| std::fs::metadata(target.join(p)).unwrap().len())
        .sum();
    assert!(written < 40 << 20, "wrote {written} bytes before stopping");

    // One 1 GiB entry: refused from its header, before a byte is written.
    let upload = root.path().join("one.tgz");
    zero_bomb_tgz(&upload, 1, 1 << 30);
    let target2 = root.path().join("target2");
    std::fs::create_dir(&target2).unwrap();
    let intake = intake::extract_archive_file(&upload, &target2, &Limits::default()).unwrap();
    assert!(
        intake
            .problems
            .iter()
            .any(|p| p.message.contains("per file")),
        "{:?}",
        intake.problems
    );
    assert!(!target2.join("zero0.bin").exists());
}

#[test]
fn all_problems_are_reported_together() {
    let t = raw_tar(&[
        file("SKILL.md", b"---\nname: Wrong_Name\n---\n"),
        file("../x", b""),
        entry(b"l", EntryType::Symlink, b"/etc"),
    ]);
    let (_root, result) = run_archive(&t);
    let r = result.unwrap_err();
    let all = r
        .problems
        .iter()
        .map(|p| p.to_string())
        .collect::<Vec<_>>()
        .join("\n");
    for want in ["'..'", "symbolic link", "name", "description: is required"] {
        assert!(all.contains(want), "missing {want:?} in\n{all}");
    }
}

#[test]
fn strict_mode_rejects_unknown_keys() {
    let t = raw_tar(&[file(
        "SKILL.md",
        b"---\nname: demo\ndescription: x\nfoo: bar\n---\n",
    )]);
    let (_root, lax) = run_archive(&t);
    assert_eq!(lax.unwrap().warnings[0].field.as_deref(), Some("foo"));
    let root = tempfile::tempdir().unwrap();
    let up = root.path().join("u");
    std::fs::write(&up, &t).unwrap();
    let intake = intake::extract_archive_file(&up, root.path(), &Limits::default()).unwrap();
    let strict = CheckOptions {
        strict: true,
        ..opts()
    };
    let r = check(intake, &strict).unwrap_err();
    assert_eq!(r.problems[0].field.as_deref(), Some("foo"));
}

#[test]
fn directory_excludes_and_skillignore() {
    let dir = tempfile::tempdir().unwrap();
    write_tree(
        dir.path(),
        &[
            ("SKILL.md", SKILL_MD_OK.as_bytes(), false),
            (".git/config", b"x", false),
            ("__pycache__/a.pyc", b"x", false),
            ("lib/b.pyc", b"x", false),
            (".DS_Store", b"x", false),
            ("node_modules/m/index.js", b"x", false),
            (".venv/bin/python", b"x", true),
            (".skillignore", b"*.log\nbuild/\n", false),
            ("debug.log", b"x", false),
            ("build/out", b"x", false),
            ("keep.txt", b"x", false),
        ],
    );
    std::os::unix::fs::symlink("/etc/passwd", dir.path().join(".git/link")).unwrap();
    let pkg = check(
        intake::scan_dir(dir.path(), &Limits::default()).unwrap(),
        &opts(),
    )
    .unwrap();
    let paths: Vec<_> = pkg
        .manifest
        .entries()
        .iter()
        .map(|e| e.path.as_str())
        .collect();
    assert_eq!(paths, [".skillignore", "SKILL.md", "keep.txt"]);
}

#[test]
fn directory_symlinks_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    write_tree(dir.path(), &[("SKILL.md", SKILL_MD_OK.as_bytes(), false)]);
    std::os::unix::fs::symlink("/etc/passwd", dir.path().join("passwd")).unwrap();
    let r = check(
        intake::scan_dir(dir.path(), &Limits::default()).unwrap(),
        &opts(),
    )
    .unwrap_err();
    assert_eq!(r.problems[0].path.as_deref(), Some("passwd"));
    assert!(r.problems[0].message.contains("symbolic link"));
}

#[test]
fn deterministic_tar_is_byte_identical_and_round_trips() {
    let long = format!("{}/{}.md", "d".repeat(120), "n".repeat(100));
    let files: Vec<Spec<'_>> = vec![
        ("SKILL.md", SKILL_MD_OK.as_bytes(), false),
        ("run.sh", b"#!/bin/sh\necho hi\n", true),
        (&long, b"long path", false),
        ("big.bin", &[7u8; 3 << 20], false),
    ];
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    write_tree(a.path(), &files);
    let mut reversed = files.clone();
    reversed.reverse();
    write_tree(b.path(), &reversed);
    let old = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
    std::fs::File::options()
        .write(true)
        .open(b.path().join("run.sh"))
        .unwrap()
        .set_modified(old)
        .unwrap();

    let pa = check(
        intake::scan_dir(a.path(), &Limits::default()).unwrap(),
        &opts(),
    )
    .unwrap();
    let pb = check(
        intake::scan_dir(b.path(), &Limits::default()).unwrap(),
        &opts(),
    )
    .unwrap();
    let ta = write::write_tar(Vec::new(), &pa.manifest, &write::DirSource(a.path())).unwrap();
    let tb = write::write_tar(Vec::new(), &pb.manifest, &write::DirSource(b.path())).unwrap();
    assert_eq!(ta, tb);
    let (_root, back) = run_archive(&ta);
    assert_eq!(back.unwrap().digest, pa.digest);

    // A source that changed under us is an error, not a different archive.
    std::fs::write(a.path().join("run.sh"), b"x").unwrap();
    assert!(write::write_tar(Vec::new(), &pa.manifest, &write::DirSource(a.path())).is_err());
}

#[test]
fn atomic_directory_write() {
    let src = tempfile::tempdir().unwrap();
    write_tree(src.path(), &pkg_files());
    let pkg = check(
        intake::scan_dir(src.path(), &Limits::default()).unwrap(),
        &opts(),
    )
    .unwrap();
    let out = tempfile::tempdir().unwrap();
    let dest = out.path().join("rev");
    let o = write::DirWriteOptions {
        read_only: true,
        sync: true,
    };
    write::write_dir_atomic(&dest, &pkg.manifest, &write::DirSource(src.path()), o).unwrap();
    let again = check(
        intake::scan_dir(&dest, &Limits::default()).unwrap(),
        &opts(),
    )
    .unwrap();
    assert_eq!(again.digest, pkg.digest);
    assert!(
        std::fs::write(dest.join("SKILL.md"), b"x").is_err() || nix_is_root(),
        "files are read-only"
    );
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(dest.join("SKILL.md"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o444
    );
    assert_eq!(
        std::fs::metadata(dest.join("scripts/run.py"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o555
    );
    assert_eq!(
        std::fs::metadata(&dest).unwrap().permissions().mode() & 0o777,
        0o555
    );
    // No staging left beside it.
    assert_eq!(
        list_all(out.path())
            .iter()
            .filter(|p| !p.starts_with("rev"))
            .count(),
        0
    );

    // A source that fails midway leaves no destination and no staging.
    std::fs::remove_file(src.path().join("reference/notes.md")).unwrap();
    let dest2 = out.path().join("rev2");
    assert!(
        write::write_dir_atomic(&dest2, &pkg.manifest, &write::DirSource(src.path()), o).is_err()
    );
    assert!(!dest2.exists());
    assert_eq!(
        list_all(out.path())
            .iter()
            .filter(|p| !p.starts_with("rev"))
            .count(),
        0
    );
    skillbox_package::staging::remove_tree(&dest).unwrap();
}

fn nix_is_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false)
}

/// A zip holding `SKILL.md` twice: written under two names of one length, then the second
/// renamed in place (the zip writer itself refuses duplicates).
fn zip_with_duplicate_skill_md(second: &[u8]) -> Vec<u8> {
    let bytes = zip_of(&[
        ("SKILL.md", SKILL_MD_OK.as_bytes(), 0o644),
        ("SKILL.mX", second, 0o644),
    ]);
    let mut out = bytes.clone();
    let (from, to) = (b"SKILL.mX", b"SKILL.md");
    let mut i = 0;
    while i + from.len() <= out.len() {
        if &out[i..i + from.len()] == from {
            out[i..i + from.len()].copy_from_slice(to);
        }
        i += 1;
    }
    out
}

#[test]
fn zip_duplicate_entries_are_refused_by_name() {
    let evil = b"---\nname: demo\ndescription: replaced\n---\nother instructions\n";
    let (root, result) = run_archive(&zip_with_duplicate_skill_md(evil));
    let rejection = result.expect_err("a zip with two SKILL.md must be refused");
    assert!(
        rejection
            .problems
            .iter()
            .any(|p| p.path.as_deref() == Some("SKILL.md") && p.message == "duplicate entry"),
        "{:?}",
        rejection.problems
    );
    assert_contained(root.path());
}

#[test]
fn paths_equal_after_nfc_normalization_collide() {
    let composed = "caf\u{e9}.md";
    let decomposed = "cafe\u{301}.md";
    for bytes in [
        raw_tar(&[
            file("SKILL.md", SKILL_MD_OK.as_bytes()),
            file(composed, b"a"),
            file(decomposed, b"b"),
        ]),
        zip_of(&[
            ("SKILL.md", SKILL_MD_OK.as_bytes(), 0o644),
            (composed, b"a", 0o644),
            (decomposed, b"b", 0o644),
        ]),
    ] {
        let (_root, result) = run_archive(&bytes);
        let rejection = result.expect_err("composed and decomposed café.md collide");
        assert!(
            rejection
                .problems
                .iter()
                .any(|p| p.path.as_deref() == Some(decomposed) && p.message.contains("collides")),
            "{:?}",
            rejection.problems
        );
    }
}

#[test]
fn malformed_pax_records_are_refused() {
    // A PAX header whose record claims an absurd length: the plain name must not be used.
    let pax = RawEntry {
        name: b"PaxHeaders/evil".to_vec(),
        kind: EntryType::XHeader,
        data: b"99999999999 path=evil.md\n".to_vec(),
        mode: 0o644,
        link: vec![],
    };
    let bytes = raw_tar(&[
        file("SKILL.md", SKILL_MD_OK.as_bytes()),
        pax,
        file("plain.md", b"x"),
    ]);
    let (root, result) = run_archive(&bytes);
    let rejection = result.expect_err("a malformed PAX record must be refused");
    assert!(
        rejection.problems.iter().any(|p| p.message.contains("PAX")),
        "{:?}",
        rejection.problems
    );
    assert_contained(root.path());
}
