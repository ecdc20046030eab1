//! Skill-level writes: the current pointer's rollback (compare-and-swap) and soft deletion.

use crate::Registry;
use crate::error::{RegistryError, Result};
use crate::meta::SkillRow;

impl Registry {
    /// Rollback: moves the pointer to `revision` when it is `base` now.
    pub async fn move_current(
        &self,
        workspace: &str,
        name: &str,
        revision: i64,
        base: i64,
    ) -> Result<()> {
        let skill = self.skill(workspace, name).await?;
        match self
            .meta
            .move_current(workspace, &skill, revision, base)
            .await?
        {
            None => {
                self.notify_change();
                Ok(())
            }
            Some(current_revision) => Err(RegistryError::RevisionConflict {
                current_revision,
                base_revision: base,
            }),
        }
    }

    pub async fn delete_skill(&self, workspace: &str, name: &str) -> Result<SkillRow> {
        let skill = self.skill(workspace, name).await?;
        if !self.meta.delete_skill(workspace, &skill).await? {
            return Err(RegistryError::NotFound(format!(
                "no skill {name:?} in workspace {workspace:?}"
            )));
        }
        self.notify_change();
        Ok(skill)
    }
}
