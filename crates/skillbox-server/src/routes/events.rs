//! The event log as Server-Sent Events.

use crate::SharedState;
use crate::error::ApiResult;
use crate::extract::{ApiPath, ApiQuery};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use skillbox_api::{Event, EventsQuery};
use std::collections::VecDeque;
use std::time::Duration;

/// How long a follower waits for a change signal before asking the store again. On SQLite,
/// writers in other processes do not signal this one; on PostgreSQL every server is told of
/// every event (LISTEN/NOTIFY), so the poll is only a safety net.
const POLL: Duration = Duration::from_millis(500);
const POLL_WHEN_TOLD: Duration = Duration::from_secs(5);

/// Returns when the registry signals a change, or after the poll interval (changes that
/// this process is not told of are found by asking again).
pub(crate) async fn wait_for_change(
    s: &SharedState,
    changes: &mut tokio::sync::watch::Receiver<u64>,
) {
    let poll = if s.registry.hears_other_servers() {
        POLL_WHEN_TOLD
    } else {
        POLL
    };
    let _ = tokio::time::timeout(poll, changes.changed()).await;
}

/// The event log as SSE, resuming after `?after=SEQ` (or `Last-Event-ID`).
pub async fn stream(
    State(s): State<SharedState>,
    ApiPath(ws): ApiPath<String>,
    ApiQuery(q): ApiQuery<EventsQuery>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let last_event_id = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    struct Follower {
        s: SharedState,
        ws: String,
        after: i64,
        pending: VecDeque<Event>,
        changes: tokio::sync::watch::Receiver<u64>,
        follow: bool,
    }
    let init = Follower {
        changes: s.registry.subscribe(),
        s,
        ws,
        after: q.after.or(last_event_id).unwrap_or(0),
        pending: VecDeque::new(),
        follow: q.follow,
    };
    let stream = futures_util::stream::unfold(init, |mut st| async move {
        loop {
            if let Some(e) = st.pending.pop_front() {
                st.after = e.seq;
                let data = serde_json::to_string(&e).unwrap_or_default();
                let ev = SseEvent::default()
                    .id(e.seq.to_string())
                    .event(e.kind)
                    .data(data);
                return Some((Ok::<_, std::convert::Infallible>(ev), st));
            }
            match st
                .s
                .registry
                .meta()
                .events_after(&st.ws, st.after, 256)
                .await
            {
                Ok(batch) if !batch.is_empty() => st.pending.extend(batch),
                Ok(_) if !st.follow => return None,
                Ok(_) => wait_for_change(&st.s, &mut st.changes).await,
                Err(e) => {
                    tracing::warn!(error = %e, "event stream query failed");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    });
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response())
}
