//! The registry in process (no server, no HTTP): compare-and-swap publication, replayed
//! retries, activation conflicts and pins, revocation, and garbage-collection roots. Each
//! scenario runs on the embedded SQLite and on a real PostgreSQL (`metadata_test!`): the one
//! SQL text must hold on both.
//!
//! PostgreSQL: `SKILLBOX_TEST_POSTGRES` names a server where the tests may create databases
//! (`scripts/test` starts one); each test gets a fresh database.

use skillbox_registry::{Registry, RegistryConfig, RegistryError};
use std::sync::Arc;
use std::time::Duration;

const WS: &str = "acme";

/// Where a test's metadata lives.
#[derive(Clone, Copy)]
enum Metadata {
    Sqlite,
    Postgres,
}

/// Defines a test per metadata store for the scenario `async fn $name(metadata: Metadata)`.
macro_rules! metadata_test {
    ($name:ident) => {
        mod $name {
            #[tokio::test]
            async fn sqlite() {
                super::$name(super::Metadata::Sqlite).await
            }

            #[tokio::test]
            async fn postgres() {
                super::$name(super::Metadata::Postgres).await
            }
        }
    };
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

async fn open(metadata: Metadata) -> (Arc<Registry>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = RegistryConfig::new(dir.path());
    if let Metadata::Postgres = metadata {
        cfg.database_url = Some(fresh_postgres_database().await);
    }
    let registry = Registry::open(cfg).await.unwrap();
    (registry, dir)
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

async fn publication_is_compare_and_swap_and_a_retry_replays(metadata: Metadata) {
    let (r, _dir) = open(metadata).await;
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
metadata_test!(publication_is_compare_and_swap_and_a_retry_replays);

async fn a_run_sees_its_pin_whatever_is_published_and_refuses_a_second_revision(
    metadata: Metadata,
) {
    let (r, _dir) = open(metadata).await;
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
metadata_test!(a_run_sees_its_pin_whatever_is_published_and_refuses_a_second_revision);

async fn collection_keeps_the_current_and_pinned_revisions_and_takes_the_rest(metadata: Metadata) {
    let (r, _dir) = open(metadata).await;
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
metadata_test!(collection_keeps_the_current_and_pinned_revisions_and_takes_the_rest);
