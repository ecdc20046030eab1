//! The registry → box composition: a run's sandbox from its pins (mounts, workspace), the
//! box's errors in the API's terms, and the release of ended runs' sandboxes. Handlers and
//! background tasks use this instead of building sandboxes themselves.

use crate::AppState;
use crate::error::{ApiError, ApiResult};
use skillbox_api::ErrorCode;
use skillbox_box::{BoxError, BoxRuntime, Mount, Sandbox};
use skillbox_registry::{ExecContext, RegistryError};
use std::sync::Arc;

impl AppState {
    /// Whether executions can run: a local box, or execution nodes (`--box remote`).
    pub fn box_available(&self) -> bool {
        self.sandbox.is_some() || self.remote.is_some()
    }

    /// The running box, or `box_unavailable` saying what still works.
    pub fn running_box(&self) -> ApiResult<Arc<BoxRuntime>> {
        self.sandbox.clone().ok_or_else(|| {
            ApiError::new(
                ErrorCode::BoxUnavailable,
                "no sandbox backend is running (--box none): activation and reads work; execution and run drafts do not",
            )
        })
    }

    /// The run's sandbox with exactly its pinned packages mounted; `environment_of` is the
    /// mount path whose dependency environment is activated.
    pub fn run_sandbox(
        &self,
        run: &str,
        context: &ExecContext,
        environment_of: Option<String>,
    ) -> ApiResult<Sandbox> {
        let mounts = context
            .pinned
            .iter()
            .map(|p| {
                Ok(Mount {
                    target: p.mount_path(),
                    source: p.tree.clone(),
                    manifest: p.manifest.clone(),
                    digest: p.pin.digest.parse().map_err(
                        |e: skillbox_package::digest::BadDigest| ApiError::internal(e.to_string()),
                    )?,
                })
            })
            .collect::<ApiResult<_>>()?;
        Ok(Sandbox {
            mounts,
            environment_of,
            ..self.workspace_sandbox(run)
        })
    }

    /// The run's sandbox with no packages: for moving files in and out of its workspace.
    pub fn workspace_sandbox(&self, run: &str) -> Sandbox {
        Sandbox {
            id: run.to_string(),
            workspace_dir: Some(self.registry.data_dir().run_workspace(run)),
            mounts: vec![],
            binds: vec![],
            environment_of: None,
            network: false,
        }
    }

    /// Releases the sandboxes (workspace, prepared copies) of runs that are no longer active,
    /// except those with an execution in progress; returns how many were released.
    pub async fn release_sandboxes(&self, only: Option<&str>) -> usize {
        let Some(sandbox) = self.sandbox.clone() else {
            return 0;
        };
        let mut candidates: Vec<String> = match only {
            Some(run) => vec![run.to_string()],
            None => {
                let mut ids: Vec<String> = std::fs::read_dir(self.registry.data_dir().workspaces())
                    .map(|rd| {
                        rd.flatten()
                            .map(|e| {
                                let name = e.file_name().to_string_lossy().into_owned();
                                skillbox_box::workspace::workspace_of_entry(&name).to_string()
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                ids.extend(sandbox.backend.sandboxes());
                ids
            }
        };
        candidates.sort();
        candidates.dedup();
        let mut released = 0;
        for run in candidates {
            match self.registry.run_is_live(&run).await {
                Ok(false) => {}
                Ok(true) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot check a run's state; keeping its sandbox");
                    continue;
                }
            }
            let (b, dir) = (
                sandbox.clone(),
                self.registry.data_dir().run_workspace(&run),
            );
            let id = run.clone();
            match tokio::task::spawn_blocking(move || b.release(&id, &dir)).await {
                Ok(Ok(true)) => released += 1,
                Ok(Ok(false)) => {}
                Ok(Err(e)) => tracing::warn!(%run, error = %e, "cannot release a sandbox"),
                Err(e) => tracing::warn!(%run, error = %e, "sandbox release task failed"),
            }
        }
        released
    }
}

/// The box's errors in the API's terms.
pub fn box_error(e: BoxError) -> ApiError {
    match e {
        BoxError::BadRequest(m) => ApiError::bad_request(m),
        BoxError::Missing(m) => ApiError::new(ErrorCode::NotFound, m),
        BoxError::TooLarge(m) => ApiError::new(ErrorCode::TooLarge, m),
        BoxError::Unavailable(m) => ApiError::new(ErrorCode::BoxUnavailable, m),
        BoxError::Dependencies(m) => ApiError::new(ErrorCode::DependencyBuildFailed, m),
        BoxError::SpecialFiles(paths) => RegistryError::InvalidPackage {
            problems: paths
                .into_iter()
                .map(|p| {
                    skillbox_package::Problem::at_path(
                        p,
                        "only regular files and directories are allowed (this is a socket)",
                    )
                })
                .collect(),
            warnings: vec![],
        }
        .into(),
        BoxError::Io(e) => ApiError::internal(format!("sandbox: {e}")),
    }
}
