//! SHA-256 values and the `sha256:<hex>` digest notation.
//!
//! Hashing goes through the `sha2` crate, which detects the CPU's SHA extensions at run time.

use sha2::Digest as _;
use std::fmt;
use std::io::{self, Read};
use std::str::FromStr;

/// A SHA-256 hash value. Displays as 64 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Sha256(pub [u8; 32]);

/// Incremental SHA-256 hasher.
#[derive(Clone, Default)]
pub struct Hasher(sha2::Sha256);

impl Hasher {
    pub fn new() -> Self {
        Hasher(sha2::Sha256::new())
    }
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
    pub fn finish(self) -> Sha256 {
        Sha256(self.0.finalize().into())
    }
}

impl Sha256 {
    pub fn of(bytes: &[u8]) -> Self {
        let mut h = Hasher::new();
        h.update(bytes);
        h.finish()
    }

    /// Hashes everything `reader` yields; returns the hash and the byte count.
    pub fn of_reader(mut reader: impl Read) -> io::Result<(Self, u64)> {
        let mut h = Hasher::new();
        let mut buf = vec![0u8; 256 * 1024];
        let mut total = 0u64;
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            h.update(&buf[..n]);
            total += n as u64;
        }
        Ok((h.finish(), total))
    }

    pub fn to_hex(&self) -> String {
        to_hex(&self.0)
    }

    /// The lowercase hex as bytes, without allocating (for hot paths such as an ETag).
    pub fn hex_bytes(&self) -> [u8; 64] {
        let mut hex = [0; 64];
        for (b, pair) in self.0.iter().zip(hex.chunks_exact_mut(2)) {
            pair.copy_from_slice(&hex_pair(*b));
        }
        hex
    }

    pub fn from_hex(s: &str) -> Option<Self> {
        let b = s.as_bytes();
        if b.len() != 64 {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, pair) in b.chunks_exact(2).enumerate() {
            out[i] = (hex_val(pair[0])? << 4) | hex_val(pair[1])?;
        }
        Some(Sha256(out))
    }
}

fn hex_val(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

/// Lowercase hex of arbitrary bytes.
pub fn to_hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.extend(hex_pair(*b).map(char::from));
    }
    s
}

/// The two lowercase hex digits of a byte.
fn hex_pair(b: u8) -> [u8; 2] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    [DIGITS[usize::from(b >> 4)], DIGITS[usize::from(b & 0xf)]]
}

impl fmt::Display for Sha256 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Sha256 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Sha256({})", self.to_hex())
    }
}

/// A package digest: the SHA-256 of a canonical manifest, written `sha256:<hex>`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(pub Sha256);

pub const DIGEST_PREFIX: &str = "sha256:";

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{DIGEST_PREFIX}{}", self.0)
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({self})")
    }
}

/// Error for text that is not `sha256:` followed by 64 lowercase hex digits.
#[derive(Debug, thiserror::Error)]
#[error("not a digest (expected sha256:<64 lowercase hex digits>): {0:?}")]
pub struct BadDigest(pub String);

impl FromStr for Digest {
    type Err = BadDigest;
    fn from_str(s: &str) -> Result<Self, BadDigest> {
        s.strip_prefix(DIGEST_PREFIX)
            .and_then(Sha256::from_hex)
            .map(Digest)
            .ok_or_else(|| BadDigest(s.to_string()))
    }
}

/// Serde as the text form: `Display` out, `FromStr` in.
macro_rules! serde_as_text {
    ($($ty:ty),*) => {$(
        impl serde::Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }

        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
            }
        }
    )*};
}

serde_as_text!(Digest, Sha256);

impl FromStr for Sha256 {
    type Err = &'static str;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Sha256::from_hex(s).ok_or("expected 64 lowercase hex digits")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vectors() {
        assert_eq!(
            Sha256::of(b"").to_hex(),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            Sha256::of(b"abc").to_hex(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            &Sha256::of(b"abc").hex_bytes(),
            b"ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn digest_round_trip_and_rejects() {
        let d = Digest(Sha256::of(b"x"));
        assert_eq!(d.to_string().parse::<Digest>().unwrap(), d);
        assert!("sha256:ABC".parse::<Digest>().is_err());
        assert!(d.to_string().to_uppercase().parse::<Digest>().is_err());
        assert!(d.0.to_hex().parse::<Digest>().is_err());
    }
}
