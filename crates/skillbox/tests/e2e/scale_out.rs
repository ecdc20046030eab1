//! Two servers on one PostgreSQL database and one content store, each with its own data
//! directory (SPEC §7.2, §8.11, the parts that need no S3 server): what is published through
//! A reads byte-exact through B (whose revision cache fills on demand); a revocation through A
//! stops B's pinned reads within a second; an event published through A reaches a follower on
//! B within a second.

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
