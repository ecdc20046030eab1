//! The SQLite pin writer's thread: the common case of every pin batch ([`pin_common`]'s
//! statements) written on a connection of its own, by a thread that does nothing else, and
//! handed to the WAL flusher ([`pin_sync`]) that answers it once durable.
//!
//! Through sqlx the same batch took a tokio task and the connection's worker thread passing
//! it back and forth: ~20 futex calls per batch on the worker, and as many wake-ups of a
//! runtime thread, on two cores shared with the connections' threads. At 8 connections in
//! `scripts/bench-runs` a batch of ~3 pins spent ~380 µs between its task and the worker for
//! ~180 µs of SQLite's own work. Here a connection's request goes to this thread and its
//! answer comes back from the flusher: two hand-overs per batch.
//!
//! The thread's connection is a second writer on the database file, beside the store's sqlx
//! writer: SQLite's write lock (`BEGIN IMMEDIATE`) orders their transactions, as it orders
//! two processes' (collection and revocation still serialize with every pin). Whichever
//! waits for the other sleeps in SQLite's busy handler (a millisecond or more), which the
//! store's other writes rarely cause: they are publications, revocations, collection and
//! lease renewals of cached pins.
//!
//! Only the common case is written here, and existing pins of live runs are found (one more
//! statement, only for a batch that has such requests). A request neither covers (a run or
//! skill that is not live, a revision that is not available or not the pinned one, a repeat
//! of a pair in the same batch) is answered `None` once the batch is durable, and its caller
//! takes the long way through the sqlx writer, which says why (and finds the pin a repeat's
//! first wrote, durable by then).

use super::pin_sync::{self, Durability, Flushes};
use super::runs::{
    LivePin, PinRequest, PinStats, PinWriter, first_of_each_pair, sqlite_existing_pins,
    sqlite_pin_statements,
};
use super::wal_checkpoints::WalRestart;
use crate::{RegistryError, Result};
use rusqlite::Connection;
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, mpsc};

/// The batch's answers, by (run, skill name): each pin and whether it was written now.
type Pinned = HashMap<(String, String), (LivePin, bool)>;

/// The pin (`Some`: written now, or found as the run's pin of a live run, with no other
/// revision requested), or `None`: the request is for the long way.
pub(crate) type Answer = Option<(LivePin, bool)>;

type Reply = tokio::sync::oneshot::Sender<Result<Answer>>;

/// The queue of the pin writer's thread; the thread ends when the last clone is dropped.
#[derive(Clone)]
pub(crate) struct PinThread {
    queue: mpsc::Sender<(PinRequest, Reply)>,
}

impl PinThread {
    /// Opens a connection to `database` (a file in WAL mode, whose WAL `flusher` flushes)
    /// and starts the thread on it; between batches it takes `restart`'s requests.
    pub(crate) fn start(
        database: &Path,
        durability: Arc<Durability>,
        flusher: Flushes<Answer>,
        stats: Arc<PinStats>,
        restart: Arc<WalRestart>,
    ) -> Result<Self> {
        let connection = open(database).map_err(|e| {
            RegistryError::broken(format!(
                "the pin writer cannot open {}: {e}",
                database.display()
            ))
        })?;
        let (queue, requests) = mpsc::channel();
        std::thread::Builder::new()
            .name("skillbox-pin-write".into())
            .spawn(move || {
                write_batches(
                    connection,
                    requests,
                    &durability,
                    &flusher,
                    &stats,
                    &restart,
                )
            })
            .map_err(|e| RegistryError::broken(format!("no pin writer thread: {e}")))?;
        Ok(PinThread { queue })
    }

    /// Writes `request`'s pin if it is the common case; answered once durable. `None` when the
    /// thread is gone.
    pub(crate) async fn pin(&self, request: PinRequest) -> Option<Result<Answer>> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.queue.send((request, reply)).ok()?;
        answer.await.ok()
    }
}

/// The connection, set as the store's own (see `MetaStore::connect`) except that its commits
/// do not flush: the flusher does, before anyone is answered. (The WAL's checkpoint thread
/// opens its connection so too: its checkpoints sync, as `synchronous = NORMAL` has them.)
pub(super) fn open(database: &Path) -> Result<Connection, BatchFailed> {
    let connection = Connection::open(database)?;
    connection.execute_batch(
        "PRAGMA busy_timeout = 30000;
         PRAGMA foreign_keys = ON;
         PRAGMA synchronous = NORMAL;
         PRAGMA cache_size = -16384;
         PRAGMA wal_autocheckpoint = 32768;
         PRAGMA temp_store = MEMORY;",
    )?;
    let mode: String = connection.query_row("PRAGMA journal_mode", [], |row| row.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        // Without a WAL the flusher's fsync would not cover the commits.
        return Err(BatchFailed::NotWal(mode));
    }
    // Statements for the batch sizes seen lately: three per size.
    connection.set_prepared_statement_cache_capacity(3 * 64);
    Ok(connection)
}

/// Why the thread's connection could not be opened, or a batch not written.
#[derive(Debug, thiserror::Error)]
pub(super) enum BatchFailed {
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
    #[error("the journal mode is {0}, not wal")]
    NotWal(String),
    #[error("run {0} got a pin but its lease cannot be read")]
    NoLease(String),
}

fn write_batches(
    mut connection: Connection,
    requests: mpsc::Receiver<(PinRequest, Reply)>,
    durability: &Durability,
    flusher: &Flushes<Answer>,
    stats: &PinStats,
    restart: &WalRestart,
) {
    while let Ok(first) = requests.recv() {
        let mut batch = vec![first];
        batch.extend(requests.try_iter().take(PinWriter::MAX_BATCH - 1));
        let pairs: Vec<&PinRequest> = batch.iter().map(|(request, _)| request).collect();
        let (number, mut pinned) = match write(&mut connection, &pairs, durability) {
            Ok(written) => written,
            Err(e) => {
                // Nothing of the batch stays (the transaction rolled back): each request
                // takes the long way, which reports its own error if it has one.
                tracing::warn!(error = %e, pins = batch.len(),
                    "the pin thread's batch failed; its requests go to the writer task");
                (durability.start_batch(), HashMap::new())
            }
        };
        let written = pinned.values().filter(|(_, now)| *now).count() as u64;
        stats.wrote(written);
        let answers: Vec<(Reply, Result<Answer>)> = batch
            .into_iter()
            .map(|(request, reply)| {
                // Once per pair: a repeat takes the long way.
                (reply, Ok(pinned.remove(&(request.run_id, request.skill))))
            })
            .collect();
        let committed = pin_sync::CommittedBatch {
            number,
            written,
            answers,
        };
        if let Err(unsent) = flusher.send(committed) {
            // The flusher is gone: no answer may leave before a flush.
            for (reply, _) in unsent.0.answers {
                let _ = reply.send(Err(RegistryError::broken(
                    "the pin batches' WAL flusher stopped",
                )));
            }
        }
        // Between two transactions, with the batch's answers on their way.
        restart.take_and_checkpoint(&connection);
    }
}

/// The common case of `requests` in one transaction: its number among the batches (taken
/// before its commit, see [`Durability::start_batch`]) and the pins written or found, by
/// (run, skill).
fn write(
    connection: &mut Connection,
    requests: &[&PinRequest],
    durability: &Durability,
) -> Result<(u64, Pinned), BatchFailed> {
    let requests = first_of_each_pair(requests);
    let tx = connection.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let [insert, renew, leases] = sqlite_pin_statements(requests.len());
    let mut inserted = Vec::new();
    for_each_row(&tx, &insert, &requests, |row| {
        let key: (String, String) = (row.get(0)?, row.get(1)?);
        inserted.push((key, row.get::<_, String>(2)?, row.get(3)?, row.get(4)?));
        Ok(())
    })?;
    for_each_row(&tx, &renew, &requests, |_| Ok(()))?;
    let mut lease_of = HashMap::new();
    for_each_row(&tx, &leases, &requests, |row| {
        let lease: (i64, i64) = (row.get(1)?, row.get(2)?);
        lease_of.insert(row.get::<_, String>(0)?, lease);
        Ok(())
    })?;
    let mut pins = HashMap::with_capacity(requests.len());
    for (key, skill_id, revision, digest) in inserted {
        let Some(&(ttl_ms, expires_at)) = lease_of.get(&key.0) else {
            // Rolled back when `tx` is dropped.
            return Err(BatchFailed::NoLease(key.0));
        };
        let pin = LivePin {
            skill_id,
            revision,
            digest,
            ttl_ms,
            expires_at,
        };
        pins.insert(key, (pin, true));
    }
    // The rest may be pins that exist (activated before, not in this server's pin cache): found
    // here, as the long way would find them, instead of a second trip through the writer task.
    // (Requests are one per pair: when every one was inserted there is no rest to look for.)
    if pins.len() < requests.len() {
        let rest: Vec<&PinRequest> = requests
            .iter()
            .copied()
            .filter(|r| !pins.contains_key(&(r.run_id.clone(), r.skill.clone())))
            .collect();
        for_each_row(&tx, &sqlite_existing_pins(rest.len()), &rest, |row| {
            let key: (String, String) = (row.get(0)?, row.get(1)?);
            let pin = LivePin {
                skill_id: row.get(2)?,
                revision: row.get(3)?,
                digest: row.get(4)?,
                ttl_ms: row.get(5)?,
                expires_at: row.get(6)?,
            };
            pins.insert(key, (pin, false));
            Ok(())
        })?;
    }
    let number = durability.start_batch();
    tx.commit()?;
    Ok((number, pins))
}

/// Runs `sql` (cached), whose one list of requests ([`sqlite_requests`]) is bound to
/// `requests`, inside `tx`, handing each row it returns to `row`.
fn for_each_row(
    tx: &rusqlite::Transaction<'_>,
    sql: &str,
    requests: &[&PinRequest],
    mut row: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<()>,
) -> rusqlite::Result<()> {
    let mut statement = tx.prepare_cached(sql)?;
    let mut index = 1;
    for r in requests {
        statement.raw_bind_parameter(index, &r.run_id)?;
        statement.raw_bind_parameter(index + 1, &r.workspace)?;
        statement.raw_bind_parameter(index + 2, &r.skill)?;
        statement.raw_bind_parameter(index + 3, r.requested)?;
        statement.raw_bind_parameter(index + 4, r.now)?;
        index += 5;
    }
    let mut rows = statement.raw_query();
    while let Some(next) = rows.next()? {
        row(next)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::runs::tests::{publish, request};
    use crate::{Registry, RegistryConfig};

    /// A registry in `dir` and the thread's connection and batch numbers beside it.
    async fn beside(dir: &Path) -> (Arc<Registry>, Connection, Arc<Durability>) {
        let r = Registry::open(RegistryConfig::new(dir)).await.unwrap();
        let file = crate::meta::sqlite_file(r.meta().writer())
            .await
            .unwrap()
            .expect("the registry's database is a file");
        let (durability, _flushes) =
            crate::meta::runs::start_flusher::<Answer>(&file, &Default::default())
                .expect("the WAL flusher starts");
        (r, open(&file).unwrap(), durability)
    }

    /// The thread writes exactly the common case of a batch (new pins of live runs, the
    /// requested or current revision, leases renewed where under half), finds existing pins,
    /// and leaves the rest (a repeat, an unauthorized skill, another revision than the pinned
    /// one, a finished run) for the long way.
    #[tokio::test]
    async fn the_thread_writes_the_common_case_and_leaves_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let (r, mut connection, durability) = beside(dir.path()).await;
        publish(&r, "a", 0).await;
        publish(&r, "a", 1).await;
        publish(&r, "b", 0).await;
        let run = |skills: Option<Vec<&str>>, ttl| {
            let skills = skills.map(|s| s.into_iter().map(String::from).collect());
            let r = r.clone();
            async move { r.create_run("ws", skills, ttl, false).await.unwrap() }
        };
        let both = run(None, None).await.run_id;
        let only_a = run(Some(vec!["a"]), None).await.run_id;
        let existing = run(None, None).await.run_id;
        r.activate("ws", &existing, "a", None).await.unwrap();
        let conflicting = run(None, None).await.run_id;
        r.activate("ws", &conflicting, "a", None).await.unwrap();
        let done = run(None, None).await.run_id;
        r.finish_run("ws", &done).await.unwrap();
        let renewing = run(None, Some(3)).await;
        tokio::time::sleep(std::time::Duration::from_millis(1600)).await;

        let batch = [
            request(&both, "a", None).0,
            request(&both, "b", None).0,
            request(&both, "a", None).0,
            request(&only_a, "a", Some(1)).0,
            request(&only_a, "b", None).0,
            request(&existing, "a", None).0,
            request(&existing, "b", None).0,
            request(&existing, "b", Some(1)).0,
            request(&only_a, "b", Some(1)).0,
            request(&conflicting, "a", Some(1)).0,
            request(&done, "a", None).0,
            request(&renewing.run_id, "a", None).0,
        ];
        let before = durability.start_batch();
        let requests: Vec<&PinRequest> = batch.iter().collect();
        let (number, written) = write(&mut connection, &requests, &durability).unwrap();
        assert!(
            number > before,
            "numbered after the batches begun before it"
        );
        let mut pins: Vec<(&str, &str, i64, bool)> = written
            .iter()
            .map(|((run, skill), (pin, now))| (run.as_str(), skill.as_str(), pin.revision, *now))
            .collect();
        pins.sort();
        let mut expected = vec![
            (both.as_str(), "a", 2, true),
            (both.as_str(), "b", 1, true),
            (only_a.as_str(), "a", 1, true),
            (existing.as_str(), "a", 2, false),
            (existing.as_str(), "b", 1, true),
            (renewing.run_id.as_str(), "a", 2, true),
        ];
        expected.sort();
        assert_eq!(pins, expected);
        // Committed, with the leases it answered; the short one renewed.
        assert!(connection.is_autocommit());
        let view = r.run("ws", &renewing.run_id).await.unwrap();
        assert!(view.expires_at > renewing.expires_at, "lease renewed");
        let (answered, _) = &written[&(renewing.run_id.clone(), "a".to_string())];
        assert_eq!(answered.expires_at, view.expires_at);
        let pinned: Vec<_> = r.run("ws", &both).await.unwrap().activations;
        assert_eq!(pinned.len(), 2);
        assert!(r.run("ws", &done).await.unwrap().activations.is_empty());
    }

    /// A batch refused partway leaves nothing written and no transaction open, and the next
    /// batch goes through.
    #[tokio::test]
    async fn a_failed_batch_rolls_back_on_the_thread() {
        let dir = tempfile::tempdir().unwrap();
        let (r, mut connection, durability) = beside(dir.path()).await;
        publish(&r, "a", 0).await;
        let run = r.create_run("ws", None, None, false).await.unwrap().run_id;
        let trigger = "CREATE TRIGGER refuse BEFORE INSERT ON pins \
                       BEGIN SELECT RAISE(ABORT, 'refused'); END";
        connection.execute_batch(trigger).unwrap();
        let request = request(&run, "a", None).0;
        let failed = write(&mut connection, &[&request], &durability);
        assert!(failed.is_err(), "the trigger refuses the insert");
        assert!(connection.is_autocommit(), "no transaction left open");
        let pins: i64 = connection
            .query_row("SELECT count(*) FROM pins", [], |row| row.get(0))
            .unwrap();
        assert_eq!(pins, 0);
        connection.execute_batch("DROP TRIGGER refuse").unwrap();
        let (_, written) = write(&mut connection, &[&request], &durability).unwrap();
        assert_eq!(written.len(), 1);
    }
}
