//! Tenants don't serialize each other (SPEC §4.11): while workspace A's large publish is slowly
//! uploading and being processed, workspace B's reads and publishes complete. Checked by order
//! of completion, not by wall-clock thresholds.

// `base` is the revision the next publish expects, not a loop index: kept explicit.
#![allow(clippy::explicit_counter_loop)]

use crate::support::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_publish_in_one_workspace_does_not_block_another() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    let c = http();
    publish(&c, &s, ADMIN, "bravo", "fast", 0, package("fast", "0")).await;

    // A: ~24 MiB over 48 chunks with a pause between each.
    let md = skill_md("big", "big");
    let big = tar_of(&[
        ("SKILL.md", md.as_bytes()),
        ("blob.bin", &vec![0x5a; 24 << 20]),
    ]);
    let a_done = Arc::new(AtomicBool::new(false));
    let chunks: Vec<bytes::Bytes> = big
        .chunks(512 * 1024)
        .map(bytes::Bytes::copy_from_slice)
        .collect();
    let slow = futures_util::stream::unfold(chunks.into_iter(), |mut it| async move {
        let next = it.next()?;
        tokio::time::sleep(std::time::Duration::from_millis(60)).await;
        Some((Ok::<_, std::io::Error>(next), it))
    });
    let a = {
        let (c, url, a_done) = (
            c.clone(),
            s.ws("alpha", "skills/big/revisions?base_revision=0"),
            a_done.clone(),
        );
        tokio::spawn(async move {
            let r = c
                .post(url)
                .bearer_auth(ADMIN)
                .header("content-type", "application/x-tar")
                .body(reqwest::Body::wrap_stream(slow))
                .send()
                .await
                .unwrap();
            a_done.store(true, Ordering::SeqCst);
            r.status().as_u16()
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(
        !a_done.load(Ordering::SeqCst),
        "A finished too early for the test to mean anything"
    );

    // B works meanwhile: reads and publishes, all finishing before A does.
    let mut base = 1;
    for i in 0..5 {
        for _ in 0..10 {
            let (st, _) = get(
                &c,
                &s.ws("bravo", "skills/fast/revisions/current/files/SKILL.md"),
                ADMIN,
            )
            .await;
            assert_eq!(st, 200);
        }
        let (st, v) = publish(
            &c,
            &s,
            ADMIN,
            "bravo",
            "fast",
            base,
            package("fast", &format!("{}", i + 1)),
        )
        .await;
        assert_eq!(st, 201, "{v}");
        base += 1;
        assert!(
            !a_done.load(Ordering::SeqCst),
            "B's work waited for A's publish (round {i})"
        );
    }
    assert_eq!(a.await.unwrap(), 201);
}
