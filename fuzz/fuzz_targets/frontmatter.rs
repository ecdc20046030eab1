//! SKILL.md parsing must never panic, and must either yield a document or a problem.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let parsed = skillbox_package::frontmatter::parse_skill_md(data, 64 * 1024);
    assert!(parsed.skill.is_some() != !parsed.problems.is_empty());
    if let Some(s) = parsed.skill {
        assert!(skillbox_package::is_valid_name(&s.frontmatter.name));
    }
});
