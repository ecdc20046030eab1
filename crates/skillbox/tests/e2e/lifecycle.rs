//! Idempotent retry, drafts (conflict and rebase), the event log (resume without gaps or
//! duplicates), and SPEC §8.6 for the revision cache.

use crate::support::*;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_retry_returns_the_created_revision() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    let c = http();
    let (st, first) = publish(&c, &s, ADMIN, "acme", "demo", 0, package("demo", "1")).await;
    assert_eq!(st, 201);
    // The response was "lost"; the client retries the same publish (same base, same bytes).
    let (st, again) = publish(&c, &s, ADMIN, "acme", "demo", 0, package("demo", "1")).await;
    assert_eq!(st, 200, "{again}");
    assert_eq!(again["revision"], first["revision"]);
    assert_eq!(again["digest"], first["digest"]);
    assert_eq!(again["replayed"], true);
    // Meanwhile someone else published r2; the retry of the r1 publish still answers r1.
    let (st, _) = publish(&c, &s, ADMIN, "acme", "demo", 1, package("demo", "2")).await;
    assert_eq!(st, 201);
    let (st, again) = publish(&c, &s, ADMIN, "acme", "demo", 0, package("demo", "1")).await;
    assert_eq!((st, again["revision"].as_i64()), (200, Some(1)));
    // Same base but different content is a conflict, not a replay.
    let (st, v) = publish(&c, &s, ADMIN, "acme", "demo", 0, package("demo", "other")).await;
    assert_eq!((st, error_code(&v)), (409, "revision_conflict"));
    let (_, revs) = get(&c, &s.ws("acme", "skills/demo/revisions"), ADMIN).await;
    assert_eq!(
        revs["revisions"].as_array().unwrap().len(),
        2,
        "a retry must not create revisions"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drafts_conflict_and_rebase() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    let c = http();
    let author = token(&c, &s, "acme", "author").await;
    let reader = token(&c, &s, "acme", "reader").await;
    publish(&c, &s, &author, "acme", "demo", 0, package("demo", "1")).await;

    let r = c
        .post(s.ws("acme", "drafts"))
        .bearer_auth(&author)
        .json(&json!({"skill": "demo", "base_revision": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let d: Value = r.json().await.unwrap();
    assert_eq!(
        (d["skill"].as_str(), d["base_revision"].as_i64()),
        (Some("demo"), Some(1))
    );
    let id = d["draft_id"].as_str().unwrap().to_string();
    let f = |p: &str| s.ws("acme", &format!("drafts/{id}/files/{p}"));

    // files copied from the base; edit, add, delete
    let body = c
        .get(f("scripts/run.sh"))
        .bearer_auth(&reader)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(body, "echo 1\n");
    let r = c
        .put(f("scripts/run.sh?executable=true"))
        .bearer_auth(&author)
        .body("echo draft\n")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        c.put(f("notes.md"))
            .bearer_auth(&author)
            .body("new file\n")
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        c.put(f("extra.txt"))
            .bearer_auth(&author)
            .body("gone soon")
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        c.delete(f("extra.txt"))
            .bearer_auth(&author)
            .send()
            .await
            .unwrap()
            .status(),
        204
    );
    assert_eq!(
        c.get(f("extra.txt"))
            .bearer_auth(&author)
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
    // (a `..` segment never reaches us: URL parsing resolves it; a backslash does)
    assert_eq!(
        c.put(f("bad%5Cname"))
            .bearer_auth(&author)
            .body("x")
            .send()
            .await
            .unwrap()
            .status(),
        400
    );
    assert_eq!(
        c.put(f("x.txt"))
            .bearer_auth(&reader)
            .body("x")
            .send()
            .await
            .unwrap()
            .status(),
        403
    );

    // someone publishes r2 meanwhile: the draft's publish conflicts and the draft is kept
    publish(&c, &s, &author, "acme", "demo", 1, package("demo", "2")).await;
    let r = c
        .post(s.ws("acme", &format!("drafts/{id}/publish")))
        .bearer_auth(&author)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 409);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        (error_code(&v), v["error"]["current_revision"].as_i64()),
        ("revision_conflict", Some(2))
    );
    let (st, kept) = get(&c, &s.ws("acme", &format!("drafts/{id}")), &reader).await;
    assert_eq!(st, 200);
    assert_eq!(kept["files"].as_array().unwrap().len(), 3);

    // rebase onto r2 and publish: r3 holds the draft's files
    let r = c
        .put(s.ws("acme", &format!("drafts/{id}")))
        .bearer_auth(&author)
        .json(&json!({"base_revision": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = c
        .post(s.ws("acme", &format!("drafts/{id}/publish")))
        .bearer_auth(&author)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let p: Value = r.json().await.unwrap();
    assert_eq!(p["revision"], 3);
    let (_, rev) = get(&c, &s.ws("acme", "skills/demo/revisions/3"), &reader).await;
    let paths: Vec<_> = rev["manifest"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["path"].as_str().unwrap().to_string(),
                e["executable"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        paths,
        [
            ("SKILL.md".into(), false),
            ("notes.md".into(), false),
            ("scripts/run.sh".into(), true)
        ]
    );
    let body = c
        .get(s.ws("acme", "skills/demo/revisions/3/files/scripts/run.sh"))
        .bearer_auth(&reader)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(body, "echo draft\n");

    // an invalid draft is refused with every problem, and stays
    let r = c
        .post(s.ws("acme", "drafts"))
        .bearer_auth(&author)
        .json(&json!({"skill": "fresh"}))
        .send()
        .await
        .unwrap();
    let empty_id = r.json::<Value>().await.unwrap()["draft_id"]
        .as_str()
        .unwrap()
        .to_string();
    let r = c
        .post(s.ws("acme", &format!("drafts/{empty_id}/publish")))
        .bearer_auth(&author)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 422);
    // delete drafts; other workspaces cannot see them
    let other = token(&c, &s, "other", "author").await;
    let (st, _) = get(&c, &s.ws("other", &format!("drafts/{id}")), &other).await;
    assert_eq!(st, 404);
    assert_eq!(
        c.delete(s.ws("acme", &format!("drafts/{id}")))
            .bearer_auth(&author)
            .send()
            .await
            .unwrap()
            .status(),
        204
    );
    assert_eq!(
        get(&c, &s.ws("acme", &format!("drafts/{id}")), &author)
            .await
            .0,
        404
    );
}

/// Parses an SSE body into (id, event, data) frames.
fn frames(body: &str) -> Vec<(i64, String, Value)> {
    body.split("\n\n")
        .filter_map(|f| {
            let field = |name: &str| {
                f.lines()
                    .find_map(|l| l.strip_prefix(name))
                    .map(|v| v.trim().to_string())
            };
            Some((
                field("id:")?.parse().ok()?,
                field("event:")?,
                serde_json::from_str(&field("data:")?).ok()?,
            ))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_log_resumes_without_gaps_or_duplicates() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    let c = http();
    for (i, base) in [(1, 0), (2, 1), (3, 2)] {
        publish(
            &c,
            &s,
            ADMIN,
            "acme",
            "demo",
            base,
            package("demo", &i.to_string()),
        )
        .await;
    }
    c.put(s.ws("acme", "skills/demo/current"))
        .bearer_auth(ADMIN)
        .json(&json!({"revision": 1, "base_revision": 3}))
        .send()
        .await
        .unwrap();
    publish(&c, &s, ADMIN, "other", "demo", 0, package("demo", "x")).await;
    c.delete(s.ws("acme", "skills/demo"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();

    let read = |after: i64| {
        let c = c.clone();
        let url = s.ws("acme", &format!("events?after={after}&follow=false"));
        async move {
            frames(
                &c.get(url)
                    .bearer_auth(ADMIN)
                    .send()
                    .await
                    .unwrap()
                    .text()
                    .await
                    .unwrap(),
            )
        }
    };
    let all = read(0).await;
    let kinds: Vec<_> = all.iter().map(|(_, k, _)| k.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "skill.published",
            "skill.published",
            "skill.published",
            "skill.current_moved",
            "skill.deleted"
        ]
    );
    let seqs: Vec<_> = all.iter().map(|(id, _, _)| *id).collect();
    assert_eq!(seqs, [1, 2, 3, 4, 5], "per-workspace sequence without gaps");
    assert_eq!(all[1].2["data"]["revision"], 2);
    for after in 0..=5 {
        let tail = read(after).await;
        assert_eq!(
            tail.iter().map(|f| f.0).collect::<Vec<_>>(),
            (after + 1..=5).collect::<Vec<_>>(),
            "resume after {after}"
        );
    }
    // Last-Event-ID resumes too, and a following stream delivers new events as they commit.
    let mut stream = c
        .get(s.ws("acme", "events"))
        .bearer_auth(ADMIN)
        .header("last-event-id", "4")
        .send()
        .await
        .unwrap();
    let mut got = String::new();
    let mut published_more = false;
    while frames(&got).len() < 2 {
        let chunk = tokio::time::timeout(std::time::Duration::from_secs(10), stream.chunk())
            .await
            .expect("stream stalled")
            .unwrap()
            .unwrap();
        got.push_str(&String::from_utf8_lossy(&chunk));
        if !published_more && !frames(&got).is_empty() {
            publish(&c, &s, ADMIN, "acme", "demo", 0, package("demo", "again")).await;
            published_more = true;
        }
    }
    let f = frames(&got);
    assert_eq!((f[0].0, f[1].0), (5, 6));
    assert_eq!(f[1].1, "skill.published");
    // The other workspace's log is its own.
    let other = frames(
        &c.get(s.ws("other", "events?follow=false"))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
    );
    assert_eq!(other.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_deleted_in_v2_is_absent_from_v2_tree() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    let c = http();
    let md = skill_md("demo", "d");
    let v1 = tar_of(&[
        ("SKILL.md", md.as_bytes()),
        ("old.txt", b"old"),
        ("keep.txt", b"keep 1"),
    ]);
    let v2 = tar_of(&[("SKILL.md", md.as_bytes()), ("keep.txt", b"keep 2")]);
    let (_, p1) = publish(&c, &s, ADMIN, "acme", "demo", 0, v1).await;
    let (_, p2) = publish(&c, &s, ADMIN, "acme", "demo", 1, v2).await;
    let tree = |p: &Value| {
        dir.path()
            .join("trees")
            .join(p["digest"].as_str().unwrap().trim_start_matches("sha256:"))
    };
    let (t1, t2) = (tree(&p1), tree(&p2));
    assert!(t1.join("old.txt").is_file());
    assert!(
        !t2.join("old.txt").exists(),
        "stale file survived into v2's tree"
    );
    assert_eq!(
        std::fs::read_to_string(t2.join("keep.txt")).unwrap(),
        "keep 2"
    );
    assert_eq!(
        std::fs::read_to_string(t1.join("keep.txt")).unwrap(),
        "keep 1"
    );
    // Trees are read-only.
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(t2.join("keep.txt"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o444
    );
    assert_eq!(
        std::fs::metadata(&t2).unwrap().permissions().mode() & 0o777,
        0o555
    );
    let (st, _) = get(
        &c,
        &s.ws("acme", "skills/demo/revisions/2/files/old.txt"),
        ADMIN,
    )
    .await;
    assert_eq!(st, 404);
}

/// SIGTERM stops the server even while a client holds an event stream open: the drain of
/// in-flight requests is bounded (it once waited for the stream forever).
#[tokio::test]
async fn sigterm_stops_the_server_with_an_event_stream_open() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Server::start(dir.path(), &[]);
    let c = http();
    let stream = c
        .get(s.ws("acme", "events"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let exited = s.terminate().await;
    drop(stream);
    assert!(
        exited.is_some(),
        "the server did not stop within a minute of SIGTERM"
    );
}

/// Connections are served whichever way they are spread: on the shared runtime
/// (`--connection-threads 0`) or handed to connection threads (three: more than this
/// machine's cores, so threads share connections and cores). Many clients at once, each on its
/// own connection, read the run's pinned file beside an event stream held open; SIGTERM then
/// stops the server with success.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_connection_thread_setting_serves_concurrent_clients_and_stops() {
    for threads in ["0", "3"] {
        let dir = tempfile::tempdir().unwrap();
        let (mut s, c, run) = hello_run(dir.path(), &["--connection-threads", threads]).await;
        let events = c
            .get(s.ws("acme", "events"))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap();
        assert_eq!(events.status(), 200);
        let url = s.ws("acme", &format!("runs/{run}/skills/hello/files/SKILL.md"));
        let mut clients = tokio::task::JoinSet::new();
        for _ in 0..24 {
            let url = url.clone();
            clients.spawn(async move {
                let own_connection = http();
                let mut bodies = Vec::new();
                for _ in 0..5 {
                    let r = own_connection
                        .get(&url)
                        .bearer_auth(ADMIN)
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(r.status(), 200);
                    bodies.push(r.text().await.unwrap());
                }
                bodies
            });
        }
        let mut answers = 0;
        while let Some(bodies) = clients.join_next().await {
            for body in bodies.unwrap() {
                assert!(body.contains("hello v1"), "threads {threads}: {body}");
                answers += 1;
            }
        }
        assert_eq!(answers, 24 * 5);
        let exited = s.terminate().await;
        drop(events);
        let status = exited
            .unwrap_or_else(|| panic!("threads {threads}: no exit within a minute of SIGTERM"));
        assert!(status.success(), "threads {threads}: {status}");
    }
}
