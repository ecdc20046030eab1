//! Extractors whose rejections answer in the SPEC envelope: axum's own (`Json`, `Query`,
//! `Path`) answer plain text (and 415 or 422) for a malformed body, a missing
//! `Content-Type`, a bad query value or a body over the limit. Every handler takes these
//! instead, so every rejection is `bad_request` (400) naming what was wrong, or `too_large`
//! (413).

use crate::error::ApiError;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;
use skillbox_api::ErrorCode;

/// A rejection of the framework's, in the envelope.
fn rejected(status: StatusCode, text: String) -> ApiError {
    match status {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::new(ErrorCode::TooLarge, text),
        s if s.is_server_error() => ApiError::internal(text),
        _ => ApiError::bad_request(text),
    }
}

/// A JSON body (`Content-Type: application/json`).
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(v)) => Ok(ApiJson(v)),
            Err(r) => Err(rejected(r.status(), r.body_text())),
        }
    }
}

/// An optional JSON body (`Option<ApiJson<T>>`): no body is `None`; a body is JSON, with
/// `Content-Type: application/json`, or refused.
impl<T: DeserializeOwned, S: Send + Sync> axum::extract::OptionalFromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Option<Self>, Self::Rejection> {
        let json_type = req
            .headers()
            .get(axum::http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| {
                let mime = ct.split(';').next().unwrap_or("").trim();
                mime == "application/json" || mime.ends_with("+json")
            });
        let bytes = match axum::body::Bytes::from_request(req, state).await {
            Ok(b) => b,
            Err(r) => return Err(rejected(r.status(), r.body_text())),
        };
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(None);
        }
        if !json_type {
            return Err(ApiError::bad_request(
                "the body must be JSON, sent with Content-Type: application/json",
            ));
        }
        match axum::Json::<T>::from_bytes(&bytes) {
            Ok(axum::Json(v)) => Ok(Some(ApiJson(v))),
            Err(r) => Err(rejected(r.status(), r.body_text())),
        }
    }
}

/// Query parameters.
pub struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(v)) => Ok(ApiQuery(v)),
            Err(r) => Err(rejected(r.status(), r.body_text())),
        }
    }
}

/// Path parameters.
pub struct ApiPath<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(v)) => Ok(ApiPath(v)),
            Err(r) => Err(rejected(r.status(), r.body_text())),
        }
    }
}
