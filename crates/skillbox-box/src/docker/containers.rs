//! Containers and volumes: the mount-set signature, creation, adoption after a restart, the
//! reaping of retired containers, and removal.

use super::*;

/// What the signature covers: every package (target, digest, ro), every other bind (target,
/// source, mode), the image, the network flag and the workspace.
/// In copy mode packages are not part of the container (they are prepared into its volume),
/// so they are not part of the signature either.
pub(super) fn signature(sandbox: &Sandbox, image_id: &str, bound_packages: bool) -> String {
    let mut lines: Vec<String> = sandbox
        .mounts
        .iter()
        .filter(|_| bound_packages)
        .map(|m| format!("pkg {} {} ro", m.target, m.digest))
        .chain(sandbox.binds.iter().map(|b| {
            format!(
                "bind {} {} {}",
                b.target,
                b.source,
                if b.writable { "rw" } else { "ro" }
            )
        }))
        .collect();
    lines.sort();
    lines.push(format!("image {image_id}"));
    lines.push(format!("network {}", sandbox.network));
    lines.push(format!("workspace {}", sandbox.workspace_dir.is_some()));
    Sha256::of(lines.join("\n").as_bytes()).to_hex()
}

pub(super) fn volume_name(sandbox: &str) -> String {
    format!("skillbox-ws-{sandbox}")
}

/// Copy mode: the volume the sandbox's packages are prepared into (mounted at `/skills`).
pub(super) fn packages_volume(sandbox: &str) -> String {
    format!("skillbox-pk-{sandbox}")
}

/// Force-removes a container (running or not); a failure is logged.
pub(super) async fn remove_container(engine: &Engine, id: &str) {
    let r = engine
        .remove_container(
            id,
            Some(bollard::query_parameters::RemoveContainerOptions {
                force: true,
                ..Default::default()
            }),
        )
        .await;
    if let Err(e) = r {
        tracing::warn!(container = %id, error = %e, "cannot remove a sandbox container");
    }
}

/// Removes a volume; one that is already gone is not an error.
pub(super) async fn remove_volume(
    engine: &Engine,
    name: &str,
) -> Result<(), bollard::errors::Error> {
    match engine
        .remove_volume(
            name,
            Some(bollard::query_parameters::RemoveVolumeOptions { force: true }),
        )
        .await
    {
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => Ok(()),
        other => other,
    }
}

/// The named volume `volume` mounted at `target`.
fn volume_mount(volume: &str, target: &str, writable: bool) -> EngineMount {
    EngineMount {
        target: Some(target.into()),
        source: Some(volume.into()),
        typ: Some(MountType::VOLUME),
        read_only: Some(!writable),
        ..Default::default()
    }
}

impl Docker {
    /// Containers of this owner, by id, with their labels.
    pub(super) async fn owned(
        &self,
    ) -> Result<Vec<(String, HashMap<String, String>, String)>, BoxError> {
        let filters = HashMap::from([(
            "label".to_string(),
            vec![format!("{LABEL_OWNER}={}", self.cfg.owner)],
        )]);
        let list = self
            .engine
            .list_containers(Some(bollard::query_parameters::ListContainersOptions {
                all: true,
                filters: Some(filters),
                ..Default::default()
            }))
            .await
            .map_err(|e| engine_error("listing containers", e))?;
        Ok(list
            .into_iter()
            .filter_map(|c| {
                Some((
                    c.id?,
                    c.labels.unwrap_or_default(),
                    c.image_id.unwrap_or_default(),
                ))
            })
            .collect())
    }

    /// Restart recovery: adopt consistent, running containers of the configured image; remove
    /// the rest unless an exec is still running in them.
    pub(super) async fn recover(&self) -> Result<(), BoxError> {
        for (id, labels, image_id) in self.owned().await? {
            let sandbox = labels.get(LABEL_SANDBOX).cloned().unwrap_or_default();
            let packages = labels
                .get(LABEL_PACKAGES)
                .and_then(|p| serde_json::from_str::<Vec<(String, String)>>(p).ok());
            let internal = labels.contains_key(LABEL_INTERNAL);
            let consistent =
                packages.is_some() && !sandbox.is_empty() && !internal && image_id == self.image_id;
            let running = self.is_running(&id).await;
            if consistent && running {
                let signature = labels.get(LABEL_SIGNATURE).cloned().unwrap_or_default();
                tracing::info!(container = %id, %sandbox, "adopted a sandbox container");
                if self.cfg.copy_mode {
                    // Uploads abandoned by the previous process.
                    let swept = self
                        .command(
                            &id,
                            "0:0",
                            "chmod -R u+w /skills/.staging 2>/dev/null; rm -rf /skills/.staging",
                            BTreeMap::new(),
                            vec![],
                        )
                        .await;
                    if let Err(e) = swept {
                        tracing::warn!(container = %id, error = %e, "cannot sweep abandoned staging");
                    }
                }
                self.known.lock().map_err(poisoned)?.insert(sandbox.clone());
                self.containers.lock().map_err(poisoned)?.insert(
                    id,
                    Container {
                        sandbox,
                        signature,
                        packages: sorted(packages.unwrap_or_default()),
                        leases: 0,
                        retired: false,
                    },
                );
            } else if !self.exec_running(&id).await {
                tracing::warn!(container = %id, "removing an inconsistent or stopped sandbox container");
                self.remove_container(&id).await;
            }
        }
        Ok(())
    }

    pub(super) async fn is_running(&self, container: &str) -> bool {
        self.engine
            .inspect_container(container, None)
            .await
            .ok()
            .and_then(|c| c.state.and_then(|s| s.running))
            .unwrap_or(false)
    }

    pub(super) async fn exec_running(&self, container: &str) -> bool {
        let Ok(c) = self.engine.inspect_container(container, None).await else {
            return false;
        };
        for exec in c.exec_ids.unwrap_or_default() {
            if let Ok(e) = self.engine.inspect_exec(&exec).await
                && e.running == Some(true)
            {
                return true;
            }
        }
        false
    }

    pub(super) async fn remove_container(&self, id: &str) {
        remove_container(&self.engine, id).await
    }

    pub(super) async fn create(
        &self,
        sandbox: &Sandbox,
        signature: &str,
    ) -> Result<String, BoxError> {
        let mut mounts: Vec<EngineMount> = sandbox
            .mounts
            .iter()
            .filter(|_| !self.cfg.copy_mode)
            .map(|m| self.bind(&m.source, &m.target, false))
            .collect();
        for b in &sandbox.binds {
            mounts.push(match &b.source {
                crate::BindSource::Host(p) => self.bind(p, &b.target, b.writable),
                crate::BindSource::Volume(v) => volume_mount(v, &b.target, b.writable),
            });
        }
        let mut labels = HashMap::from([
            (LABEL_OWNER.to_string(), self.cfg.owner.clone()),
            (LABEL_SANDBOX.to_string(), sandbox.id.clone()),
            (LABEL_SIGNATURE.to_string(), signature.to_string()),
            (
                LABEL_LEASE.to_string(),
                format!("pid-{}", std::process::id()),
            ),
        ]);
        if sandbox.workspace_dir.is_none() {
            labels.insert(LABEL_INTERNAL.to_string(), "true".to_string());
        }
        let packages = package_list(sandbox);
        labels.insert(
            LABEL_PACKAGES.to_string(),
            serde_json::to_string(&packages).unwrap_or_default(),
        );
        if self.cfg.copy_mode {
            let volume = packages_volume(&sandbox.id);
            self.create_volume(&volume, &sandbox.id).await?;
            mounts.push(volume_mount(&volume, "/skills", true));
        }
        if let Some(dir) = &sandbox.workspace_dir {
            let volume = volume_name(&sandbox.id);
            self.create_workspace_volume(&volume, &sandbox.id, dir)
                .await?;
            mounts.push(volume_mount(&volume, "/workspace", true));
        }
        let host = HostConfig {
            mounts: Some(mounts),
            readonly_rootfs: Some(true),
            tmpfs: Some(HashMap::from([(
                "/tmp".to_string(),
                format!("rw,nosuid,nodev,size={}", self.cfg.tmp_bytes),
            )])),
            network_mode: Some(if sandbox.network { "bridge" } else { "none" }.into()),
            cap_drop: Some(vec!["ALL".into()]),
            security_opt: Some(vec!["no-new-privileges".into()]),
            pids_limit: Some(self.cfg.pids),
            memory: Some(self.cfg.memory_bytes),
            nano_cpus: Some(self.cfg.nano_cpus),
            init: Some(true),
            ..Default::default()
        };
        let body = ContainerCreateBody {
            image: Some(self.cfg.image.clone()),
            cmd: Some(vec!["sleep".into(), "infinity".into()]),
            user: Some(format!("{0}:{0}", self.cfg.uid)),
            labels: Some(labels),
            host_config: Some(host),
            network_disabled: Some(!sandbox.network),
            ..Default::default()
        };
        let created = self
            .engine
            .create_container(
                None::<bollard::query_parameters::CreateContainerOptions>,
                body,
            )
            .await
            .map_err(|e| engine_error("creating a sandbox container", e))?;
        if let Err(e) = self.engine.start_container(&created.id, None).await {
            self.remove_container(&created.id).await;
            return Err(engine_error("starting a sandbox container", e));
        }
        // A fresh volume's root belongs to root; the sandbox user writes into the writable
        // ones (environment builds). Root owns it, so it may chmod it without capabilities.
        for b in sandbox.binds.iter().filter(|b| b.writable) {
            if let crate::BindSource::Volume(_) = b.source {
                let r = self
                    .command(
                        &created.id,
                        "0:0",
                        r#"chmod 0777 "$T""#,
                        BTreeMap::from([("T".to_string(), b.target.clone())]),
                        vec![],
                    )
                    .await?;
                if r.exit_code != Some(0) {
                    self.remove_container(&created.id).await;
                    return Err(BoxError::Unavailable(format!(
                        "docker: cannot open {} to the sandbox user: {}",
                        b.target,
                        r.failure()
                    )));
                }
            }
        }
        Ok(created.id)
    }

    /// A bind mount; read-only ones are made recursively read-only where the engine can
    /// (API ≥ 1.44 fails rather than silently downgrading). Package trees have no submounts,
    /// so on older engines a plain read-only bind is read-only all the way down.
    pub(super) fn bind(&self, source: &Path, target: &str, writable: bool) -> EngineMount {
        EngineMount {
            target: Some(target.to_string()),
            source: Some(source.display().to_string()),
            typ: Some(MountType::BIND),
            read_only: Some(!writable),
            bind_options: (!writable && self.recursive_read_only()).then(|| {
                bollard::models::MountBindOptions {
                    read_only_force_recursive: Some(true),
                    ..Default::default()
                }
            }),
            ..Default::default()
        }
    }

    pub(super) async fn create_volume(&self, name: &str, sandbox: &str) -> Result<(), BoxError> {
        self.create_volume_with(name, sandbox, None).await
    }

    pub(super) async fn create_volume_with(
        &self,
        name: &str,
        sandbox: &str,
        driver_opts: Option<HashMap<String, String>>,
    ) -> Result<(), BoxError> {
        self.engine
            .create_volume(bollard::models::VolumeCreateRequest {
                name: Some(name.to_string()),
                labels: Some(HashMap::from([
                    (LABEL_OWNER.to_string(), self.cfg.owner.clone()),
                    (LABEL_SANDBOX.to_string(), sandbox.to_string()),
                ])),
                driver_opts,
                ..Default::default()
            })
            .await
            .map_err(|e| engine_error("creating a volume", e))?;
        Ok(())
    }

    /// The workspace volume. With a quota it is the ext4 image beside the workspace's host
    /// directory, on a loop device (the engine's local driver mounts a block device but not an
    /// image file); a volume left on another device (the host restarted since) is made anew
    /// on the same image, so the workspace's files survive.
    pub(super) async fn create_workspace_volume(
        &self,
        name: &str,
        sandbox: &str,
        dir: &Path,
    ) -> Result<(), BoxError> {
        if self.cfg.workspace_bytes == 0 {
            return self.create_volume(name, sandbox).await;
        }
        let (image, bytes, uid) = (
            crate::workspace::image_path(dir),
            self.cfg.workspace_bytes,
            self.cfg.uid,
        );
        let device = tokio::task::spawn_blocking(move || {
            crate::workspace::make_image(&image, bytes, uid)?;
            crate::workspace::attach(&image)
        })
        .await
        .map_err(|e| BoxError::Unavailable(format!("workspace image task failed: {e}")))??;
        if let Ok(v) = self.engine.inspect_volume(name).await {
            let current = v.options.get("device").cloned().unwrap_or_default();
            if current == device {
                return Ok(());
            }
            remove_volume(&self.engine, name)
                .await
                .map_err(|e| engine_error("replacing a workspace volume", e))?;
        }
        let opts = HashMap::from([
            ("type".to_string(), "ext4".to_string()),
            ("device".to_string(), device),
            ("o".to_string(), "nosuid,nodev".to_string()),
        ]);
        self.create_volume_with(name, sandbox, Some(opts)).await
    }

    /// Removes containers that are retired and unleased.
    pub(super) async fn reap(&self) {
        let idle: Vec<String> = match self.containers.lock() {
            Ok(mut c) => {
                let ids: Vec<String> = c
                    .iter()
                    .filter(|(_, e)| e.retired && e.leases == 0)
                    .map(|(id, _)| id.clone())
                    .collect();
                for id in &ids {
                    c.remove(id);
                }
                ids
            }
            Err(_) => return,
        };
        for id in idle {
            self.remove_container(&id).await;
        }
    }
}
