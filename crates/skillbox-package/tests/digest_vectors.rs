//! Golden vectors for the skillbox-tree-v1 manifest and digest (SPEC §2), spelled out by hand.

mod common;
use common::*;
use skillbox_package::{Limits, Manifest, intake};

fn manifest_of(files: &[Spec<'_>]) -> Manifest {
    let dir = tempfile::tempdir().unwrap();
    write_tree(dir.path(), files);
    let intake = intake::scan_dir(dir.path(), &Limits::default()).unwrap();
    assert!(intake.problems.is_empty(), "{:?}", intake.problems);
    Manifest::new(intake.files).unwrap()
}

#[test]
fn vector_exec_bit_and_nesting() {
    let m = manifest_of(&[("SKILL.md", b"abc", false), ("scripts/run.sh", b"", true)]);
    let expected = "skillbox-tree-v1\n\
f 3 ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad SKILL.md\n\
x 0 e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855 scripts/run.sh\n";
    assert_eq!(String::from_utf8(m.encode()).unwrap(), expected);
    assert_eq!(
        m.digest().to_string(),
        "sha256:007b3ce2daec17922ea775544dae35c959307abebfe04d01c049d7e30a9ed2cf"
    );
}

#[test]
fn vector_byte_order_sorting_and_unicode() {
    let m = manifest_of(&[
        ("a.txt", b"a", false),
        ("B.txt", b"", false),
        ("a/b", b"abc", true),
        ("a-b", b"", false),
        ("\u{e9}.txt", b"a", false),
        ("z.txt", b"", false),
    ]);
    let expected = "skillbox-tree-v1\n\
f 0 e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855 B.txt\n\
f 0 e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855 a-b\n\
f 1 ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb a.txt\n\
x 3 ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad a/b\n\
f 0 e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855 z.txt\n\
f 1 ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb \u{e9}.txt\n";
    assert_eq!(String::from_utf8(m.encode()).unwrap(), expected);
    assert_eq!(
        m.digest().to_string(),
        "sha256:b5d8e8390b23561ef19c3bf8a30bd4605d956517a806463374109718d760a958"
    );
}

#[test]
fn vector_empty_tree() {
    let m = Manifest::new(vec![]).unwrap();
    assert_eq!(m.encode(), b"skillbox-tree-v1\n");
    assert_eq!(
        m.digest().to_string(),
        "sha256:45022312b2608cd91bfb45f3b7f03adbd9f62e8770438a5b3b52187e3d7d3172"
    );
}

#[test]
fn any_execute_bit_counts_and_empty_dirs_do_not() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    write_tree(
        dir.path(),
        &[("a", b"", false), ("b", b"", false), ("c", b"", false)],
    );
    for (name, mode) in [("a", 0o744), ("b", 0o654), ("c", 0o645)] {
        std::fs::set_permissions(dir.path().join(name), std::fs::Permissions::from_mode(mode))
            .unwrap();
    }
    std::fs::create_dir_all(dir.path().join("empty/nested")).unwrap();
    let intake = intake::scan_dir(dir.path(), &Limits::default()).unwrap();
    let m = Manifest::new(intake.files).unwrap();
    assert_eq!(m.len(), 3);
    assert!(m.entries().iter().all(|e| e.executable), "{m:?}");
}

#[test]
fn parse_rejects_non_canonical_bytes() {
    let good = b"skillbox-tree-v1\nf 3 ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad SKILL.md\n";
    assert_eq!(Manifest::parse(good).unwrap().encode(), good);
    let h = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
    for bad in [
        "skillbox-tree-v2\n".to_string(),
        format!("skillbox-tree-v1\nf 03 {h} a\n"),
        format!("skillbox-tree-v1\nf 3  {h} a\n"),
        format!("skillbox-tree-v1\ny 3 {h} a\n"),
        format!("skillbox-tree-v1\nf 3 {} a\n", h.to_uppercase()),
        format!("skillbox-tree-v1\nf 3 {h} b\nf 3 {h} a\n"),
        format!("skillbox-tree-v1\nf 3 {h} a\nf 3 {h} a\n"),
        format!("skillbox-tree-v1\nf 3 {h} ../a\n"),
        format!("skillbox-tree-v1\nf 3 {h} a"),
    ] {
        assert!(Manifest::parse(bad.as_bytes()).is_err(), "accepted {bad:?}");
    }
}
