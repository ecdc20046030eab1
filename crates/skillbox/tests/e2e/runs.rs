//! Runs with `--box none`: activation pins (SPEC §4.3–4.4), pinned reads, deletion, restart
//! recovery and unavailable content (§8.1, §8.3, §8.4, §8.7), leases, the prompt index.

use crate::support::*;
use serde_json::{Value, json};

fn v1() -> Vec<u8> {
    let md = skill_md("demo", "version one");
    tar_of(&[
        ("SKILL.md", md.as_bytes()),
        ("changed.txt", b"v1 content"),
        ("deleted.txt", b"only in v1"),
        ("same.txt", b"same"),
    ])
}

fn v2() -> Vec<u8> {
    let md = skill_md("demo", "version two");
    tar_of(&[
        ("SKILL.md", md.as_bytes()),
        ("changed.txt", b"v2 content"),
        ("same.txt", b"same"),
    ])
}

async fn create_run(c: &reqwest::Client, s: &Server, token: &str, body: Value) -> (u16, Value) {
    let r = c
        .post(s.ws("acme", "runs"))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .unwrap();
    let st = r.status().as_u16();
    (st, r.json().await.unwrap())
}

async fn activate(
    c: &reqwest::Client,
    s: &Server,
    token: &str,
    run: &str,
    body: Value,
) -> (u16, Value) {
    let r = c
        .post(s.ws("acme", &format!("runs/{run}/activations")))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .unwrap();
    let st = r.status().as_u16();
    (st, r.json().await.unwrap())
}

async fn read(
    c: &reqwest::Client,
    s: &Server,
    token: &str,
    run: &str,
    skill: &str,
    path: &str,
) -> (u16, String) {
    let r = c
        .get(s.ws("acme", &format!("runs/{run}/skills/{skill}/files/{path}")))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

async fn new_runs_see_new_revisions_existing_runs_do_not(d: Deployment) {
    let dir = tempfile::tempdir().unwrap();
    let s = d.server(dir.path());
    let c = http();
    let runner = token(&c, &s, "acme", "runner").await;
    publish(&c, &s, ADMIN, "acme", "demo", 0, v1()).await;

    let (st, a) = create_run(&c, &s, &runner, json!({})).await;
    assert_eq!(st, 201, "{a}");
    assert_eq!(a["authorized_skills"], json!(["demo"]));
    assert_eq!(a["state"], "active");
    let run_a = a["run_id"].as_str().unwrap().to_string();
    let (st, act) = activate(&c, &s, &runner, &run_a, json!({"skill": "demo"})).await;
    assert_eq!(st, 200, "{act}");
    assert_eq!(act["revision"], 1);
    assert_eq!(act["instructions"], "# demo\nInstructions.\n");
    assert_eq!(act["frontmatter"]["description"], "version one");
    assert_eq!(act["files"].as_array().unwrap().len(), 4);
    let skill_id = act["skill_id"].as_str().unwrap().to_string();
    assert_eq!(act["mount_path"], format!("/skills/{skill_id}/1"));

    publish(&c, &s, ADMIN, "acme", "demo", 1, v2()).await;
    // run A still reads v1, including the file v2 changed and the file v2 deleted
    assert_eq!(
        read(&c, &s, &runner, &run_a, "demo", "changed.txt").await,
        (200, "v1 content".into())
    );
    assert_eq!(
        read(&c, &s, &runner, &run_a, "demo", "deleted.txt").await,
        (200, "only in v1".into())
    );
    assert_eq!(
        read(&c, &s, &runner, &run_a, "demo", "SKILL.md").await.1,
        skill_md("demo", "version one")
    );
    // re-activation returns the same pin; asking for v2 explicitly conflicts
    let (st, again) = activate(&c, &s, &runner, &run_a, json!({"skill": "demo"})).await;
    assert_eq!(
        (st, again["revision"].as_i64(), again["digest"].clone()),
        (200, Some(1), act["digest"].clone())
    );
    let (st, v) = activate(
        &c,
        &s,
        &runner,
        &run_a,
        json!({"skill": "demo", "revision": 2}),
    )
    .await;
    assert_eq!((st, error_code(&v)), (409, "activation_conflict"));
    let (st, _) = activate(
        &c,
        &s,
        &runner,
        &run_a,
        json!({"skill": "demo", "revision": 1}),
    )
    .await;
    assert_eq!(st, 200);

    // run B gets v2
    let (_, b) = create_run(&c, &s, &runner, json!({"skills": ["demo"]})).await;
    let run_b = b["run_id"].as_str().unwrap().to_string();
    let (_, act_b) = activate(&c, &s, &runner, &run_b, json!({"skill": "demo"})).await;
    assert_eq!(act_b["revision"], 2);
    assert_eq!(
        read(&c, &s, &runner, &run_b, "demo", "changed.txt").await,
        (200, "v2 content".into())
    );
    let (st, _) = read(&c, &s, &runner, &run_b, "demo", "deleted.txt").await;
    assert_eq!(st, 404);

    // run detail lists the pins
    let (_, view) = get(&c, &s.ws("acme", &format!("runs/{run_a}")), &runner).await;
    let pins = view["activations"].as_array().unwrap();
    assert_eq!(pins.len(), 1);
    assert_eq!(
        (pins[0]["skill"].as_str(), pins[0]["revision"].as_i64()),
        (Some("demo"), Some(1))
    );

    // reads of a skill not activated, unknown runs, other workspaces, wrong roles
    publish(&c, &s, ADMIN, "acme", "other", 0, package("other", "1")).await;
    let (_, run_c) = create_run(&c, &s, &runner, json!({})).await;
    let run_c = run_c["run_id"].as_str().unwrap().to_string();
    let r = c
        .get(s.ws("acme", &format!("runs/{run_c}/skills/other/files/SKILL.md")))
        .bearer_auth(&runner)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(error_code(&r.json().await.unwrap()), "not_activated");
    let (st, v) = activate(&c, &s, &runner, &run_a, json!({"skill": "other"})).await;
    assert_eq!((st, error_code(&v)), (403, "skill_not_authorized"));
    let (st, v) = activate(&c, &s, &runner, "run_nope", json!({"skill": "demo"})).await;
    assert_eq!((st, error_code(&v)), (404, "not_found"));
    let foreign = token(&c, &s, "zeta", "runner").await;
    let (st, v) = get(&c, &s.ws("acme", &format!("runs/{run_a}")), &foreign).await;
    assert_eq!((st, error_code(&v)), (404, "not_found"));
    let reader = token(&c, &s, "acme", "reader").await;
    let (st, v) = activate(&c, &s, &reader, &run_a, json!({"skill": "demo"})).await;
    assert_eq!((st, error_code(&v)), (403, "forbidden"));
    // exec without a box
    let r = c
        .post(s.ws("acme", &format!("runs/{run_a}/exec")))
        .bearer_auth(&runner)
        .json(&json!({"argv": ["true"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(error_code(&r.json().await.unwrap()), "box_unavailable");

    // finishing releases the run: no more reads
    let r = c
        .delete(s.ws("acme", &format!("runs/{run_a}")))
        .bearer_auth(&runner)
        .send()
        .await
        .unwrap();
    assert_eq!(r.json::<Value>().await.unwrap()["state"], "finished");
    let (st, _) = read(&c, &s, &runner, &run_a, "demo", "changed.txt").await;
    assert_eq!(st, 404);
}
storage_test!(new_runs_see_new_revisions_existing_runs_do_not);

async fn deletion_keeps_pinned_runs_working(d: Deployment) {
    let dir = tempfile::tempdir().unwrap();
    let s = d.server(dir.path());
    let c = http();
    publish(&c, &s, ADMIN, "acme", "demo", 0, v1()).await;
    let (_, pinned) = create_run(&c, &s, ADMIN, json!({})).await;
    let pinned = pinned["run_id"].as_str().unwrap().to_string();
    let (_, act) = activate(&c, &s, ADMIN, &pinned, json!({"skill": "demo"})).await;
    let old_id = act["skill_id"].as_str().unwrap().to_string();
    let (_, unpinned) = create_run(&c, &s, ADMIN, json!({})).await;
    let unpinned = unpinned["run_id"].as_str().unwrap().to_string();

    assert_eq!(
        c.delete(s.ws("acme", "skills/demo"))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    // the pinned run keeps reading and re-activating
    assert_eq!(
        read(&c, &s, ADMIN, &pinned, "demo", "changed.txt").await,
        (200, "v1 content".into())
    );
    let (st, _) = activate(&c, &s, ADMIN, &pinned, json!({"skill": "demo"})).await;
    assert_eq!(st, 200);
    // no new activations, no new runs
    let (st, v) = activate(&c, &s, ADMIN, &unpinned, json!({"skill": "demo"})).await;
    assert_eq!((st, error_code(&v)), (410, "skill_deleted"));
    let (st, v) = create_run(&c, &s, ADMIN, json!({"skills": ["demo"]})).await;
    assert_eq!((st, error_code(&v)), (410, "skill_deleted"));
    let (_, fresh) = create_run(&c, &s, ADMIN, json!({})).await;
    assert_eq!(fresh["authorized_skills"], json!([]));
    let (st, v) = create_run(&c, &s, ADMIN, json!({"skills": ["never"]})).await;
    assert_eq!((st, error_code(&v)), (404, "not_found"));

    // the name is reusable; old pins still point to the old skill
    publish(&c, &s, ADMIN, "acme", "demo", 0, v2()).await;
    let (_, newrun) = create_run(&c, &s, ADMIN, json!({"skills": ["demo"]})).await;
    let newrun = newrun["run_id"].as_str().unwrap().to_string();
    let (_, act2) = activate(&c, &s, ADMIN, &newrun, json!({"skill": "demo"})).await;
    assert_ne!(act2["skill_id"].as_str().unwrap(), old_id);
    assert_eq!(act2["revision"], 1);
    assert_eq!(
        read(&c, &s, ADMIN, &newrun, "demo", "changed.txt").await.1,
        "v2 content"
    );
    assert_eq!(
        read(&c, &s, ADMIN, &pinned, "demo", "changed.txt").await.1,
        "v1 content"
    );
    // the prompt: the pinned run shows its pinned description; the deleted skill is absent for others
    let (_, p) = get(&c, &s.ws("acme", &format!("runs/{pinned}/prompt")), ADMIN).await;
    assert!(
        p["prompt"]
            .as_str()
            .unwrap()
            .contains("<description>version one</description>"),
        "{p}"
    );
    let (_, p) = get(&c, &s.ws("acme", &format!("runs/{unpinned}/prompt")), ADMIN).await;
    assert_eq!(p["skills"], json!([]));
}
storage_test!(deletion_keeps_pinned_runs_working);

async fn prompt_index_is_escaped_and_ordered(d: Deployment) {
    let dir = tempfile::tempdir().unwrap();
    let s = d.server(dir.path());
    let c = http();
    for (name, desc) in [
        ("zeta", "last & <least>"),
        ("alpha", "first \"quoted\" 'x'"),
        ("mid", "|\n  middle\n"),
    ] {
        // `mid`'s description is a block scalar: its trailing newline is trimmed.
        let md = skill_md(name, desc);
        publish(
            &c,
            &s,
            ADMIN,
            "acme",
            name,
            0,
            tar_of(&[("SKILL.md", md.as_bytes())]),
        )
        .await;
    }
    let (_, run) = create_run(&c, &s, ADMIN, json!({})).await;
    let run = run["run_id"].as_str().unwrap().to_string();
    let (_, pin) = activate(&c, &s, ADMIN, &run, json!({"skill": "mid"})).await;
    let (st, p) = get(&c, &s.ws("acme", &format!("runs/{run}/prompt")), ADMIN).await;
    assert_eq!(st, 200);
    // A pinned skill says where its SKILL.md is in the sandbox.
    let location = format!("{}/SKILL.md", pin["mount_path"].as_str().unwrap());
    assert_eq!(
        p["prompt"].as_str().unwrap(),
        format!(
            "<available_skills>\n<skill>\n<name>alpha</name>\n<description>first &quot;quoted&quot; &apos;x&apos;</description>\n</skill>\n\
<skill>\n<name>mid</name>\n<description>middle</description>\n<location>{location}</location>\n</skill>\n\
<skill>\n<name>zeta</name>\n<description>last &amp; &lt;least&gt;</description>\n</skill>\n</available_skills>\n"
        )
    );

    // No authorized skill: no block at all.
    let (st, r) = c
        .post(s.ws("nothing-here", "runs"))
        .bearer_auth(ADMIN)
        .json(&json!({}))
        .send()
        .await
        .map(|r| (r.status().as_u16(), r))
        .unwrap();
    assert_eq!(st, 201);
    let r: serde_json::Value = r.json().await.unwrap();
    let (st, p) = get(
        &c,
        &s.ws(
            "nothing-here",
            &format!("runs/{}/prompt", r["run_id"].as_str().unwrap()),
        ),
        ADMIN,
    )
    .await;
    assert_eq!(st, 200, "{p}");
    assert_eq!(p["prompt"], "", "{p}");
}
storage_test!(prompt_index_is_escaped_and_ordered);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_keeps_pins_and_never_falls_back_to_latest() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut s = Server::start_on(dir.path(), port, &[]);
    let c = http();
    let (_, p1) = publish(&c, &s, ADMIN, "acme", "demo", 0, v1()).await;
    let (_, run) = create_run(&c, &s, ADMIN, json!({})).await;
    let run = run["run_id"].as_str().unwrap().to_string();
    activate(&c, &s, ADMIN, &run, json!({"skill": "demo"})).await;
    publish(&c, &s, ADMIN, "acme", "demo", 1, v2()).await;

    s.kill9();
    let s = Server::start_on(dir.path(), port, &[]);
    let (_, view) = get(&c, &s.ws("acme", &format!("runs/{run}")), ADMIN).await;
    assert_eq!(
        (
            view["state"].as_str(),
            view["activations"][0]["revision"].as_i64()
        ),
        (Some("active"), Some(1))
    );
    assert_eq!(
        read(&c, &s, ADMIN, &run, "demo", "changed.txt").await,
        (200, "v1 content".into())
    );

    // Remove v1's content out-of-band: its tree and the blob only v1 has.
    let hex = p1["digest"]
        .as_str()
        .unwrap()
        .trim_start_matches("sha256:")
        .to_string();
    skillbox_package::staging::remove_tree(&dir.path().join("trees").join(&hex)).unwrap();
    let only_v1 = skillbox_package::Sha256::of(b"only in v1").to_hex();
    std::fs::remove_file(dir.path().join("store/blobs/sha256").join(&only_v1)).unwrap();
    let r = c
        .get(s.ws("acme", &format!("runs/{run}/skills/demo/files/deleted.txt")))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 410);
    let v: Value = r.json().await.unwrap();
    assert_eq!(error_code(&v), "pinned_revision_unavailable", "{v}");
    assert_eq!(
        (
            v["error"]["skill"].as_str(),
            v["error"]["revision"].as_i64()
        ),
        (Some("demo"), Some(1))
    );
    // a file whose bytes survive elsewhere (content-addressed) is still exactly v1's
    assert_eq!(
        read(&c, &s, ADMIN, &run, "demo", "same.txt").await,
        (200, "same".into())
    );
    // and `changed.txt` is never v2's
    let (st, body) = read(&c, &s, ADMIN, &run, "demo", "changed.txt").await;
    assert_eq!((st, body.as_str()), (200, "v1 content"));

    // Revoked: revision_revoked for reads and activations, for every run.
    revoke(&c, &s, "demo", 1, "leaked key").await;
    let r = c
        .get(s.ws("acme", &format!("runs/{run}/skills/demo/files/changed.txt")))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 410);
    let v: Value = r.json().await.unwrap();
    assert_eq!(error_code(&v), "revision_revoked");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("leaked key")
    );
    let (st, v) = activate(&c, &s, ADMIN, &run, json!({"skill": "demo"})).await;
    assert_eq!((st, error_code(&v)), (410, "revision_revoked"));
}

async fn concurrent_runs_read_their_own_pins_under_publishing(d: Deployment) {
    let dir = tempfile::tempdir().unwrap();
    let s = d.server(dir.path());
    let c = http();
    fn content(n: i64) -> String {
        format!("content of revision {n}")
    }
    let pkg = move |n: i64| {
        let md = skill_md("demo", &format!("rev {n}"));
        tar_of(&[
            ("SKILL.md", md.as_bytes()),
            ("data.txt", content(n).as_bytes()),
        ])
    };
    publish(&c, &s, ADMIN, "acme", "demo", 0, pkg(1)).await;
    let mut runs = Vec::new();
    for i in 0..32 {
        let (_, run) = create_run(&c, &s, ADMIN, json!({})).await;
        let id = run["run_id"].as_str().unwrap().to_string();
        let want = if i % 2 == 0 { 1 } else { 2 };
        if want == 2 && i == 1 {
            publish(&c, &s, ADMIN, "acme", "demo", 1, pkg(2)).await;
        }
        let (_, a) = activate(
            &c,
            &s,
            ADMIN,
            &id,
            json!({"skill": "demo", "revision": want}),
        )
        .await;
        assert_eq!(a["revision"], want);
        runs.push((id, want));
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let publisher = {
        let (c, url, stop) = (
            c.clone(),
            s.ws("acme", "skills/demo/revisions"),
            stop.clone(),
        );
        tokio::spawn(async move {
            let mut base = 2;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) && base < 40 {
                let r = c
                    .post(format!("{url}?base_revision={base}"))
                    .bearer_auth(ADMIN)
                    .header("content-type", "application/x-tar")
                    .body(pkg(base + 1))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 201);
                base += 1;
            }
            base
        })
    };
    let mut readers = Vec::new();
    for (id, want) in runs {
        let (c, url) = (
            c.clone(),
            s.ws("acme", &format!("runs/{id}/skills/demo/files/data.txt")),
        );
        let expected = content(want);
        readers.push(tokio::spawn(async move {
            for _ in 0..40 {
                let body = c
                    .get(&url)
                    .bearer_auth(ADMIN)
                    .send()
                    .await
                    .unwrap()
                    .text()
                    .await
                    .unwrap();
                assert_eq!(body, expected, "a run read another revision's bytes");
            }
        }));
    }
    for r in readers {
        r.await.unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let last = publisher.await.unwrap();
    assert!(last > 3, "publishing did not overlap the reads");
}
storage_test!(concurrent_runs_read_their_own_pins_under_publishing);

/// Bytes from a xorshift generator: every window differs, so a body sent from a wrong offset of
/// its file cannot pass for the right one.
fn patterned(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 24) as u8
        })
        .collect()
}

/// The bodies of the HTTP/1.1 responses in `raw`, in order, each with its status.
fn split_responses(mut raw: &[u8]) -> Vec<(u16, Vec<u8>)> {
    let mut out = Vec::new();
    while !raw.is_empty() {
        let end = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("a whole response head");
        let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
        let status = head[9..12].parse().unwrap();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .expect("a content-length")
            .trim()
            .parse()
            .unwrap();
        let body = &raw[end + 4..];
        assert!(
            body.len() >= len,
            "a body cut short: {} of {len}",
            body.len()
        );
        out.push((status, body[..len].to_vec()));
        raw = &body[len..];
    }
    out
}

/// Large pinned files arrive whole and byte-exact when the server sends them zero-copy from
/// the revision cache (`sendfile`): one held in memory between reads, one read from its tree
/// each time, over plain requests and over pipelined requests read slowly (so the sends end
/// part-way and resume). `skillbox_zero_copy_bytes_total` shows they went out that way.
async fn large_pinned_files_arrive_exact_when_sent_zero_copy(d: Deployment) {
    let dir = tempfile::tempdir().unwrap();
    let s = d.server(dir.path());
    let c = http();
    let held = patterned(200 << 10, 1);
    let from_tree = patterned(1000 << 10, 2);
    let md = skill_md("big", "large files");
    let pkg = tar_of(&[
        ("SKILL.md", md.as_bytes()),
        ("held.bin", &held),
        ("tree.bin", &from_tree),
    ]);
    assert_eq!(publish(&c, &s, ADMIN, "acme", "big", 0, pkg).await.0, 201);
    let run = new_run(&c, &s, &["big"]).await;
    let url = |f: &str| s.ws("acme", &format!("runs/{run}/skills/big/files/{f}"));
    let metric_name = "skillbox_zero_copy_bytes_total";
    let before = metric(&c, &s.url, metric_name).await;

    for (file, want) in [
        ("held.bin", &held),
        ("held.bin", &held),
        ("tree.bin", &from_tree),
    ] {
        let r = c.get(url(file)).bearer_auth(ADMIN).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert!(r.bytes().await.unwrap() == want[..], "{file} differs");
    }

    let path = |f: &str| url(f).strip_prefix(&s.url).unwrap().to_string();
    let mut requests = String::new();
    // Some 5 MB of answers: more than loopback's socket buffers hold unread.
    let pipelined = [
        "held.bin", "tree.bin", "held.bin", "tree.bin", "tree.bin", "tree.bin", "held.bin",
    ];
    for (i, file) in pipelined.iter().enumerate() {
        let close = if i + 1 == pipelined.len() {
            "Connection: close\r\n"
        } else {
            ""
        };
        requests += &format!(
            "GET {} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN}\r\n{close}\r\n",
            path(file)
        );
    }
    let addr = socket_addr_of(&s.url);
    let raw = tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut sock = std::net::TcpStream::connect(addr).unwrap();
        sock.write_all(requests.as_bytes()).unwrap();
        // Unread, the answers fill the socket buffers and the server's sends stop part-way.
        std::thread::sleep(std::time::Duration::from_millis(300));
        let (mut raw, mut chunk) = (Vec::new(), [0u8; 1024]);
        loop {
            match sock.read(&mut chunk).unwrap() {
                0 => break raw,
                n => raw.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await
    .unwrap();
    let answers = split_responses(&raw);
    assert_eq!(answers.len(), pipelined.len());
    for ((status, body), file) in answers.iter().zip(pipelined) {
        assert_eq!(*status, 200);
        let want = if file == "held.bin" {
            &held
        } else {
            &from_tree
        };
        assert!(body == want, "pipelined {file} differs");
    }

    // Every body went out by sendfile, save at most its last `MIN_LEN` bytes (a remainder that
    // short after a partial send is copied).
    let sent = metric(&c, &s.url, metric_name).await - before;
    let bodies = (5 * held.len() + 5 * from_tree.len()) as u64;
    let copied_at_most = (pipelined.len() + 3) * skillbox_registry::zero_copy::MIN_LEN;
    assert!(
        sent >= bodies - copied_at_most as u64,
        "{sent} of {bodies} bytes sent zero-copy"
    );
}

storage_test!(large_pinned_files_arrive_exact_when_sent_zero_copy);

async fn leases_expire_and_heartbeats_extend_them(d: Deployment) {
    let dir = tempfile::tempdir().unwrap();
    let s = d.server(dir.path());
    let c = http();
    publish(&c, &s, ADMIN, "acme", "demo", 0, v1()).await;
    let (_, short) = create_run(&c, &s, ADMIN, json!({"ttl_seconds": 1})).await;
    let short = short["run_id"].as_str().unwrap().to_string();
    let (_, kept) = create_run(&c, &s, ADMIN, json!({"ttl_seconds": 2})).await;
    let kept = kept["run_id"].as_str().unwrap().to_string();
    activate(&c, &s, ADMIN, &short, json!({"skill": "demo"})).await;
    let (_, a) = activate(&c, &s, ADMIN, &kept, json!({"skill": "demo"})).await;
    assert_eq!(a["revision"], 1);
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(3500);
    while std::time::Instant::now() < deadline {
        let r = c
            .post(s.ws("acme", &format!("runs/{kept}/heartbeat")))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    }
    let (_, v) = get(&c, &s.ws("acme", &format!("runs/{short}")), ADMIN).await;
    assert_eq!(v["state"], "expired");
    let (st, _) = read(&c, &s, ADMIN, &short, "demo", "changed.txt").await;
    assert_eq!(st, 404);
    let r = c
        .post(s.ws("acme", &format!("runs/{short}/heartbeat")))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404, "an expired run cannot be revived");
    let (_, v) = get(&c, &s.ws("acme", &format!("runs/{kept}")), ADMIN).await;
    assert_eq!(v["state"], "active");
    assert_eq!(
        read(&c, &s, ADMIN, &kept, "demo", "changed.txt").await.0,
        200
    );
    // The expired run is no GC root: once v2 is current, v1 goes (the kept run finishes first).
    c.delete(s.ws("acme", &format!("runs/{kept}")))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    publish(&c, &s, ADMIN, "acme", "demo", 1, v2()).await;
    let r: Value = c
        .post(format!("{}/v1/admin/gc", s.url))
        .bearer_auth(ADMIN)
        .json(&json!({"grace_seconds": 0}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["revisions"].as_array().unwrap().len(), 1, "{r}");
    assert_eq!(r["revisions"][0]["revision"], 1);
}
storage_test!(leases_expire_and_heartbeats_extend_them);

/// Two servers: a revocation or a finish through one is seen by the other's reads — at once on
/// one data directory (its pin cache is invalidated through the shared generation), within a
/// second across servers on PostgreSQL (through the database's notifications).
async fn revocation_through_one_server_stops_reads_on_another(d: Deployment) {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = d.pair(dir.path());
    let c = http();
    publish(&c, &a, ADMIN, "acme", "demo", 0, v1()).await;
    let mut runs = Vec::new();
    for _ in 0..2 {
        let (_, run) = create_run(&c, &a, ADMIN, json!({})).await;
        let run = run["run_id"].as_str().unwrap().to_string();
        activate(&c, &a, ADMIN, &run, json!({"skill": "demo"})).await;
        for _ in 0..3 {
            assert_eq!(
                read(&c, &b, ADMIN, &run, "demo", "changed.txt").await,
                (200, "v1 content".into())
            );
        }
        runs.push(run);
    }
    c.delete(a.ws("acme", &format!("runs/{}", runs[0])))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    let stopped = holds_within(d.propagation(), || async {
        read(&c, &b, ADMIN, &runs[0], "demo", "changed.txt").await.0 == 404
    })
    .await;
    assert!(stopped, "finished run still read through b");
    assert_eq!(
        read(&c, &b, ADMIN, &runs[1], "demo", "changed.txt").await.0,
        200
    );
    revoke(&c, &a, "demo", 1, "r").await;
    let pinned = b.ws(
        "acme",
        &format!("runs/{}/skills/demo/files/changed.txt", runs[1]),
    );
    let stopped = holds_within(d.propagation(), || async {
        let r = c.get(&pinned).bearer_auth(ADMIN).send().await.unwrap();
        r.status() == 410 && error_code(&r.json().await.unwrap()) == "revision_revoked"
    })
    .await;
    assert!(stopped, "revoked revision still read through b");
}
storage_test!(revocation_through_one_server_stops_reads_on_another);
