//! Durability of SQLite pin batches behind the writer: a batch commits without waiting for its
//! fsync, and the next batch is written while a thread of its own flushes the WAL; each
//! activation is answered once a flush that began after its batch committed has returned.
//!
//! SQLite's `synchronous = FULL` fsyncs the WAL inside every commit, while the write lock is
//! held: one batch's flush and the next batch's statements could not overlap, and an
//! activation that arrived during a flush (~0.3 ms here) waited for it and then for its own.
//! With `synchronous = NORMAL` for the batch's commit alone (see `pin_common`) and the flush
//! here, what an activation waits for is the same: its pin is in the WAL, synced, before its
//! answer leaves.
//!
//! A commit is visible to readers before it is durable. Reads in this process that can see a
//! pin or a lease renewal (a run's record, a pinned read's check) therefore wait with
//! [`Durability::reads_are_durable`] until every batch whose commit had begun when they read
//! is flushed: nothing is served from a pin that an operating-system crash could take back.
//! Another process on the same database file does not see this process's batches' numbers:
//! for the one flush (~0.3 ms) after a commit it may read a pin that is not durable yet. A pin
//! it activates itself is made durable by its own flush (a flush covers the whole file,
//! whoever wrote it); a process crash (`kill -9`) loses nothing either way, since the WAL's
//! pages are in the kernel once the commit returns.

use crate::{RegistryError, Result};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};

/// Which pin batches have begun to commit, and which are durable.
pub(crate) struct Durability {
    /// Batches numbered as they begin to commit (the number is taken before `COMMIT` is sent,
    /// so a reader that saw a batch's writes finds a number at least as high).
    started: AtomicU64,
    /// Every batch up to this number is durable.
    synced: tokio::sync::watch::Sender<u64>,
}

impl Durability {
    /// Numbers the batch about to commit.
    pub(crate) fn start_batch(&self) -> u64 {
        self.started.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Returns once every batch whose commit had begun is durable: called after a read, it
    /// makes whatever the read saw of pin batches durable before it is used.
    pub(crate) async fn reads_are_durable(&self) -> Result<()> {
        let target = self.started.load(Ordering::SeqCst);
        if *self.synced.borrow() >= target {
            return Ok(());
        }
        let mut synced = self.synced.subscribe();
        synced
            .wait_for(|synced| *synced >= target)
            .await
            .map(|_| ())
            .map_err(|_| RegistryError::broken("the pin batches' WAL flusher stopped"))
    }
}

/// The answers of one committed batch, held until its flush.
pub(crate) struct CommittedBatch<A> {
    pub number: u64,
    /// Pins the batch wrote (a flush that covers none is not counted as a pin commit).
    pub written: u64,
    pub answers: Vec<(tokio::sync::oneshot::Sender<Result<A>>, Result<A>)>,
}

/// Where the writer hands committed batches over; the flusher thread ends when it is dropped.
pub(crate) type Flushes<A> = mpsc::Sender<CommittedBatch<A>>;

/// Starts the flusher of `wal` (the database's `-wal` file): it flushes after each committed
/// batch (and once for all batches that queued during a flush), then marks them durable and
/// answers their callers. `flushed` is told each flush that covered written pins.
pub(crate) fn start<A: Send + 'static>(
    wal: PathBuf,
    flushed: impl Fn() + Send + 'static,
) -> std::io::Result<(Arc<Durability>, Flushes<A>)> {
    let durability = Arc::new(Durability {
        started: AtomicU64::new(0),
        synced: tokio::sync::watch::Sender::new(0),
    });
    let (flushes, batches) = mpsc::channel::<CommittedBatch<A>>();
    let marks = durability.clone();
    std::thread::Builder::new()
        .name("skillbox-pin-flush".into())
        .spawn(move || {
            let mut wal = WalFile { path: wal, file: None };
            while let Ok(first) = batches.recv() {
                let mut ready = vec![first];
                ready.extend(batches.try_iter());
                let outcome = wal.flush();
                if let Err(e) = &outcome {
                    tracing::error!(wal = %wal.path.display(), error = %e,
                        "flushing the WAL failed: the batch's activations are answered with an error");
                }
                if outcome.is_ok() && ready.iter().any(|b| b.written > 0) {
                    flushed();
                }
                if let Some(last) = ready.last() {
                    marks.synced.send_replace(last.number);
                }
                for batch in ready {
                    for (reply, answer) in batch.answers {
                        let answer = match (&outcome, answer) {
                            (Err(e), Ok(_)) => Err(RegistryError::broken(format!(
                                "the activation was committed but its flush to disk failed ({e}); \
                                 retry it: a retry finds the pin if it was kept"
                            ))),
                            (_, answer) => answer,
                        };
                        // The caller may have gone (its request was cancelled): the pin stays.
                        let _ = reply.send(answer);
                    }
                }
            }
        })?;
    Ok((durability, flushes))
}

/// The WAL file, opened once and again if it was removed and made anew (it is removed when
/// the last connection to the database closes).
struct WalFile {
    path: PathBuf,
    file: Option<std::fs::File>,
}

impl WalFile {
    fn flush(&mut self) -> std::io::Result<()> {
        let file = match self.file.take() {
            Some(file) if file.metadata()?.nlink() > 0 => file,
            _ => std::fs::File::open(&self.path)?,
        };
        self.file.insert(file).sync_data()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;
    use std::sync::atomic::AtomicUsize;

    fn flusher(wal: PathBuf) -> (Arc<Durability>, Flushes<u32>, Arc<AtomicUsize>) {
        let flushes = Arc::new(AtomicUsize::new(0));
        let counted = flushes.clone();
        let (durability, queue) = start(wal, move || {
            counted.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
        (durability, queue, flushes)
    }

    fn batch(
        number: u64,
        written: u64,
    ) -> (
        CommittedBatch<u32>,
        tokio::sync::oneshot::Receiver<Result<u32>>,
    ) {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let answers = vec![(reply, Ok(7))];
        let batch = CommittedBatch {
            number,
            written,
            answers,
        };
        (batch, answer)
    }

    #[tokio::test]
    async fn reads_wait_until_the_batches_begun_before_them_are_flushed() {
        let dir = tempfile::tempdir().unwrap();
        let wal = dir.path().join("meta.db-wal");
        std::fs::write(&wal, b"frames").unwrap();
        let (durability, queue, flushes) = flusher(wal);
        // Nothing begun: nothing to wait for.
        assert!(durability.reads_are_durable().now_or_never().is_some());

        let number = durability.start_batch();
        let mut read = Box::pin(durability.reads_are_durable());
        // Until the batch is handed over and flushed, a read that may have seen it waits.
        assert!((&mut read).now_or_never().is_none());
        let (committed, answer) = batch(number, 1);
        queue.send(committed).unwrap();
        read.await.unwrap();
        assert_eq!(answer.await.unwrap().unwrap(), 7);
        assert_eq!(flushes.load(Ordering::SeqCst), 1);

        // A flush for a batch that wrote no pin is no pin commit.
        let (committed, answer) = batch(durability.start_batch(), 0);
        queue.send(committed).unwrap();
        assert_eq!(answer.await.unwrap().unwrap(), 7);
        assert_eq!(flushes.load(Ordering::SeqCst), 1);
        durability.reads_are_durable().await.unwrap();
    }

    #[tokio::test]
    async fn a_failed_flush_answers_with_an_error_and_no_read_waits_forever() {
        let dir = tempfile::tempdir().unwrap();
        let (durability, queue, flushes) = flusher(dir.path().join("no-such-wal"));
        let (committed, answer) = batch(durability.start_batch(), 1);
        queue.send(committed).unwrap();
        let e = answer.await.unwrap().unwrap_err().to_string();
        assert!(e.contains("flush to disk failed"), "{e}");
        durability.reads_are_durable().await.unwrap();
        assert_eq!(flushes.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_wal_removed_and_made_anew_is_opened_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.db-wal");
        std::fs::write(&path, b"frames").unwrap();
        let mut wal = WalFile {
            path: path.clone(),
            file: None,
        };
        wal.flush().unwrap();
        std::fs::remove_file(&path).unwrap();
        // The held file is gone from the directory: flushing it would make nothing durable.
        assert!(wal.flush().is_err());
        std::fs::write(&path, b"new frames").unwrap();
        wal.flush().unwrap();
        let held = wal.file.as_ref().unwrap().metadata().unwrap();
        assert_eq!(held.ino(), std::fs::metadata(&path).unwrap().ino());
    }
}
