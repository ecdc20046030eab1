//! Authentication and authorization as one check: every route's [`Access`] (from the route
//! table) is enforced by [`check`] before its handler runs, and the handler receives the
//! authorized [`Caller`].

use crate::SharedState;
use crate::error::{ApiError, ApiResult};
use axum::RequestExt;
use axum::extract::{FromRequestParts, RawPathParams, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use skillbox_api::ErrorCode;
use skillbox_registry::{Principal, Role};

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone, without a token.
    Public,
    /// Any valid token.
    AnyToken,
    /// A token of the path's workspace `{ws}` with at least this role (or the admin token).
    Workspace(Role),
    /// The server's admin token only.
    ServerAdmin,
    /// An execution node's token only (SPEC §7.3).
    Node,
}

impl Access {
    /// The role as the OpenAPI document names it (`x-skillbox-role`).
    pub fn label(self) -> Option<&'static str> {
        match self {
            Access::Public => None,
            Access::AnyToken => Some("any"),
            Access::Workspace(role) => Some(role.as_str()),
            Access::ServerAdmin => Some("server-admin"),
            Access::Node => Some("node"),
        }
    }
}

/// The authorized caller of a request.
#[derive(Debug, Clone)]
pub struct Caller(pub Principal);

impl Caller {
    /// A short description for `publisher` fields and logs.
    pub fn label(&self) -> String {
        self.0.label()
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<Caller>()
            .cloned()
            .ok_or_else(|| ApiError::internal("this route has no access check"))
    }
}

/// The access check of a route: authenticates the bearer token, authorizes it for `access`,
/// and hands the handler its [`Caller`].
pub async fn check(
    State(state): State<SharedState>,
    access: Access,
    mut req: Request,
    next: Next,
) -> Response {
    let workspace = match req.extract_parts::<RawPathParams>().await {
        Ok(params) => params
            .iter()
            .find(|(name, _)| *name == "ws")
            .map(|(_, value)| value.to_string()),
        Err(_) => None,
    };
    match authorize(&state, req.headers(), access, workspace.as_deref()).await {
        Ok(Some(caller)) => {
            req.extensions_mut().insert(caller);
            next.run(req).await
        }
        Ok(None) => next.run(req).await,
        Err(e) => e.into_response(),
    }
}

async fn authorize(
    state: &crate::AppState,
    headers: &HeaderMap,
    access: Access,
    workspace: Option<&str>,
) -> ApiResult<Option<Caller>> {
    if access == Access::Public {
        return Ok(None);
    }
    let principal = principal(state, headers).await?;
    match access {
        Access::Public | Access::AnyToken => {}
        Access::ServerAdmin => {
            if principal != Principal::ServerAdmin {
                return Err(ApiError::new(
                    ErrorCode::Forbidden,
                    "this needs the server's admin token",
                ));
            }
        }
        Access::Node => {
            if !matches!(principal, Principal::Node { .. }) {
                return Err(ApiError::new(
                    ErrorCode::Forbidden,
                    "this needs a node token (POST /v1/admin/tokens {\"role\": \"node\"})",
                ));
            }
        }
        // A node reads no workspace by name.
        Access::Workspace(_) if matches!(principal, Principal::Node { .. }) => {
            return Err(ApiError::new(
                ErrorCode::Forbidden,
                "a node token cannot use workspace routes",
            ));
        }
        Access::Workspace(needed) => {
            let ws =
                workspace.ok_or_else(|| ApiError::internal("a workspace route without {ws}"))?;
            if !skillbox_package::is_valid_name(ws) {
                return Err(ApiError::bad_request(format!(
                    "invalid workspace name {:?}: 1-64 characters of a-z, 0-9 and single hyphens",
                    truncated(ws, 80)
                )));
            }
            // A token of another workspace learns nothing: `not_found`.
            if let Principal::Workspace { workspace, role } = &principal {
                if workspace != ws {
                    return Err(ApiError::new(
                        ErrorCode::NotFound,
                        format!("no workspace {ws:?}"),
                    ));
                }
                if *role < needed {
                    return Err(ApiError::new(
                        ErrorCode::Forbidden,
                        format!(
                            "this needs the {} role; the token has {}",
                            needed.as_str(),
                            role.as_str()
                        ),
                    ));
                }
            }
        }
    }
    Ok(Some(Caller(principal)))
}

async fn principal(state: &crate::AppState, headers: &HeaderMap) -> ApiResult<Principal> {
    let value = headers.get(header::AUTHORIZATION).ok_or_else(|| {
        ApiError::new(
            ErrorCode::Unauthorized,
            "missing Authorization: Bearer <token>",
        )
    })?;
    let token = value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| {
            ApiError::new(
                ErrorCode::Unauthorized,
                "Authorization must be 'Bearer <token>'",
            )
        })?;
    state
        .registry
        .authenticate(token, &state.cfg.admin_token)
        .await?
        .ok_or_else(|| ApiError::new(ErrorCode::Unauthorized, "unknown token"))
}

/// At most `max` characters of `s` (an echoed input stays short).
pub fn truncated(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}
