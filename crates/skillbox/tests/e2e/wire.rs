//! The wire contract between the server and its clients: every answer of a full session —
//! skills, revisions, drafts, runs, execution (whole and streamed), run drafts, revocation,
//! events, administration and errors — parses as its `skillbox_api` type, and that type
//! serializes back to exactly what the server sent (no field the type does not know, none
//! missing). A handler that answered with an ad-hoc shape fails here.

use crate::support::*;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use skillbox_api as api;

/// `v` parses as `T` and `T` gives `v` back.
fn round_trip<T: DeserializeOwned + Serialize>(what: &str, v: &Value) -> T {
    let typed: T = serde_json::from_value(v.clone())
        .unwrap_or_else(|e| panic!("{what}: does not parse as its wire type ({e}): {v}"));
    assert_eq!(
        &serde_json::to_value(&typed).unwrap(),
        v,
        "{what}: the wire type does not say what the server sent"
    );
    typed
}

async fn call(
    c: &reqwest::Client,
    method: reqwest::Method,
    url: String,
    body: Option<Value>,
) -> (u16, Value) {
    let mut rb = c.request(method, url).bearer_auth(ADMIN);
    if let Some(b) = body {
        rb = rb.json(&b);
    }
    let r = rb.send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_is_its_wire_type() {
    use reqwest::Method as M;
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(dir.path(), &["--box", "bwrap"]);
    let c = http();
    let ws = |rest: &str| s.ws("acme", rest);

    let (st, v) = publish(
        &c,
        &s,
        ADMIN,
        "acme",
        "hello",
        0,
        versioned("hello", "v1", &[]),
    )
    .await;
    assert_eq!(st, 201, "{v}");
    round_trip::<api::Published>("publish", &v);
    let (_, v) = publish(
        &c,
        &s,
        ADMIN,
        "acme",
        "hello",
        1,
        versioned("hello", "v2", &[]),
    )
    .await;
    round_trip::<api::Published>("publish v2", &v);
    let (_, v) = get(&c, &ws("skills"), ADMIN).await;
    round_trip::<api::SkillList>("skills", &v);
    let (_, v) = get(&c, &ws("skills/hello"), ADMIN).await;
    round_trip::<api::SkillDetail>("skill", &v);
    let (_, v) = get(&c, &ws("skills/hello/revisions"), ADMIN).await;
    round_trip::<api::RevisionList>("revisions", &v);
    let (_, v) = get(&c, &ws("skills/hello/revisions/current"), ADMIN).await;
    round_trip::<api::RevisionDetail>("revision", &v);
    let (_, v) = call(
        &c,
        M::PUT,
        ws("skills/hello/current"),
        Some(json!({"revision": 1, "base_revision": 2})),
    )
    .await;
    round_trip::<api::CurrentMoved>("rollback", &v);

    let (st, v) = call(
        &c,
        M::POST,
        ws("drafts"),
        Some(json!({"skill": "hello", "base_revision": 1})),
    )
    .await;
    assert_eq!(st, 201, "{v}");
    let draft: api::DraftCreated = round_trip("draft", &v);
    let r = c
        .put(ws(&format!("drafts/{}/files/notes.txt", draft.draft_id)))
        .bearer_auth(ADMIN)
        .body("notes")
        .send()
        .await
        .unwrap();
    round_trip::<api::DraftFile>("draft file", &r.json().await.unwrap());
    let (_, v) = get(&c, &ws(&format!("drafts/{}", draft.draft_id)), ADMIN).await;
    round_trip::<api::DraftDetail>("draft detail", &v);
    let (_, v) = call(
        &c,
        M::POST,
        ws(&format!("drafts/{}/publish", draft.draft_id)),
        None,
    )
    .await;
    round_trip::<api::Published>("draft publish", &v);

    let (st, v) = call(&c, M::POST, ws("runs"), Some(json!({"skills": ["hello"]}))).await;
    assert_eq!(st, 201, "{v}");
    let run: api::RunView = round_trip("run", &v);
    let run = run.run_id;
    let (_, v) = call(
        &c,
        M::POST,
        ws(&format!("runs/{run}/activations")),
        Some(json!({"skill": "hello"})),
    )
    .await;
    round_trip::<api::Activation>("activation", &v);
    let (_, v) = get(&c, &ws(&format!("runs/{run}/prompt")), ADMIN).await;
    round_trip::<api::Prompt>("prompt", &v);
    let (_, v) = get(&c, &ws(&format!("runs/{run}")), ADMIN).await;
    round_trip::<api::RunView>("run detail", &v);
    let (_, v) = call(&c, M::POST, ws(&format!("runs/{run}/heartbeat")), None).await;
    round_trip::<api::RunView>("heartbeat", &v);
    let (_, v) = exec(
        &c,
        &s,
        &run,
        json!({"skill": "hello", "argv": ["./scripts/run.sh"]}),
    )
    .await;
    let answer: api::ExecAnswer = round_trip("exec", &v);
    // Current is revision 3: the draft of revision 1 (after the rollback) plus notes.txt.
    assert_eq!(answer.stdout.as_deref(), Some("I am v1\n"));
    let text = c
        .post(ws(&format!("runs/{run}/exec?stream=true")))
        .bearer_auth(ADMIN)
        .json(&json!({"command": "echo out; echo err >&2"}))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let lines: Vec<api::ExecStreamLine> = text
        .lines()
        .map(|l| round_trip("stream line", &serde_json::from_str(l).unwrap()))
        .collect();
    assert!(
        matches!(lines.last(), Some(api::ExecStreamLine::Exit(_))),
        "{text}"
    );
    let (st, v) = call(
        &c,
        M::POST,
        ws(&format!("runs/{run}/drafts")),
        Some(json!({"skill": "hello"})),
    )
    .await;
    assert_eq!(st, 201, "{v}");
    round_trip::<api::RunDraftCreated>("run draft", &v);

    let (_, v) = call(
        &c,
        M::POST,
        ws("skills/hello/revisions/1/revoke"),
        Some(json!({"reason": "test"})),
    )
    .await;
    round_trip::<api::Revoked>("revoke", &v);
    let (_, v) = call(&c, M::DELETE, ws(&format!("runs/{run}")), None).await;
    round_trip::<api::RunView>("finish", &v);
    let (_, v) = call(&c, M::DELETE, ws("skills/hello"), None).await;
    round_trip::<api::SkillDeleted>("delete", &v);

    let events = c
        .get(ws("events?follow=false"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let data: Vec<&str> = events
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .collect();
    assert!(data.len() >= 5, "{events}");
    for d in data {
        round_trip::<api::Event>("event", &serde_json::from_str(d.trim()).unwrap());
    }

    let (st, v) = call(
        &c,
        M::POST,
        format!("{}/v1/admin/tokens", s.url),
        Some(json!({"workspace": "acme", "role": "reader"})),
    )
    .await;
    assert_eq!(st, 201, "{v}");
    round_trip::<api::TokenCreated>("token", &v);
    let (_, v) = call(
        &c,
        M::POST,
        format!("{}/v1/admin/gc", s.url),
        Some(json!({"dry_run": true})),
    )
    .await;
    round_trip::<api::GcReport>("gc", &v);
    let (_, v) = call(&c, M::POST, format!("{}/v1/admin/fsck", s.url), None).await;
    round_trip::<api::FsckReport>("fsck", &v);
    let (_, v) = get(&c, &format!("{}/v1/whoami", s.url), ADMIN).await;
    round_trip::<api::WhoAmI>("whoami", &v);
    let (_, v) = get(&c, &format!("{}/healthz", s.url), ADMIN).await;
    round_trip::<api::Health>("healthz", &v);

    // Errors: the envelope, its code one of the codes, with the code's details.
    let (st, v) = publish(
        &c,
        &s,
        ADMIN,
        "acme",
        "other",
        3,
        versioned("other", "v1", &[]),
    )
    .await;
    let e: api::ErrorEnvelope = round_trip("error", &v);
    assert_eq!(
        api::ErrorCode::parse(&e.error.code).map(|c| c.status()),
        Some(st)
    );
    let (st, v) = get(&c, &ws("skills/nope"), ADMIN).await;
    let e: api::ErrorEnvelope = round_trip("error", &v);
    assert_eq!((st, e.error.code.as_str()), (404, "not_found"));
}
