//! The web console (SPEC §10) at `/ui/`: one page of plain HTML, CSS and a JavaScript module,
//! embedded in the binary and speaking only the public HTTP API with the token the user
//! signs in with. The server gives it nothing the API does not: the console has no session
//! and no access of its own.

use crate::SharedState;
use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;

const INDEX: &str = include_str!("index.html");

/// The assets by name: (content type, body).
fn asset(name: &str) -> Option<(&'static str, &'static str)> {
    Some(match name {
        "" | "index.html" => ("text/html; charset=utf-8", INDEX),
        "app.js" => ("text/javascript; charset=utf-8", include_str!("app.js")),
        "style.css" => ("text/css; charset=utf-8", include_str!("style.css")),
        _ => return None,
    })
}

/// Skill content is untrusted: the page runs only its own script, loads nothing from elsewhere
/// and cannot be framed.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     connect-src 'self'; img-src 'self' data: blob:; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

fn answer(name: &str) -> Response {
    let Some((content_type, body)) = asset(name) else {
        return (StatusCode::NOT_FOUND, "no such console asset").into_response();
    };
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    // Assets change with the binary: revalidate rather than keep a stale console.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

/// `/ui` (to `/ui/`), `/ui/` and its assets; public, as the page holds no data.
pub fn router() -> Router<SharedState> {
    Router::new()
        .route("/ui", get(|| async { Redirect::permanent("/ui/") }))
        .route("/ui/", get(|| async { answer("") }))
        .route(
            "/ui/{asset}",
            get(|Path(name): Path<String>| async move { answer(&name) }),
        )
}
