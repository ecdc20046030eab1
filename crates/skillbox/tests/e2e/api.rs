//! Every route over real HTTP against a real `skillbox serve`: success, auth failures,
//! cross-workspace `not_found`, validation errors, limits, unknown skills and revisions.

use crate::support::*;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_auth_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    let c = http();
    let reader = token(&c, &s, "acme", "reader").await;
    let author = token(&c, &s, "acme", "author").await;
    let admin = token(&c, &s, "acme", "admin").await;
    let other = token(&c, &s, "other", "admin").await;

    // auth failures
    let r = c.get(s.ws("acme", "skills")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(error_code(&r.json().await.unwrap()), "unauthorized");
    let (st, v) = get(&c, &s.ws("acme", "skills"), "sbx_wrong").await;
    assert_eq!((st, error_code(&v)), (401, "unauthorized"));
    let (st, v) = publish(&c, &s, &reader, "acme", "demo", 0, package("demo", "1")).await;
    assert_eq!((st, error_code(&v)), (403, "forbidden"));

    // publish
    let (st, v) = publish(&c, &s, &author, "acme", "demo", 0, package("demo", "1")).await;
    assert_eq!(st, 201, "{v}");
    for k in [
        "skill_id",
        "name",
        "revision",
        "digest",
        "file_count",
        "size",
        "published_at",
        "warnings",
    ] {
        assert!(v.get(k).is_some(), "missing {k} in {v}");
    }
    assert_eq!(v["revision"], 1);
    assert_eq!(v["file_count"], 2);
    let digest1 = v["digest"].as_str().unwrap().to_string();

    // cross-workspace: not_found, for reads and writes
    let (st, v) = get(&c, &s.ws("acme", "skills"), &other).await;
    assert_eq!((st, error_code(&v)), (404, "not_found"));
    let (st, v) = get(&c, &s.ws("acme", "skills/demo"), &other).await;
    assert_eq!((st, error_code(&v)), (404, "not_found"));
    let (st, v) = publish(&c, &s, &other, "acme", "demo", 1, package("demo", "x")).await;
    assert_eq!((st, error_code(&v)), (404, "not_found"));
    let (st, v) = get(&c, &s.ws("other", "skills/demo"), &other).await;
    assert_eq!((st, error_code(&v)), (404, "not_found"));

    // reads
    let (st, v) = get(&c, &s.ws("acme", "skills"), &reader).await;
    assert_eq!(st, 200);
    let sk = &v["skills"][0];
    assert_eq!(
        (sk["name"].as_str(), sk["current_revision"].as_i64()),
        (Some("demo"), Some(1))
    );
    assert_eq!(sk["current_digest"].as_str(), Some(digest1.as_str()));
    assert_eq!(sk["description"], "variant 1");
    let (st, v) = get(&c, &s.ws("acme", "skills/demo"), &reader).await;
    assert_eq!((st, v["frontmatter"]["name"].as_str()), (200, Some("demo")));
    let (st, v) = get(&c, &s.ws("acme", "skills/demo/revisions/current"), &reader).await;
    assert_eq!(st, 200);
    assert_eq!(v["digest"].as_str(), Some(digest1.as_str()));
    assert_eq!(v["parent_revision"], 0);
    assert_eq!(v["state"], "available");
    let m = v["manifest"].as_array().unwrap();
    assert_eq!(m.len(), 2);
    assert_eq!(m[1]["path"], "scripts/run.sh");
    assert_eq!(m[1]["executable"], true);
    let run_sha = m[1]["sha256"].as_str().unwrap().to_string();

    let r = c
        .get(s.ws("acme", "skills/demo/revisions/1/files/scripts/run.sh"))
        .bearer_auth(&reader)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let etag = r.headers()["etag"].to_str().unwrap().to_string();
    assert_eq!(etag, format!("\"sha256:{run_sha}\""));
    assert_eq!(r.text().await.unwrap(), "echo 1\n");
    let r = c
        .get(s.ws("acme", "skills/demo/revisions/1/files/scripts/run.sh"))
        .bearer_auth(&reader)
        .header("if-none-match", &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 304);

    // archive: deterministic, verifies against the digest
    let a1 = c
        .get(s.ws("acme", "skills/demo/revisions/1/archive"))
        .bearer_auth(&reader)
        .send()
        .await
        .unwrap();
    assert_eq!(a1.headers()["x-skillbox-digest"].to_str().unwrap(), digest1);
    let a1 = a1.bytes().await.unwrap();
    let a2 = c
        .get(s.ws("acme", "skills/demo/revisions/1/archive"))
        .bearer_auth(&reader)
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(a1, a2);
    let t = tempfile::tempdir().unwrap();
    let intake =
        skillbox_package::intake::extract_tar(&a1[..], false, t.path(), &Default::default())
            .unwrap();
    assert_eq!(
        skillbox_package::Manifest::new(intake.files)
            .unwrap()
            .digest()
            .to_string(),
        digest1
    );

    // unknown skill / revision / file, bad revision
    for (url, status, code) in [
        ("skills/nope", 404, "not_found"),
        ("skills/nope/revisions", 404, "not_found"),
        ("skills/demo/revisions/9", 404, "not_found"),
        ("skills/demo/revisions/abc", 400, "bad_request"),
        ("skills/demo/revisions/0", 400, "bad_request"),
        (
            "skills/demo/revisions/1/files/missing.txt",
            404,
            "not_found",
        ),
        ("skills/demo/revisions/9/archive", 404, "not_found"),
    ] {
        let (st, v) = get(&c, &s.ws("acme", url), &reader).await;
        assert_eq!((st, error_code(&v)), (status, code), "{url}: {v}");
    }

    // invalid_package: all problems at once
    let bad = tar_of(&[
        ("SKILL.md", b"---\nname: Bad_Name\n---\n"),
        ("../evil", b"x"),
    ]);
    let (st, v) = publish(&c, &s, &author, "acme", "demo", 1, bad).await;
    assert_eq!((st, error_code(&v)), (422, "invalid_package"), "{v}");
    let problems = v["error"]["problems"].as_array().unwrap();
    let text = problems
        .iter()
        .map(|p| p.to_string())
        .collect::<Vec<_>>()
        .join("\n");
    for want in ["'..'", "\"field\":\"name\"", "\"field\":\"description\""] {
        assert!(text.contains(want), "missing {want} in {text}");
    }
    // frontmatter name must equal the skill name published under
    let (st, v) = publish(
        &c,
        &s,
        &author,
        "acme",
        "other-name",
        0,
        package("demo", "1"),
    )
    .await;
    assert_eq!((st, error_code(&v)), (422, "invalid_package"));
    assert!(
        v["error"]["problems"][0]["message"]
            .as_str()
            .unwrap()
            .contains("published as")
    );
    // bad names, bad content type, not an archive
    let (st, v) = publish(&c, &s, &author, "acme", "Bad_Name", 0, package("demo", "1")).await;
    assert_eq!((st, error_code(&v)), (400, "bad_request"));
    let r = c
        .post(s.ws("acme", "skills/demo/revisions?base_revision=1"))
        .bearer_auth(&author)
        .header("content-type", "text/plain")
        .body("hi")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let (st, v) = publish(
        &c,
        &s,
        &author,
        "acme",
        "demo",
        1,
        b"not an archive at all".to_vec(),
    )
    .await;
    assert_eq!((st, error_code(&v)), (422, "invalid_package"));

    // conflicts
    let (st, v) = publish(&c, &s, &author, "acme", "demo", 0, package("demo", "2")).await;
    assert_eq!((st, error_code(&v)), (409, "revision_conflict"));
    assert_eq!(v["error"]["current_revision"], 1);
    let (st, v) = publish(
        &c,
        &s,
        &author,
        "acme",
        "newskill",
        3,
        package("newskill", "2"),
    )
    .await;
    assert_eq!((st, error_code(&v)), (409, "revision_conflict"));
    assert_eq!(v["error"]["current_revision"], 0);

    // rollback CAS
    let (st, _) = publish(&c, &s, &author, "acme", "demo", 1, package("demo", "2")).await;
    assert_eq!(st, 201);
    let put = |rev: i64, base: i64| {
        c.put(s.ws("acme", "skills/demo/current"))
            .bearer_auth(&author)
            .json(&json!({"revision": rev, "base_revision": base}))
            .send()
    };
    let r = put(1, 1).await.unwrap();
    assert_eq!(r.status(), 409);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        (error_code(&v), v["error"]["current_revision"].as_i64()),
        ("revision_conflict", Some(2))
    );
    assert_eq!(put(1, 2).await.unwrap().status(), 200);
    assert_eq!(put(7, 1).await.unwrap().status(), 404);
    let (_, v) = get(&c, &s.ws("acme", "skills/demo"), &reader).await;
    assert_eq!(v["current_revision"], 1);
    // a publish based on the rolled-back pointer gets a new number (never reused)
    let (st, v) = publish(&c, &s, &author, "acme", "demo", 1, package("demo", "3")).await;
    assert_eq!((st, v["revision"].as_i64()), (201, Some(3)));

    // deletion: admin only; name reusable as a new skill
    let r = c
        .delete(s.ws("acme", "skills/demo"))
        .bearer_auth(&author)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let old_id = get(&c, &s.ws("acme", "skills/demo"), &reader).await.1["id"]
        .as_str()
        .unwrap()
        .to_string();
    let r = c
        .delete(s.ws("acme", "skills/demo"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (_, v) = get(&c, &s.ws("acme", "skills"), &reader).await;
    assert_eq!(v["skills"].as_array().unwrap().len(), 0);
    let (st, _) = get(&c, &s.ws("acme", "skills/demo"), &reader).await;
    assert_eq!(st, 404);
    let (st, v) = publish(&c, &s, &author, "acme", "demo", 0, package("demo", "4")).await;
    assert_eq!((st, v["revision"].as_i64()), (201, Some(1)));
    assert_ne!(v["skill_id"].as_str().unwrap(), old_id);

    // admin endpoints need the server's admin token
    let r = c
        .post(format!("{}/v1/admin/fsck", s.url))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let r = c
        .post(format!("{}/v1/admin/tokens", s.url))
        .bearer_auth(&admin)
        .json(&json!({"workspace": "acme", "role": "admin"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let r = c
        .post(format!("{}/v1/admin/tokens", s.url))
        .bearer_auth(ADMIN)
        .json(&json!({"workspace": "acme", "role": "king"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let r = c
        .post(format!("{}/v1/admin/fsck", s.url))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["ok"], true, "{v}");
    assert!(v["revisions_checked"].as_i64().unwrap() >= 4);

    // operational endpoints
    assert_eq!(
        c.get(format!("{}/healthz", s.url))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let metrics = metrics_text(&c, &s.url).await;
    for m in [
        "skillbox_http_requests_total{",
        "skillbox_publishes_total 4",
        "skillbox_publish_conflicts_total 3",
        "skillbox_store_blobs",
        "skillbox_http_request_duration_seconds_bucket",
    ] {
        assert!(metrics.contains(m), "metrics lack {m}:\n{metrics}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_large_uploads() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(
        dir.path(),
        &["--max-total-size", "4096", "--max-file-size", "2048"],
    );
    let c = http();
    // Declared too large: refused from Content-Length before the body is read.
    let head = format!(
        "POST /v1/workspaces/acme/skills/demo/revisions?base_revision=0 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN}\r\nContent-Type: application/x-tar\r\nContent-Length: {}\r\n\r\n",
        40u64 << 20
    );
    let resp = raw_exchange(s.port, head.into_bytes(), Vec::new());
    assert!(resp.starts_with("HTTP/1.1 413"), "{resp}");
    assert!(resp.contains("too_large"), "{resp}");
    // Streamed (chunked, no length): refused while spooling, once past the cap.
    let head = format!(
        "POST /v1/workspaces/acme/skills/demo/revisions?base_revision=0 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN}\r\nContent-Type: application/x-tar\r\nTransfer-Encoding: chunked\r\n\r\n"
    );
    let mut chunk = format!("{:x}\r\n", 1 << 20).into_bytes();
    chunk.extend(std::iter::repeat_n(0u8, 1 << 20));
    chunk.extend_from_slice(b"\r\n");
    let body: Vec<u8> = std::iter::repeat_n(chunk, 40).flatten().collect();
    let resp = raw_exchange(s.port, head.into_bytes(), body);
    assert!(resp.starts_with("HTTP/1.1 413"), "{resp}");
    // Fits the upload cap but the content exceeds the package limits: invalid_package.
    let over = tar_of(&[
        ("SKILL.md", skill_md("demo", "d").as_bytes()),
        ("a.bin", &[1u8; 3000]),
    ]);
    let (st, v) = publish(&c, &s, ADMIN, "acme", "demo", 0, over).await;
    assert_eq!((st, error_code(&v)), (422, "invalid_package"), "{v}");
    // Nothing was stored and the server still answers.
    let (st, v) = get(&c, &s.ws("acme", "skills"), ADMIN).await;
    assert_eq!((st, v["skills"].as_array().unwrap().len()), (200, 0));
}

/// SPEC §5 routes this build serves; the OpenAPI document must list each, and every route in
/// the document must reach a handler (not the router's fallback).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openapi_lists_every_route() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    let c = http();
    let doc: Value = c
        .get(format!("{}/openapi.json", s.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let spec_routes = [
        ("get", "/v1/workspaces/{ws}/skills"),
        ("post", "/v1/workspaces/{ws}/skills/{name}/revisions"),
        ("get", "/v1/workspaces/{ws}/skills/{name}"),
        ("get", "/v1/workspaces/{ws}/skills/{name}/revisions"),
        ("get", "/v1/workspaces/{ws}/skills/{name}/revisions/{rev}"),
        (
            "get",
            "/v1/workspaces/{ws}/skills/{name}/revisions/{rev}/files/{path}",
        ),
        (
            "get",
            "/v1/workspaces/{ws}/skills/{name}/revisions/{rev}/archive",
        ),
        ("put", "/v1/workspaces/{ws}/skills/{name}/current"),
        ("delete", "/v1/workspaces/{ws}/skills/{name}"),
        ("post", "/v1/workspaces/{ws}/drafts"),
        ("get", "/v1/workspaces/{ws}/drafts/{id}/files/{path}"),
        ("put", "/v1/workspaces/{ws}/drafts/{id}/files/{path}"),
        ("delete", "/v1/workspaces/{ws}/drafts/{id}/files/{path}"),
        ("post", "/v1/workspaces/{ws}/drafts/{id}/publish"),
        ("get", "/v1/workspaces/{ws}/events"),
        (
            "post",
            "/v1/workspaces/{ws}/skills/{name}/revisions/{rev}/revoke",
        ),
        ("post", "/v1/workspaces/{ws}/runs"),
        ("get", "/v1/workspaces/{ws}/runs/{run}"),
        ("delete", "/v1/workspaces/{ws}/runs/{run}"),
        ("post", "/v1/workspaces/{ws}/runs/{run}/activations"),
        (
            "get",
            "/v1/workspaces/{ws}/runs/{run}/skills/{name}/files/{path}",
        ),
        ("post", "/v1/workspaces/{ws}/runs/{run}/exec"),
        ("post", "/v1/workspaces/{ws}/runs/{run}/drafts"),
        ("post", "/v1/workspaces/{ws}/runs/{run}/heartbeat"),
        ("get", "/v1/workspaces/{ws}/runs/{run}/prompt"),
        ("post", "/v1/admin/gc"),
        ("post", "/v1/admin/tokens"),
        ("post", "/v1/admin/fsck"),
        ("get", "/healthz"),
        ("get", "/metrics"),
        ("get", "/openapi.json"),
        ("get", "/v1/whoami"),
    ];
    let paths = doc["paths"].as_object().unwrap();
    for (m, p) in spec_routes {
        assert!(
            paths.get(p).and_then(|o| o.get(m)).is_some(),
            "OpenAPI lacks {m} {p}"
        );
    }
    for (p, ops) in paths {
        let url = format!(
            "{}{}",
            s.url,
            p.replace("{ws}", "acme")
                .replace("{name}", "demo")
                .replace("{rev}", "1")
                .replace("{path}", "SKILL.md")
                .replace("{id}", "0123456789abcdef0123456789abcdef")
                .replace("{run}", "r1")
        );
        // The event stream follows forever unless told otherwise.
        let url = if p.ends_with("/events") {
            format!("{url}?follow=false")
        } else {
            url
        };
        for m in ops.as_object().unwrap().keys() {
            let method = reqwest::Method::from_bytes(m.to_uppercase().as_bytes()).unwrap();
            let r = c
                .request(method, &url)
                .bearer_auth(ADMIN)
                .header("content-type", "application/json")
                .body("{}")
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let body = r.text().await.unwrap_or_default();
            assert_ne!(status, 405, "{m} {p} is documented but not routed");
            assert!(
                !body.contains("no such route"),
                "{m} {p} is documented but not routed"
            );
        }
    }
}

/// Every route of the table is behind the access the table gives it: one role short is 403,
/// no token is 401, another workspace's token learns nothing (404) — checked from the table
/// the router is built from, so a route added without the right access fails here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_enforces_the_access_in_the_route_table() {
    use skillbox_registry::Role;
    use skillbox_server::auth::Access;
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &[]);
    let c = http();
    let mut tokens = std::collections::HashMap::new();
    for role in ["reader", "author", "runner", "admin"] {
        tokens.insert(role, token(&c, &s, "acme", role).await);
    }
    let other = token(&c, &s, "other", "admin").await;
    let node = node_token(&c, &s).await;
    let one_short = |role: Role| match role {
        Role::Reader => None,
        Role::Author => Some("reader"),
        Role::Runner => Some("author"),
        Role::Admin => Some("runner"),
    };
    let mut checked = 0;
    for route in skillbox_server::routes::ROUTES {
        let url = format!(
            "{}{}",
            s.url,
            route
                .path
                .replace("{ws}", "acme")
                .replace("{name}", "demo")
                .replace("{rev}", "1")
                .replace("{*path}", "SKILL.md")
                .replace("{id}", "0123456789abcdef0123456789abcdef")
                .replace("{run}", "r1")
        );
        // The event stream follows forever unless told otherwise.
        let url = if route.path.ends_with("/events") {
            format!("{url}?follow=false")
        } else {
            url
        };
        let method = reqwest::Method::from_bytes(route.method.as_str().as_bytes()).unwrap();
        let call = |token: Option<&str>| {
            let mut rb = c
                .request(method.clone(), &url)
                .header("content-type", "application/json")
                .body("{}");
            if let Some(t) = token {
                rb = rb.bearer_auth(t);
            }
            async move {
                let r = rb.send().await.unwrap();
                let status = r.status().as_u16();
                let v: Value = r.json().await.unwrap_or(Value::Null);
                (status, error_code(&v).to_string())
            }
        };
        let what = format!("{} {}", route.method, route.path);
        match route.access {
            Access::Public => continue,
            Access::AnyToken => {
                assert_eq!(call(None).await.0, 401, "{what} without a token");
            }
            Access::ServerAdmin => {
                assert_eq!(call(None).await.0, 401, "{what} without a token");
                for (who, t) in [("a workspace admin", &tokens["admin"]), ("a node", &node)] {
                    let (st, code) = call(Some(t)).await;
                    assert_eq!(
                        (st, code.as_str()),
                        (403, "forbidden"),
                        "{what} with {who} token"
                    );
                }
            }
            Access::Node => {
                assert_eq!(call(None).await.0, 401, "{what} without a token");
                for (who, t) in [
                    ("a workspace admin", &tokens["admin"]),
                    ("the server admin", &ADMIN.to_string()),
                ] {
                    let (st, code) = call(Some(t)).await;
                    assert_eq!(
                        (st, code.as_str()),
                        (403, "forbidden"),
                        "{what} with {who} token"
                    );
                }
                let (st, _) = call(Some(&node)).await;
                assert!(
                    ![401, 403].contains(&st),
                    "{what} refused a node token ({st})"
                );
            }
            Access::Workspace(role) => {
                assert_eq!(call(None).await.0, 401, "{what} without a token");
                let (st, code) = call(Some(&other)).await;
                assert_eq!(
                    (st, code.as_str()),
                    (404, "not_found"),
                    "{what} with another workspace's token"
                );
                // A node token reads no workspace by name.
                let (st, code) = call(Some(&node)).await;
                assert_eq!(
                    (st, code.as_str()),
                    (403, "forbidden"),
                    "{what} with a node token"
                );
                if let Some(short) = one_short(role) {
                    let (st, code) = call(Some(&tokens[short])).await;
                    assert_eq!(
                        (st, code.as_str()),
                        (403, "forbidden"),
                        "{what} with a {short} token"
                    );
                }
                // The role itself passes the check: whatever it answers, it is not a refusal.
                let (st, _) = call(Some(&tokens[role.as_str()])).await;
                assert!(
                    ![401, 403].contains(&st),
                    "{what} refused its own role ({st})"
                );
            }
        }
        checked += 1;
    }
    assert!(checked >= 30, "only {checked} routes checked");
}

/// `GET /v1/whoami` says what a token is and may do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whoami_names_the_tokens_role_and_workspace() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &["--box", "none"]);
    let c = http();
    let runner = token(&c, &s, "acme", "runner").await;
    let (st, v) = get(&c, &format!("{}/v1/whoami", s.url), &runner).await;
    assert_eq!(st, 200, "{v}");
    let me: skillbox_api::WhoAmI = serde_json::from_value(v).unwrap();
    assert_eq!(
        me,
        skillbox_api::WhoAmI {
            role: "runner".into(),
            workspace: Some("acme".into()),
            box_available: false,
        }
    );
    let (_, v) = get(&c, &format!("{}/v1/whoami", s.url), ADMIN).await;
    assert_eq!(
        (v["role"].as_str(), v["workspace"].is_null()),
        (Some("admin"), true)
    );
    let (st, v) = get(&c, &format!("{}/v1/whoami", s.url), "nope").await;
    assert_eq!((st, error_code(&v)), (401, "unauthorized"));
}

/// Sends `head` then `body` (from another thread, ignoring a server that hangs up early) and
/// returns the response text.
fn raw_exchange(port: u16, head: Vec<u8>, body: Vec<u8>) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.write_all(&head).unwrap();
    let mut writer = stream.try_clone().unwrap();
    let t = std::thread::spawn(move || {
        let _ = writer.write_all(&body);
    });
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while let Ok(n) = stream.read(&mut chunk) {
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.windows(4).any(|w| w == b"\r\n\r\n")
            && String::from_utf8_lossy(&buf).contains("\"error\"")
        {
            break;
        }
    }
    let _ = stream.shutdown(std::net::Shutdown::Both);
    let _ = t.join();
    String::from_utf8_lossy(&buf).into_owned()
}

/// What the console lists: a workspace's live runs (newest first, with pins; a finished run
/// leaves the list; another workspace's token learns nothing) and, for the server's admin,
/// the workspaces. The console itself is served at `/ui/`, with a policy that runs only its
/// own script.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_runs_workspaces_and_the_console_page() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &["--box", "none"]);
    let c = http();
    let (st, _) = publish(&c, &s, ADMIN, "acme", "demo", 0, package("demo", "v1")).await;
    assert_eq!(st, 201);
    let first = new_run(&c, &s, &["demo"]).await;
    let second = new_run(&c, &s, &[]).await;
    let runner = token(&c, &s, "acme", "runner").await;
    let (st, v) = get(&c, &s.ws("acme", "runs"), &runner).await;
    assert_eq!(st, 200, "{v}");
    let listed: skillbox_api::RunList = serde_json::from_value(v).unwrap();
    let ids: Vec<&str> = listed.runs.iter().map(|r| r.run.run_id.as_str()).collect();
    assert_eq!(ids, [second.as_str(), first.as_str()]);
    let pins = &listed.runs[1].run.activations;
    assert_eq!((pins[0].skill.as_str(), pins[0].revision), ("demo", 1));
    assert_eq!(
        (
            listed.runs[1].sandbox.as_deref(),
            listed.runs[1].node.as_deref()
        ),
        (None, None)
    );

    let r = c
        .delete(s.ws("acme", &format!("runs/{first}")))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (_, v) = get(&c, &s.ws("acme", "runs"), &runner).await;
    assert_eq!(v["runs"].as_array().map(Vec::len), Some(1), "{v}");

    let reader = token(&c, &s, "acme", "reader").await;
    let (st, v) = get(&c, &s.ws("acme", "runs"), &reader).await;
    assert_eq!((st, error_code(&v)), (403, "forbidden"));
    let other = token(&c, &s, "other", "admin").await;
    let (st, v) = get(&c, &s.ws("acme", "runs"), &other).await;
    assert_eq!((st, error_code(&v)), (404, "not_found"));

    let (st, v) = get(&c, &format!("{}/v1/admin/workspaces", s.url), ADMIN).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["workspaces"], json!(["acme", "other"]));
    let (st, v) = get(&c, &format!("{}/v1/admin/workspaces", s.url), &other).await;
    assert_eq!((st, error_code(&v)), (403, "forbidden"));

    let page = c.get(format!("{}/ui/", s.url)).send().await.unwrap();
    assert_eq!(page.status(), 200);
    let policy = page.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        policy.contains("script-src 'self'") && policy.contains("frame-ancestors 'none'"),
        "{policy}"
    );
    assert!(page.text().await.unwrap().contains("/ui/app.js"));
    let script = c.get(format!("{}/ui/app.js", s.url)).send().await.unwrap();
    assert_eq!(
        script.headers()["content-type"],
        "text/javascript; charset=utf-8"
    );
    let missing = c.get(format!("{}/ui/nope.js", s.url)).send().await.unwrap();
    assert_eq!(missing.status(), 404);
}
