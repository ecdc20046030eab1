//! File-backed bytes: a large file's content held in memory together with the open file it
//! was read from, so that a socket writer can send it with `sendfile(2)` instead of copying
//! the bytes into the kernel.
//!
//! HTTP bodies travel through hyper as [`bytes::Bytes`]; the writer underneath sees only the
//! slices hyper hands it. [`file_backed`] registers the memory of the bytes it makes, and
//! [`backing_file`] answers, for a slice about to be written, which file at which offset
//! holds the same bytes. Sending a file's page-cache pages spares the sender's copy: on
//! loopback, `write` copies a 256 KiB body into socket buffers and the reader copies it out
//! again, while `sendfile` passes page references and only the reader copies (nginx's
//! `sendfile on`).
//!
//! Why a slice can be trusted to mean its file: an entry is removed when the bytes' owner is
//! dropped, before their memory is freed, under the same lock a lookup takes. A slice being
//! written is borrowed from live bytes, so any entry that contains its address is the entry of
//! those very bytes (live allocations do not overlap) and not of earlier memory at the same
//! address. The file must hold the same bytes as the memory: callers pass the file they read
//! them from, and only immutable files (revision-cache trees, read-only and never rewritten in
//! place; removal unlinks them, which an open file survives).

use bytes::Bytes;
use std::collections::BTreeMap;
use std::fs::File;
use std::sync::{Arc, RwLock};

/// Smaller bodies are copied: a `sendfile` call and a lookup cost about what copying a few
/// pages does.
pub const MIN_LEN: usize = 64 << 10;

/// At most this many files are held open for zero-copy sends (each costs a descriptor);
/// past it, [`file_backed`] answers plain bytes.
const MAX_OPEN: usize = 256;

/// The file behind a registered span of memory.
struct Backing {
    len: usize,
    file: Arc<File>,
}

/// Registered spans by start address.
static SPANS: RwLock<BTreeMap<usize, Backing>> = RwLock::new(BTreeMap::new());

/// Owns the memory of file-backed bytes; dropping it unregisters the span first.
struct Owner {
    data: Vec<u8>,
}

impl AsRef<[u8]> for Owner {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        let start = self.data.as_ptr() as usize;
        // A poisoned lock still holds a consistent map (no code panics while holding it
        // mid-update); the entry must go before the memory does.
        let mut spans = SPANS.write().unwrap_or_else(|p| p.into_inner());
        spans.remove(&start);
    }
}

/// `data`, read whole from `file` (which must keep exactly these bytes), as bytes a socket
/// writer may send from `file`. Small data, or too many files open already: plain bytes.
pub fn file_backed(data: Vec<u8>, file: File) -> Bytes {
    if data.len() < MIN_LEN {
        return Bytes::from(data);
    }
    let mut spans = SPANS.write().unwrap_or_else(|p| p.into_inner());
    if spans.len() >= MAX_OPEN {
        return Bytes::from(data);
    }
    let (start, len) = (data.as_ptr() as usize, data.len());
    // The Vec's heap buffer stays where it is when the Vec moves into the owner.
    let bytes = Bytes::from_owner(Owner { data });
    spans.insert(
        start,
        Backing {
            len,
            file: Arc::new(file),
        },
    );
    bytes
}

/// The file and offset holding `slice`'s bytes, when `slice` lies within file-backed bytes
/// (see the module doc for why the answer is sound for a slice of live bytes).
pub fn backing_file(slice: &[u8]) -> Option<(Arc<File>, u64)> {
    if slice.len() < MIN_LEN {
        return None;
    }
    let at = slice.as_ptr() as usize;
    let spans = SPANS.read().unwrap_or_else(|p| p.into_inner());
    let (start, backing) = spans.range(..=at).next_back()?;
    let offset = at - start;
    (offset + slice.len() <= backing.len).then(|| (backing.file.clone(), offset as u64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, SeekFrom, Write};

    fn file_with(data: &[u8]) -> File {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(data).unwrap();
        f
    }

    fn read_at(file: &File, offset: u64, len: usize) -> Vec<u8> {
        let mut f = file.try_clone().unwrap();
        f.seek(SeekFrom::Start(offset)).unwrap();
        let mut out = vec![0; len];
        f.read_exact(&mut out).unwrap();
        out
    }

    #[test]
    fn a_slice_of_file_backed_bytes_maps_to_the_same_bytes_of_its_file() {
        let data: Vec<u8> = (0..MIN_LEN * 3).map(|i| (i % 251) as u8).collect();
        let bytes = file_backed(data.clone(), file_with(&data));
        for (from, to) in [(0, bytes.len()), (1000, bytes.len()), (7, MIN_LEN + 7)] {
            let slice = &bytes[from..to];
            let (file, offset) = backing_file(slice).expect("registered");
            assert_eq!(offset, from as u64);
            assert_eq!(read_at(&file, offset, slice.len()), slice);
        }
        // Too short to be worth a sendfile; and memory that is not file-backed.
        assert!(backing_file(&bytes[..MIN_LEN - 1]).is_none());
        assert!(backing_file(&data).is_none());
    }

    #[test]
    fn dropped_bytes_leave_no_span_behind() {
        // A length no other test uses: the memory's address may be reused at once by a test
        // running beside this one.
        let data = vec![7u8; MIN_LEN + 4321];
        let bytes = file_backed(data.clone(), file_with(&data));
        let clone = bytes.clone();
        drop(bytes);
        assert!(backing_file(&clone).is_some(), "a clone keeps the span");
        drop(clone);
        let spans = SPANS.read().unwrap();
        assert!(
            !spans.values().any(|b| b.len == data.len()),
            "the span outlived its memory"
        );
    }

    #[test]
    fn small_data_is_plain_bytes() {
        let data = vec![1u8; MIN_LEN - 1];
        let bytes = file_backed(data.clone(), file_with(&data));
        assert_eq!(&bytes[..], &data[..]);
        let spans = SPANS.read().unwrap();
        assert!(!spans.contains_key(&(bytes.as_ptr() as usize)));
    }
}
