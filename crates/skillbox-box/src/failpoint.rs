//! Failpoints for the fault tests: a place in the box that a test can make fail (a truncated
//! or corrupted copy, a build that hangs) to prove what survives.
//!
//! Compiled in only with the `failpoints` cargo feature, which the test builds turn on (the
//! `skillbox` crate's dev-dependencies): without it, [`Failpoint::take`] is always `None` and
//! nothing is read from disk, so a release build cannot be made to fail on purpose.
//!
//! With the feature, a failpoint is armed by writing the fault's name into the file
//! `<dir>/FAILPOINT`; the place that takes it consumes (removes) the file, and may mark that it
//! was reached with `<dir>/FAILPOINT.reached`.

use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Default)]
pub struct Failpoint {
    #[cfg_attr(not(feature = "failpoints"), allow(dead_code))]
    file: Option<PathBuf>,
}

impl Failpoint {
    /// The failpoint armed by `<dir>/FAILPOINT`.
    pub fn in_dir(dir: &Path) -> Self {
        Failpoint {
            file: Some(dir.join("FAILPOINT")),
        }
    }

    /// A failpoint that never fires.
    pub fn none() -> Self {
        Failpoint { file: None }
    }

    /// The armed fault, consumed.
    pub fn take(&self) -> Option<String> {
        #[cfg(feature = "failpoints")]
        {
            let file = self.file.as_ref()?;
            let name = std::fs::read_to_string(file).ok()?;
            std::fs::remove_file(file).ok()?;
            Some(name.trim().to_string())
        }
        #[cfg(not(feature = "failpoints"))]
        None
    }

    /// Consumes the armed fault if it is `fault` (another fault is left for the place that
    /// takes it).
    pub fn take_if(&self, fault: &str) -> bool {
        #[cfg(feature = "failpoints")]
        {
            self.file.as_ref().is_some_and(|file| {
                std::fs::read_to_string(file).is_ok_and(|f| f.trim() == fault)
                    && std::fs::remove_file(file).is_ok()
            })
        }
        #[cfg(not(feature = "failpoints"))]
        {
            let _ = fault;
            false
        }
    }

    /// Marks the failpoint reached, for a test waiting on it.
    pub fn reached(&self) {
        #[cfg(feature = "failpoints")]
        if let Some(file) = &self.file {
            let _ = std::fs::write(file.with_file_name("FAILPOINT.reached"), b"");
        }
    }
}
