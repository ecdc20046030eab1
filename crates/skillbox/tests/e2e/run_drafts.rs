//! Run drafts on every backend (SPEC §5 `POST …/runs/{run}/drafts`, §4.8): made from
//! the run's pin (or the current revision) at `/workspace/skill-drafts/<draft-id>/`, edited by
//! the agent inside the sandbox, published from what is there with the draft's base revision
//! (409 on conflict); hostile trees are refused and lose nothing.

use crate::backends::Backend;
use crate::support::*;
use serde_json::{Value, json};

fn notes(v: &str) -> Vec<u8> {
    let md = skill_md("notes", &format!("notes {v}"));
    let script = format!("#!/bin/sh\necho \"notes {v}\"\n");
    tar_of(&[
        ("SKILL.md", md.as_bytes()),
        ("scripts/run.sh", script.as_bytes()),
        ("old.txt", b"old"),
    ])
}

async fn create_draft(c: &reqwest::Client, s: &Server, run: &str, body: Value) -> (u16, Value) {
    let r = c
        .post(s.ws("acme", &format!("runs/{run}/drafts")))
        .bearer_auth(ADMIN)
        .json(&body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

async fn publish_draft(c: &reqwest::Client, s: &Server, id: &str) -> (u16, Value) {
    let r = c
        .post(s.ws("acme", &format!("drafts/{id}/publish")))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

/// On every backend: the draft lives in the run's workspace (moving files in and out of it
/// keeps the run's sandbox), and the run's end releases everything.
async fn run_drafts_are_edited_in_the_sandbox_and_published_with_their_base(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let s = backend.start(dir.path(), &[]);
    let c = http();
    publish(&c, &s, ADMIN, "acme", "notes", 0, notes("v1")).await;
    let run = new_run(&c, &s, &["notes"]).await;
    publish(&c, &s, ADMIN, "acme", "notes", 1, notes("v2")).await;
    sh(&c, &s, &run, None, "true").await;
    let handles = backend.sandbox_handles(&run);

    // From the run's pin (v1), not the current revision (v2).
    let (st, d) = create_draft(&c, &s, &run, json!({"skill": "notes"})).await;
    assert_eq!(st, 201, "{d}");
    assert_eq!(d["base_revision"], 1);
    let id = d["draft_id"].as_str().unwrap().to_string();
    let path = d["path"].as_str().unwrap().to_string();
    assert_eq!(path, format!("/workspace/skill-drafts/{id}"));
    let v = sh(
        &c,
        &s,
        &run,
        None,
        &format!("cat {path}/scripts/run.sh && test -x {path}/scripts/run.sh && echo exec"),
    )
    .await;
    assert_eq!(v["stdout"], "#!/bin/sh\necho \"notes v1\"\nexec\n", "{v}");

    // The agent edits it inside the sandbox.
    let v = sh(
        &c,
        &s,
        &run,
        None,
        &format!(
            "cd {path} && sed -i 's/v1/v3/' scripts/run.sh && echo fresh > new.txt && rm old.txt \
             && mkdir __pycache__ && echo junk > __pycache__/x.pyc && echo ok"
        ),
    )
    .await;
    assert_eq!(v["stdout"], "ok\n", "{v}");

    // Its base (1) is stale: 409 with the current revision; nothing is published.
    let (st, v) = publish_draft(&c, &s, &id).await;
    assert_eq!(st, 409, "{v}");
    assert_eq!(error_code(&v), "revision_conflict");
    assert_eq!(v["error"]["current_revision"], 2);
    let (_, revs) = get(&c, &s.ws("acme", "skills/notes/revisions"), ADMIN).await;
    assert_eq!(
        revs["revisions"].as_array().map(Vec::len),
        Some(2),
        "{revs}"
    );

    // Rebased, it publishes what is in the sandbox now.
    let r = c
        .put(s.ws("acme", &format!("drafts/{id}")))
        .bearer_auth(ADMIN)
        .json(&json!({"base_revision": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (st, v) = publish_draft(&c, &s, &id).await;
    assert_eq!(st, 201, "{v}");
    assert_eq!(v["revision"], 3);
    let (_, rev) = get(&c, &s.ws("acme", "skills/notes/revisions/3"), ADMIN).await;
    let files: Vec<(String, bool)> = rev["manifest"]
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
        files,
        vec![
            ("SKILL.md".to_string(), false),
            ("new.txt".to_string(), false),
            ("scripts/run.sh".to_string(), true),
        ],
        "edits, deletions and the executable bit come through; __pycache__ is excluded"
    );
    let body = c
        .get(s.ws("acme", "skills/notes/revisions/3/files/scripts/run.sh"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(body.contains("notes v3"), "{body}");
    // The run still executes its pin.
    let v = sh(&c, &s, &run, None, "sh /skills/*/1/scripts/run.sh").await;
    assert_eq!(v["stdout"], "notes v1\n");

    // A run draft's files are in the sandbox, not behind the draft file API.
    let r = c
        .put(s.ws("acme", &format!("drafts/{id}/files/x.txt")))
        .bearer_auth(ADMIN)
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("run draft"));

    // Unpinned skill with an explicit base; unauthorized skill; unknown run.
    publish(&c, &s, ADMIN, "acme", "other", 0, package("other", "o1")).await;
    let r = c
        .post(s.ws("acme", "runs"))
        .bearer_auth(ADMIN)
        .json(&json!({"skills": ["notes"]}))
        .send()
        .await
        .unwrap();
    let fresh = r.json::<Value>().await.unwrap()["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    let (st, d) = create_draft(&c, &s, &fresh, json!({"skill": "notes"})).await;
    assert_eq!((st, d["base_revision"].as_i64()), (201, Some(3)), "{d}");
    let (st, d) = create_draft(
        &c,
        &s,
        &fresh,
        json!({"skill": "notes", "base_revision": 2}),
    )
    .await;
    assert_eq!((st, d["base_revision"].as_i64()), (201, Some(2)), "{d}");
    let (st, v) = create_draft(&c, &s, &fresh, json!({"skill": "other"})).await;
    assert_eq!((st, error_code(&v)), (403, "skill_not_authorized"), "{v}");
    let (st, v) = create_draft(&c, &s, "nope", json!({"skill": "notes"})).await;
    assert_eq!((st, error_code(&v)), (404, "not_found"), "{v}");

    assert_eq!(
        backend.sandbox_handles(&run),
        handles,
        "the run's sandbox was replaced"
    );
    for r in [&run, &fresh] {
        let r = c
            .delete(s.ws("acme", &format!("runs/{r}")))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    backend.assert_run_released(dir.path(), &run).await;
}
backend_test!(run_drafts_are_edited_in_the_sandbox_and_published_with_their_base);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_run_drafts_are_refused_and_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &["--box", "bwrap"]);
    let c = http();
    publish(&c, &s, ADMIN, "acme", "notes", 0, notes("v1")).await;
    let run = new_run(&c, &s, &["notes"]).await;
    let secret = dir.path().join("host-secret.txt");
    std::fs::write(&secret, "host secret").unwrap();

    // A symlink to a host file: refused as a link, the host file never read.
    let (_, d) = create_draft(&c, &s, &run, json!({"skill": "notes"})).await;
    let (id, path) = (d["draft_id"].as_str().unwrap(), d["path"].as_str().unwrap());
    sh(
        &c,
        &s,
        &run,
        None,
        &format!("ln -s {} {path}/leak.txt", secret.display()),
    )
    .await;
    let (st, v) = publish_draft(&c, &s, id).await;
    assert_eq!((st, error_code(&v)), (422, "invalid_package"), "{v}");
    assert!(v.to_string().contains("symbolic links"), "{v}");

    // The draft directory replaced by a link elsewhere: it is packed inside the sandbox, as
    // the sandbox user, so only what the sandbox can read is ever read (here /etc/ssl/private
    // is not: refused).
    let (_, d) = create_draft(&c, &s, &run, json!({"skill": "notes"})).await;
    let (id2, path2) = (d["draft_id"].as_str().unwrap(), d["path"].as_str().unwrap());
    sh(
        &c,
        &s,
        &run,
        None,
        &format!("rm -rf {path2} && ln -s /etc {path2}"),
    )
    .await;
    let (st, v) = publish_draft(&c, &s, id2).await;
    assert_eq!((st, error_code(&v)), (400, "bad_request"), "{v}");
    assert!(v.to_string().contains("cannot be packed"), "{v}");
    assert!(!v.to_string().contains("host secret"));

    // The draft directory removed: not found.
    let (_, d) = create_draft(&c, &s, &run, json!({"skill": "notes"})).await;
    let (id3, path3) = (d["draft_id"].as_str().unwrap(), d["path"].as_str().unwrap());
    sh(&c, &s, &run, None, &format!("rm -rf {path3}")).await;
    let (st, v) = publish_draft(&c, &s, id3).await;
    assert_eq!((st, error_code(&v)), (404, "not_found"), "{v}");

    // Nothing was published by any of it.
    let (_, revs) = get(&c, &s.ws("acme", "skills/notes/revisions"), ADMIN).await;
    assert_eq!(
        revs["revisions"].as_array().map(Vec::len),
        Some(1),
        "{revs}"
    );
    let (st, _) = get(&c, &format!("{}/healthz", s.url), ADMIN).await;
    assert_eq!(st, 200);
    drop(s);

    // Without a sandbox, run drafts are unavailable (and say so); activation still works.
    let s = Server::start(dir.path(), &["--box", "none"]);
    let (st, v) = create_draft(&c, &s, &run, json!({"skill": "notes"})).await;
    assert_eq!((st, error_code(&v)), (503, "box_unavailable"), "{v}");
    let r = c
        .post(s.ws("acme", &format!("runs/{run}/activations")))
        .bearer_auth(ADMIN)
        .json(&json!({"skill": "notes"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ended_runs_release_their_sandbox() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &["--box", "bwrap"]);
    let c = http();
    publish(&c, &s, ADMIN, "acme", "notes", 0, notes("v1")).await;
    let workspace = |run: &str| dir.path().join("box/workspaces").join(run);

    // Finished: the workspace (and the run drafts in it) goes at once.
    let run = new_run(&c, &s, &["notes"]).await;
    let (_, d) = create_draft(&c, &s, &run, json!({"skill": "notes"})).await;
    let id = d["draft_id"].as_str().unwrap().to_string();
    sh(&c, &s, &run, None, "echo kept > /workspace/file.txt").await;
    assert!(workspace(&run).join("file.txt").exists());
    let r = c
        .delete(s.ws("acme", &format!("runs/{run}")))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        !workspace(&run).exists(),
        "a finished run's workspace is released"
    );
    let (st, v) = publish_draft(&c, &s, &id).await;
    assert_eq!((st, error_code(&v)), (404, "not_found"), "{v}");
    let (st, v) = exec(&c, &s, &run, json!({"command": "true"})).await;
    assert_eq!((st, error_code(&v)), (404, "not_found"), "{v}");

    // Expired: released by the upkeep sweep; a live run's workspace is kept.
    let r = c
        .post(s.ws("acme", "runs"))
        .bearer_auth(ADMIN)
        .json(&json!({"ttl_seconds": 1}))
        .send()
        .await
        .unwrap();
    let short = r.json::<Value>().await.unwrap()["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    let live = new_run(&c, &s, &["notes"]).await;
    sh(&c, &s, &short, None, "echo x > /workspace/x").await;
    sh(&c, &s, &live, None, "echo x > /workspace/x").await;
    assert!(
        holds_within(std::time::Duration::from_secs(30), || async {
            !workspace(&short).exists()
        })
        .await,
        "an expired run's workspace was never released"
    );
    assert!(
        workspace(&live).join("x").exists(),
        "a live run's workspace is kept"
    );
}
