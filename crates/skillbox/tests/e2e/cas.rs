//! Compare-and-swap across OS processes (SPEC §4.2, §8.5, §8.11): two `skillbox serve`
//! processes — on one data directory (embedded), or on one PostgreSQL database and one store
//! with a data directory each (scale-out) — 16 concurrent publishers (8 through each) with the
//! same base, 50 rounds. Exactly one wins each round; the others get 409 with the winner's
//! revision; nothing is lost.

// `base` is the revision the next publish expects, not a loop index: kept explicit.
#![allow(clippy::explicit_counter_loop)]

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_publishers_two_processes_one_winner() {
    let dir = tempfile::tempdir().unwrap();
    let a = Server::start(dir.path(), &[]);
    let b = Server::start(dir.path(), &[]);
    sixteen_publishers_one_winner(&a, &b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_publishers_two_servers_on_postgres_and_s3_one_winner() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = scale_out_pair(dir.path());
    sixteen_publishers_one_winner(&a, &b).await;
}

async fn sixteen_publishers_one_winner(a: &Server, b: &Server) {
    let c = http();
    let mut base = 0i64;
    let mut winners = Vec::new();
    for round in 0..50 {
        let mut tasks = Vec::new();
        for writer in 0..16 {
            let c = c.clone();
            let server = if writer % 2 == 0 { a } else { b };
            let url = server.ws(
                "acme",
                &format!("skills/race/revisions?base_revision={base}"),
            );
            let body = package("race", &format!("round {round} writer {writer}"));
            tasks.push(tokio::spawn(async move {
                let r = c
                    .post(url)
                    .bearer_auth(ADMIN)
                    .header("content-type", "application/x-tar")
                    .body(body)
                    .send()
                    .await
                    .unwrap();
                let st = r.status().as_u16();
                (writer, st, r.json::<serde_json::Value>().await.unwrap())
            }));
        }
        let mut won = Vec::new();
        for t in tasks {
            let (writer, st, v) = t.await.unwrap();
            match st {
                201 => won.push((writer, v)),
                409 => {
                    assert_eq!(error_code(&v), "revision_conflict");
                    let cur = v["error"]["current_revision"].as_i64().unwrap();
                    assert!(
                        cur > base,
                        "round {round}: conflict names {cur}, base was {base}"
                    );
                }
                other => panic!("round {round} writer {writer}: unexpected {other}: {v}"),
            }
        }
        assert_eq!(
            won.len(),
            1,
            "round {round}: {} winners: {won:?}",
            won.len()
        );
        let (writer, v) = won.pop().unwrap();
        assert_eq!(
            v["revision"].as_i64(),
            Some(base + 1),
            "revision numbers are consecutive"
        );
        winners.push((writer, v["digest"].as_str().unwrap().to_string()));
        base += 1;
    }
    // No lost update: the history is exactly the winners, each based on its predecessor.
    let (_, v) = get(&c, &a.ws("acme", "skills/race/revisions"), ADMIN).await;
    let revs = v["revisions"].as_array().unwrap();
    assert_eq!(revs.len(), 50);
    for r in revs {
        let n = r["revision"].as_i64().unwrap();
        assert_eq!(r["parent_revision"].as_i64(), Some(n - 1));
        assert_eq!(r["digest"].as_str().unwrap(), winners[(n - 1) as usize].1);
    }
    let (_, v) = get(&c, &b.ws("acme", "skills/race"), ADMIN).await;
    assert_eq!(v["current_revision"], 50);
}

/// The CLI as separate publisher processes: the same guarantee from `skillbox publish`.
#[test]
fn cli_publishers_in_separate_processes() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    let pkgs = tempfile::tempdir().unwrap();
    for round in 0..3 {
        let base = round;
        let children: Vec<_> = (0..8)
            .map(|w| {
                let p = pkgs.path().join(format!("r{round}w{w}"));
                std::fs::create_dir_all(&p).unwrap();
                std::fs::write(
                    p.join("SKILL.md"),
                    skill_md("clirace", &format!("round {round} writer {w}")),
                )
                .unwrap();
                std::process::Command::new(bin())
                    .args([
                        "publish",
                        "--json",
                        "--base",
                        &base.to_string(),
                        "--url",
                        &s.url,
                        "--token",
                        ADMIN,
                        "-w",
                        "acme",
                    ])
                    .arg(&p)
                    .output_async()
            })
            .collect();
        let outcomes: Vec<_> = children
            .into_iter()
            .map(|c| c.wait_with_output().unwrap())
            .collect();
        let ok: Vec<_> = outcomes.iter().filter(|o| o.status.success()).collect();
        assert_eq!(ok.len(), 1, "round {round}: {} winners", ok.len());
        for o in outcomes.iter().filter(|o| !o.status.success()) {
            assert_eq!(o.status.code(), Some(1));
            // With --json the refusal is the server's error object, on stdout.
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
            assert_eq!(
                v["error"]["code"],
                "revision_conflict",
                "{}",
                String::from_utf8_lossy(&o.stdout)
            );
        }
    }
}

trait SpawnOutput {
    fn output_async(&mut self) -> std::process::Child;
}

impl SpawnOutput for std::process::Command {
    fn output_async(&mut self) -> std::process::Child {
        self.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    }
}
