//! Builders for test packages and (hostile) archives, written by hand so that nothing in the
//! archive libraries sanitises what we want to send.
#![allow(dead_code)]

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

pub const SKILL_MD_OK: &str =
    "---\nname: demo\ndescription: A demo skill.\n---\n# Demo\nDo things.\n";

/// (path, content, executable)
pub type Spec<'a> = (&'a str, &'a [u8], bool);

pub fn write_tree(root: &Path, files: &[Spec<'_>]) {
    for (path, content, exec) in files {
        let p = root.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, content).unwrap();
        let mode = if *exec { 0o755 } else { 0o644 };
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    }
}

/// One raw tar entry.
pub struct RawEntry {
    pub name: Vec<u8>,
    pub kind: tar::EntryType,
    pub data: Vec<u8>,
    pub mode: u32,
    pub link: Vec<u8>,
}

pub fn file(name: &str, data: &[u8]) -> RawEntry {
    RawEntry {
        name: name.as_bytes().to_vec(),
        kind: tar::EntryType::Regular,
        data: data.to_vec(),
        mode: 0o644,
        link: vec![],
    }
}

pub fn entry(name: &[u8], kind: tar::EntryType, link: &[u8]) -> RawEntry {
    RawEntry {
        name: name.to_vec(),
        kind,
        data: vec![],
        mode: 0o644,
        link: link.to_vec(),
    }
}

/// A ustar archive with exactly these entries (names up to 100 bytes).
pub fn raw_tar(entries: &[RawEntry]) -> Vec<u8> {
    let mut out = Vec::new();
    for e in entries {
        let mut h = tar::Header::new_ustar();
        {
            let old = h.as_old_mut();
            old.name[..e.name.len()].copy_from_slice(&e.name);
            old.linkname[..e.link.len()].copy_from_slice(&e.link);
        }
        h.set_entry_type(e.kind);
        h.set_size(e.data.len() as u64);
        h.set_mode(e.mode);
        h.set_mtime(0);
        h.set_cksum();
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(&e.data);
        let pad = (512 - e.data.len() % 512) % 512;
        out.extend(std::iter::repeat_n(0u8, pad));
    }
    out.extend(std::iter::repeat_n(0u8, 1024));
    out
}

pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(data).unwrap();
    enc.finish().unwrap()
}

/// A zip with these (name, data, unix mode) entries; a mode with S_IFLNK makes a symlink.
pub fn zip_of(entries: &[(&str, &[u8], u32)]) -> Vec<u8> {
    let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for (name, data, mode) in entries {
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated)
            .unix_permissions(*mode);
        if mode & 0o170000 == 0o120000 {
            w.add_symlink(*name, std::str::from_utf8(data).unwrap(), opts)
                .unwrap();
        } else if name.ends_with('/') {
            w.add_directory(*name, opts).unwrap();
        } else {
            w.start_file(*name, opts).unwrap();
            w.write_all(data).unwrap();
        }
    }
    w.finish().unwrap().into_inner()
}

/// A tar (uncompressed) of a tree built with the tar crate's builder (for well-formed input).
pub fn tar_of(files: &[Spec<'_>], prefix: &str) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, content, exec) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(content.len() as u64);
        h.set_mode(if *exec { 0o755 } else { 0o644 });
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, format!("{prefix}{path}"), *content)
            .unwrap();
    }
    b.into_inner().unwrap()
}

/// Every path under `dir`, relative, sorted (to prove nothing was written elsewhere).
pub fn list_all(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    fn rec(base: &Path, d: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            out.push(p.strip_prefix(base).unwrap().to_string_lossy().into_owned());
            if e.file_type().unwrap().is_dir() {
                rec(base, &p, out);
            }
        }
    }
    rec(dir, dir, &mut out);
    out.sort();
    out
}
