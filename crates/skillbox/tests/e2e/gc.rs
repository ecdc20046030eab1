//! Garbage collection (SPEC §4.10, §8.7): roots are current revisions of active skills, pins
//! of live runs and anything younger than the grace period; collected revisions keep a
//! tombstone; a publisher deduplicating against content the collector deletes never ends up
//! with a revision missing content (randomized race).

use crate::support::*;
use serde_json::{Value, json};

async fn gc(c: &reqwest::Client, s: &Server, body: Value) -> Value {
    let r = c
        .post(format!("{}/v1/admin/gc", s.url))
        .bearer_auth(ADMIN)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

fn pkg(tag: &str, unique: &str) -> Vec<u8> {
    let md = skill_md("demo", &format!("tag {tag}"));
    tar_of(&[
        ("SKILL.md", md.as_bytes()),
        ("unique.txt", unique.as_bytes()),
        ("shared.txt", b"shared by all"),
    ])
}

fn collected(report: &Value) -> Vec<i64> {
    report["revisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["revision"].as_i64().unwrap())
        .collect()
}

fn collected_of(report: &Value, skill: &str) -> Vec<i64> {
    report["revisions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["skill"] == skill)
        .map(|r| r["revision"].as_i64().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_keeps_roots_and_frees_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    let c = http();
    let (_, p1) = publish(&c, &s, ADMIN, "acme", "demo", 0, pkg("1", "u1")).await;
    let (_, p2) = publish(&c, &s, ADMIN, "acme", "demo", 1, pkg("2", "u2")).await;
    publish(&c, &s, ADMIN, "acme", "demo", 2, pkg("3", "u3")).await;
    let r = c
        .post(s.ws("acme", "runs"))
        .bearer_auth(ADMIN)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    let run = r.json::<Value>().await.unwrap()["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    c.post(s.ws("acme", &format!("runs/{run}/activations")))
        .bearer_auth(ADMIN)
        .json(&json!({"skill": "demo", "revision": 1}))
        .send()
        .await
        .unwrap();

    // everything is younger than the grace period
    let report = gc(&c, &s, json!({"grace_seconds": 3600})).await;
    assert_eq!(collected(&report), Vec::<i64>::new());

    // dry run: reports r2 (r1 pinned, r3 current) and changes nothing
    let tree2 = dir
        .path()
        .join("trees")
        .join(p2["digest"].as_str().unwrap().trim_start_matches("sha256:"));
    let blob_u2 = dir
        .path()
        .join("store/blobs/sha256")
        .join(skillbox_package::Sha256::of(b"u2").to_hex());
    let report = gc(&c, &s, json!({"grace_seconds": 0, "dry_run": true})).await;
    assert_eq!(report["dry_run"], true);
    assert_eq!(collected(&report), vec![2]);
    assert!(
        report["blobs_removed"].as_u64().unwrap_or(0) >= 1,
        "{report}"
    );
    assert!(tree2.is_dir() && blob_u2.is_file());
    let (st, _) = get(&c, &s.ws("acme", "skills/demo/revisions/2"), ADMIN).await;
    assert_eq!(st, 200);

    // the real thing
    let report = gc(&c, &s, json!({"grace_seconds": 0})).await;
    assert_eq!(collected(&report), vec![2]);
    assert!(report["bytes_freed"].as_u64().unwrap() >= 2, "{report}");
    assert!(!tree2.exists() && !blob_u2.exists());
    assert!(
        dir.path()
            .join("store/blobs/sha256")
            .join(skillbox_package::Sha256::of(b"shared by all").to_hex())
            .is_file()
    );
    // tombstone row, event, no reads
    let (_, revs) = get(&c, &s.ws("acme", "skills/demo/revisions"), ADMIN).await;
    let states: Vec<(i64, String)> = revs["revisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["revision"].as_i64().unwrap(),
                r["state"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        states,
        [
            (3, "available".into()),
            (2, "collected".into()),
            (1, "available".into())
        ]
    );
    let (st, _) = get(&c, &s.ws("acme", "skills/demo/revisions/2"), ADMIN).await;
    assert_eq!(st, 404);
    let events = c
        .get(s.ws("acme", "events?follow=false"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(events.contains("event: revision.collected"), "{events}");
    // the pinned run still reads r1
    let body = c
        .get(s.ws("acme", &format!("runs/{run}/skills/demo/files/unique.txt")))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(body, "u1");

    // finishing the run releases r1
    c.delete(s.ws("acme", &format!("runs/{run}")))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    let report = gc(&c, &s, json!({"grace_seconds": 0})).await;
    assert_eq!(collected(&report), vec![1]);
    assert!(
        !dir.path()
            .join("trees")
            .join(p1["digest"].as_str().unwrap().trim_start_matches("sha256:"))
            .exists()
    );
    // numbers are never reused
    let (_, p4) = publish(&c, &s, ADMIN, "acme", "demo", 3, pkg("4", "u4")).await;
    assert_eq!(p4["revision"], 4);

    // a deleted skill: pinned revisions survive until the run ends; then everything goes
    publish(
        &c,
        &s,
        ADMIN,
        "acme",
        "gone",
        0,
        tar_of(&[
            ("SKILL.md", skill_md("gone", "g").as_bytes()),
            ("g.txt", b"gone bytes"),
        ]),
    )
    .await;
    let r = c
        .post(s.ws("acme", "runs"))
        .bearer_auth(ADMIN)
        .json(&json!({"skills": ["gone"]}))
        .send()
        .await
        .unwrap();
    let run2 = r.json::<Value>().await.unwrap()["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    c.post(s.ws("acme", &format!("runs/{run2}/activations")))
        .bearer_auth(ADMIN)
        .json(&json!({"skill": "gone"}))
        .send()
        .await
        .unwrap();
    c.delete(s.ws("acme", "skills/gone"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    let report = gc(&c, &s, json!({"grace_seconds": 0})).await;
    assert_eq!(
        collected_of(&report, "gone"),
        Vec::<i64>::new(),
        "a pinned revision of a deleted skill was collected"
    );
    assert_eq!(
        collected_of(&report, "demo"),
        vec![3],
        "r3 stopped being current when r4 was published"
    );
    let body = c
        .get(s.ws("acme", &format!("runs/{run2}/skills/gone/files/g.txt")))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(body, "gone bytes");
    c.delete(s.ws("acme", &format!("runs/{run2}")))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    let report = gc(&c, &s, json!({"grace_seconds": 0})).await;
    assert_eq!(collected_of(&report, "gone"), vec![1]);
    assert_eq!(
        collected_of(&report, "demo"),
        Vec::<i64>::new(),
        "current r4 is a root"
    );
    assert!(
        !dir.path()
            .join("store/blobs/sha256")
            .join(skillbox_package::Sha256::of(b"gone bytes").to_hex())
            .exists()
    );

    let fsck = fsck(&c, &s).await;
    assert_eq!(fsck["ok"], true, "{fsck}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gc_never_deletes_content_a_concurrent_publish_references() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    gc_races_publishes(&s, &s).await;
}

/// The same race across two servers on PostgreSQL and a shared store: publishes and draft
/// writes through A, collections through B.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gc_on_one_server_never_deletes_content_a_publish_on_another_references() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = scale_out_pair(dir.path());
    gc_races_publishes(&a, &b).await;
}

async fn gc_races_publishes(s: &Server, collector_server: &Server) {
    let c = http();
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    eprintln!("seed {seed}");
    let mut rng = seed;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let (_, d) = {
        let r = c
            .post(s.ws("acme", "drafts"))
            .bearer_auth(ADMIN)
            .json(&json!({"skill": "demo"}))
            .send()
            .await
            .unwrap();
        (r.status(), r.json::<Value>().await.unwrap())
    };
    let draft = d["draft_id"].as_str().unwrap().to_string();
    let mut base = 0i64;
    for round in 0..40 {
        // X becomes garbage: published, then superseded by Y.
        let x = pkg(
            &format!("x{}", round % 3),
            &format!("x-unique-{}", round % 3),
        );
        let (st, _) = publish(&c, s, ADMIN, "acme", "demo", base, x.clone()).await;
        assert_eq!(st, 201);
        let (st, _) = publish(
            &c,
            s,
            ADMIN,
            "acme",
            "demo",
            base + 1,
            pkg("y", &format!("y{round}")),
        )
        .await;
        assert_eq!(st, 201);
        base += 2;
        // Race: the collector deletes X's content while X is published again and a draft
        // writes a file with X's unique bytes (both deduplicate against what GC removes).
        let delay = next() % 6;
        let collector = {
            let (c, url) = (c.clone(), format!("{}/v1/admin/gc", collector_server.url));
            tokio::spawn(async move {
                tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
                let r = c
                    .post(url)
                    .bearer_auth(ADMIN)
                    .json(&json!({"grace_seconds": 0}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200);
            })
        };
        let writer = {
            let (c, url) = (
                c.clone(),
                s.ws("acme", &format!("drafts/{draft}/files/copy.txt")),
            );
            let body = format!("x-unique-{}", round % 3);
            tokio::spawn(async move {
                let r = c
                    .put(url)
                    .bearer_auth(ADMIN)
                    .body(body)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200);
            })
        };
        tokio::time::sleep(std::time::Duration::from_millis(next() % 6)).await;
        let (st, again) = publish(&c, s, ADMIN, "acme", "demo", base, x).await;
        assert_eq!(st, 201, "{again}");
        base += 1;
        collector.await.unwrap();
        writer.await.unwrap();
        // The re-published revision is complete and the draft's file readable.
        let n = again["revision"].as_i64().unwrap();
        let (st, d) = archive_digest(&c, s, "acme", "demo", n).await;
        assert_eq!(st, 200, "round {round}: r{n} lost content");
        assert_eq!(d, again["digest"].as_str().unwrap());
        let body = c
            .get(s.ws("acme", &format!("drafts/{draft}/files/copy.txt")))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap();
        assert_eq!(body.status(), 200, "round {round}: draft blob lost");
        assert_eq!(
            body.text().await.unwrap(),
            format!("x-unique-{}", round % 3)
        );
    }
    let fsck = fsck(&c, s).await;
    assert_eq!(fsck["ok"], true, "{fsck}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revocation_falls_back_and_removes_the_tree() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    let c = http();
    publish(&c, &s, ADMIN, "acme", "demo", 0, pkg("1", "u1")).await;
    publish(&c, &s, ADMIN, "acme", "demo", 1, pkg("2", "u2")).await;
    let (_, p3) = publish(&c, &s, ADMIN, "acme", "demo", 2, pkg("3", "u3")).await;
    let tree3 = dir
        .path()
        .join("trees")
        .join(p3["digest"].as_str().unwrap().trim_start_matches("sha256:"));
    assert!(tree3.is_dir());
    let author = token(&c, &s, "acme", "author").await;
    let revoke = |rev: i64, tok: String| {
        let c = c.clone();
        let url = s.ws("acme", &format!("skills/demo/revisions/{rev}/revoke"));
        async move {
            c.post(url)
                .bearer_auth(tok)
                .json(&json!({"reason": "compromised"}))
                .send()
                .await
                .unwrap()
        }
    };
    assert_eq!(
        revoke(3, author).await.status(),
        403,
        "revocation needs the admin role"
    );
    // r2 is revoked first: then revoking current r3 falls back past it to r1
    assert_eq!(revoke(2, ADMIN.into()).await.status(), 200);
    let r = revoke(3, ADMIN.into()).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        (v["state"].as_str(), v["current_revision"].as_i64()),
        (Some("revoked"), Some(1))
    );
    assert!(!tree3.exists(), "the revoked revision's tree is removed");
    let (_, skill) = get(&c, &s.ws("acme", "skills/demo"), ADMIN).await;
    assert_eq!(skill["current_revision"], 1);
    let (st, v) = get(&c, &s.ws("acme", "skills/demo/revisions/3"), ADMIN).await;
    assert_eq!((st, error_code(&v)), (410, "revision_revoked"));
    let (st, v) = get(
        &c,
        &s.ws("acme", "skills/demo/revisions/3/files/unique.txt"),
        ADMIN,
    )
    .await;
    assert_eq!((st, error_code(&v)), (410, "revision_revoked"));
    // revoking again is idempotent; revoking the last one leaves no current revision
    assert_eq!(revoke(3, ADMIN.into()).await.status(), 200);
    let v: Value = revoke(1, ADMIN.into()).await.json().await.unwrap();
    assert_eq!(v["current_revision"], 0);
    let (st, _) = get(&c, &s.ws("acme", "skills/demo/revisions/current"), ADMIN).await;
    assert_eq!(st, 404);
    // a new publish starts again from base 0, with a fresh number
    let (st, v) = publish(&c, &s, ADMIN, "acme", "demo", 0, pkg("4", "u4")).await;
    assert_eq!((st, v["revision"].as_i64()), (201, Some(4)));
    let events = c
        .get(s.ws("acme", "events?follow=false"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(events.matches("event: revision.revoked").count(), 3);
}
