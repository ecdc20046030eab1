//! The HTTP server (axum): the API of SPEC §5. Handlers are thin — parse, call
//! `skillbox-registry`, answer with a `skillbox-api` type; all logic lives in the registry.
//!
//! - [`routes`]: the route table (router, access, OpenAPI from one list) and the handlers, one
//!   file per concern;
//! - [`auth`]: the one access check every route passes, yielding the [`auth::Caller`];
//! - [`sandbox`]: the registry → box composition (a run's sandbox from its pins);
//! - [`error`]: the error envelope; [`extract`]: extractors whose rejections use it;
//! - [`metrics`], [`openapi`]: `/metrics` and `/openapi.json`.
//!
//! - no global lock on the request path: every handler works on its own workspace's rows,
//!   and the registry's write transactions are short;
//! - request size limits (uploads are streamed to disk with a byte cap), a request timeout,
//!   graceful shutdown;
//! - `/healthz`, Prometheus `/metrics`, `/openapi.json` from the route table in [`openapi`].

pub mod auth;
mod connection_threads;
pub mod console;
pub mod error;
pub mod extract;
pub mod metrics;
pub mod node;
pub mod openapi;
pub mod remote;
pub mod routes;
pub mod sandbox;
mod zero_copy_io;

use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use skillbox_registry::Registry;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Server settings beyond the registry's.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub admin_token: String,
    /// Largest accepted upload body, in bytes.
    pub max_upload_bytes: u64,
    pub request_timeout: Duration,
    /// Default grace period of garbage collection.
    pub gc_grace: Duration,
    /// A node whose last heartbeat is older than this is `lost` (SPEC §7.3).
    pub node_timeout: Duration,
    pub connections: ConnectionLimits,
}

/// What one client may hold of the server's connections.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Connections open at once; more wait in the listen backlog.
    pub max_connections: usize,
    /// Longest a client may take to send a request's headers (and to start the next request
    /// on a kept-alive connection).
    pub header_timeout: Duration,
    /// Threads that serve connections, each its own single-threaded runtime (see
    /// `connection_threads`); 0 serves them on the caller's runtime.
    pub threads: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: 4096,
            header_timeout: Duration::from_secs(10),
            threads: 0,
        }
    }
}

pub struct AppState {
    pub registry: Arc<Registry>,
    /// The sandbox runtime; `None` with `--box none` and `--box remote`.
    pub sandbox: Option<Arc<skillbox_box::BoxRuntime>>,
    /// `--box remote`: executions go to execution nodes.
    pub remote: Option<remote::RemoteBox>,
    pub cfg: ServerConfig,
    pub metrics: metrics::Metrics,
}

pub type SharedState = Arc<AppState>;

/// The application router.
pub fn router(state: SharedState) -> Router {
    router_with(state, Router::new())
}

/// The application router with `mounted` routes beside [`routes::ROUTES`] (services the
/// binary builds, such as the MCP endpoint): observed and timed like every route, each behind
/// the access check it puts on itself ([`routes::mount`]).
pub fn router_with(state: SharedState, mounted: Router<SharedState>) -> Router {
    routes::router(&state)
        .merge(mounted)
        .layer(axum::middleware::from_fn_with_state(state.clone(), observe))
        .with_state(state)
}

/// Records metrics and logs, and bounds the time to produce response headers.
async fn observe(State(state): State<SharedState>, req: Request, next: Next) -> Response {
    let start = Instant::now();
    // Neither allocates: a standard method is a constant, a matched path an `Arc<str>`.
    let method = req.method().clone();
    let matched = req.extensions().get::<MatchedPath>().cloned();
    let route = matched.as_ref().map_or("unmatched", MatchedPath::as_str);
    let response = match tokio::time::timeout(state.cfg.request_timeout, next.run(req)).await {
        Ok(r) => r,
        Err(_) => error::ApiError::new(
            skillbox_api::ErrorCode::Timeout,
            format!("request took longer than {:?}", state.cfg.request_timeout),
        )
        .into_response(),
    };
    let ms = start.elapsed().as_secs_f64() * 1000.0;
    let status = response.status().as_u16();
    state.metrics.observe(method.as_str(), route, status, ms);
    tracing::info!(target: "skillbox::http", %method, route, status, ms, "request");
    response
}

/// Background upkeep: marks lapsed leases expired every `sweep`, collects garbage every
/// `gc_every` (if set). Runs until the process ends.
pub fn spawn_upkeep(state: SharedState, sweep: Duration, gc_every: Option<Duration>) {
    let s = state.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(sweep);
        loop {
            tick.tick().await;
            match s.registry.expire_runs().await {
                Ok(0) => {}
                Ok(n) => tracing::info!(runs = n, "leases expired"),
                Err(e) => tracing::warn!(error = %e, "lease sweep failed"),
            }
            let released = s.release_sandboxes(None).await + remote::release_ended(&s).await;
            if released > 0 {
                tracing::info!(sandboxes = released, "released the sandboxes of ended runs");
            }
        }
    });
    if let Some(every) = gc_every {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.tick().await;
            loop {
                tick.tick().await;
                if let Err(e) = state.registry.gc(false, state.cfg.gc_grace).await {
                    tracing::warn!(error = %e, "scheduled garbage collection failed");
                }
            }
        });
    }
}

/// Kills executions that mount a revision as soon as it is revoked, and removes its prepared
/// copies.
pub fn spawn_revocation_killer(state: SharedState) {
    let Some(sandbox) = state.sandbox.clone() else {
        return;
    };
    let mut rx = state.registry.subscribe_revocations();
    tokio::spawn(async move {
        loop {
            match rx.recv().await {
                Ok((skill_id, revision)) => {
                    let target = skillbox_registry::runs::mount_path(&skill_id, revision);
                    let killed = sandbox.executions.kill_mounting(&target);
                    if killed > 0 {
                        tracing::warn!(%target, killed, "killed executions of a revoked revision");
                    }
                    if let Err(e) = sandbox.backend.discard(&target).await {
                        tracing::warn!(%target, error = %e, "cannot remove prepared copies of a revoked revision");
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                    tracing::error!(missed = n, "revocation notices lagged");
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
            }
        }
    });
}

/// How long a shutdown waits for open connections to finish.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Serves until `shutdown` resolves, then drains in-flight requests (at most
/// [`DRAIN_TIMEOUT`]).
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    limits: ConnectionLimits,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // Every open connection holds a permit: past the bound, new connections wait in the
    // listen backlog instead of costing a task and buffers each.
    let permits = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut shutdown = std::pin::pin!(shutdown);
    let threads = match limits.threads {
        0 => None,
        n => Some(connection_threads::ConnectionThreads::start(n)?),
    };
    let here = tokio::runtime::Handle::current();
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            _ = &mut shutdown => break,
        };
        let (stream, _peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // Out of descriptors, say: wait rather than spin.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let mut stop = stop_rx.clone();
        // The socket leaves this reactor as a std socket and is registered on the reactor of
        // the runtime that serves it (once per connection, not per request).
        let target = threads.as_ref().map_or(&here, |t| t.next());
        let stream = match stream.into_std() {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "handing a connection over failed");
                continue;
            }
        };
        let task = async move {
            let _permit = permit;
            let stream = match tokio::net::TcpStream::from_std(stream) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "registering a connection on its runtime failed");
                    return;
                }
            };
            // A client that does not finish its request headers in time is dropped
            // (slowloris); so is one idle between requests for as long.
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .serve_connection(zero_copy_io::ZeroCopyIo::new(stream), service)
                .with_upgrades();
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = async { let _ = stop.wait_for(|s| *s).await; } => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        };
        drop(target.spawn(task));
    }
    drop(listener);
    let _ = stop_tx.send(true);
    // In-flight requests finish: every connection task returns its permit. Long-lived
    // answers (event streams, MCP sessions' streams) would hold theirs forever, so the drain
    // is bounded; what it cuts off is crash-safe like a `kill -9`.
    let drained = tokio::time::timeout(
        DRAIN_TIMEOUT,
        permits.acquire_many(limits.max_connections.max(1) as u32),
    )
    .await;
    if drained.is_err() {
        tracing::warn!(
            open = limits.max_connections.max(1) - permits.available_permits(),
            "shutting down with connections still open after {DRAIN_TIMEOUT:?}"
        );
    }
    Ok(())
}
