//! Emergency revocation (SPEC §4): reads, activations and executions of the revision fail
//! with `revision_revoked` at once on every process (the pin caches are invalidated), running
//! executions are killed (the box listens to [`Registry::subscribe_revocations`]), and its
//! tree leaves the revision cache unless another available revision shares it.

use crate::Registry;
use crate::error::{RegistryError, Result};
use crate::meta::{RevisionState, Revocation, now_ms};
use skillbox_api::Revoked;
use skillbox_package::Digest;

impl Registry {
    /// Revokes one revision; if it was current the pointer falls back to the newest available
    /// older revision (or none), by compare-and-swap. Revoking a revoked revision answers
    /// as the first revocation did.
    pub async fn revoke(
        &self,
        workspace: &str,
        name: &str,
        revision: i64,
        reason: &str,
    ) -> Result<Revoked> {
        let skill = self.skill(workspace, name).await?;
        let outcome = self
            .meta
            .revoke(workspace, &skill, revision, reason, now_ms())
            .await?;
        let (digest, reason, current_revision) = match outcome {
            Revocation::AlreadyRevoked {
                digest,
                reason,
                current_revision,
            } => (digest, reason, current_revision),
            Revocation::Revoked {
                digest,
                current_revision,
                tree_shared,
            } => {
                if !tree_shared {
                    let d: Digest = digest.parse().map_err(RegistryError::internal)?;
                    self.cache.remove(&d)?;
                }
                self.pin_cache.bump();
                self.notify_change();
                let _ = self.revocations.send((skill.id.clone(), revision));
                tracing::warn!(
                    workspace,
                    skill = name,
                    revision,
                    reason,
                    "revision revoked"
                );
                (digest, reason.to_string(), current_revision)
            }
        };
        Ok(Revoked {
            skill: name.into(),
            skill_id: skill.id,
            revision,
            digest,
            state: RevisionState::Revoked,
            reason,
            current_revision,
        })
    }
}
