//! Execution in a sandbox (SPEC §4.5, §8.1, §8.4, §8.6, §8.8, §8.9): exactly the pinned
//! packages, read-only; no network; nothing of the host; limits and timeouts that hold. Each
//! scenario runs on the real bubblewrap and through Core on an execution node (bwrap there);
//! the docker backend's counterparts are in `docker.rs`, which checks the container's own
//! means (its uid, its network mode) rather than the host's.

use crate::backends::Backend;
use crate::support::*;
use serde_json::{Value, json};

async fn runs_execute_their_pinned_revision(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let s = backend.start(dir.path(), &[]);
    let c = http();
    publish(
        &c,
        &s,
        ADMIN,
        "acme",
        "hello",
        0,
        versioned("hello", "v1", &[("old.txt", b"old")]),
    )
    .await;
    let run_a = new_run(&c, &s, &["hello"]).await;
    let (st, v) = exec(
        &c,
        &s,
        &run_a,
        json!({"skill": "hello", "argv": ["./scripts/run.sh"]}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        (
            v["stdout"].as_str(),
            v["exit_code"].as_i64(),
            v["backend"].as_str()
        ),
        (Some("I am v1\n"), Some(0), Some(backend.name()))
    );
    assert_eq!(v["packages"][0]["revision"], 1);

    publish(
        &c,
        &s,
        ADMIN,
        "acme",
        "hello",
        1,
        versioned("hello", "v2", &[]),
    )
    .await;
    let (_, v) = exec(
        &c,
        &s,
        &run_a,
        json!({"skill": "hello", "argv": ["./scripts/run.sh"]}),
    )
    .await;
    assert_eq!(v["stdout"], "I am v1\n", "run A switched versions");
    let run_b = new_run(&c, &s, &["hello"]).await;
    let (_, v) = exec(&c, &s, &run_b, json!({"skill": "hello", "command": "./scripts/run.sh; test -e old.txt && echo stale || echo clean"})).await;
    assert_eq!(
        v["stdout"], "I am v2\nclean\n",
        "§8.6: a file deleted in v2 is absent in a v2 sandbox"
    );
    let (_, v) = exec(
        &c,
        &s,
        &run_a,
        json!({"skill": "hello", "command": "cat old.txt"}),
    )
    .await;
    assert_eq!(v["stdout"], "old");

    // the workspace outlives executions; exit codes and stdin come through
    let (_, v) = exec(
        &c,
        &s,
        &run_a,
        json!({"command": "cat > /workspace/note; pwd", "stdin": "kept"}),
    )
    .await;
    assert_eq!(v["stdout"], "/workspace\n");
    let (_, v) = exec(&c, &s, &run_a, json!({"argv": ["cat", "/workspace/note"]})).await;
    assert_eq!(v["stdout"], "kept");
    let (_, v) = exec(&c, &s, &run_a, json!({"command": "echo oops >&2; exit 7"})).await;
    assert_eq!(
        (
            v["exit_code"].as_i64(),
            v["outcome"].as_str(),
            v["stderr"].as_str()
        ),
        (Some(7), Some("exited"), Some("oops\n"))
    );
    let (st, v) = exec(&c, &s, &run_a, json!({"argv": []})).await;
    assert_eq!((st, error_code(&v)), (400, "bad_request"));
    let (st, v) = exec(&c, &s, &run_a, json!({"skill": "nope", "argv": ["true"]})).await;
    assert_eq!((st, error_code(&v)), (404, "not_activated"));
}
backend_test!(runs_execute_their_pinned_revision: bwrap, remote);

async fn the_sandbox_holds(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let s = backend.start(dir.path(), &[]);
    let c = http();
    publish(
        &c,
        &s,
        ADMIN,
        "acme",
        "hello",
        0,
        versioned("hello", "v1", &[]),
    )
    .await;
    let secret = tar_of(&[
        (
            "SKILL.md",
            skill_md("secret", "not for this run").as_bytes(),
        ),
        ("key.txt", b"s3cret"),
    ]);
    let (_, sp) = publish(&c, &s, ADMIN, "acme", "secret", 0, secret).await;
    let run = new_run(&c, &s, &["hello"]).await;
    let (_, view) = get(&c, &s.ws("acme", &format!("runs/{run}")), ADMIN).await;
    let mount = format!(
        "/skills/{}/1",
        view["activations"][0]["skill_id"].as_str().unwrap()
    );
    let sh = |cmd: String| json!({"command": cmd, "timeout_ms": 20_000});

    let (_, v) = exec(
        &c,
        &s,
        &run,
        sh(format!("touch {mount}/x; echo > {mount}/scripts/run.sh")),
    )
    .await;
    assert_ne!(v["exit_code"], 0);
    assert!(
        v["stderr"]
            .as_str()
            .unwrap()
            .contains("Read-only file system"),
        "{v}"
    );
    // `/skills` itself, and every directory above a mount, are read-only: no fake skill can
    // be planted beside the real ones.
    let skill_dir = mount.rsplit_once('/').unwrap().0.to_string();
    let (_, v) = exec(
        &c,
        &s,
        &run,
        sh(format!(
            "mkdir -p /skills/planted/1 2>/dev/null && echo planted; touch /skills/x 2>/dev/null && echo wrote; \
             mkdir {skill_dir}/2 2>/dev/null && echo revision-planted; touch /x 2>/dev/null && echo root-written; \
             ls /skills | wc -l"
        )),
    )
    .await;
    assert_eq!(v["stdout"], "1\n", "/skills is writable: {v}");
    let (_, v) = exec(&c, &s, &run, sh(format!("mount -o remount,rw {mount}"))).await;
    assert_ne!(v["exit_code"], 0, "remount succeeded: {v}");
    let (_, v) = exec(&c, &s, &run, sh(format!("cat {mount}/scripts/run.sh"))).await;
    assert!(
        v["stdout"].as_str().unwrap().contains("I am v1"),
        "the package changed: {v}"
    );

    // only the run's activated skills, nothing of the host
    let (_, v) = exec(&c, &s, &run, sh("ls /skills; ls /skills/*".into())).await;
    let listing = v["stdout"].as_str().unwrap();
    assert!(
        !listing.contains(sp["skill_id"].as_str().unwrap()),
        "a skill outside the run is visible: {listing}"
    );
    assert_eq!(listing.lines().next().unwrap().len(), 32, "{listing}");
    let data = format!(
        "{} {}",
        dir.path().display(),
        backend.sandbox_root(dir.path()).display()
    );
    let (_, v) = exec(
        &c,
        &s,
        &run,
        sh(format!(
            "ls /root /home {data} 2>&1; ls -d /work 2>&1; id -u"
        )),
    )
    .await;
    let out = v["stdout"].as_str().unwrap();
    assert!(
        out.contains("No such file or directory") && !out.contains("skillbox.db"),
        "{out}"
    );
    let uid: u32 = out.lines().last().unwrap().trim().parse().unwrap();
    assert!(
        uid >= 1_000_000,
        "not the sandbox's own unprivileged uid from the pool: {out}"
    );
    let (_, v) = exec(&c, &s, &run, sh("grep CapEff /proc/self/status".into())).await;
    assert_eq!(v["stdout"], "CapEff:\t0000000000000000\n");

    // no network: a listener on the host's loopback is unreachable
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let py = format!(
        "python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 3); print('CONNECTED')\""
    );
    let (_, v) = exec(&c, &s, &run, sh(py)).await;
    assert!(
        !v["stdout"].as_str().unwrap().contains("CONNECTED"),
        "network reached the host: {v}"
    );
    assert_ne!(v["exit_code"], 0);

    // a fork bomb and a memory hog are contained; the server keeps serving
    let (st, v) = exec(&c, &s, &run, json!({"command": "bomb() { bomb | bomb & }; bomb; sleep 2; echo survived", "timeout_ms": 8000})).await;
    assert_eq!(st, 200, "{v}");
    let (_, v) = exec(
        &c,
        &s,
        &run,
        sh("python3 -c 'x = bytearray(8 << 30)'; echo rc=$?".into()),
    )
    .await;
    assert!(
        v["stdout"].as_str().unwrap().contains("rc=1"),
        "the memory hog was not refused: {v}"
    );
    assert!(v["stderr"].as_str().unwrap().contains("MemoryError"), "{v}");

    // the timeout kills children too
    let (_, v) = exec(
        &c,
        &s,
        &run,
        json!({"command": "sleep 300 & sleep 300 & sleep 300", "timeout_ms": 700}),
    )
    .await;
    assert_eq!(
        (
            v["timed_out"].as_bool(),
            v["outcome"].as_str(),
            v["exit_code"].clone()
        ),
        (Some(true), Some("timed_out"), Value::Null)
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    let left = std::process::Command::new("pgrep")
        .args(["-u", "65534", "-f", "sleep 300"])
        .output()
        .unwrap();
    assert!(
        left.stdout.is_empty(),
        "sandboxed processes survived the timeout: {}",
        String::from_utf8_lossy(&left.stdout)
    );
    let (_, v) = exec(&c, &s, &run, sh("echo still fine".into())).await;
    assert_eq!(v["stdout"], "still fine\n");
}
backend_test!(the_sandbox_holds: bwrap, remote);

async fn revocation_kills_running_executions(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let s = backend.start(dir.path(), &[]);
    let c = http();
    publish(
        &c,
        &s,
        ADMIN,
        "acme",
        "hello",
        0,
        versioned("hello", "v1", &[]),
    )
    .await;
    let run = new_run(&c, &s, &["hello"]).await;
    let started = std::time::Instant::now();
    let long = spawn_exec(
        &c,
        &s,
        &run,
        json!({"command": "echo started > /workspace/flag; sleep 60", "timeout_ms": 90_000}),
    );
    let flag = backend.workspace(dir.path(), &run).join("flag");
    while !flag.exists() {
        assert!(
            started.elapsed().as_secs() < 20,
            "the execution never started"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    revoke(&c, &s, "hello", 1, "bad").await;
    let (st, v) = long.await.unwrap();
    assert_eq!((st, error_code(&v)), (410, "revision_revoked"), "{v}");
    assert!(
        started.elapsed().as_secs() < 30,
        "the execution was not killed"
    );
    let (st, v) = exec(&c, &s, &run, json!({"argv": ["true"]})).await;
    assert_eq!((st, error_code(&v)), (410, "revision_revoked"));
}
backend_test!(revocation_kills_running_executions: bwrap, remote);

async fn concurrent_runs_execute_their_own_revisions(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let s = backend.start(dir.path(), &[]);
    let c = http();
    publish(
        &c,
        &s,
        ADMIN,
        "acme",
        "hello",
        0,
        versioned("hello", "v1", &[]),
    )
    .await;
    let mut runs = Vec::new();
    for i in 0..8 {
        if i == 1 {
            publish(
                &c,
                &s,
                ADMIN,
                "acme",
                "hello",
                1,
                versioned("hello", "v2", &[]),
            )
            .await;
        }
        let want = if i == 0 || i % 2 == 0 && i > 1 {
            "v1"
        } else {
            "v2"
        };
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
        let rev = if want == "v1" { 1 } else { 2 };
        c.post(s.ws("acme", &format!("runs/{run}/activations")))
            .bearer_auth(ADMIN)
            .json(&json!({"skill": "hello", "revision": rev}))
            .send()
            .await
            .unwrap();
        runs.push((run, want));
    }
    let publisher = {
        let (c, url) = (c.clone(), s.ws("acme", "skills/hello/revisions"));
        tokio::spawn(async move {
            for base in 2..6 {
                let body = versioned("hello", &format!("v{}", base + 1), &[]);
                let r = c
                    .post(format!("{url}?base_revision={base}"))
                    .bearer_auth(ADMIN)
                    .header("content-type", "application/x-tar")
                    .body(body)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 201);
            }
        })
    };
    let mut tasks = Vec::new();
    for (run, want) in runs {
        let (c, url) = (c.clone(), s.ws("acme", &format!("runs/{run}/exec")));
        tasks.push(tokio::spawn(async move {
            for _ in 0..4 {
                let v: Value = c
                    .post(&url)
                    .bearer_auth(ADMIN)
                    .json(&json!({"skill": "hello", "argv": ["./scripts/run.sh"]}))
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                assert_eq!(
                    v["stdout"].as_str(),
                    Some(format!("I am {want}\n").as_str()),
                    "{v}"
                );
                assert_eq!(v["packages"].as_array().unwrap().len(), 1);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    publisher.await.unwrap();
}
backend_test!(concurrent_runs_execute_their_own_revisions: bwrap, remote);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_restart_between_executions_keeps_the_pin() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut s = Server::start_on(dir.path(), port, &["--box", "bwrap"]);
    let c = http();
    publish(
        &c,
        &s,
        ADMIN,
        "acme",
        "hello",
        0,
        versioned("hello", "v1", &[]),
    )
    .await;
    let run = new_run(&c, &s, &["hello"]).await;
    let (_, v) = exec(
        &c,
        &s,
        &run,
        json!({"skill": "hello", "command": "./scripts/run.sh; echo mark > /workspace/m"}),
    )
    .await;
    assert_eq!(v["stdout"], "I am v1\n");
    publish(
        &c,
        &s,
        ADMIN,
        "acme",
        "hello",
        1,
        versioned("hello", "v2", &[]),
    )
    .await;
    s.kill9();
    let s = Server::start_on(dir.path(), port, &["--box", "bwrap"]);
    // the tree of the pinned revision vanished while the server was down: rebuilt and verified
    let digest = v["packages"][0]["digest"]
        .as_str()
        .unwrap()
        .trim_start_matches("sha256:")
        .to_string();
    skillbox_package::staging::remove_tree(&dir.path().join("trees").join(&digest)).unwrap();
    let (st, v) = exec(
        &c,
        &s,
        &run,
        json!({"skill": "hello", "command": "./scripts/run.sh; cat /workspace/m"}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        v["stdout"], "I am v1\nmark\n",
        "after a restart the run still executes its pin, with its workspace"
    );
    // if the content is gone too, the run fails explicitly — never falls back to v2
    skillbox_package::staging::remove_tree(&dir.path().join("trees").join(&digest)).unwrap();
    let script_blob = skillbox_package::Sha256::of(b"#!/bin/sh\necho \"I am v1\"\n").to_hex();
    std::fs::remove_file(dir.path().join("store/blobs/sha256").join(script_blob)).unwrap();
    let (st, v) = exec(
        &c,
        &s,
        &run,
        json!({"skill": "hello", "argv": ["./scripts/run.sh"]}),
    )
    .await;
    assert_eq!(
        (st, error_code(&v)),
        (410, "pinned_revision_unavailable"),
        "{v}"
    );
    assert_eq!(v["error"]["revision"], 1);
}
