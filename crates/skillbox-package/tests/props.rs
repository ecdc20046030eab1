//! Property tests: manifest encoding round-trips; the digest ignores on-disk order.

mod common;
use proptest::prelude::*;
use skillbox_package::{FileEntry, Limits, Manifest, Sha256, intake};

fn path_strategy() -> impl Strategy<Value = String> {
    let component = "[a-zA-Z0-9 ._é€-]{1,12}".prop_filter("not . or ..", |c| c != "." && c != "..");
    prop::collection::vec(component, 1..4).prop_map(|c| c.join("/"))
}

fn entries_strategy() -> impl Strategy<Value = Vec<FileEntry>> {
    prop::collection::btree_map(
        path_strategy(),
        (any::<u64>(), any::<[u8; 32]>(), any::<bool>()),
        0..20,
    )
    .prop_map(|m| {
        m.into_iter()
            .map(|(path, (size, h, executable))| FileEntry {
                path,
                size,
                sha256: Sha256(h),
                executable,
            })
            .collect()
    })
}

proptest! {
    #[test]
    fn encode_parse_round_trip(entries in entries_strategy()) {
        let m = Manifest::new(entries).unwrap();
        let bytes = m.encode();
        let back = Manifest::parse(&bytes).unwrap();
        prop_assert_eq!(&back, &m);
        prop_assert_eq!(back.encode(), bytes);
        prop_assert_eq!(back.digest(), m.digest());
    }

    #[test]
    fn order_of_entries_does_not_matter(entries in entries_strategy(), seed in any::<u64>()) {
        let mut shuffled = entries.clone();
        let n = shuffled.len();
        if n > 1 {
            for i in 0..n {
                let j = (seed.wrapping_mul(6364136223846793005).wrapping_add(i as u64) % n as u64) as usize;
                shuffled.swap(i, j);
            }
        }
        prop_assert_eq!(Manifest::new(entries).unwrap().digest(), Manifest::new(shuffled).unwrap().digest());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn digest_independent_of_file_order_on_disk(
        files in prop::collection::btree_map("[a-z]{1,6}(/[a-z]{1,6}){0,2}", prop::collection::vec(any::<u8>(), 0..64), 1..12),
    ) {
        // Skip sets where one path is a directory prefix of another (cannot exist on disk).
        let keys: Vec<&String> = files.keys().collect();
        prop_assume!(!keys.iter().any(|a| keys.iter().any(|b| b.starts_with(&format!("{a}/")))));
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let specs: Vec<(&str, &[u8], bool)> = files.iter().map(|(p, c)| (p.as_str(), c.as_slice(), false)).collect();
        common::write_tree(a.path(), &specs);
        let mut rev = specs.clone();
        rev.reverse();
        common::write_tree(b.path(), &rev);
        let da = Manifest::new(intake::scan_dir(a.path(), &Limits::default()).unwrap().files).unwrap().digest();
        let db = Manifest::new(intake::scan_dir(b.path(), &Limits::default()).unwrap().files).unwrap().digest();
        prop_assert_eq!(da, db);
    }
}
