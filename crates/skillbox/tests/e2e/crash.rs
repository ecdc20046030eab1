//! Crash safety (SPEC §4.1, §8.10): publishes in a loop while the server is `kill -9`ed at
//! random moments, 100 times. After every restart: every acknowledged publish is present with
//! its digest, no partial revision is visible, the pointer names a complete revision; at the
//! end `fsck` is clean and staging is empty. The same for activations under load (group
//! commit): every acknowledged pin survives, none is half there.

use crate::support::*;
use serde_json::Value;
use std::sync::{Arc, Mutex};

const KILLS: usize = 100;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn bulky_package(n: u64) -> Vec<u8> {
    let md = skill_md("crashy", &format!("publish {n}"));
    let files: Vec<(String, Vec<u8>)> = (0..24)
        .map(|i| {
            (
                format!("data/f{i}.txt"),
                format!("{n}:{i}:").repeat(400).into_bytes(),
            )
        })
        .collect();
    let mut all: Vec<(&str, &[u8])> = vec![("SKILL.md", md.as_bytes())];
    all.extend(files.iter().map(|(p, c)| (p.as_str(), c.as_slice())));
    tar_of(&all)
}

/// Checks the registry against what was acknowledged; returns the current revision.
async fn verify(
    c: &reqwest::Client,
    s: &Server,
    acked: &[(i64, String)],
    checked: &mut usize,
) -> i64 {
    let (st, v) = get(c, &s.ws("acme", "skills/crashy/revisions"), ADMIN).await;
    if st == 404 {
        assert!(acked.is_empty(), "acknowledged publishes lost: {acked:?}");
        return 0;
    }
    let revs = v["revisions"].as_array().unwrap().clone();
    for (rev, digest) in acked {
        let found = revs
            .iter()
            .find(|r| r["revision"].as_i64() == Some(*rev))
            .unwrap_or_else(|| panic!("acknowledged r{rev} lost"));
        assert_eq!(
            found["digest"].as_str(),
            Some(digest.as_str()),
            "r{rev} changed digest"
        );
    }
    // Every visible revision is complete: its manifest loads and its archive matches its digest.
    let mut numbers: Vec<i64> = revs
        .iter()
        .map(|r| r["revision"].as_i64().unwrap())
        .collect();
    numbers.sort();
    for n in numbers.iter().skip(*checked) {
        let (st, detail) = get(
            c,
            &s.ws("acme", &format!("skills/crashy/revisions/{n}")),
            ADMIN,
        )
        .await;
        assert_eq!(st, 200, "r{n}: {detail}");
        let (st, d) = archive_digest(c, s, "acme", "crashy", *n).await;
        assert_eq!(st, 200);
        assert_eq!(
            Some(d.as_str()),
            detail["digest"].as_str(),
            "r{n} content does not match its digest"
        );
    }
    *checked = numbers.len();
    let (_, skill) = get(c, &s.ws("acme", "skills/crashy"), ADMIN).await;
    let cur = skill["current_revision"].as_i64().unwrap();
    assert!(
        numbers.contains(&cur),
        "pointer names r{cur}, which is not a complete revision"
    );
    cur
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill9_during_publishes_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    eprintln!("seed {seed}");
    let mut rng = Rng(seed);
    let c = http();
    let acked: Arc<Mutex<Vec<(i64, String)>>> = Arc::default();
    let mut checked = 0usize;
    let mut counter = 0u64;
    let mut kills_mid_request = 0;
    for _ in 0..KILLS {
        let mut s = Server::start_on(dir.path(), port, &[]);
        let snapshot = acked.lock().unwrap().clone();
        let mut base = verify(&c, &s, &snapshot, &mut checked).await;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let in_flight = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let task = {
            let (c, url_base, acked, stop, in_flight) = (
                c.clone(),
                s.ws("acme", "skills/crashy"),
                acked.clone(),
                stop.clone(),
                in_flight.clone(),
            );
            counter += 1000;
            let mut n = counter;
            tokio::spawn(async move {
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    n += 1;
                    in_flight.store(true, std::sync::atomic::Ordering::SeqCst);
                    let r = c
                        .post(format!("{url_base}/revisions?base_revision={base}"))
                        .bearer_auth(ADMIN)
                        .header("content-type", "application/x-tar")
                        .body(bulky_package(n))
                        .send()
                        .await;
                    let Some((st, v)) = answered(r).await else {
                        break;
                    };
                    in_flight.store(false, std::sync::atomic::Ordering::SeqCst);
                    match st {
                        201 => {
                            let rev = v["revision"].as_i64().unwrap();
                            acked
                                .lock()
                                .unwrap()
                                .push((rev, v["digest"].as_str().unwrap().to_string()));
                            base = rev;
                        }
                        409 => base = v["error"]["current_revision"].as_i64().unwrap(),
                        other => panic!("unexpected {other}: {v}"),
                    }
                }
            })
        };
        tokio::time::sleep(std::time::Duration::from_millis(rng.next() % 150)).await;
        if in_flight.load(std::sync::atomic::Ordering::SeqCst) {
            kills_mid_request += 1;
        }
        s.kill9();
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let _ = task.await;
    }
    let s = Server::start_on(dir.path(), port, &[]);
    let staging: Vec<_> = std::fs::read_dir(dir.path().join("staging"))
        .unwrap()
        .collect();
    assert!(
        staging.is_empty(),
        "staging not swept after restart: {staging:?}"
    );
    let snapshot = acked.lock().unwrap().clone();
    verify(&c, &s, &snapshot, &mut checked).await;
    let fsck = fsck(&c, &s).await;
    assert_eq!(fsck["ok"], true, "{fsck}");
    eprintln!(
        "{} acknowledged publishes, {kills_mid_request} of {KILLS} kills landed mid-request",
        snapshot.len()
    );
    assert!(
        snapshot.len() > KILLS / 2,
        "too few publishes to mean anything: {}",
        snapshot.len()
    );
    assert!(
        kills_mid_request > KILLS / 4,
        "too few kills landed mid-publish: {kills_mid_request}"
    );
}

/// Group commit does not trade durability (SPEC §4.1): 16 clients activate fresh (run, skill)
/// pairs as fast as they can while the server is `kill -9`ed, five times. After every restart
/// each acknowledged activation is present with the revision and digest it was answered with,
/// and every pin present — acknowledged or caught in flight — is whole: its revision's digest.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill9_during_activations_loses_no_acknowledged_pin() {
    kill9_during_activations(&[]).await
}

/// [`kill9_during_activations_loses_no_acknowledged_pin`] on PostgreSQL + S3, whose group
/// commit has several batches in flight at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill9_during_activations_on_postgres_loses_no_acknowledged_pin() {
    let storage = ScaleOut::fresh();
    kill9_during_activations(&storage.args()).await
}

async fn kill9_during_activations(storage: &[&str]) {
    const SKILLS: usize = 40;
    const ROUNDS: usize = 5;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let c = http();
    let mut digests = std::collections::HashMap::new();
    let mut runs: Vec<String> = Vec::new();
    // (run, skill, revision, digest), as acknowledged.
    let acked: Arc<Mutex<Vec<AckedPin>>> = Arc::default();
    let mut killed_in_flight = 0;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for round in 0..ROUNDS {
        let mut s = Server::start_on(dir.path(), port, storage);
        if round == 0 {
            for k in 0..SKILLS {
                let name = format!("s{k}");
                let (st, v) = publish(&c, &s, ADMIN, "acme", &name, 0, package(&name, "v1")).await;
                assert_eq!(st, 201, "{v}");
                digests.insert(name, v["digest"].as_str().unwrap().to_string());
            }
        }
        let acked_so_far = acked.lock().unwrap().clone();
        verify_pins(&c, &s, &runs, &acked_so_far, &digests).await;
        let mut round_runs = Vec::new();
        for _ in 0..16 {
            let r = c
                .post(s.ws("acme", "runs"))
                .bearer_auth(ADMIN)
                .json(&serde_json::json!({}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 201);
            round_runs.push(
                r.json::<Value>().await.unwrap()["run_id"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            );
        }
        runs.extend(round_runs.iter().cloned());
        let in_flight = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let clients: Vec<_> = round_runs
            .into_iter()
            .map(|run| {
                let (c, url, acked, in_flight) = (
                    c.clone(),
                    s.ws("acme", &format!("runs/{run}/activations")),
                    acked.clone(),
                    in_flight.clone(),
                );
                tokio::spawn(async move {
                    for k in 0..SKILLS {
                        let skill = format!("s{k}");
                        in_flight.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        let r = c
                            .post(&url)
                            .bearer_auth(ADMIN)
                            .json(&serde_json::json!({"skill": skill}))
                            .send()
                            .await;
                        let Some((st, v)) = answered(r).await else {
                            break;
                        };
                        in_flight.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                        assert_eq!(st, 200, "{v}");
                        let digest = v["digest"].as_str().unwrap().to_string();
                        acked.lock().unwrap().push((
                            run.clone(),
                            skill,
                            v["revision"].as_i64().unwrap(),
                            digest,
                        ));
                    }
                })
            })
            .collect();
        tokio::time::sleep(std::time::Duration::from_millis(50 + rng.next() % 200)).await;
        if in_flight.load(std::sync::atomic::Ordering::SeqCst) > 0 {
            killed_in_flight += 1;
        }
        s.kill9();
        for client in clients {
            client.await.unwrap();
        }
    }
    let s = Server::start_on(dir.path(), port, storage);
    let acked = acked.lock().unwrap().clone();
    verify_pins(&c, &s, &runs, &acked, &digests).await;
    eprintln!(
        "{} acknowledged activations, {killed_in_flight} of {ROUNDS} kills with requests in flight",
        acked.len()
    );
    assert!(
        acked.len() >= ROUNDS * 16,
        "too few activations to mean anything: {}",
        acked.len()
    );
    assert!(
        killed_in_flight >= ROUNDS / 2,
        "too few kills landed under load: {killed_in_flight}"
    );
}

/// An acknowledged activation: (run, skill, revision, digest).
type AckedPin = (String, String, i64, String);

/// Every acknowledged pin is present as acknowledged; every pin present is whole.
async fn verify_pins(
    c: &reqwest::Client,
    s: &Server,
    runs: &[String],
    acked: &[AckedPin],
    digests: &std::collections::HashMap<String, String>,
) {
    let mut present = std::collections::HashMap::new();
    for run in runs {
        let (st, v) = get(c, &s.ws("acme", &format!("runs/{run}")), ADMIN).await;
        assert_eq!(st, 200, "{v}");
        for pin in v["activations"].as_array().unwrap() {
            let skill = pin["skill"].as_str().unwrap().to_string();
            let (revision, digest) = (
                pin["revision"].as_i64().unwrap(),
                pin["digest"].as_str().unwrap(),
            );
            assert_eq!(
                (revision, digest),
                (1, digests[&skill].as_str()),
                "a pin that is not whole: {pin}"
            );
            present.insert((run.clone(), skill), (revision, digest.to_string()));
        }
    }
    for (run, skill, revision, digest) in acked {
        assert_eq!(
            present.get(&(run.clone(), skill.clone())),
            Some(&(*revision, digest.clone())),
            "acknowledged activation of {skill} in run {run} lost"
        );
    }
}

/// A response's status and JSON body, or `None` when the server died before answering whole.
async fn answered(r: reqwest::Result<reqwest::Response>) -> Option<(u16, Value)> {
    let r = r.ok()?;
    let status = r.status().as_u16();
    Some((status, r.json::<Value>().await.ok()?))
}
