//! What a new user and an attacker hit first: a data directory under a private home, one
//! tenant's fork bomb, a full `/tmp` or workspace, hostile execution input, a socket in a run
//! draft, slow clients, every framework rejection in the SPEC envelope, request timeouts and
//! invalid workspace names.

use crate::support::*;
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bwrap_works_from_a_data_dir_under_a_private_home() {
    // A clone in /root: every directory above the data directory is 0700.
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700)).unwrap();
    let data = home.join("skillbox-data");
    let (s, c, run) = hello_run(&data, &["--box", "bwrap"]).await;
    let (st, v) = exec(
        &c,
        &s,
        &run,
        json!({"skill": "hello", "argv": ["./scripts/run.sh"]}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        (v["exit_code"].as_i64(), v["stdout"].as_str()),
        (Some(0), Some("I am v1\n")),
        "{v}"
    );
    let v = sh(
        &c,
        &s,
        &run,
        None,
        "echo kept > /workspace/f && cat /workspace/f",
    )
    .await;
    assert_eq!(v["stdout"], "kept\n", "{v}");
    // The probe `doctor` runs tries the same data directory, for real.
    let out = std::process::Command::new(bin())
        .args(["--json", "doctor", "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let bwrap = &report["backends"][0];
    assert_eq!(
        (bwrap["backend"].as_str(), bwrap["usable"].as_bool()),
        (Some("bwrap"), Some(true)),
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenants_fork_bomb_leaves_other_tenants_executing() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &["--box", "bwrap"]);
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
    publish(
        &c,
        &s,
        ADMIN,
        "beta",
        "hello",
        0,
        versioned("hello", "v1", &[]),
    )
    .await;
    let bomber = new_run_in(&c, &s, "acme", &["hello"]).await;
    let victim = new_run_in(&c, &s, "beta", &["hello"]).await;
    let bomb = {
        let (c, url) = (c.clone(), s.ws("acme", &format!("runs/{bomber}/exec")));
        tokio::spawn(async move {
            c.post(url)
                .bearer_auth(ADMIN)
                .json(&json!({"command": "b() { b | b & }; b; sleep 20", "timeout_ms": 12_000}))
                .send()
                .await
        })
    };
    // The bomb has used its whole process budget by now.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for i in 0..20 {
        let (st, v) = exec_in(
            &c,
            &s,
            "beta",
            &victim,
            json!({"argv": ["sh", "-c", "echo ok; ls / >/dev/null"]}),
        )
        .await;
        assert_eq!(st, 200, "execution {i}: {v}");
        assert_eq!(
            (v["exit_code"].as_i64(), v["stdout"].as_str()),
            (Some(0), Some("ok\n")),
            "execution {i} of another tenant failed: {v}"
        );
    }
    let r = bomb.await.unwrap().unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["timed_out"], true, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_exec_input_is_a_bad_request_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let (s, c, run) = hello_run(dir.path(), &["--box", "bwrap"]).await;
    let cases = [
        (json!({"argv": ["echo", "a\u{0}b"]}), "argv[1]"),
        (json!({"command": "echo \u{0}"}), "command"),
        (json!({"argv": ["true"], "env": {"X": "a\u{0}b"}}), "env"),
        (json!({"argv": ["true"], "env": {"A=B": "x"}}), "env"),
        (json!({"argv": ["true"], "env": {"": "x"}}), "env"),
        (json!({"argv": ["true"], "timeout_ms": -1}), "timeout_ms"),
        (json!({"argv": ["true"], "cwd": "/tm\u{0}p"}), "cwd"),
    ];
    for (body, field) in cases {
        let (st, v) = exec(&c, &s, &run, body.clone()).await;
        assert_eq!((st, error_code(&v)), (400, "bad_request"), "{body}: {v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(field),
            "{body}: {v}"
        );
    }
    let v = sh(&c, &s, &run, None, "echo still-fine").await;
    assert_eq!(v["stdout"], "still-fine\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_in_a_run_draft_is_refused_by_path() {
    let dir = tempfile::tempdir().unwrap();
    let (s, c, run) = hello_run(dir.path(), &["--box", "bwrap"]).await;
    let r: Value = c
        .post(s.ws("acme", &format!("runs/{run}/drafts")))
        .bearer_auth(ADMIN)
        .json(&json!({"skill": "hello"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let (id, path) = (r["draft_id"].as_str().unwrap(), r["path"].as_str().unwrap());
    let v = sh(
        &c,
        &s,
        &run,
        None,
        &format!("python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('{path}/scripts/agent.sock')\" && echo bound"),
    )
    .await;
    assert_eq!(v["stdout"], "bound\n", "{v}");
    let r = c
        .post(s.ws("acme", &format!("drafts/{id}/publish")))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    let st = r.status().as_u16();
    let v: Value = r.json().await.unwrap();
    assert_eq!((st, error_code(&v)), (422, "invalid_package"), "{v}");
    assert_eq!(
        v["error"]["problems"][0]["path"], "scripts/agent.sock",
        "{v}"
    );
    let (_, skill) = get(&c, &s.ws("acme", "skills/hello"), ADMIN).await;
    assert_eq!(
        skill["current_revision"], 1,
        "nothing was published: {skill}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_cannot_starve_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &["--header-timeout", "2"]);
    // 300 connections whose headers never finish (bounded: they are dropped at the end).
    let mut slow: Vec<std::net::TcpStream> = (0..300)
        .map(|_| {
            let mut t = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
            t.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                .unwrap();
            t
        })
        .collect();
    let c = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let r = c
        .get(format!("{}/healthz", s.url))
        .send()
        .await
        .expect("healthz answers beside slow clients");
    assert_eq!(r.status(), 200);
    // The slow ones are dropped once the header timeout has passed: the server closes the
    // connection (perhaps after a 408), long before this read would time out.
    let t = &mut slow[0];
    t.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let mut buf = [0u8; 256];
    let dropped = loop {
        match t.read(&mut buf) {
            Ok(0) => break true,
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                break false;
            }
            Err(_) => break true, // reset by the server
        }
    };
    assert!(
        dropped,
        "a client that never finished its headers was not dropped"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rejection_uses_the_error_envelope() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    let c = http();
    let runs = s.ws("acme", "runs");
    let big = format!("{{\"skills\": [\"{}\"]}}", "a".repeat(3 << 20));
    let cases: Vec<(&str, reqwest::RequestBuilder, u16, &str)> = vec![
        (
            "malformed JSON",
            c.post(&runs)
                .header("content-type", "application/json")
                .body("{"),
            400,
            "bad_request",
        ),
        (
            "wrong-shape JSON",
            c.post(&runs).json(&json!({"skills": 5})),
            400,
            "bad_request",
        ),
        (
            "missing Content-Type",
            c.post(&runs).body("{}"),
            400,
            "bad_request",
        ),
        (
            "bad query value",
            c.get(s.ws("acme", "events?after=abc&follow=false")),
            400,
            "bad_request",
        ),
        (
            "JSON body over the limit",
            c.post(&runs)
                .header("content-type", "application/json")
                .body(big),
            413,
            "too_large",
        ),
        (
            "wrong method",
            c.delete(s.ws("acme", "skills")),
            405,
            "method_not_allowed",
        ),
        (
            "unknown route",
            c.get(format!("{}/v1/nothing", s.url)),
            404,
            "not_found",
        ),
    ];
    for (what, rb, status, code) in cases {
        let r = rb.bearer_auth(ADMIN).send().await.unwrap();
        let st = r.status().as_u16();
        let text = r.text().await.unwrap();
        let v: Value =
            serde_json::from_str(&text).unwrap_or_else(|_| panic!("{what}: not JSON: {text:?}"));
        assert_eq!((st, error_code(&v)), (status, code), "{what}: {v}");
        assert!(
            !v["error"]["message"].as_str().unwrap_or("").is_empty(),
            "{what}: {v}"
        );
    }
    // Invalid workspace names are refused, even for the admin token (not an empty list).
    // Sent raw: an HTTP client would resolve `%2e%2e` as `..` before sending.
    for ws in ["ALPHA", "%2e%2e", &"a".repeat(10_000)] {
        let mut t = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
        write!(
            t,
            "GET /v1/workspaces/{ws}/skills HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut answer = String::new();
        t.read_to_string(&mut answer).unwrap();
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        let v: Value = serde_json::from_str(body).unwrap_or_default();
        assert!(head.starts_with("HTTP/1.1 400"), "{ws:.20}: {answer}");
        assert_eq!(error_code(&v), "bad_request", "{ws:.20}: {answer}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_over_the_timeout_answers_503_timeout() {
    let dir = tempfile::tempdir().unwrap();
    // Long enough that setting up the run is never cut, short enough for the test.
    let (s, c, run) = hello_run(dir.path(), &["--box", "bwrap", "--request-timeout", "4"]).await;
    let (st, v) = exec(&c, &s, &run, json!({"argv": ["sleep", "30"]})).await;
    assert_eq!((st, error_code(&v)), (503, "timeout"), "{v}");
}
