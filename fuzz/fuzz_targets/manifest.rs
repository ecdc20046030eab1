//! Manifest parsing accepts exactly the canonical form: whatever parses re-encodes to the
//! same bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = skillbox_package::Manifest::parse(data) {
        assert_eq!(m.encode(), data);
    }
});
