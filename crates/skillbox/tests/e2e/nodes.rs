//! Execution nodes (SPEC §7.3, §8.12) as only nodes have them: node tokens, registration,
//! heartbeats, `live`/`lost`, a node's identity across its restarts and Core's, a node that
//! answers Core only, placement across two nodes, node loss and `new_sandbox`, transfers cut
//! or corrupted between Core and node, prefetch. The scenarios every backend passes (SPEC §8.1,
//! §8.2, §8.4, §8.6, §8.8, §8.9) run on a node through `backend_test!` (`Backend::Remote`).

use crate::support::*;
use serde_json::{Value, json};
use std::time::Duration;

/// `hello` v1 published, a run of it, and its first execution through Core (placing it on a
/// node), which leaves `/workspace/m`: the run and the exec answer.
async fn hello_v1_run_with_a_mark(c: &reqwest::Client, core: &Server) -> (String, Value) {
    publish(
        c,
        core,
        ADMIN,
        "acme",
        "hello",
        0,
        versioned("hello", "v1", &[]),
    )
    .await;
    let run = new_run(c, core, &["hello"]).await;
    let (st, v) = exec(
        c,
        core,
        &run,
        json!({"skill": "hello", "command": "./scripts/run.sh; echo mark > /workspace/m"}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        (v["stdout"].as_str(), v["backend"].as_str()),
        (Some("I am v1\n"), Some("remote")),
        "{v}"
    );
    (run, v)
}

async fn nodes(c: &reqwest::Client, core: &Server) -> Vec<Value> {
    let (st, v) = get(c, &format!("{}/v1/admin/nodes", core.url), ADMIN).await;
    assert_eq!(st, 200, "{v}");
    v["nodes"].as_array().unwrap().clone()
}

/// Waits until Core lists exactly one node in `state` at `address`; returns it.
async fn the_node(c: &reqwest::Client, core: &Server, state: &str, address: &str) -> Value {
    let mut last = Vec::new();
    for _ in 0..600 {
        last = nodes(c, core).await;
        if let [n] = last.as_slice()
            && n["state"] == state
            && n["address"] == address
        {
            return n.clone();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no single {state} node at {address}: {last:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_registers_heartbeats_is_lost_when_stopped_and_keeps_its_identity() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut core = Server::start_on(&dir.path().join("core"), port, &["--node-timeout", "2"]);
    let c = http();

    // The CLI mints a node token of no workspace.
    let minted = node_token_by_cli(&core.url);
    assert_eq!(
        (&minted["role"], &minted["workspace"]),
        (&json!("node"), &Value::Null),
        "{minted}"
    );
    let token = minted["token"].as_str().unwrap().to_string();
    let (st, who) = get(&c, &format!("{}/v1/whoami", core.url), &token).await;
    assert_eq!((st, &who["role"]), (200, &json!("node")), "{who}");

    let mut node = Node::start(&core, &token, &dir.path().join("node"));
    let first = the_node(&c, &core, "live", &node.url()).await;
    let id = first["id"].as_str().unwrap().to_string();
    assert_eq!(first["version"], env!("CARGO_PKG_VERSION"));
    // The list is its wire type, field for field.
    let (_, listed) = get(&c, &format!("{}/v1/admin/nodes", core.url), ADMIN).await;
    let typed: skillbox_api::NodeList = serde_json::from_value(listed.clone()).unwrap();
    assert_eq!(serde_json::to_value(&typed).unwrap(), listed);
    assert_eq!(
        std::fs::read_to_string(node.data_dir.join("node-id"))
            .unwrap()
            .trim(),
        id
    );

    // The node answers Core only: neither no token nor the node token itself will do.
    for bearer in [None, Some(token.as_str()), Some(ADMIN)] {
        let mut rb = c.get(format!("{}/v1/node", node.url()));
        if let Some(t) = bearer {
            rb = rb.bearer_auth(t);
        }
        assert_eq!(rb.send().await.unwrap().status(), 401, "{bearer:?}");
    }

    // Heartbeats keep it live past the timeout; a Core restart changes nothing.
    tokio::time::sleep(Duration::from_secs(3)).await;
    the_node(&c, &core, "live", &node.url()).await;
    core.kill9();
    let core = Server::start_on(&dir.path().join("core"), port, &["--node-timeout", "2"]);
    tokio::time::sleep(Duration::from_secs(3)).await;
    the_node(&c, &core, "live", &node.url()).await;

    // Stopped, it is lost and still listed; restarted on its data directory it is the same
    // node at its new address.
    let old_address = node.url();
    node.kill9();
    let lost = the_node(&c, &core, "lost", &old_address).await;
    assert_eq!(lost["id"], id);
    let node = Node::start(&core, &token, &dir.path().join("node"));
    let back = the_node(&c, &core, "live", &node.url()).await;
    assert_eq!(back["id"], id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registration_refuses_what_is_not_a_node() {
    let dir = tempfile::tempdir().unwrap();
    let core = Server::start(dir.path(), &[]);
    let c = http();
    let token = node_token(&c, &core).await;
    let register = |body: Value| {
        c.post(format!("{}/v1/nodes", core.url))
            .bearer_auth(&token)
            .json(&body)
            .send()
    };
    for (body, why) in [
        (
            json!({"address": "ftp://x", "version": "1"}),
            "not an http URL",
        ),
        (
            json!({"id": "../../etc", "address": "http://127.0.0.1:1", "version": "1"}),
            "an id Core never assigned",
        ),
    ] {
        let r = register(body).await.unwrap();
        assert_eq!(r.status(), 400, "{why}");
    }
    let r = c
        .post(format!(
            "{}/v1/nodes/0123456789abcdef0123456789abcdef/heartbeat",
            core.url
        ))
        .bearer_auth(&token)
        .json(&json!({"load": 0}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        404,
        "a heartbeat of an unknown node: register again"
    );
    // A node belongs to the node token it registered with.
    let r = register(json!({"address": "http://127.0.0.1:1", "version": "1"}))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let id = r.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let other = node_token(&c, &core).await;
    let r = c
        .post(format!("{}/v1/nodes", core.url))
        .bearer_auth(&other)
        .json(&json!({"id": id, "address": "http://127.0.0.1:2", "version": "1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403, "another token's node");
    let r = c
        .post(format!("{}/v1/nodes/{id}/heartbeat", core.url))
        .bearer_auth(&other)
        .json(&json!({"load": 0}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404, "a heartbeat for another token's node");
    // A workspace token for a node role is refused at minting.
    let r = c
        .post(format!("{}/v1/admin/tokens", core.url))
        .bearer_auth(ADMIN)
        .json(&json!({"workspace": "acme", "role": "node"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn executions_through_core_run_on_a_node_with_exactly_the_runs_pins() {
    let dir = tempfile::tempdir().unwrap();
    let core_port = free_port();
    let core_args = ["--box", "remote", "--node-timeout", "2"];
    let mut core = Server::start_on(&dir.path().join("core"), core_port, &core_args);
    let c = http();
    let token = node_token(&c, &core).await;
    // Two nodes on one machine: sandbox uids from different pools.
    let mut started = [
        Node::start_with(
            &core,
            &token,
            &dir.path().join("n1"),
            &["--sandbox-uid-base", "2000000"],
        ),
        Node::start_with(
            &core,
            &token,
            &dir.path().join("n2"),
            &["--sandbox-uid-base", "2100000"],
        ),
    ];
    for _ in 0..600 {
        if nodes(&c, &core)
            .await
            .iter()
            .filter(|n| n["state"] == "live")
            .count()
            == 2
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (run, v) = hello_v1_run_with_a_mark(&c, &core).await;
    let placed = v["node"].as_str().unwrap().to_string();

    // v2 is published; the run still sees v1, on the same node, in the same workspace.
    publish(
        &c,
        &core,
        ADMIN,
        "acme",
        "hello",
        1,
        versioned("hello", "v2", &[]),
    )
    .await;
    let (st, v) = exec(
        &c,
        &core,
        &run,
        json!({"skill": "hello", "command": "./scripts/run.sh; cat /workspace/m"}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["stdout"], "I am v1\nmark\n", "{v}");
    assert_eq!(v["node"], placed.as_str());

    // Streamed: the node's lines, and Core's exit line.
    let r = c
        .post(core.ws("acme", &format!("runs/{run}/exec?stream=true")))
        .bearer_auth(ADMIN)
        .json(&json!({"skill": "hello", "command": "./scripts/run.sh"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l["type"] == "stdout" && l["data"] == "I am v1\n"),
        "{text}"
    );
    let last = lines.last().unwrap();
    assert_eq!(
        (&last["type"], &last["backend"], &last["node"]),
        (&json!("exit"), &json!("remote"), &json!(placed)),
        "{text}"
    );

    // A run draft lives in the run's sandbox on its node: made there from the current
    // revision, edited by an execution there, published through Core from there.
    let r = c
        .post(core.ws("acme", &format!("runs/{run}/drafts")))
        .bearer_auth(ADMIN)
        .json(&json!({"skill": "hello", "base_revision": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let draft: Value = r.json().await.unwrap();
    let path = draft["path"].as_str().unwrap();
    let (st, v) = exec(
        &c,
        &core,
        &run,
        json!({"command": format!("printf '#!/bin/sh\\necho \"I am drafted\"\\n' > {path}/scripts/run.sh")}),
    )
    .await;
    assert_eq!((st, v["exit_code"].as_i64()), (200, Some(0)), "{v}");
    let r = c
        .post(core.ws(
            "acme",
            &format!("drafts/{}/publish", draft["draft_id"].as_str().unwrap()),
        ))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let drafted: Value = r.json().await.unwrap();
    assert_eq!(drafted["revision"], 3, "{drafted}");

    // A Core restart loses no placement and no pin: the run goes on on its node.
    core.kill9();
    let core = Server::start_on(&dir.path().join("core"), core_port, &core_args);
    let again = json!({"skill": "hello", "command": "./scripts/run.sh; cat /workspace/m"});
    let (st, v) = exec(&c, &core, &run, again.clone()).await;
    assert_eq!(
        (st, v["stdout"].as_str()),
        (200, Some("I am v1\nmark\n")),
        "{v}"
    );
    assert_eq!(v["node"], placed.as_str());

    // A node restart on its data directory keeps its identity, its runs' workspaces and pins;
    // its prepared package is verified again before use.
    let index = started.iter().position(|n| n.id() == placed).unwrap();
    let node_dir = started[index].data_dir.clone();
    let uid_base = if index == 0 { "2000000" } else { "2100000" };
    started[index].kill9();
    started[index] = Node::start_with(&core, &token, &node_dir, &["--sandbox-uid-base", uid_base]);
    let new_address = started[index].url();
    let mut registered_again = false;
    for _ in 0..600 {
        if nodes(&c, &core)
            .await
            .iter()
            .any(|n| n["id"] == placed.as_str() && n["address"] == new_address.as_str())
        {
            registered_again = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        registered_again,
        "the restarted node did not register its new address"
    );
    let (st, v) = exec(&c, &core, &run, again).await;
    assert_eq!(
        (st, v["stdout"].as_str()),
        (200, Some("I am v1\nmark\n")),
        "{v}"
    );
    assert_eq!(v["node"], placed.as_str());

    // The node is lost: its run's sandbox is lost with it, said, not silently replaced.
    let index = started.iter().position(|n| n.id() == placed).unwrap();
    started[index].kill9();
    the_node_state(&c, &core, &placed, "lost").await;
    let (st, v) = exec(&c, &core, &run, json!({"command": "true"})).await;
    assert_eq!((st, error_code(&v)), (410, "sandbox_lost"), "{v}");
    assert_eq!(v["error"]["node"], placed.as_str(), "{v}");

    // A fresh sandbox elsewhere, with the same pins and a blank workspace.
    let (st, v) = exec(
        &c,
        &core,
        &run,
        json!({"skill": "hello", "command": "./scripts/run.sh; ls /workspace", "new_sandbox": true}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_ne!(v["node"], placed.as_str());
    assert_eq!(v["stdout"], "I am v1\n", "{v}");

    // A new run sees the new current revision.
    let fresh = new_run(&c, &core, &["hello"]).await;
    let (st, v) = exec(
        &c,
        &core,
        &fresh,
        json!({"skill": "hello", "command": "./scripts/run.sh"}),
    )
    .await;
    assert_eq!(
        (st, v["stdout"].as_str()),
        (200, Some("I am drafted\n")),
        "{v}"
    );
    // The run ends: its node releases its sandbox (workspace image and mount).
    let placed_on = v["node"].as_str().unwrap().to_string();
    let node = started.iter().find(|n| n.id() == placed_on).unwrap();
    let image = node.data_dir.join(format!("box/workspaces/{fresh}.ext4"));
    assert!(image.exists(), "the run has a workspace on its node");
    c.delete(core.ws("acme", &format!("runs/{fresh}")))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert!(
        holds_within(Duration::from_secs(30), || async { !image.exists() }).await,
        "the node kept the workspace of a finished run"
    );
}

async fn the_node_state(c: &reqwest::Client, core: &Server, id: &str, state: &str) {
    for _ in 0..600 {
        if nodes(c, core)
            .await
            .iter()
            .any(|n| n["id"] == id && n["state"] == state)
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("node {id} never became {state}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_revocation_kills_the_revisions_executions_on_nodes_and_removes_its_copies() {
    let dir = tempfile::tempdir().unwrap();
    let core = Server::start(
        &dir.path().join("core"),
        &["--box", "remote", "--node-timeout", "5"],
    );
    let c = http();
    let token = node_token(&c, &core).await;
    let node = Node::start_with(
        &core,
        &token,
        &dir.path().join("n1"),
        &["--sandbox-uid-base", "2200000"],
    );
    the_node(&c, &core, "live", &node.url()).await;
    let (_, published) = publish(
        &c,
        &core,
        ADMIN,
        "acme",
        "hello",
        0,
        versioned("hello", "v1", &[]),
    )
    .await;
    let run = new_run(&c, &core, &["hello"]).await;
    let (st, v) = exec(
        &c,
        &core,
        &run,
        json!({"skill": "hello", "command": "./scripts/run.sh"}),
    )
    .await;
    assert_eq!((st, v["stdout"].as_str()), (200, Some("I am v1\n")), "{v}");
    let tree = node.data_dir.join("trees").join(
        published["digest"]
            .as_str()
            .unwrap()
            .trim_start_matches("sha256:"),
    );
    assert!(tree.is_dir(), "the node keeps the verified package");
    // Archives by digest: for the token whose node runs the run, and no other.
    let archive = format!(
        "{}/v1/nodes/archives/{}",
        core.url,
        published["digest"].as_str().unwrap()
    );
    let other = node_token(&c, &core).await;
    for (who, t, expected) in [
        ("its node", &token, 200),
        ("another node token", &other, 404),
    ] {
        let r = c.get(&archive).bearer_auth(t).send().await.unwrap();
        assert_eq!(r.status(), expected, "{who}");
    }

    let running = spawn_exec(
        &c,
        &core,
        &run,
        json!({"skill": "hello", "command": "sleep 30", "timeout_ms": 60000}),
    );
    tokio::time::sleep(Duration::from_millis(800)).await;
    let revoked_at = std::time::Instant::now();
    revoke(&c, &core, "hello", 1, "leaked").await;
    let (st, v) = tokio::time::timeout(Duration::from_secs(20), running)
        .await
        .expect("the execution ended")
        .unwrap();
    assert_eq!((st, error_code(&v)), (410, "revision_revoked"), "{v}");
    assert!(
        revoked_at.elapsed() < Duration::from_secs(20),
        "killed, not timed out"
    );
    // Core relays the revocation to its nodes in the background: the node kills first, and
    // the killed execution's answer can overtake the removal of the tree.
    assert!(
        holds_within(Duration::from_secs(10), || async { !tree.exists() }).await,
        "the node never removed the revoked revision's tree"
    );
    let (st, v) = exec(&c, &core, &run, json!({"command": "true"})).await;
    assert_eq!((st, error_code(&v)), (410, "revision_revoked"), "{v}");
}

/// Bytes that do not compress: a transfer of them is as long on the wire as on disk.
fn incompressible(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A transfer between Core and node truncated, corrupted or dropped mid-way (the node reaches
/// Core through a proxy the test cuts) never executes, lands nothing, and the next attempt
/// fetches the whole package afresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cut_or_corrupted_transfer_to_a_node_never_runs() {
    let dir = tempfile::tempdir().unwrap();
    let core = Server::start(
        &dir.path().join("core"),
        &["--box", "remote", "--node-timeout", "10"],
    );
    let c = http();
    let token = node_token(&c, &core).await;
    let proxy = TcpProxy::start(socket_addr_of(&core.url)).await;
    let node = Node::start_for(
        &proxy.url(),
        &token,
        &dir.path().join("n1"),
        &["--sandbox-uid-base", "2300000"],
    );
    the_node(&c, &core, "live", &node.url()).await;
    let payload = incompressible(256 << 10);
    for fault in ["truncate", "flip", "drop"] {
        let skill = format!("s-{fault}");
        let (st, published) = publish(
            &c,
            &core,
            ADMIN,
            "acme",
            &skill,
            0,
            versioned(&skill, "v1", &[("data.bin", &payload)]),
        )
        .await;
        assert_eq!(st, 201, "{published}");
        let run = new_run(&c, &core, &[&skill]).await;
        if fault == "drop" {
            proxy.cut_after(64 << 10);
        } else {
            std::fs::write(node.data_dir.join("staging/FAILPOINT"), fault).unwrap();
        }
        let body = json!({"skill": skill, "command": "./scripts/run.sh"});
        let (st, v) = exec(&c, &core, &run, body.clone()).await;
        proxy.restore();
        assert_eq!(
            (st, error_code(&v)),
            (503, "box_unavailable"),
            "{fault}: {v}"
        );
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("cannot fetch package"),
            "{fault}: {v}"
        );
        let tree = node.data_dir.join("trees").join(
            published["digest"]
                .as_str()
                .unwrap()
                .trim_start_matches("sha256:"),
        );
        assert!(!tree.exists(), "{fault}: a bad transfer landed");
        // The next attempt fetches afresh, whole.
        let (st, v) = exec(&c, &core, &run, body).await;
        assert_eq!(
            (st, v["stdout"].as_str()),
            (200, Some("I am v1\n")),
            "{fault}: {v}"
        );
        assert!(tree.is_dir());
    }
    let fetches = node_metric(&c, &node, "skillbox_node_package_fetch_failures_total").await;
    assert_eq!(fetches, 3, "every bad transfer is counted");
}

/// A counter from the node's `/metrics`.
async fn node_metric(c: &reqwest::Client, node: &Node, name: &str) -> u64 {
    metric(c, &node.url(), name).await
}

/// Prefetch (SPEC §7.3): when the current revision of a skill that a live run on the node has
/// pinned moves, the node fetches and verifies it ahead of use, leaving the pinned one alone;
/// a skill no run of it uses is not fetched. The first execution of the new revision then
/// finds it there (a prefetch hit, no download). The node is reached at its `--advertise` URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_prefetches_the_new_current_revision_of_skills_its_runs_use() {
    let dir = tempfile::tempdir().unwrap();
    let core = Server::start(
        &dir.path().join("core"),
        &["--box", "remote", "--node-timeout", "10"],
    );
    let c = http();
    let token = node_token(&c, &core).await;
    let port = free_port();
    let advertised = format!("http://localhost:{port}");
    let node = Node::start_on_port(
        &core.url,
        &token,
        &dir.path().join("n1"),
        port,
        &["--advertise", &format!("{advertised}/")],
    );
    the_node(&c, &core, "live", &advertised).await;
    let (_, v1) = publish(
        &c,
        &core,
        ADMIN,
        "acme",
        "hello",
        0,
        versioned("hello", "v1", &[]),
    )
    .await;
    let (_, other1) = publish(
        &c,
        &core,
        ADMIN,
        "acme",
        "other",
        0,
        versioned("other", "v1", &[]),
    )
    .await;
    let run_a = new_run(&c, &core, &["hello"]).await;
    let body = json!({"skill": "hello", "command": "./scripts/run.sh"});
    let (st, v) = exec(&c, &core, &run_a, body.clone()).await;
    assert_eq!((st, v["stdout"].as_str()), (200, Some("I am v1\n")), "{v}");
    let tree_of = |published: &Value| {
        node.data_dir.join("trees").join(
            published["digest"]
                .as_str()
                .unwrap()
                .trim_start_matches("sha256:"),
        )
    };
    let v1_tree = tree_of(&v1);
    let v1_mtime = std::fs::metadata(v1_tree.join("SKILL.md"))
        .unwrap()
        .modified()
        .unwrap();

    let (_, v2) = publish(
        &c,
        &core,
        ADMIN,
        "acme",
        "hello",
        1,
        versioned("hello", "v2", &[]),
    )
    .await;
    let (_, other2) = publish(
        &c,
        &core,
        ADMIN,
        "acme",
        "other",
        1,
        versioned("other", "v2", &[]),
    )
    .await;
    let v2_tree = tree_of(&v2);
    assert!(
        holds_within(Duration::from_secs(20), || {
            let t = v2_tree.clone();
            async move { t.is_dir() }
        })
        .await,
        "the node did not prefetch hello v2"
    );
    assert!(node_metric(&c, &node, "skillbox_node_prefetched_total").await >= 1);
    assert!(v1_tree.is_dir(), "the pinned revision's tree was touched");
    assert_eq!(
        std::fs::metadata(v1_tree.join("SKILL.md"))
            .unwrap()
            .modified()
            .unwrap(),
        v1_mtime
    );
    for unused in [&other1, &other2] {
        assert!(!tree_of(unused).exists(), "a skill no run uses was fetched");
    }
    // What a node token may fetch: the prefetched current revision, not a skill its runs
    // never used.
    for (published, expected) in [(&v2, 200), (&other2, 404)] {
        let r = c
            .get(format!(
                "{}/v1/nodes/archives/{}",
                core.url,
                published["digest"].as_str().unwrap()
            ))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), expected, "{published}");
    }

    // The run keeps v1; a new run's first execution of v2 finds it prefetched.
    let (_, v) = exec(&c, &core, &run_a, body.clone()).await;
    assert_eq!(v["stdout"], "I am v1\n", "{v}");
    let fetches = node_metric(&c, &node, "skillbox_node_package_fetches_total").await;
    let hits = node_metric(&c, &node, "skillbox_node_prefetch_hits_total").await;
    let run_b = new_run(&c, &core, &["hello"]).await;
    let (st, v) = exec(&c, &core, &run_b, body).await;
    assert_eq!((st, v["stdout"].as_str()), (200, Some("I am v2\n")), "{v}");
    assert_eq!(
        node_metric(&c, &node, "skillbox_node_package_fetches_total").await,
        fetches,
        "the prefetched package was downloaded again"
    );
    assert_eq!(
        node_metric(&c, &node, "skillbox_node_prefetch_hits_total").await,
        hits + 1
    );

    // Executions that need one new package at once (and the prefetch its pins start) share
    // one download.
    publish(
        &c,
        &core,
        ADMIN,
        "acme",
        "wide",
        0,
        versioned("wide", "v1", &[("data.bin", &incompressible(1 << 20))]),
    )
    .await;
    let fetches = node_metric(&c, &node, "skillbox_node_package_fetches_total").await;
    let mut runs = Vec::new();
    for _ in 0..4 {
        runs.push(new_run(&c, &core, &["wide"]).await);
    }
    let body = json!({"skill": "wide", "command": "./scripts/run.sh"});
    let answers: Vec<_> = runs
        .iter()
        .map(|run| spawn_exec(&c, &core, run, body.clone()))
        .collect();
    for answer in answers {
        let (st, v) = answer.await.unwrap();
        assert_eq!((st, v["stdout"].as_str()), (200, Some("I am v1\n")), "{v}");
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        node_metric(&c, &node, "skillbox_node_package_fetches_total").await,
        fetches + 1,
        "one package, one download"
    );
}

/// A node on the docker backend: executions through Core run in the node's container for the
/// run with exactly its pins; a node restart adopts the container and keeps the workspace
/// volume; the run's end removes both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_docker_node_runs_the_runs_executions_in_its_containers() {
    let dir = tempfile::tempdir().unwrap();
    let core = Server::start(
        &dir.path().join("core"),
        &["--box", "remote", "--node-timeout", "10"],
    );
    let c = http();
    let token = node_token(&c, &core).await;
    let owner = crate::backends::Owner::new("docker_node");
    let image = crate::backends::image();
    let node_args = [
        "--box",
        "docker",
        "--docker-image",
        &image,
        "--docker-owner",
        &owner.0,
    ];
    let mut node = Node::start_with(&core, &token, &dir.path().join("n1"), &node_args);
    the_node(&c, &core, "live", &node.url()).await;
    let (run, _) = hello_v1_run_with_a_mark(&c, &core).await;
    let containers = owner.containers(&[format!("skillbox.sandbox={run}")]);
    assert_eq!(
        containers.len(),
        1,
        "the run's container on the node's engine"
    );
    publish(
        &c,
        &core,
        ADMIN,
        "acme",
        "hello",
        1,
        versioned("hello", "v2", &[]),
    )
    .await;
    let again = json!({"skill": "hello", "command": "./scripts/run.sh; cat /workspace/m; touch /skills/x 2>/dev/null || echo read-only"});
    let (_, v) = exec(&c, &core, &run, again.clone()).await;
    assert_eq!(v["stdout"], "I am v1\nmark\nread-only\n", "{v}");

    node.kill9();
    let node = Node::start_with(&core, &token, &dir.path().join("n1"), &node_args);
    the_node(&c, &core, "live", &node.url()).await;
    let (st, v) = exec(&c, &core, &run, again).await;
    assert_eq!(
        (st, v["stdout"].as_str()),
        (200, Some("I am v1\nmark\nread-only\n")),
        "{v}"
    );
    assert_eq!(
        owner.containers(&[format!("skillbox.sandbox={run}")]),
        containers,
        "the restarted node adopted the run's container"
    );

    c.delete(core.ws("acme", &format!("runs/{run}")))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert!(
        holds_within(Duration::from_secs(60), || async {
            owner.containers(&[]).is_empty() && owner.volumes().is_empty()
        })
        .await,
        "the node kept the finished run's container or volume"
    );
}

/// Two Core servers on one PostgreSQL + S3 and a node registered with one of them: with no
/// live node an execution is `box_unavailable`; then a run placed through A is routed to its
/// node by B too (the placement is in the database), and a revocation through B kills the
/// revision's execution on the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn any_core_server_routes_a_run_to_its_node() {
    let dir = tempfile::tempdir().unwrap();
    let storage = ScaleOut::fresh();
    let remote = ["--box", "remote", "--node-timeout", "10"];
    let a = storage.server_with(&dir.path().join("a"), &remote);
    let b = storage.server_with(&dir.path().join("b"), &remote);
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
    let run = new_run(&c, &a, &["hello"]).await;
    let body = json!({"skill": "hello", "command": "./scripts/run.sh"});
    let (st, v) = exec(&c, &b, &run, body.clone()).await;
    assert_eq!(
        (st, error_code(&v)),
        (503, "box_unavailable"),
        "no live node: {v}"
    );

    let token = node_token(&c, &a).await;
    let node = Node::start_with(&a, &token, &dir.path().join("n1"), &[]);
    the_node(&c, &b, "live", &node.url()).await;
    let (st, v) = exec(&c, &a, &run, body.clone()).await;
    assert_eq!((st, v["stdout"].as_str()), (200, Some("I am v1\n")), "{v}");
    let placed = v["node"].clone();
    let (st, v) = exec(&c, &b, &run, body).await;
    assert_eq!((st, v["stdout"].as_str()), (200, Some("I am v1\n")), "{v}");
    assert_eq!(v["node"], placed, "B routed the run elsewhere");

    let running = spawn_exec(
        &c,
        &a,
        &run,
        json!({"skill": "hello", "command": "sleep 30", "timeout_ms": 60000}),
    );
    tokio::time::sleep(Duration::from_millis(800)).await;
    revoke(&c, &b, "hello", 1, "leaked").await;
    let (st, v) = tokio::time::timeout(Duration::from_secs(20), running)
        .await
        .expect("the execution was killed")
        .unwrap();
    assert_eq!((st, error_code(&v)), (410, "revision_revoked"), "{v}");
}
