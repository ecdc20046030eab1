//! The registry in process (no server, no HTTP): compare-and-swap publication, replayed
//! retries, activation conflicts and pins, revocation, garbage-collection roots, verification
//! of stored objects. Each scenario runs on every storage configuration (`storage_test!`):
//! embedded (SQLite + local store), PostgreSQL + local store, and the scale-out one,
//! PostgreSQL + S3 — the one SQL text and the one content code must hold on all.
//!
//! PostgreSQL: `SKILLBOX_TEST_POSTGRES` names a server where the tests may create databases
//! (`scripts/test` starts one); each test gets a fresh database. S3: `SKILLBOX_TEST_S3_BUCKET`
//! names a bucket on the server the `AWS_*` variables point at (`scripts/test` starts
//! SeaweedFS); each test gets a fresh prefix.

use skillbox_registry::{Registry, RegistryConfig, RegistryError};
use std::sync::Arc;
use std::time::Duration;

const WS: &str = "acme";

/// Where a test's metadata and content live.
#[derive(Clone, Copy, PartialEq)]
enum Storage {
    /// SQLite + the local store in the data directory.
    Embedded,
    /// PostgreSQL + the local store.
    Postgres,
    /// PostgreSQL + S3.
    PostgresS3,
}

/// Defines a test per storage configuration for the scenario `async fn $name(storage: Storage)`.
macro_rules! storage_test {
    ($name:ident) => {
        mod $name {
            #[tokio::test]
            async fn sqlite() {
                super::$name(super::Storage::Embedded).await
            }

            #[tokio::test]
            async fn postgres() {
                super::$name(super::Storage::Postgres).await
            }

            #[tokio::test]
            async fn postgres_s3() {
                super::$name(super::Storage::PostgresS3).await
            }
        }
    };
}

/// A fresh place in the test bucket.
fn fresh_s3_store() -> String {
    let bucket = std::env::var("SKILLBOX_TEST_S3_BUCKET").expect(
        "SKILLBOX_TEST_S3_BUCKET must name a bucket on the S3 server that AWS_ENDPOINT_URL \
         points at; scripts/test starts one",
    );
    format!(
        "s3://{bucket}/registry-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

/// A fresh database on the test PostgreSQL server.
async fn fresh_postgres_database() -> String {
    use sqlx::Connection;
    let server = std::env::var("SKILLBOX_TEST_POSTGRES").expect(
        "SKILLBOX_TEST_POSTGRES must name a PostgreSQL server for the tests \
         (postgres://user@host:port/db); scripts/test starts one",
    );
    sqlx::any::install_default_drivers();
    let mut admin = sqlx::AnyConnection::connect(&server).await.unwrap();
    let name = format!(
        "skillbox_test_{}_{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut admin)
        .await
        .unwrap();
    let base = server.rsplit_once('/').map_or(server.as_str(), |(b, _)| b);
    format!("{base}/{name}")
}

async fn config(storage: Storage, dir: &std::path::Path) -> RegistryConfig {
    let mut cfg = RegistryConfig::new(dir);
    if storage != Storage::Embedded {
        cfg.database_url = Some(fresh_postgres_database().await);
    }
    if storage == Storage::PostgresS3 {
        cfg.store = Some(fresh_s3_store());
    }
    cfg
}

async fn open(storage: Storage) -> (Arc<Registry>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let registry = Registry::open(config(storage, dir.path()).await)
        .await
        .unwrap();
    (registry, dir)
}

/// A second server on the same database and store: on PostgreSQL with its own data directory
/// (servers share only the database and the store), embedded on the same data directory (as
/// processes on one SQLite database do).
async fn open_beside(first: &Registry) -> (Arc<Registry>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = first.config().clone();
    if cfg.database_url.is_some() {
        cfg.data_dir = dir.path().to_path_buf();
        if cfg.store.is_none() {
            cfg.store = Some(format!("file://{}", first.data_dir().store().display()));
        }
    }
    (Registry::open(cfg).await.unwrap(), dir)
}

/// The bytes of a file of a run's pinned revision.
async fn pinned_bytes(
    r: &Registry,
    run: &str,
    skill: &str,
    path: &str,
) -> Result<Vec<u8>, RegistryError> {
    let (_, content) = r.pinned_file(WS, run, skill, path).await?;
    Ok(match content {
        skillbox_registry::FileContent::Bytes(b) => b.to_vec(),
        skillbox_registry::FileContent::Path(p) => std::fs::read(p).unwrap(),
    })
}

/// Polls `check` until it holds, for at most `within`; whether it did.
async fn holds_within<F, Fut>(within: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A tar of a valid package of `name` whose SKILL.md body says `version`.
fn package(name: &str, version: &str) -> Vec<u8> {
    let md = format!("---\nname: {name}\ndescription: {name} {version}\n---\n# {name} {version}\n");
    let mut tar = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_ustar();
    header.set_size(md.len() as u64);
    header.set_mode(0o644);
    header.set_cksum();
    tar.append_data(&mut header, "SKILL.md", md.as_bytes())
        .unwrap();
    tar.into_inner().unwrap()
}

async fn publish(
    r: &Registry,
    name: &str,
    base: i64,
    version: &str,
) -> Result<skillbox_registry::Published, RegistryError> {
    let staging = r.new_staging("test-").unwrap();
    std::fs::write(staging.path().join("upload"), package(name, version)).unwrap();
    r.publish_archive(WS, name, base, staging, None, "test")
        .await
}

async fn publication_is_compare_and_swap_and_a_retry_replays(storage: Storage) {
    let (r, _dir) = open(storage).await;
    let v1 = publish(&r, "demo", 0, "v1").await.unwrap();
    assert_eq!((v1.revision, v1.replayed), (1, false));
    // Two writers from the same base: one wins, the other gets the current revision.
    let (a, b) = tokio::join!(publish(&r, "demo", 1, "a"), publish(&r, "demo", 1, "b"));
    let (winner_version, won, lost) = match (a, b) {
        (Ok(w), Err(l)) => ("a", w, l),
        (Err(l), Ok(w)) => ("b", w, l),
        other => panic!("exactly one writer wins: {other:?}"),
    };
    assert_eq!(won.revision, 2);
    match lost {
        RegistryError::RevisionConflict {
            current_revision,
            base_revision,
        } => assert_eq!((current_revision, base_revision), (2, 1)),
        e => panic!("not a conflict: {e:?}"),
    }
    // The winner's retry (same base, same content) answers with its revision, not a conflict.
    let again = publish(&r, "demo", 1, winner_version).await.unwrap();
    assert_eq!((again.revision, again.replayed), (2, true));
    // Publishing what is current changes nothing either.
    let same = publish(&r, "demo", 2, winner_version).await.unwrap();
    assert_eq!((same.revision, same.replayed), (2, true));
    assert_eq!(r.revisions(WS, "demo").await.unwrap().len(), 2);
}
storage_test!(publication_is_compare_and_swap_and_a_retry_replays);

async fn a_run_sees_its_pin_whatever_is_published_and_refuses_a_second_revision(storage: Storage) {
    let (r, _dir) = open(storage).await;
    publish(&r, "demo", 0, "v1").await.unwrap();
    let run = r.create_run(WS, None, None, false).await.unwrap();
    let a = r.activate(WS, &run.run_id, "demo", None).await.unwrap();
    assert_eq!(a.revision, 1);
    publish(&r, "demo", 1, "v2").await.unwrap();
    // Re-activation keeps the pin; asking for another revision is a conflict.
    let again = r.activate(WS, &run.run_id, "demo", None).await.unwrap();
    assert_eq!(
        (again.revision, again.instructions.trim()),
        (1, "# demo v1")
    );
    match r.activate(WS, &run.run_id, "demo", Some(2)).await {
        Err(RegistryError::ActivationConflict {
            pinned_revision: 1,
            requested_revision: 2,
            ..
        }) => {}
        other => panic!("not an activation conflict: {other:?}"),
    }
    let (_, content) = r
        .pinned_file(WS, &run.run_id, "demo", "SKILL.md")
        .await
        .unwrap();
    let bytes = match content {
        skillbox_registry::FileContent::Bytes(b) => b.to_vec(),
        skillbox_registry::FileContent::Path(p) => std::fs::read(p).unwrap(),
    };
    assert!(String::from_utf8_lossy(&bytes).contains("demo v1"));
    // A new run pins the new current revision.
    let fresh = r.create_run(WS, None, None, false).await.unwrap();
    assert_eq!(
        r.activate(WS, &fresh.run_id, "demo", None)
            .await
            .unwrap()
            .revision,
        2
    );
    // Revoking the pinned revision stops the pinned read at once; finishing ends the run.
    r.revoke(WS, "demo", 1, "bad").await.unwrap();
    assert!(matches!(
        r.pinned_file(WS, &run.run_id, "demo", "SKILL.md").await,
        Err(RegistryError::RevisionRevoked(_))
    ));
    r.finish_run(WS, &fresh.run_id).await.unwrap();
    assert!(matches!(
        r.activate(WS, &fresh.run_id, "demo", None).await,
        Err(RegistryError::NotFound(_))
    ));
    assert!(matches!(
        r.create_run(WS, Some(vec!["nope".into()]), None, false)
            .await,
        Err(RegistryError::NotFound(_))
    ));
}
storage_test!(a_run_sees_its_pin_whatever_is_published_and_refuses_a_second_revision);

/// The JSON answer (`activate_json`, what the HTTP route sends) is the `Activation` of the
/// same pin, also where one content (one digest, whose answers are kept) is published as two
/// revisions and in two workspaces.
async fn an_activation_answers_the_same_as_json_whatever_shares_its_content(storage: Storage) {
    let (r, _dir) = open(storage).await;
    publish(&r, "demo", 0, "v1").await.unwrap();
    publish(&r, "demo", 1, "v2").await.unwrap();
    let again = publish(&r, "demo", 2, "v1").await.unwrap();
    assert_eq!((again.revision, again.replayed), (3, false));
    let staging = r.new_staging("test-").unwrap();
    std::fs::write(staging.path().join("upload"), package("demo", "v1")).unwrap();
    r.publish_archive("other", "demo", 0, staging, None, "test")
        .await
        .unwrap();
    let mut digests = std::collections::HashSet::new();
    for (ws, revision) in [(WS, Some(1)), (WS, Some(3)), ("other", None), (WS, Some(1))] {
        let run = r.create_run(ws, None, None, false).await.unwrap().run_id;
        // First as JSON (a new pin), then again (the pin cache's answer), then as the struct.
        let first = r.activate_json(ws, &run, "demo", revision).await.unwrap();
        let cached = r.activate_json(ws, &run, "demo", None).await.unwrap();
        let activation = r.activate(ws, &run, "demo", None).await.unwrap();
        for body in [first, cached] {
            let answer: skillbox_api::Activation = serde_json::from_slice(&body).unwrap();
            assert_eq!(answer, activation);
        }
        assert_eq!(activation.revision, revision.unwrap_or(1));
        assert_eq!(activation.instructions.trim(), "# demo v1");
        digests.insert(activation.digest);
    }
    assert_eq!(digests.len(), 1, "one content throughout");
}
storage_test!(an_activation_answers_the_same_as_json_whatever_shares_its_content);

async fn collection_keeps_the_current_and_pinned_revisions_and_takes_the_rest(storage: Storage) {
    let (r, _dir) = open(storage).await;
    for (base, v) in [(0, "v1"), (1, "v2"), (2, "v3"), (3, "v4")] {
        publish(&r, "demo", base, v).await.unwrap();
    }
    // A live run pins v2 (by asking for it); v4 is current; v1 and v3 are nobody's.
    let run = r.create_run(WS, None, None, false).await.unwrap();
    r.activate(WS, &run.run_id, "demo", Some(2)).await.unwrap();
    // Within the grace period nothing is collected.
    let young = r.gc(false, Duration::from_secs(3600)).await.unwrap();
    assert!(young.revisions.is_empty(), "{young:?}");
    let dry = r.gc(true, Duration::ZERO).await.unwrap();
    let taken = |report: &skillbox_registry::GcReport| -> Vec<i64> {
        let mut v: Vec<i64> = report.revisions.iter().map(|c| c.revision).collect();
        v.sort();
        v
    };
    assert_eq!(taken(&dry), [1, 3]);
    assert_eq!(
        r.revisions(WS, "demo").await.unwrap().len(),
        4,
        "a dry run changes nothing"
    );
    let report = r.gc(false, Duration::ZERO).await.unwrap();
    assert_eq!(taken(&report), [1, 3]);
    // The pinned revision still reads; a collected one cannot be activated.
    r.pinned_file(WS, &run.run_id, "demo", "SKILL.md")
        .await
        .unwrap();
    let fresh = r.create_run(WS, None, None, false).await.unwrap();
    assert!(matches!(
        r.activate(WS, &fresh.run_id, "demo", Some(1)).await,
        Err(RegistryError::NotFound(_))
    ));
    // Once the run ends, its pin is no root.
    r.finish_run(WS, &run.run_id).await.unwrap();
    let report = r.gc(false, Duration::ZERO).await.unwrap();
    assert_eq!(taken(&report), [2]);
    assert!(r.fsck().await.unwrap().ok);
}
storage_test!(collection_keeps_the_current_and_pinned_revisions_and_takes_the_rest);

async fn the_store_creates_each_object_once(storage: Storage) {
    use object_store::{ObjectStoreExt, PutMode, PutOptions, path::Path};
    let (r, _dir) = open(storage).await;
    let store = r.content().object_store().clone();
    let create = || PutOptions {
        mode: PutMode::Create,
        ..Default::default()
    };
    // Writers racing to create one key with different bytes: exactly one wins, and what is
    // stored is the winner's (the S3 server honours `If-None-Match: *`, checked, not assumed).
    let key = Path::from("probe/create-if-absent");
    let attempts = (0..16u8).map(|i| {
        let (store, key) = (store.clone(), key.clone());
        async move {
            store
                .put_opts(&key, vec![i; 64].into(), create())
                .await
                .map(|_| i)
        }
    });
    let results = futures_util::future::join_all(attempts).await;
    let winners: Vec<u8> = results
        .iter()
        .filter_map(|r| r.as_ref().ok().copied())
        .collect();
    assert_eq!(winners.len(), 1, "{results:?}");
    for lost in results.iter().filter_map(|r| r.as_ref().err()) {
        assert!(
            matches!(lost, object_store::Error::AlreadyExists { .. }),
            "a losing create is AlreadyExists: {lost:?}"
        );
    }
    let stored = store.get(&key).await.unwrap().bytes().await.unwrap();
    assert_eq!(stored.to_vec(), vec![winners[0]; 64]);
}
storage_test!(the_store_creates_each_object_once);

async fn a_corrupt_object_is_treated_as_missing_and_never_served(storage: Storage) {
    use object_store::ObjectStoreExt;
    let (r, _dir) = open(storage).await;
    publish(&r, "demo", 0, "v1").await.unwrap();
    let run = r.create_run(WS, None, None, false).await.unwrap();
    r.activate(WS, &run.run_id, "demo", None).await.unwrap();
    let good = pinned_bytes(&r, &run.run_id, "demo", "SKILL.md")
        .await
        .unwrap();
    let view = r
        .revision(WS, "demo", skillbox_registry::RevSel::Current)
        .await
        .unwrap();
    let sha = view.manifest.get("SKILL.md").unwrap().sha256;
    let key = skillbox_registry::content::blob_key(&sha);
    // The stored blob is replaced by other bytes, and this server's cache is lost (a data
    // directory deleted while stopped).
    let store = r.content().object_store().clone();
    store
        .put(&key, b"not the published bytes".to_vec().into())
        .await
        .unwrap();
    r.cache().remove(&view.digest).unwrap();
    let refused = |result: Result<Vec<u8>, RegistryError>| match result {
        Err(RegistryError::PinnedRevisionUnavailable { revision: 1, .. }) => {}
        other => panic!("not pinned_revision_unavailable: {other:?}"),
    };
    refused(pinned_bytes(&r, &run.run_id, "demo", "SKILL.md").await);
    // A server that never had it cached refuses too.
    let (b, _b_dir) = open_beside(&r).await;
    refused(pinned_bytes(&b, &run.run_id, "demo", "SKILL.md").await);
    let report = r.fsck().await.unwrap();
    assert!(!report.ok);
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.object == format!("blob {sha}") && p.message.contains("does not match")),
        "{report:?}"
    );
    // With the right bytes back, the revision reads again: nothing wrong was cached.
    store.put(&key, good.clone().into()).await.unwrap();
    assert_eq!(
        pinned_bytes(&b, &run.run_id, "demo", "SKILL.md")
            .await
            .unwrap(),
        good
    );
    assert!(r.fsck().await.unwrap().ok);
}
storage_test!(a_corrupt_object_is_treated_as_missing_and_never_served);

async fn a_change_through_one_server_reaches_every_server_within_a_second(storage: Storage) {
    let (a, _a_dir) = open(storage).await;
    let (b, _b_dir) = open_beside(&a).await;
    if storage != Storage::Embedded {
        // B's pin cache is on once B listens for the database's notifications.
        assert!(
            holds_within(Duration::from_secs(2), || async { b.hears_other_servers() }).await,
            "B does not listen"
        );
    }
    // Published through A, read byte-exact through B (whose cache never saw it).
    publish(&a, "demo", 0, "v1").await.unwrap();
    let run = a.create_run(WS, None, None, false).await.unwrap();
    a.activate(WS, &run.run_id, "demo", None).await.unwrap();
    let through_a = pinned_bytes(&a, &run.run_id, "demo", "SKILL.md")
        .await
        .unwrap();
    assert_eq!(
        pinned_bytes(&b, &run.run_id, "demo", "SKILL.md")
            .await
            .unwrap(),
        through_a
    );
    // B re-activates it from its own pin cache from now on.
    b.activate(WS, &run.run_id, "demo", None).await.unwrap();
    b.activate(WS, &run.run_id, "demo", None).await.unwrap();
    // B serves it again (from its pin cache where it has one); a revocation through A stops
    // B's reads within a second.
    pinned_bytes(&b, &run.run_id, "demo", "SKILL.md")
        .await
        .unwrap();
    let mut b_revocations = b.subscribe_revocations();
    let revoked = a.revoke(WS, "demo", 1, "bad").await.unwrap();
    if storage != Storage::Embedded {
        // B's box hears of it too (to kill the executions that mount it there).
        let heard = tokio::time::timeout(Duration::from_secs(1), b_revocations.recv())
            .await
            .expect("B heard of the revocation within a second")
            .unwrap();
        assert_eq!(heard, (revoked.skill_id.clone(), 1));
    }
    let stopped = holds_within(Duration::from_secs(1), || async {
        matches!(
            b.pinned_file(WS, &run.run_id, "demo", "SKILL.md").await,
            Err(RegistryError::RevisionRevoked(_))
        )
    })
    .await;
    assert!(stopped, "B still serves a revision revoked through A");
    // … and B's re-activations of it, answered from that cache a moment ago.
    let refused = holds_within(Duration::from_secs(1), || async {
        matches!(
            b.activate(WS, &run.run_id, "demo", None).await,
            Err(RegistryError::RevisionRevoked(_))
        )
    })
    .await;
    assert!(refused, "B still re-activates a revision revoked through A");
    // A finish through A stops B's reads of another run within a second.
    // (Revoking the current revision moved the pointer off it.)
    let current = a.skill(WS, "demo").await.unwrap().current_revision;
    let v2 = publish(&a, "demo", current, "v2").await.unwrap();
    let other = a.create_run(WS, None, None, false).await.unwrap();
    b.activate(WS, &other.run_id, "demo", None).await.unwrap();
    pinned_bytes(&b, &other.run_id, "demo", "SKILL.md")
        .await
        .unwrap();
    pinned_bytes(&b, &other.run_id, "demo", "SKILL.md")
        .await
        .unwrap();
    b.activate(WS, &other.run_id, "demo", None).await.unwrap();
    a.finish_run(WS, &other.run_id).await.unwrap();
    let stopped = holds_within(Duration::from_secs(1), || async {
        b.pinned_file(WS, &other.run_id, "demo", "SKILL.md")
            .await
            .is_err()
            && b.activate(WS, &other.run_id, "demo", None).await.is_err()
    })
    .await;
    assert!(
        stopped,
        "B still serves or re-activates a run finished through A"
    );
    // On PostgreSQL the database tells B of A's events (SQLite followers poll).
    if storage != Storage::Embedded {
        let mut changes = b.subscribe();
        changes.borrow_and_update();
        publish(&a, "demo", v2.revision, "v3").await.unwrap();
        tokio::time::timeout(Duration::from_secs(1), changes.changed())
            .await
            .expect("B heard of A's publish within a second")
            .unwrap();
    }
}
storage_test!(a_change_through_one_server_reaches_every_server_within_a_second);

async fn one_collection_at_a_time_and_each_lapsed_lease_expired_once(storage: Storage) {
    let (a, _a_dir) = open(storage).await;
    let (b, _b_dir) = open_beside(&a).await;
    for (base, v) in [(0, "v1"), (1, "v2"), (2, "v3"), (3, "v4")] {
        publish(&a, "demo", base, v).await.unwrap();
    }
    let mut runs = Vec::new();
    for _ in 0..6 {
        let run = a.create_run(WS, None, Some(1), false).await.unwrap();
        a.activate(WS, &run.run_id, "demo", None).await.unwrap();
        runs.push(run.run_id);
    }
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // Both servers sweep leases and collect at once: every lapsed run is expired by exactly
    // one of them, every old revision collected by exactly one.
    let (ga, gb) = tokio::join!(a.gc(false, Duration::ZERO), b.gc(false, Duration::ZERO));
    let (ga, gb) = (ga.unwrap(), gb.unwrap());
    assert_eq!(ga.runs_expired + gb.runs_expired, 6, "{ga:?} {gb:?}");
    let mut collected: Vec<i64> = ga
        .revisions
        .iter()
        .chain(&gb.revisions)
        .map(|c| c.revision)
        .collect();
    collected.sort();
    assert_eq!(collected, [1, 2, 3], "{ga:?} {gb:?}");
    assert!(a.fsck().await.unwrap().ok);
    for run in &runs {
        assert_eq!(
            a.run(WS, run).await.unwrap().state,
            skillbox_registry::RunState::Expired
        );
    }
}
storage_test!(one_collection_at_a_time_and_each_lapsed_lease_expired_once);

/// Activations racing a collection (through another server) and a revocation of the
/// revisions they ask for: an acknowledged pin's revision is never collected, and a
/// revocation stops the reads of every pin of its revision, also one acknowledged while it
/// ran. On PostgreSQL no row lock orders them (see `pin_insert`), so this is what holds it.
async fn collection_and_revocation_racing_activations_never_leave_a_pin_unsafe(storage: Storage) {
    let (r, _dir) = open(storage).await;
    let (other, _other_dir) = open_beside(&r).await;
    let mut current = 0;
    let (mut pinned, mut refused) = (0, 0);
    for round in 0..6u32 {
        // Four revisions: the newest current, the three before it nobody's (collectable).
        for v in 1..=4 {
            let version = format!("round {round} v{v}");
            current = publish(&r, "demo", current, &version)
                .await
                .unwrap()
                .revision;
        }
        let mut activations = tokio::task::JoinSet::new();
        for revision in current - 3..current {
            let run = r.create_run(WS, None, None, false).await.unwrap().run_id;
            let r = r.clone();
            activations.spawn(async move {
                // From before the collection to after it, over the rounds.
                tokio::time::sleep(Duration::from_millis((1 << round) - 1)).await;
                let answer = r.activate(WS, &run, "demo", Some(revision)).await;
                (run, revision, answer)
            });
        }
        let collected = other.gc(false, Duration::ZERO).await.unwrap();
        let collected: Vec<i64> = collected.revisions.iter().map(|c| c.revision).collect();
        for (run, revision, answer) in activations.join_all().await {
            match answer {
                Ok(a) => {
                    pinned += 1;
                    assert_eq!(a.revision, revision);
                    assert!(
                        !collected.contains(&revision),
                        "pinned {revision} was collected"
                    );
                    let text = pinned_bytes(&r, &run, "demo", "SKILL.md").await.unwrap();
                    assert!(String::from_utf8_lossy(&text).contains(&format!("round {round}")));
                }
                Err(RegistryError::NotFound(_)) => {
                    refused += 1;
                    assert!(
                        collected.contains(&revision),
                        "{revision} refused, not collected"
                    );
                }
                Err(e) => panic!("activation of {revision} racing collection: {e:?}"),
            }
        }
        // Runs activating the (non-current) revision before the newest while it is revoked.
        let target = current;
        publish(&r, "demo", current, &format!("round {round} v5"))
            .await
            .unwrap();
        current += 1;
        let mut activations = tokio::task::JoinSet::new();
        for _ in 0..4 {
            let run = r.create_run(WS, None, None, false).await.unwrap().run_id;
            let r = r.clone();
            activations.spawn(async move {
                let answer = r.activate(WS, &run, "demo", Some(target)).await;
                (run, answer)
            });
        }
        r.revoke(WS, "demo", target, "race").await.unwrap();
        for (run, answer) in activations.join_all().await {
            match answer {
                Ok(a) => assert_eq!(a.revision, target),
                Err(RegistryError::RevisionRevoked(_)) => continue,
                Err(e) => panic!("activation of {target} racing its revocation: {e:?}"),
            }
            // Acknowledged: no read of it once the revocation returned, on either server.
            assert!(matches!(
                r.pinned_file(WS, &run, "demo", "SKILL.md").await,
                Err(RegistryError::RevisionRevoked(_))
            ));
            let stopped = holds_within(Duration::from_secs(1), || async {
                matches!(
                    other.pinned_file(WS, &run, "demo", "SKILL.md").await,
                    Err(RegistryError::RevisionRevoked(_))
                )
            });
            assert!(stopped.await, "the other server reads a revoked pin");
        }
    }
    // Which side won each race is up to timing (both do, over the rounds' delays); each
    // outcome was checked above.
    assert_eq!(pinned + refused, 18);
    assert!(r.fsck().await.unwrap().ok);
}
storage_test!(collection_and_revocation_racing_activations_never_leave_a_pin_unsafe);

/// Activations that arrive together are written together, and those that are not a new pin of
/// a live run (repeats of one pair, an unknown skill or revision, a finished run, a pin that
/// exists but another server has not cached) each get their own answer from the same batches:
/// one pin per pair, whichever server and request wrote it, and nothing for the rest.
async fn activations_written_together_each_get_their_own_answer(storage: Storage) {
    let (r, _dir) = open(storage).await;
    let (other, _other_dir) = open_beside(&r).await;
    let first = publish(&r, "demo", 0, "one").await.unwrap().revision;
    let current = publish(&r, "demo", first, "two").await.unwrap().revision;
    let runs: Vec<String> =
        futures_util::future::join_all((0..6).map(|_| r.create_run(WS, None, None, false)))
            .await
            .into_iter()
            .map(|run| run.unwrap().run_id)
            .collect();
    let finished = runs[5].clone();
    r.finish_run(WS, &finished).await.unwrap();
    let written_before = r.meta().pin_commits().1 + other.meta().pin_commits().1;

    let mut activations = tokio::task::JoinSet::new();
    for round in 0..8usize {
        // Every run but the finished one, from both servers at once.
        for (i, run) in runs[..5].iter().enumerate() {
            let server = if (round + i) % 2 == 0 { &r } else { &other }.clone();
            let (run, requested) = (run.clone(), (i == 4).then_some(first));
            activations.spawn(async move {
                let answer = server.activate(WS, &run, "demo", requested).await;
                ("demo", run, answer.map(|a| a.revision))
            });
        }
        let (server, run) = (r.clone(), runs[round % 5].clone());
        activations.spawn(async move {
            let answer = server.activate(WS, &run, "nosuch", None).await;
            ("nosuch", run, answer.map(|a| a.revision))
        });
        let (server, run) = (other.clone(), runs[round % 5].clone());
        activations.spawn(async move {
            let answer = server.activate(WS, &run, "demo", Some(current + 5)).await;
            ("unpublished revision", run, answer.map(|a| a.revision))
        });
        let (server, run) = (r.clone(), finished.clone());
        activations.spawn(async move {
            let answer = server.activate(WS, &run, "demo", None).await;
            ("finished run", run, answer.map(|a| a.revision))
        });
    }
    let mut answered = std::collections::HashMap::new();
    for (what, run, answer) in activations.join_all().await {
        match what {
            "demo" => {
                let revision = answer.unwrap_or_else(|e| panic!("activating {run}: {e:?}"));
                let expected = if run == runs[4] { first } else { current };
                assert_eq!(revision, expected, "run {run}");
                *answered.entry(run).or_insert(0) += 1;
            }
            _ => assert!(answer.is_err(), "{what} in {run} answered {answer:?}"),
        }
    }
    assert_eq!(answered.len(), 5);
    assert!(answered.values().all(|n| *n == 8), "{answered:?}");
    // One pin per run, the one every answer gave, seen by both servers.
    for (i, run) in runs[..5].iter().enumerate() {
        for server in [&r, &other] {
            let view = server.run(WS, run).await.unwrap();
            let pins: Vec<(&str, i64)> = view
                .activations
                .iter()
                .map(|p| (p.skill.as_str(), p.revision))
                .collect();
            let expected = if i == 4 { first } else { current };
            assert_eq!(pins, [("demo", expected)], "run {run}");
        }
    }
    assert!(r.run(WS, &finished).await.unwrap().activations.is_empty());
    let written = r.meta().pin_commits().1 + other.meta().pin_commits().1 - written_before;
    assert_eq!(written, 5, "pins written");
    assert!(r.fsck().await.unwrap().ok);
}
storage_test!(activations_written_together_each_get_their_own_answer);

/// On PostgreSQL a statement that changes runs' states tells every server to drop its cached
/// pins. The lease sweep runs every few seconds on every server: one that finds nothing due
/// must tell nobody, or no server's pin cache would live longer than the sweep's period.
#[tokio::test]
async fn a_sweep_with_no_lapsed_lease_tells_no_server_to_drop_its_pins() {
    let (a, _dir) = open(Storage::Postgres).await;
    publish(&a, "demo", 0, "v1").await.unwrap();
    let live = a.create_run(WS, None, Some(600), false).await.unwrap();
    a.activate(WS, &live.run_id, "demo", None).await.unwrap();
    let lapsing = a.create_run(WS, None, Some(1), false).await.unwrap();
    let url = a.config().database_url.clone().unwrap();
    let mut heard = sqlx::postgres::PgListener::connect(&url).await.unwrap();
    heard.listen("skillbox_pins").await.unwrap();

    assert_eq!(a.expire_runs().await.unwrap(), 0, "nothing is due yet");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        a.expire_runs().await.unwrap(),
        1,
        "{} lapsed",
        lapsing.run_id
    );

    // Notifications arrive in commit order: a notice from the first sweep would come first.
    let first = tokio::time::timeout(Duration::from_secs(10), heard.recv()).await;
    assert!(
        matches!(first, Ok(Ok(_))),
        "the expiry was announced: {first:?}"
    );
    let second = tokio::time::timeout(Duration::from_millis(500), heard.recv()).await;
    assert!(
        second.is_err(),
        "one sweep changed runs, one notice: {second:?}"
    );
}
