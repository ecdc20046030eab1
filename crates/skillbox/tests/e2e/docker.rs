//! The docker backend on the real engine (SPEC §4.5–4.9, §8.1, §8.4, §8.6, §8.9): long-lived
//! containers with exactly the run's packages bound read-only, selected by mount-set
//! signature; a mount-set change gets a new container on the same workspace volume and the old
//! one goes only when its execution ends; a restarted server adopts matching containers and
//! removes inconsistent ones; nothing is left behind.
//!
//! Needs the image `scripts/docker-test-image` builds (`scripts/test` builds it).

use crate::backends::{Owner, image};
use crate::support::*;
use serde_json::{Value, json};
use std::process::Command;

fn start(dir: &std::path::Path, owner: &Owner) -> Server {
    let args = owner.args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Server::start(dir, &args)
}

async fn finish(c: &reqwest::Client, s: &Server, run: &str) {
    let r = c
        .delete(s.ws("acme", &format!("runs/{run}")))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_runs_see_exactly_their_pins_read_only() {
    let owner = Owner::new("pins");
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path(), &owner);
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
    publish(&c, &s, ADMIN, "acme", "other", 0, package("other", "o")).await;

    // §8.1: a v1 run keeps executing v1 after v2 is published; a new run executes v2.
    let run_a = new_run(&c, &s, &["hello"]).await;
    let v = sh(&c, &s, &run_a, Some("hello"), "./scripts/run.sh").await;
    assert_eq!(
        (v["stdout"].as_str(), v["backend"].as_str()),
        (Some("I am v1\n"), Some("docker"))
    );
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
    let run_b = new_run(&c, &s, &["hello"]).await;
    // §8.4: concurrently, each sees its own.
    let (va, vb) = tokio::join!(
        sh(
            &c,
            &s,
            &run_a,
            Some("hello"),
            "./scripts/run.sh; test -e old.txt && echo has-old"
        ),
        sh(
            &c,
            &s,
            &run_b,
            Some("hello"),
            "./scripts/run.sh; test -e old.txt && echo has-old || echo no-old"
        ),
    );
    assert_eq!(va["stdout"], "I am v1\nhas-old\n");
    assert_eq!(
        vb["stdout"], "I am v2\nno-old\n",
        "§8.6: a file removed in v2 is absent"
    );
    assert_ne!(
        owner.containers(&[format!("skillbox.sandbox={run_a}")]),
        owner.containers(&[format!("skillbox.sandbox={run_b}")]),
        "runs with different pins share no container"
    );

    // §8.9 inside the container.
    let host_file = dir.path().join("host-only.txt");
    std::fs::write(&host_file, "host").unwrap();
    let listener = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let v = sh(
        &c,
        &s,
        &run_a,
        Some("hello"),
        &format!(
            "touch /skills/x 2>/dev/null && echo wrote-skills; mkdir -p /skills/planted/1 2>/dev/null && echo planted; \
             touch scripts/run.sh 2>/dev/null && echo wrote-pkg; \
             mount -o remount,rw /skills 2>/dev/null && echo remounted; id -u; grep CapEff /proc/self/status; \
             ls -d /skills/*/* | wc -l; test -e {host} && echo host-visible; \
             python3 -c \"import socket; socket.create_connection(('172.17.0.1', {port}), 2); print('CONNECTED')\" 2>/dev/null || echo no-network",
            host = host_file.display()
        ),
    )
    .await;
    assert_eq!(
        v["stdout"], "65534\nCapEff:\t0000000000000000\n1\nno-network\n",
        "read-only packages, no remount, unprivileged, only the run's one package, no network: {v}"
    );
    drop(listener);

    // A timeout kills the execution's own processes, not the container's other work: a
    // concurrent execution in the same container completes.
    let (other, (_, timed)) = tokio::join!(
        sh(&c, &s, &run_a, None, "sleep 2; echo other-finished"),
        exec(
            &c,
            &s,
            &run_a,
            json!({"command": "sleep 30", "timeout_ms": 300})
        ),
    );
    assert_eq!(timed["timed_out"], true, "{timed}");
    assert_eq!(other["stdout"], "other-finished\n", "{other}");

    // A timeout kills the execution's children, not the container.
    let (_, v) = exec(
        &c,
        &s,
        &run_a,
        json!({"command": "(sleep 3; echo late > /workspace/late) & sleep 30", "timeout_ms": 500}),
    )
    .await;
    assert_eq!(v["timed_out"], true, "{v}");
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    let v2 = sh(
        &c,
        &s,
        &run_a,
        None,
        "test -e /workspace/late && echo survived || echo killed",
    )
    .await;
    assert_eq!(v2["stdout"], "killed\n", "{v}");

    // Cleanup: finished runs leave no container and no volume.
    finish(&c, &s, &run_a).await;
    finish(&c, &s, &run_b).await;
    owner.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mount_set_change_waits_for_the_running_execution() {
    let owner = Owner::new("mountset");
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path(), &owner);
    let c = http();
    publish(&c, &s, ADMIN, "acme", "a", 0, versioned("a", "a1", &[])).await;
    publish(&c, &s, ADMIN, "acme", "b", 0, versioned("b", "b1", &[])).await;
    let r = c
        .post(s.ws("acme", "runs"))
        .bearer_auth(ADMIN)
        .json(&json!({"skills": ["a", "b"]}))
        .send()
        .await
        .unwrap();
    let run = r.json::<Value>().await.unwrap()["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    let activate = |skill: &'static str| {
        let (c, url) = (c.clone(), s.ws("acme", &format!("runs/{run}/activations")));
        async move {
            let r = c
                .post(url)
                .bearer_auth(ADMIN)
                .json(&json!({ "skill": skill }))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
        }
    };
    activate("a").await;
    sh(&c, &s, &run, Some("a"), "true").await;
    let old = owner.containers(&[format!("skillbox.sandbox={run}")]);
    assert_eq!(old.len(), 1);

    // A long execution in the old container writes to the workspace when it ends.
    let long = spawn_exec(
        &c,
        &s,
        &run,
        json!({"command": "sleep 3; echo from-old > /workspace/f; echo done"}),
    );
    tokio::time::sleep(std::time::Duration::from_millis(800)).await;

    // Activating b changes the mount set: a new container on the same workspace volume, while
    // the old one keeps running its execution.
    activate("b").await;
    let v = sh(
        &c,
        &s,
        &run,
        Some("b"),
        "ls -d /skills/*/* | wc -l; test -e /workspace/f && echo early || echo not-yet",
    )
    .await;
    assert_eq!(v["stdout"], "2\nnot-yet\n", "{v}");
    let both = owner.containers(&[format!("skillbox.sandbox={run}")]);
    assert_eq!(both.len(), 2, "old container kept while its execution runs");
    assert!(both.contains(&old[0]));

    let (_, long_result) = long.await.unwrap();
    assert_eq!(
        long_result["stdout"], "done\n",
        "the execution in the old container completed: {long_result}"
    );
    let v = sh(&c, &s, &run, Some("b"), "cat /workspace/f").await;
    assert_eq!(
        v["stdout"], "from-old\n",
        "the workspace outlives containers"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let now = owner.containers(&[format!("skillbox.sandbox={run}")]);
        if now.len() == 1 && !now.contains(&old[0]) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the old container was not retired after its execution ended: {now:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    finish(&c, &s, &run).await;
    owner.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_adopts_matching_containers_and_removes_inconsistent_ones() {
    let owner = Owner::new("restart");
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let args = owner.args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut s = Server::start_on(dir.path(), port, &args);
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
    sh(&c, &s, &run, Some("hello"), "echo kept > /workspace/k").await;
    let before = owner.containers(&[]);
    assert_eq!(before.len(), 1);

    // A container of this owner whose labels do not hold together (no package list).
    let out = Command::new("docker")
        .args(["run", "-d", "--network", "none", "--label"])
        .arg(format!("skillbox.owner={}", owner.0))
        .args([
            "--label",
            "skillbox.sandbox=forged",
            "--label",
            "skillbox.signature=0000",
        ])
        .arg(image())
        .args(["sleep", "infinity"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let forged = String::from_utf8_lossy(&out.stdout).trim().to_string();
    // Another one, with an execution in progress: never destroyed while it runs.
    let out = Command::new("docker")
        .args(["run", "-d", "--network", "none", "--label"])
        .arg(format!("skillbox.owner={}", owner.0))
        .args(["--label", "skillbox.sandbox=busy"])
        .arg(image())
        .args(["sleep", "infinity"])
        .output()
        .unwrap();
    let busy = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let out = Command::new("docker")
        .args(["exec", "-d", &busy, "sleep", "30"])
        .output()
        .unwrap();
    assert!(out.status.success());

    s.kill9();
    let s = Server::start_on(dir.path(), port, &args);
    let v = sh(
        &c,
        &s,
        &run,
        Some("hello"),
        "./scripts/run.sh; cat /workspace/k",
    )
    .await;
    assert_eq!(v["stdout"], "I am v1\nkept\n");
    assert_eq!(
        owner.containers(&[format!("skillbox.sandbox={run}")]),
        before,
        "the matching container was adopted, no new one made"
    );
    assert!(!owner.containers(&[]).contains(&forged));
    assert!(
        owner.containers(&[]).contains(&busy),
        "a container with an execution in progress was destroyed"
    );
    let _ = Command::new("docker").args(["rm", "-f", &busy]).output();
    finish(&c, &s, &run).await;
    owner.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_contains_bombs_and_revocation_kills() {
    let owner = Owner::new("contain");
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path(), &owner);
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
    sh(&c, &s, &run, None, "echo kept > /workspace/k").await;

    // A fork bomb and a memory hog are contained; the container keeps working.
    let (st, v) = exec(&c, &s, &run, json!({"command": "bomb() { bomb | bomb & }; bomb; sleep 2; echo survived", "timeout_ms": 8000})).await;
    assert_eq!(st, 200, "{v}");
    let v = sh(
        &c,
        &s,
        &run,
        None,
        "python3 -c 'x = bytearray(8 << 30)' 2>/dev/null; echo rc=$?",
    )
    .await;
    assert_ne!(
        v["stdout"], "rc=0\n",
        "8 GiB allocated past a 2 GiB limit: {v}"
    );
    let v = sh(&c, &s, &run, None, "cat /workspace/k").await;
    assert_eq!(v["stdout"], "kept\n", "{v}");

    // Box restart: the container dies between executions; the next one gets a fresh container
    // on the same workspace volume.
    let before = owner.containers(&[format!("skillbox.sandbox={run}")]);
    assert_eq!(before.len(), 1);
    let out = Command::new("docker")
        .args(["kill", &before[0]])
        .output()
        .unwrap();
    assert!(out.status.success());
    let v = sh(
        &c,
        &s,
        &run,
        Some("hello"),
        "./scripts/run.sh; cat /workspace/k",
    )
    .await;
    assert_eq!(v["stdout"], "I am v1\nkept\n", "{v}");
    assert!(
        !owner
            .containers(&[format!("skillbox.sandbox={run}")])
            .contains(&before[0])
    );

    // §8.8: revocation kills the running execution, and later ones refuse.
    let started = std::time::Instant::now();
    let long = spawn_exec(
        &c,
        &s,
        &run,
        json!({"command": "sleep 60", "timeout_ms": 90_000}),
    );
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    revoke(&c, &s, "hello", 1, "bad").await;
    let (st, v) = long.await.unwrap();
    assert_eq!((st, error_code(&v)), (410, "revision_revoked"), "{v}");
    assert!(
        started.elapsed().as_secs() < 30,
        "the execution was not killed"
    );
    let (st, v) = exec(&c, &s, &run, json!({"argv": ["true"]})).await;
    assert_eq!((st, error_code(&v)), (410, "revision_revoked"), "{v}");
    finish(&c, &s, &run).await;
    owner.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_dependency_environments_are_built_in_the_image() {
    let owner = Owner::new("deps");
    let dir = tempfile::tempdir().unwrap();
    let wheels = wheel_dir(dir.path(), &["1.0"]);
    let mut args = owner.args();
    args.extend([
        "--deps-find-links".to_string(),
        wheels.display().to_string(),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let s = Server::start(&dir.path().join("data"), &args);
    let c = http();
    let md = skill_md("py", "python skill");
    let script = "import os, sys, skbdemo\nprint(skbdemo.VERSION, os.environ['VIRTUAL_ENV'].startswith('/envs/'))\n";
    let pkg = tar_of(&[
        ("SKILL.md", md.as_bytes()),
        ("requirements.txt", b"skbdemo==1.0\n"),
        ("scripts/ver.py", script.as_bytes()),
    ]);
    publish(&c, &s, ADMIN, "acme", "py", 0, pkg).await;
    publish(
        &c,
        &s,
        ADMIN,
        "acme",
        "plain",
        0,
        versioned("plain", "p1", &[]),
    )
    .await;
    let run = new_run(&c, &s, &["py", "plain"]).await;
    for _ in 0..2 {
        let (st, v) = exec(
            &c,
            &s,
            &run,
            json!({"skill": "py", "argv": ["python3", "scripts/ver.py"]}),
        )
        .await;
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["stdout"], "1.0 True\n", "{v}");
    }
    let v = sh(
        &c,
        &s,
        &run,
        Some("py"),
        "touch \"$VIRTUAL_ENV/x\" 2>/dev/null && echo wrote || echo read-only",
    )
    .await;
    assert_eq!(v["stdout"], "read-only\n");
    // Executions with and without the environment alternate between two containers of the
    // same packages (one mounts the environment): neither retires the other.
    sh(&c, &s, &run, Some("plain"), "true").await;
    let mut two = owner.containers(&[format!("skillbox.sandbox={run}")]);
    for skill in ["py", "plain", "py", "plain"] {
        sh(&c, &s, &run, Some(skill), "true").await;
    }
    let mut now = owner.containers(&[format!("skillbox.sandbox={run}")]);
    now.sort();
    two.sort();
    assert_eq!((now.len(), now), (2, two), "containers churned");
    // The build's one-shot containers are gone.
    assert_eq!(
        owner.containers(&[]).len(),
        2,
        "{:?}",
        owner.containers(&[])
    );
    // Stored in a volume of the engine (a cache shared by runs, kept after them), not on the host.
    let volumes = owner.volumes();
    assert!(
        volumes.iter().any(|v| v.starts_with("skillbox-env-")),
        "{volumes:?}"
    );
    let host_envs: Vec<_> = std::fs::read_dir(dir.path().join("data/box/envs"))
        .map(|rd| rd.flatten().collect())
        .unwrap_or_default();
    assert!(host_envs.is_empty(), "{host_envs:?}");
    finish(&c, &s, &run).await;
    assert!(owner.containers(&[]).is_empty());
    assert!(
        owner
            .volumes()
            .iter()
            .all(|v| v.starts_with("skillbox-env-")),
        "{:?}",
        owner.volumes()
    );
}

/// The race behind an environment build failing under a parallel suite ("sealing the
/// environment failed" with no reason, or pip killed with 137): the sweep that releases ended
/// runs' sandboxes took the build's one-shot container for an ended run's and destroyed it
/// mid-build. A build stalled in its container must outlive several sweeps (every 5 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_upkeep_sweep_never_destroys_a_build_in_progress() {
    let owner = Owner::new("sweep");
    let dir = tempfile::tempdir().unwrap();
    let wheels = wheel_dir(dir.path(), &["1.0"]);
    let mut args = owner.args();
    args.extend([
        "--deps-find-links".to_string(),
        wheels.display().to_string(),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let data = dir.path().join("data");
    let s = Server::start(&data, &args);
    let c = http();
    let md = skill_md("py", "python skill");
    let pkg = tar_of(&[
        ("SKILL.md", md.as_bytes()),
        ("requirements.txt", b"skbdemo==1.0\n"),
    ]);
    publish(&c, &s, ADMIN, "acme", "py", 0, pkg).await;
    let run = new_run(&c, &s, &["py"]).await;
    let envs = data.join("box/envs");
    std::fs::write(envs.join("FAILPOINT"), "stall").unwrap();
    let pending = {
        let (c, url) = (c.clone(), s.ws("acme", &format!("runs/{run}/exec")));
        tokio::spawn(async move {
            c.post(url)
                .bearer_auth(ADMIN)
                .json(&json!({"skill": "py", "argv": ["true"]}))
                .send()
                .await
        })
    };
    wait_for_failpoint(&envs).await;
    // The build's container: its exec starts right after the failpoint is reached.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let building = owner.containers(&[]);
    assert_eq!(building.len(), 1, "the build's container: {building:?}");
    tokio::time::sleep(std::time::Duration::from_secs(12)).await;
    let running = Command::new("docker")
        .args(["inspect", "-f", "{{.State.Running}}", &building[0]])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&running.stdout).trim(),
        "true",
        "the sweep destroyed a build in progress"
    );
    pending.abort();
    drop(s);
}
