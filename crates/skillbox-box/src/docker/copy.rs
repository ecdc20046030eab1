//! Copy mode: packages uploaded into a per-sandbox volume at `/skills`, verified and sealed
//! inside the container (`READY` markers last), and the list of what is prepared.

use super::*;

/// Copy mode: where the ready marker of `target` is (`target digest`, written last).
pub(super) const READY_DIR: &str = "/skills/.ready";

/// Verifies the staged package in `$S` against the manifest on stdin (`<hex>  ./<path>`
/// lines, then `x ./<path>` lines naming the executables): every file's SHA-256, no file
/// missing or extra, nothing but files and directories, the executable bits. Then makes it
/// read-only, moves anything at `$T` aside (never changed in place), renames it into place and
/// writes the ready marker last.
pub(super) const PREPARE_SCRIPT: &str = r#"set -e
m=/tmp/.skillbox-m.$$
cat > "$m"
cd "$S"
grep -v '^x ' "$m" > "$m.sha" || true
sha256sum -c --quiet --strict "$m.sha" >/dev/null 2>&1 || { echo "content differs from the manifest" >&2; exit 4; }
find . -type f | sort > "$m.have"
sed 's/^[0-9a-f]*  //' "$m.sha" | sort > "$m.want"
cmp -s "$m.have" "$m.want" || { echo "files differ from the manifest" >&2; exit 4; }
[ -z "$(find . ! -type f ! -type d)" ] || { echo "not only files and directories" >&2; exit 4; }
find . -type f -perm -u+x | sort > "$m.xhave"
{ grep '^x ' "$m" || true; } | sed 's/^x //' | sort > "$m.xwant"
cmp -s "$m.xhave" "$m.xwant" || { echo "executable bits differ from the manifest" >&2; exit 4; }
# Files read-only; directories stay writable by their owner (root) only, which a rename
# across directories needs (it rewrites the directory's `..`).
find . -type f -exec chmod a-w {} +
chmod -R go-w .
cd /
mkdir -p "$(dirname "$T")" "$READY_DIR"
rm -f "$READY_DIR/$K"
if [ -e "$T" ]; then a="/skills/.stale-$$"; mv "$T" "$a"; chmod -R u+w "$a"; rm -rf "$a"; fi
mv "$S" "$T"
echo "$T $D" > "$READY_DIR/$K.tmp"
mv "$READY_DIR/$K.tmp" "$READY_DIR/$K"
rm -f "$m" "$m".*
"#;

/// Lists the ready packages (`<target> <digest>` from the markers) and re-verifies each one
/// named on stdin (`<target>\t<hex>\t<path>` lines) against its manifest: prints `ok <target>
/// <digest>` for a verified one, `extra <target> <digest>` for a marker outside the list.
pub(super) const PREPARED_SCRIPT: &str = r#"m=/tmp/.skillbox-v.$$
cat > "$m"
for f in "$READY_DIR"/*; do
  [ -f "$f" ] || continue
  read -r t d < "$f" || continue
  if ! grep -q "^$t	" "$m"; then echo "extra $t $d"; continue; fi
  grep "^$t	" "$m" | awk -F'	' '{print $2"  ./"$3}' > "$m.sha"
  ( cd "$t" 2>/dev/null && sha256sum -c --quiet --strict "$m.sha" >/dev/null 2>&1     && [ "$(find . -type f | wc -l)" = "$(wc -l < "$m.sha")" ] ) && echo "ok $t $d"
done
rm -f "$m" "$m".*
"#;

pub(super) fn marker_key(target: &str) -> String {
    Sha256::of(target.as_bytes()).to_hex()[..32].to_string()
}

/// The package as a tar for upload, with a test fault injected if asked; `true` = simulate a
/// crash after the upload.
pub(super) fn package_tar(
    source: &Path,
    manifest: &skillbox_package::Manifest,
    fault: Option<&str>,
) -> Result<(Vec<u8>, bool), BoxError> {
    let Some(fault) = fault else {
        let tar = skillbox_package::write::write_tar(
            Vec::new(),
            manifest,
            &skillbox_package::write::DirSource(source),
        )?;
        return Ok((tar, false));
    };
    let fault = Some(fault);
    let victim = manifest
        .entries()
        .iter()
        .max_by_key(|e| e.size)
        .map(|e| e.path.clone());
    let entries: Vec<skillbox_package::FileEntry> = manifest
        .entries()
        .iter()
        .filter(|e| !(fault == Some("missing") && Some(&e.path) == victim.as_ref()))
        .cloned()
        .collect();
    let mut b = tar::Builder::new(Vec::new());
    for e in &entries {
        let mut data = std::fs::read(source.join(&e.path))?;
        if fault == Some("flip")
            && Some(&e.path) == victim.as_ref()
            && let Some(x) = data.first_mut()
        {
            *x ^= 1;
        }
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(if e.executable { 0o755 } else { 0o644 });
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mtime(0);
        b.append_data(&mut h, &e.path, &data[..])?;
    }
    if fault == Some("extra") {
        let data = b"#!/bin/sh\necho planted\n";
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o755);
        b.append_data(&mut h, "planted.sh", &data[..])?;
    }
    let mut bytes = b.into_inner()?;
    if fault == Some("truncate") {
        bytes.truncate(bytes.len() / 2);
    }
    Ok((bytes, fault == Some("crash")))
}

impl Docker {
    /// Copy mode: uploads the package as a tar into a fresh staging directory on the
    /// packages volume, then verifies and seals it inside the container (`PREPARE_SCRIPT`).
    pub(super) async fn prepare_copy(&self, lease: &Lease, mount: &Mount) -> Result<(), BoxError> {
        let staging = format!(
            "/skills/.staging/{}",
            skillbox_package::staging::unique_name("")
        );
        let r = self
            .command(
                &lease.handle,
                "0:0",
                r#"mkdir -p /skills/.staging && mkdir "$S""#,
                BTreeMap::from([("S".to_string(), staging.clone())]),
                vec![],
            )
            .await?;
        if r.exit_code != Some(0) {
            return Err(BoxError::Unavailable(format!(
                "docker: cannot make a staging directory: {}",
                r.failure()
            )));
        }
        let (source, manifest) = (mount.source.clone(), mount.manifest.clone());
        let fault = self.cfg.failpoint.take();
        let tar =
            tokio::task::spawn_blocking(move || package_tar(&source, &manifest, fault.as_deref()))
                .await
                .map_err(|e| BoxError::Unavailable(format!("packing task failed: {e}")))??;
        let crash = tar.1;
        // The engine's answer is not trusted (it reports success for some failed uploads):
        // whatever arrived is verified next.
        let uploaded = self
            .engine
            .upload_to_container(
                &lease.handle,
                Some(bollard::query_parameters::UploadToContainerOptions {
                    path: staging.clone(),
                    ..Default::default()
                }),
                bollard::body_full(tar.0.into()),
            )
            .await;
        if let Err(e) = &uploaded {
            tracing::warn!(target = %mount.target, error = %e, "copy-mode upload failed");
        }
        if crash {
            return Err(BoxError::Unavailable(
                "package preparation was interrupted; nothing was executed".into(),
            ));
        }
        let mut listing = String::new();
        for e in mount.manifest.entries() {
            listing.push_str(&format!(
                "{}  ./{}
",
                e.sha256.to_hex(),
                e.path
            ));
        }
        for e in mount.manifest.entries().iter().filter(|e| e.executable) {
            listing.push_str(&format!(
                "x ./{}
",
                e.path
            ));
        }
        let env = BTreeMap::from([
            ("S".to_string(), staging.clone()),
            ("T".to_string(), mount.target.clone()),
            ("K".to_string(), marker_key(&mount.target)),
            ("D".to_string(), mount.digest.to_string()),
            ("READY_DIR".to_string(), READY_DIR.to_string()),
        ]);
        let r = self
            .command(
                &lease.handle,
                "0:0",
                PREPARE_SCRIPT,
                env,
                listing.into_bytes(),
            )
            .await?;
        if r.exit_code != Some(0) {
            let _ = self
                .command(
                    &lease.handle,
                    "0:0",
                    r#"chmod -R u+w "$S" 2>/dev/null; rm -rf "$S""#,
                    BTreeMap::from([("S".to_string(), staging)]),
                    vec![],
                )
                .await;
            return Err(BoxError::Unavailable(format!(
                "the copy of {} failed verification in the container ({}); nothing was executed — retry",
                mount.target,
                r.failure()
            )));
        }
        Ok(())
    }

    /// Copy mode: the verified ready packages of the container, and any marker outside the set.
    pub(super) async fn prepared_copies(
        &self,
        lease: &Lease,
    ) -> Result<BTreeMap<String, Digest>, BoxError> {
        let mut listing = String::new();
        for m in &lease.sandbox.mounts {
            for e in m.manifest.entries() {
                listing.push_str(&format!(
                    "{}	{}	{}
",
                    m.target,
                    e.sha256.to_hex(),
                    e.path
                ));
            }
        }
        let env = BTreeMap::from([("READY_DIR".to_string(), READY_DIR.to_string())]);
        let uid = format!("{0}:{0}", self.cfg.uid);
        let out = self
            .command(
                &lease.handle,
                &uid,
                PREPARED_SCRIPT,
                env,
                listing.into_bytes(),
            )
            .await?
            .stdout;
        let mut ready = BTreeMap::new();
        for line in String::from_utf8_lossy(&out).lines() {
            let mut it = line.split(' ');
            if let (Some(_), Some(target), Some(digest)) = (it.next(), it.next(), it.next())
                && let Ok(d) = digest.parse::<Digest>()
            {
                ready.insert(target.to_string(), d);
            }
        }
        Ok(ready)
    }
}
