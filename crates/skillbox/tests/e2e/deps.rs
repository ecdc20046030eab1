//! Dependency environments on the real bubblewrap (SPEC §4.8): a virtualenv per requirements
//! key, built once (single-flight) from the operator's index — here a local wheel directory
//! built offline — mounted read-only, activated for the skill's executions, and never used
//! half-built.

use serde_json::{Value, json};
use std::path::{Path, PathBuf};

use crate::support::*;

fn py_skill(requirements: &str, tag: &str) -> Vec<u8> {
    let md = skill_md("py", &format!("python skill {tag}"));
    let script = format!(
        "import os, skbdemo\nprint(skbdemo.VERSION, os.environ['VIRTUAL_ENV'].startswith('/envs/'), '{tag}')\n"
    );
    tar_of(&[
        ("SKILL.md", md.as_bytes()),
        ("requirements.txt", requirements.as_bytes()),
        ("scripts/ver.py", script.as_bytes()),
    ])
}

async fn builds(c: &reqwest::Client, s: &Server) -> u64 {
    metric(c, &s.url, "skillbox_dep_env_builds").await
}

async fn run_version(c: &reqwest::Client, s: &Server, run: &str) -> (u16, Value) {
    exec(
        c,
        s,
        run,
        json!({"skill": "py", "argv": ["python3", "scripts/ver.py"]}),
    )
    .await
}

fn ready_envs(data: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(data.join("box/envs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("READY").exists())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn environments_are_built_once_per_requirements_and_mounted_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let wheels = wheel_dir(dir.path(), &["1.0", "2.0"]);
    let data = dir.path().join("data");
    let s = Server::start(
        &data,
        &[
            "--box",
            "bwrap",
            "--deps-find-links",
            wheels.to_str().unwrap(),
        ],
    );
    let c = http();
    let (st, v) = publish(
        &c,
        &s,
        ADMIN,
        "acme",
        "py",
        0,
        py_skill("skbdemo==1.0\n", "a"),
    )
    .await;
    assert_eq!(st, 201, "{v}");

    // Two runs of the same revision, executing at once: one build serves both.
    let run_a = new_run(&c, &s, &["py"]).await;
    let run_b = new_run(&c, &s, &["py"]).await;
    let (ra, rb) = tokio::join!(run_version(&c, &s, &run_a), run_version(&c, &s, &run_b));
    for (st, v) in [ra, rb] {
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["stdout"], "1.0 True a\n", "{v}");
    }
    assert_eq!(
        builds(&c, &s).await,
        1,
        "two runs of one revision share one build"
    );

    // A new revision with the same requirements reuses the environment.
    publish(
        &c,
        &s,
        ADMIN,
        "acme",
        "py",
        1,
        py_skill("skbdemo==1.0\n", "b"),
    )
    .await;
    let run_c = new_run(&c, &s, &["py"]).await;
    let (_, v) = run_version(&c, &s, &run_c).await;
    assert_eq!(v["stdout"], "1.0 True b\n", "{v}");
    assert_eq!(builds(&c, &s).await, 1);

    // Different requirements: a new environment; the old run keeps its own.
    publish(
        &c,
        &s,
        ADMIN,
        "acme",
        "py",
        2,
        py_skill("skbdemo==2.0\n", "c"),
    )
    .await;
    let run_d = new_run(&c, &s, &["py"]).await;
    let (_, v) = run_version(&c, &s, &run_d).await;
    assert_eq!(v["stdout"], "2.0 True c\n", "{v}");
    assert_eq!(builds(&c, &s).await, 2);
    let (_, v) = run_version(&c, &s, &run_a).await;
    assert_eq!(v["stdout"], "1.0 True a\n", "{v}");
    assert_eq!(ready_envs(&data).len(), 2);

    // The environment is read-only inside the sandbox, and only the skill's executions get it.
    let (_, v) = exec(
        &c,
        &s,
        &run_a,
        json!({"skill": "py", "command": "touch \"$VIRTUAL_ENV/planted\" 2>/dev/null && echo wrote; pip_dir=$(ls -d $VIRTUAL_ENV/lib/python3*/site-packages); rm -rf \"$pip_dir/skbdemo\" 2>/dev/null; python3 -c 'import skbdemo; print(skbdemo.VERSION)'"}),
    )
    .await;
    assert_eq!(v["stdout"], "1.0\n", "{v}");
    let (_, v) = exec(
        &c,
        &s,
        &run_a,
        json!({"command": "python3 -c 'import skbdemo' 2>/dev/null && echo visible || echo absent"}),
    )
    .await;
    assert_eq!(v["stdout"], "absent\n", "{v}");

    // Requirements that cannot be satisfied: a clear error, nothing marked ready, and the next
    // attempt tries again rather than using anything half-built.
    publish(
        &c,
        &s,
        ADMIN,
        "acme",
        "py",
        3,
        py_skill("skbdemo==9.9\n", "d"),
    )
    .await;
    let run_e = new_run(&c, &s, &["py"]).await;
    for _ in 0..2 {
        let (st, v) = run_version(&c, &s, &run_e).await;
        assert_eq!(st, 422, "{v}");
        assert_eq!(error_code(&v), "dependency_build_failed");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("skbdemo==9.9"),
            "{v}"
        );
    }
    assert_eq!(ready_envs(&data).len(), 2);
    let leftovers: Vec<_> = std::fs::read_dir(data.join("box/envs"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "failed builds leave nothing behind");

    // An environment whose READY marker is gone is not used: it is rebuilt.
    let env = ready_envs(&data)
        .into_iter()
        .find(|p| {
            let out = std::process::Command::new("sh")
                .arg("-c")
                .arg(format!("ls {}/lib/python3*/site-packages", p.display()))
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).contains("skbdemo-1.0")
        })
        .unwrap();
    let ready = env.join("READY");
    let mut perms = std::fs::metadata(&env).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&env, perms).unwrap();
    std::fs::remove_file(&ready).unwrap();
    let (_, v) = run_version(&c, &s, &run_a).await;
    assert_eq!(v["stdout"], "1.0 True a\n", "{v}");
    assert_eq!(
        builds(&c, &s).await,
        3,
        "an environment without READY is rebuilt"
    );
    assert!(ready.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_build_is_never_used() {
    let dir = tempfile::tempdir().unwrap();
    let wheels = wheel_dir(dir.path(), &["1.0"]);
    let data = dir.path().join("data");
    let args = [
        "--box",
        "bwrap",
        "--deps-find-links",
        wheels.to_str().unwrap(),
    ];
    let mut s = Server::start(&data, &args);
    let c = http();
    publish(
        &c,
        &s,
        ADMIN,
        "acme",
        "py",
        0,
        py_skill("skbdemo==1.0\n", "a"),
    )
    .await;
    let run = new_run(&c, &s, &["py"]).await;

    // The build stops after pip and before READY; the server is killed right there.
    let envs = data.join("box/envs");
    std::fs::write(envs.join("FAILPOINT"), "hang").unwrap();
    let pending = {
        let (c, url) = (c.clone(), s.ws("acme", &format!("runs/{run}/exec")));
        tokio::spawn(async move {
            c.post(url)
                .bearer_auth(ADMIN)
                .json(&json!({"skill": "py", "argv": ["python3", "scripts/ver.py"]}))
                .send()
                .await
        })
    };
    wait_for_failpoint(&envs).await;
    let staged: Vec<String> = std::fs::read_dir(&envs)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with("FAILPOINT"))
        .collect();
    assert!(
        staged.len() == 1 && staged[0].starts_with(".build-"),
        "only the build's staging exists while it runs: {staged:?}"
    );
    s.kill9();
    assert!(
        pending.await.unwrap().is_err(),
        "the request died with the server"
    );
    assert!(ready_envs(&data).is_empty());

    // Without an index, the skill cannot run — said clearly, activation and reads unaffected.
    let s = Server::start(&data, &["--box", "bwrap"]);
    let (st, v) = run_version(&c, &s, &run).await;
    assert_eq!(st, 422, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--deps-find-links"),
        "{v}"
    );
    drop(s);

    // After a restart the abandoned build is gone and a complete one is made.
    let s = Server::start(&data, &args);
    let (st, v) = run_version(&c, &s, &run).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["stdout"], "1.0 True a\n", "{v}");
    assert_eq!(builds(&c, &s).await, 1);
    let names: Vec<String> = std::fs::read_dir(&envs)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with("FAILPOINT"))
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
    assert!(envs.join(&names[0]).join("READY").exists());
}
