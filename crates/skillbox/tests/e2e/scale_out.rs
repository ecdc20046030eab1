//! Two servers on one PostgreSQL database and one S3 store, each with its own data directory
//! (SPEC §7.2, §8.11): what is published through A reads byte-exact through B (whose revision
//! cache fills on demand); a revocation through A stops B's pinned reads within a second; an
//! event published through A reaches a follower on B within a second; `kill -9` of A during
//! publishes loses nothing acknowledged and leaves nothing partial; B's data directory deleted
//! while it is stopped loses nothing; an outage of the database or the store answers 503 and
//! changes nothing. (The compare-and-swap race across both servers is in `cas.rs`, the
//! collection-versus-publish race in `gc.rs`.)

use crate::support::*;
use serde_json::json;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_second_server_serves_what_the_first_published_and_stops_what_it_revoked() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = scale_out_pair(dir.path());
    let c = http();
    let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let (st, v) = publish(
        &c,
        &a,
        ADMIN,
        "acme",
        "hello",
        0,
        versioned("hello", "v1", &[("data.bin", &data)]),
    )
    .await;
    assert_eq!(st, 201, "{v}");

    // Published through A, read byte-exact through B (same digest, same bytes).
    let got = c
        .get(b.ws("acme", "skills/hello/revisions/1/files/data.bin"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(got.as_ref(), data.as_slice());
    let (st, digest) = archive_digest(&c, &b, "acme", "hello", 1).await;
    assert_eq!((st, digest.as_str()), (200, v["digest"].as_str().unwrap()));

    // A run made through B pins revision 1; A revokes it; B's pinned reads stop within 1 s.
    let run = new_run(&c, &b, &["hello"]).await;
    let r = c
        .post(b.ws("acme", &format!("runs/{run}/activations")))
        .bearer_auth(ADMIN)
        .json(&json!({"skill": "hello"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let pinned = b.ws("acme", &format!("runs/{run}/skills/hello/files/data.bin"));
    let (st, _) = get_status(&c, &pinned).await;
    assert_eq!(st, 200);
    revoke(&c, &a, "hello", 1, "leaked").await;
    let revoked_at = Instant::now();
    loop {
        let (st, code) = get_status(&c, &pinned).await;
        if st == 410 {
            assert_eq!(code, "revision_revoked");
            break;
        }
        assert!(
            revoked_at.elapsed() < Duration::from_secs(1),
            "B still served a revision revoked through A"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn get_status(c: &reqwest::Client, url: &str) -> (u16, String) {
    let r = c.get(url).bearer_auth(ADMIN).send().await.unwrap();
    let st = r.status().as_u16();
    let v: serde_json::Value = r.json().await.unwrap_or_default();
    (st, error_code(&v).to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_event_published_through_one_server_reaches_a_follower_on_the_other() {
    use futures_util::StreamExt;
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = scale_out_pair(dir.path());
    let c = http();
    publish(
        &c,
        &a,
        ADMIN,
        "acme",
        "hello",
        0,
        versioned("hello", "v1", &[]),
    )
    .await;
    let follower = c
        .get(b.ws("acme", "events?after=1"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    let mut stream = follower.bytes_stream();
    // Let the follower settle on an empty backlog, then publish through A.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let published_at = Instant::now();
    publish(
        &c,
        &a,
        ADMIN,
        "acme",
        "hello",
        1,
        versioned("hello", "v2", &[]),
    )
    .await;
    let mut text = String::new();
    while !text.contains("skill.published") {
        let chunk = tokio::time::timeout(Duration::from_secs(5), stream.next())
            .await
            .expect("no event on B within 5 s")
            .unwrap()
            .unwrap();
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(
        published_at.elapsed() < Duration::from_secs(1),
        "the event took {:?} to reach B",
        published_at.elapsed()
    );
    assert!(text.contains("\"revision\":2"), "{text}");
}

/// Sends a publish; `None` when the server did not answer (it was killed meanwhile).
async fn try_publish(
    c: reqwest::Client,
    url: String,
    body: Vec<u8>,
) -> Option<(u16, serde_json::Value)> {
    let r = c
        .post(url)
        .bearer_auth(ADMIN)
        .header("content-type", "application/x-tar")
        .body(body)
        .send()
        .await
        .ok()?;
    let status = r.status().as_u16();
    Some((status, r.json().await.ok()?))
}

/// Revision `i`'s package: a SKILL.md and 256 KiB that depend on `i`.
fn numbered_package(i: u32) -> Vec<u8> {
    let data: Vec<u8> = (0..262_144u32)
        .map(|k| (k.wrapping_mul(i + 3) % 251) as u8)
        .collect();
    versioned("hello", &format!("v{i}"), &[("data.bin", &data)])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_of_a_during_publishes_loses_nothing_acknowledged_and_b_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let storage = ScaleOut::fresh();
    let mut a = storage.server(&dir.path().join("a"));
    let b = storage.server(&dir.path().join("b"));
    let c = http();
    // Deterministic per run, different across runs; printed so a failure can be replayed.
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64
        | 1;
    eprintln!("kill points seed: {seed}");
    let mut random = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut acknowledged: Vec<(i64, String)> = Vec::new();
    let mut kills = 0;
    for i in 1..=50u32 {
        let base = i as i64 - 1;
        // About one publish in five has A killed under it, at a random point of the request.
        let kill_after = (random() % 5 == 0).then(|| Duration::from_millis(random() % 60));
        let url = a.ws(
            "acme",
            &format!("skills/hello/revisions?base_revision={base}"),
        );
        let answer = match kill_after {
            None => try_publish(c.clone(), url.clone(), numbered_package(i)).await,
            Some(after) => {
                let request = try_publish(c.clone(), url.clone(), numbered_package(i));
                // The request is sent on its own task; A is killed under it.
                let (tx, rx) = tokio::sync::oneshot::channel();
                let request = async move {
                    let _ = tx.send(request.await);
                };
                let in_flight = tokio::spawn(request);
                tokio::time::sleep(after).await;
                a.kill9();
                in_flight.await.unwrap();
                let answer = rx.await.unwrap();
                kills += 1;
                // What B serves meanwhile: the last acknowledged revision, whole.
                if let Some((rev, digest)) = acknowledged.last() {
                    let (st, got) = archive_digest(&c, &b, "acme", "hello", *rev).await;
                    assert_eq!((st, &got), (200, digest), "B while A is down");
                }
                a = Server::start_on(&a.data_dir.clone(), a.port, &storage.args());
                answer
            }
        };
        // An answer that arrived before the kill is an acknowledgement; otherwise the client
        // retries the same publish, which replays it if it had committed.
        let (status, v) = match answer {
            Some((status @ (200 | 201), v)) => (status, v),
            _ => try_publish(c.clone(), url, numbered_package(i))
                .await
                .expect("the restarted A answers"),
        };
        assert!(matches!(status, 200 | 201), "publish {i}: {status} {v}");
        assert_eq!(v["revision"], i as i64, "publish {i}: {v}");
        acknowledged.push((i as i64, v["digest"].as_str().unwrap().to_string()));
    }
    eprintln!("{kills} kills during 50 publishes");
    // Every acknowledged revision reads whole through B, and there is no other revision (a
    // killed publish either committed whole, and its retry replayed it, or left nothing).
    let (st, list) = get(&c, &b.ws("acme", "skills/hello/revisions"), ADMIN).await;
    assert_eq!(st, 200);
    let listed = list
        .as_array()
        .or_else(|| list["revisions"].as_array())
        .unwrap()
        .len();
    assert_eq!(listed, 50, "{list}");
    for (rev, digest) in &acknowledged {
        let (st, got) = archive_digest(&c, &b, "acme", "hello", *rev).await;
        assert_eq!((st, &got), (200, digest), "revision {rev} through B");
    }
    let report = fsck(&c, &b).await;
    assert_eq!(report["ok"], true, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stopped_servers_data_dir_deleted_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let storage = ScaleOut::fresh();
    let a = storage.server(&dir.path().join("a"));
    let mut b = storage.server(&dir.path().join("b"));
    let c = http();
    let mut digests = Vec::new();
    for i in 1..=3u32 {
        let (st, v) = publish(
            &c,
            &a,
            ADMIN,
            "acme",
            "hello",
            i as i64 - 1,
            numbered_package(i),
        )
        .await;
        assert_eq!(st, 201, "{v}");
        digests.push(v["digest"].as_str().unwrap().to_string());
    }
    // B serves (and so caches) them, pins revision 3 for a run, then is stopped and its data
    // directory deleted.
    let run = new_run(&c, &b, &["hello"]).await;
    let pinned = b.ws("acme", &format!("runs/{run}/skills/hello/files/data.bin"));
    assert_eq!(get_status(&c, &pinned).await.0, 200);
    let b_dir = b.data_dir.clone();
    b.kill9();
    release_workspace_mounts(&b_dir);
    std::fs::remove_dir_all(&b_dir).unwrap();
    let b = Server::start_on(&b_dir, b.port, &storage.args());
    for (i, digest) in digests.iter().enumerate() {
        let (st, got) = archive_digest(&c, &b, "acme", "hello", i as i64 + 1).await;
        assert_eq!(
            (st, got.as_str()),
            (200, digest.as_str()),
            "revision {}",
            i + 1
        );
    }
    let bytes = c.get(&pinned).bearer_auth(ADMIN).send().await.unwrap();
    assert_eq!(bytes.status(), 200);
    let expected: Vec<u8> = (0..262_144u32)
        .map(|k| (k.wrapping_mul(3 + 3) % 251) as u8)
        .collect();
    assert_eq!(bytes.bytes().await.unwrap().as_ref(), expected.as_slice());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_outage_of_the_database_or_the_store_answers_503_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let storage = ScaleOut::fresh();
    let db_proxy = TcpProxy::start(socket_addr_of(&storage.database)).await;
    let s3_proxy = TcpProxy::start(socket_addr_of(
        &std::env::var("AWS_ENDPOINT_URL").expect("AWS_ENDPOINT_URL names the test S3 server"),
    ))
    .await;
    let database = {
        let addr = socket_addr_of(&storage.database).to_string();
        storage
            .database
            .replace(&addr, &format!("127.0.0.1:{}", db_proxy.port))
    };
    // The server's database and store traffic goes through the proxies.
    let endpoint = format!("http://127.0.0.1:{}", s3_proxy.port);
    let a = Server::start_with_env(
        &dir.path().join("a"),
        free_port(),
        &["--database-url", &database, "--store", &storage.store],
        &[("AWS_ENDPOINT_URL", &endpoint)],
    );
    let c = http();
    let (st, v) = publish(&c, &a, ADMIN, "acme", "hello", 0, numbered_package(1)).await;
    assert_eq!(st, 201, "{v}");

    for (what, proxy) in [
        ("content store", &s3_proxy),
        ("metadata database", &db_proxy),
    ] {
        proxy.cut();
        let (st, v) = get(&c, &format!("{}/healthz", a.url), ADMIN).await;
        assert_eq!((st, error_code(&v)), (503, "unavailable"), "{what}: {v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(what),
            "{v}"
        );
        let (st, v) = publish(&c, &a, ADMIN, "acme", "hello", 1, numbered_package(2)).await;
        assert_eq!(
            (st, error_code(&v)),
            (503, "unavailable"),
            "publish during a {what} outage: {v}"
        );
        proxy.restore();
        let healthy = async {
            loop {
                if get(&c, &format!("{}/healthz", a.url), ADMIN).await.0 == 200 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(30), healthy)
            .await
            .unwrap_or_else(|_| panic!("healthy again after the {what} is back"));
        // Nothing was half-made: still one revision, and the next publish is revision 2.
        let (st, v) = get(&c, &a.ws("acme", "skills/hello"), ADMIN).await;
        assert_eq!(
            (st, &v["current_revision"]),
            (200, &serde_json::json!(1)),
            "{v}"
        );
    }
    // An outage in the middle of a publish: the database goes while a large package uploads.
    let big: Vec<u8> = (0..8u32 << 20)
        .map(|k| (k.wrapping_mul(31) % 251) as u8)
        .collect();
    let body = versioned("hello", "big", &[("big.bin", &big)]);
    let url = a.ws("acme", "skills/hello/revisions?base_revision=1");
    let in_flight = tokio::spawn(try_publish(c.clone(), url, body));
    tokio::time::sleep(Duration::from_millis(20)).await;
    db_proxy.cut();
    let (st, v) = in_flight.await.unwrap().expect("an answer");
    assert_eq!((st, error_code(&v)), (503, "unavailable"), "{v}");
    db_proxy.restore();
    let healthy = async {
        while get(&c, &format!("{}/healthz", a.url), ADMIN).await.0 != 200 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), healthy)
        .await
        .expect("healthy again");

    let (st, v) = publish(&c, &a, ADMIN, "acme", "hello", 1, numbered_package(2)).await;
    assert_eq!((st, &v["revision"]), (201, &serde_json::json!(2)), "{v}");
    let report = fsck(&c, &a).await;
    assert_eq!(report["ok"], true, "{report}");
}

#[test]
fn a_server_refuses_to_start_on_storage_it_cannot_use_and_says_why_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let storage = ScaleOut::fresh();
    let nobody = format!("postgres://postgres@127.0.0.1:{}/postgres", free_port());
    let no_s3 = format!("http://127.0.0.1:{}", free_port());
    // (what, serve arguments, environment, what the line must name)
    type Case<'a> = (
        &'a str,
        Vec<&'a str>,
        Vec<(&'a str, &'a str)>,
        &'a [&'a str],
    );
    let cases: [Case; 3] = [
        (
            "wrong credentials",
            vec!["--store", &storage.store],
            vec![("AWS_SECRET_ACCESS_KEY", "not-the-secret")],
            &["content store", "SignatureDoesNotMatch"],
        ),
        (
            "an unreachable store",
            vec!["--store", &storage.store],
            vec![("AWS_ENDPOINT_URL", &no_s3)],
            &["content store", "does not answer"],
        ),
        (
            "an unreachable database",
            vec!["--database-url", &nobody],
            vec![],
            &["metadata database", "refused"],
        ),
    ];
    for (what, args, envs, says) in cases {
        let out = std::process::Command::new(bin())
            .args(["serve", "--box", "none", "--listen"])
            .arg(format!("127.0.0.1:{}", free_port()))
            .arg("--data-dir")
            .arg(dir.path().join(what.replace(' ', "-")))
            .args(&args)
            .envs(envs)
            .env("SKILLBOX_ADMIN_TOKEN", ADMIN)
            .env("SKILLBOX_LOG", "error")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what}: started anyway");
        assert_eq!(
            stderr.trim().lines().count(),
            1,
            "{what}: not one line: {stderr}"
        );
        for word in says {
            assert!(stderr.contains(word), "{what}: {stderr}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_bucket_is_created_at_the_first_start() {
    let dir = tempfile::tempdir().unwrap();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let store = format!("s3://skillbox-made-{}-{nanos}", std::process::id());
    let s = Server::start(dir.path(), &["--store", &store]);
    let c = http();
    let (st, v) = publish(&c, &s, ADMIN, "acme", "hello", 0, numbered_package(1)).await;
    assert_eq!(st, 201, "{v}");
    let (st, digest) = archive_digest(&c, &s, "acme", "hello", 1).await;
    assert_eq!((st, digest.as_str()), (200, v["digest"].as_str().unwrap()));
}

#[test]
fn doctor_checks_the_database_and_the_store() {
    let storage = ScaleOut::fresh();
    let dir = tempfile::tempdir().unwrap();
    let doctor = |database: &str, store: &str| {
        let out = std::process::Command::new(bin())
            .args(["--json", "doctor", "--data-dir"])
            .arg(dir.path())
            .args(["--database-url", database, "--store", store])
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        (out.status.code(), v)
    };
    let (code, v) = doctor(&storage.database, &storage.store);
    assert_eq!((code, &v["ok"]), (Some(0), &json!(true)), "{v}");
    assert!(
        v["storage"][0]["detail"]
            .as_str()
            .unwrap()
            .contains("PostgreSQL"),
        "{v}"
    );
    let nobody = format!("postgres://postgres@127.0.0.1:{}/postgres", free_port());
    let (code, v) = doctor(&nobody, "s3://skillbox-no-such-bucket");
    assert_eq!((code, &v["ok"]), (Some(1), &json!(false)), "{v}");
    assert_eq!(
        (&v["storage"][0]["ok"], &v["storage"][1]["ok"]),
        (&json!(false), &json!(false)),
        "{v}"
    );
}
