//! SQLite's WAL copied back into the database by a thread of its own, and started over by the
//! pin writer's thread ([`super::pin_thread`]) between two batches, without a stall.
//!
//! A checkpoint that copies only part of the WAL (a passive one beside a busy writer) does not
//! sync the database: its frames stay in the WAL, which recovery replays. The one that finds
//! every frame copied syncs the database, and with it every page the partial ones wrote since.
//! And SQLite starts the WAL over only when a write transaction begins with every frame
//! copied, which under a steady stream of pin batches a checkpoint beside them never sees
//! (a batch commits while it copies). Left alone, the WAL grew to the automatic checkpoint's
//! threshold (32,768 frames, in `MetaStore::connect`), whose commit, in the pin thread, copied
//! what was left and synced a second's worth of pages: in `scripts/bench-runs` at 64
//! connections an 11–18 ms stall of every activation once a second, a good part of the
//! slowest 1% of requests (docs/BENCHMARKS.md, fourteenth session).
//!
//! Here, every [`INTERVAL`]:
//! - the thread copies the WAL back (passive: it never waits for the writer) and syncs the
//!   database file itself, so that what a checkpoint finding every frame copied must sync is
//!   only what it copied;
//! - once the WAL holds [`RESTART_FRAMES`] frames and a pass found them all copied, it asks
//!   for a restart ([`WalRestart`]). The pin thread, after handing its batch to the flusher,
//!   runs a passive checkpoint on its own connection: the few frames committed since, the
//!   WAL's sync and the database's (1–5 ms measured), and its next commit starts the WAL over.
//!
//! Without a pin thread (it could not be started) nothing takes the request, and the WAL is
//! started over as before, by the automatic checkpoint.

use crate::{RegistryError, Result};
use rusqlite::Connection;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

/// How often the WAL is copied back: under the full write load of `scripts/bench-runs`
/// (~2,000 frames in that time) a pass and its sync take ~10–20 ms. Passes every 250 ms wrote
/// fewer pages (a page changed twice is copied once) but made the p99 at 64 connections worse.
/// Passes every 25 ms took ~1.2 ms off the p99 at 8 connections and ~7% off the new-pin rate
/// (four times the database syncs, each sharing the disk's cache flush with the WAL's); 50 ms
/// gained nothing (docs/BENCHMARKS.md, fifteenth session).
const INTERVAL: Duration = Duration::from_millis(100);

/// The WAL's length (frames of one page) from which a pass that found it all copied asks for
/// a restart: ~0.7 s of the full new-pin load of `scripts/bench-runs` at 64 connections
/// (~36,000 frames a second), a 96 MiB WAL, and still 8,192 frames below the automatic
/// checkpoint's threshold. The restart's two syncs stall the pin writer (p90 ~4.5 ms traced),
/// and batches wait behind them: at 8,192 frames (four restarts a second) the new-pin p99 at 64
/// connections was 1.6 ms higher and the rate 7% lower (docs/BENCHMARKS.md, twenty-first
/// session); at 49,152 frames (the threshold raised to 65,536) no better than here.
const RESTART_FRAMES: i64 = 24576;

/// A restart asked for by the checkpoint thread, taken by the pin writer's thread.
#[derive(Default)]
pub(crate) struct WalRestart(AtomicBool);

impl WalRestart {
    fn request(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// Whether a restart was asked for since the last call.
    fn take(&self) -> bool {
        self.0.swap(false, Ordering::AcqRel)
    }

    /// Called by the writer between two transactions: if asked, copies back what is left
    /// of the WAL (a passive checkpoint on the writer's `connection`), so that its next commit
    /// starts the WAL over. A failure is logged; the next request or the automatic checkpoint
    /// tries again.
    pub(crate) fn take_and_checkpoint(&self, connection: &Connection) {
        if !self.take() {
            return;
        }
        match checkpoint(connection) {
            Ok(pass) => tracing::debug!(
                frames = pass.frames,
                copied = pass.copied,
                "the pin writer copied the rest of the WAL back"
            ),
            Err(e) => tracing::warn!(error = %e,
                "the pin writer's checkpoint failed; the WAL is started over later"),
        }
    }
}

/// The checkpoint thread; it ends when this is dropped.
pub(crate) struct WalCheckpoints {
    _stop: mpsc::Sender<()>,
}

/// Starts the checkpoint thread of `database` (a file in WAL mode) on a connection of its own,
/// asking `restart` for restarts.
pub(crate) fn start(database: &Path, restart: Arc<WalRestart>) -> Result<WalCheckpoints> {
    let cannot = |e: &dyn std::fmt::Display| {
        RegistryError::broken(format!(
            "the WAL checkpoint thread cannot start on {}: {e}",
            database.display()
        ))
    };
    let connection = super::pin_thread::open(database).map_err(|e| cannot(&e))?;
    let file = std::fs::File::open(database).map_err(|e| cannot(&e))?;
    let (stop, stopped) = mpsc::channel::<()>();
    std::thread::Builder::new()
        .name("skillbox-wal-ckpt".into())
        .spawn(move || {
            let mut last = None;
            // Nothing is ever sent: the sender's drop ends the wait, and the thread.
            while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(INTERVAL) {
                match pass(&connection, &file, &mut last, RESTART_FRAMES) {
                    Ok(asks) => {
                        if asks {
                            restart.request();
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "WAL checkpoint failed; the next one retries")
                    }
                }
            }
        })
        .map_err(|e| cannot(&e))?;
    Ok(WalCheckpoints { _stop: stop })
}

/// What a checkpoint reported: the WAL's frames and how many of them are copied back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Pass {
    frames: i64,
    copied: i64,
}

/// Copies the WAL back (passive: what no reader still needs, without waiting for anyone).
fn checkpoint(connection: &Connection) -> rusqlite::Result<Pass> {
    connection.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
        Ok(Pass {
            frames: row.get(1)?,
            copied: row.get(2)?,
        })
    })
}

/// One pass of the thread: a checkpoint, then the database file synced if it copied anything
/// since the `last` pass. Returns whether a restart is due (`restart_frames` frames, all
/// copied).
///
/// The sync is for speed, not safety: a partial checkpoint's pages are still in the WAL, and
/// the checkpoint that copies the last frames syncs the database itself. Which one that was
/// cannot be told from here: the frames a checkpoint reports are the WAL's as it began, and
/// SQLite syncs only if no commit came while it copied. Syncing only after passes that
/// reported part of the WAL copied left such pages to the pin thread's checkpoint: p99 at 8
/// connections 16–17.5 ms in `scripts/bench-runs`, against 5.4 ms with a sync after every
/// pass that copied.
fn pass(
    connection: &Connection,
    database: &std::fs::File,
    last: &mut Option<Pass>,
    restart_frames: i64,
) -> Result<bool, Failed> {
    let now = checkpoint(connection)?;
    if now.copied > 0 && *last != Some(now) {
        database.sync_data().map_err(Failed::Sync)?;
    }
    *last = Some(now);
    Ok(now.frames >= restart_frames && now.copied == now.frames)
}

#[derive(Debug, thiserror::Error)]
enum Failed {
    #[error(transparent)]
    Checkpoint(#[from] rusqlite::Error),
    #[error("syncing the database after a checkpoint: {0}")]
    Sync(std::io::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A database in WAL mode in `dir`, with a table, and three more connections to it as the
    /// store opens them: the writer's, the checkpoint thread's and a reader's.
    fn database(dir: &Path) -> (std::path::PathBuf, [Connection; 3]) {
        let file = dir.join("meta.db");
        let setup = Connection::open(&file).unwrap();
        setup
            .execute_batch(
                "PRAGMA journal_mode = WAL; CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT);",
            )
            .unwrap();
        let open = || super::super::pin_thread::open(&file).unwrap();
        (file.clone(), [open(), open(), open()])
    }

    fn commit(writer: &Connection, rows: usize) {
        writer.execute_batch("BEGIN IMMEDIATE").unwrap();
        for _ in 0..rows {
            writer
                .execute("INSERT INTO t (v) VALUES (hex(randomblob(600)))", [])
                .unwrap();
        }
        writer.execute_batch("COMMIT").unwrap();
    }

    /// The WAL header's checkpoint sequence number (big-endian, at byte 12): SQLite counts
    /// each start over of the WAL there.
    fn restarts(file: &Path) -> u32 {
        let mut wal = file.as_os_str().to_owned();
        wal.push("-wal");
        let header = std::fs::read(wal).unwrap();
        u32::from_be_bytes(header[12..16].try_into().unwrap())
    }

    /// Leaves frames in the WAL that no checkpoint copied: a reader's snapshot holds `copy`
    /// back while the writer commits past it. Returns what `copy` returned.
    fn partly_copied<T>(writer: &Connection, reader: &Connection, copy: impl FnOnce() -> T) -> T {
        commit(writer, 20);
        reader.execute_batch("BEGIN").unwrap();
        let _: i64 = reader
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
        commit(writer, 20);
        let copied = copy();
        reader.execute_batch("COMMIT").unwrap();
        copied
    }

    #[test]
    fn a_pass_asks_for_a_restart_only_when_the_wal_is_long_and_all_copied() {
        let dir = tempfile::tempdir().unwrap();
        let (file, [writer, checkpoints, reader]) = database(dir.path());
        let db = std::fs::File::open(&file).unwrap();
        let mut last = None;
        let asked = partly_copied(&writer, &reader, || pass(&checkpoints, &db, &mut last, 1));
        assert!(!asked.unwrap());
        let held = last.unwrap();
        assert!(0 < held.copied && held.copied < held.frames, "{held:?}");
        // All copied, but the WAL is shorter than the threshold.
        assert!(!pass(&checkpoints, &db, &mut last, held.frames + 1).unwrap());
        assert_eq!(last.unwrap().copied, held.frames);
        // All copied, and long enough.
        assert!(pass(&checkpoints, &db, &mut last, held.frames).unwrap());
    }

    #[test]
    fn asked_between_batches_the_writer_starts_the_wal_over() {
        let dir = tempfile::tempdir().unwrap();
        let (file, [writer, checkpoints, reader]) = database(dir.path());
        let held = partly_copied(&writer, &reader, || checkpoint(&checkpoints).unwrap());
        assert!(held.copied < held.frames, "{held:?}");
        let before = restarts(&file);
        let restart = WalRestart::default();

        // Not asked: the writer does nothing, and its next commit goes on appending (the WAL
        // is not all copied).
        restart.take_and_checkpoint(&writer);
        commit(&writer, 1);
        assert_eq!(restarts(&file), before);

        // Asked: it copies the rest, and its next commit starts the WAL over.
        restart.request();
        restart.take_and_checkpoint(&writer);
        assert!(!restart.take(), "the request was taken");
        commit(&writer, 1);
        assert_eq!(restarts(&file), before + 1);
        let pass = checkpoint(&checkpoints).unwrap();
        assert!(pass.frames < 10, "the WAL started over: {pass:?}");
    }
}
