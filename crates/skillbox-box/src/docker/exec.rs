//! Executions in a container: exec create/start with output demultiplexed, capped and
//! optionally streamed; timeouts and revocations kill the exec's process group from the host,
//! checked against the container's cgroup.

use super::*;

/// Host processes in process group `group` whose cgroup names `container` (its full id).
pub(super) fn group_members_in(group: i32, container: &str) -> Vec<i32> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|p| {
            // `pid (comm) state ppid pgrp …`: comm may hold spaces and parentheses.
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            let pgrp = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(2))
                .and_then(|g| g.parse::<i32>().ok());
            pgrp == Some(group)
                && std::fs::read_to_string(format!("/proc/{p}/cgroup"))
                    .is_ok_and(|c| c.contains(container))
        })
        .collect()
}

impl Docker {
    /// Runs a box-internal command in a container as `user`.
    pub(super) async fn command(
        &self,
        container: &str,
        user: &str,
        script: &str,
        env: BTreeMap<String, String>,
        stdin: Vec<u8>,
    ) -> Result<ExecResult, BoxError> {
        let req = ExecRequest {
            cwd: "/".into(),
            stdin: Some(stdin),
            timeout: std::time::Duration::from_secs(300),
            output_cap: 1 << 20,
            ..ExecRequest::shell(script, env)
        };
        let (_never, kill) = tokio::sync::oneshot::channel();
        self.run_exec_as(container, user, false, req, kill).await
    }

    /// The host pid of a running exec's first process: the leader of its process group.
    pub(super) async fn exec_pid(&self, exec_id: &str) -> Option<i32> {
        let e = self.engine.inspect_exec(exec_id).await.ok()?;
        e.pid.filter(|p| *p > 1).map(|p| p as i32)
    }

    /// Kills the exec's process group from the host: the processes whose process group is
    /// the exec's leader's pid *and* that live in this container's cgroup. The pid alone is
    /// not enough: once the group is empty the kernel may give that pid to a new process —
    /// another container's exec leader, say — and a bare `killpg` would kill it.
    pub(super) fn kill_group(pid: Option<i32>, container: &str) {
        let Some(group) = pid else {
            return;
        };
        // A member may fork while we look (a fork bomb does nothing else). Every member found
        // is stopped, and we look again until a look finds none not stopped yet: a stopped
        // process cannot fork (a fork that a stop interrupts is undone), so the set is then
        // closed and can be killed whole. Killing each look's members at once let children
        // forked between a look and the kill outrun 200 looks on a loaded host, and a bomb's
        // survivors then held the container's pids limit ("Cannot fork" in its next exec).
        // Bounded in time: a bomb is also held by the pids limit.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let signal = |p: i32, s| {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), s);
        };
        loop {
            let mut stopped = std::collections::HashSet::new();
            while std::time::Instant::now() < deadline {
                let fresh: Vec<i32> = group_members_in(group, container)
                    .into_iter()
                    .filter(|p| !stopped.contains(p))
                    .collect();
                if fresh.is_empty() {
                    break;
                }
                for p in fresh {
                    signal(p, nix::sys::signal::Signal::SIGSTOP);
                    stopped.insert(p);
                }
            }
            if stopped.is_empty() {
                return;
            }
            for p in stopped {
                signal(p, nix::sys::signal::Signal::SIGKILL);
            }
            if std::time::Instant::now() >= deadline {
                return;
            }
        }
    }

    pub(super) async fn run_exec_as(
        &self,
        container: &str,
        user: &str,
        workspace: bool,
        req: ExecRequest,
        kill: tokio::sync::oneshot::Receiver<()>,
    ) -> Result<ExecResult, BoxError> {
        let cmd = req.command_line()?;
        let env = req.environment(workspace);
        let start = Instant::now();
        let exec = self
            .engine
            .create_exec(
                container,
                CreateExecOptions {
                    cmd: Some(cmd),
                    env: Some(env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
                    working_dir: Some(req.cwd.clone()),
                    user: Some(user.to_string()),
                    attach_stdin: Some(req.stdin.is_some()),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| engine_error("creating an exec", e))?;
        let started = self
            .engine
            .start_exec(&exec.id, None)
            .await
            .map_err(|e| engine_error("starting an exec", e))?;
        let StartExecResults::Attached {
            mut output,
            mut input,
        } = started
        else {
            return Err(BoxError::Unavailable(
                "docker: exec started detached".into(),
            ));
        };
        if let Some(data) = req.stdin {
            tokio::spawn(async move {
                let _ = input.write_all(&data).await;
                let _ = input.shutdown().await;
            });
        } else {
            drop(input);
        }
        // As with bwrap, an execution's processes end with it: background children still in
        // its process group are killed when it ends (and on timeout or revocation). Its host
        // pid is asked of the engine only when needed.
        let mut group = None;
        let mut out = Capped::new(req.output_cap, req.live.clone(), StreamKind::Stdout);
        let mut err = Capped::new(req.output_cap, req.live.clone(), StreamKind::Stderr);
        let deadline = tokio::time::sleep(req.timeout);
        tokio::pin!(deadline);
        let mut kill = kill;
        let mut ended_by = None;
        loop {
            tokio::select! {
                chunk = output.next() => match chunk {
                    Some(Ok(bollard::container::LogOutput::StdOut { message })) => out.push(&message),
                    Some(Ok(bollard::container::LogOutput::StdErr { message })) => err.push(&message),
                    Some(Ok(_)) => {}
                    Some(Err(_)) | None => break,
                },
                _ = &mut deadline, if ended_by.is_none() => {
                    ended_by = Some(Outcome::TimedOut);
                    if group.is_none() { group = self.exec_pid(&exec.id).await; }
                    Self::kill_group(group, container);
                }
                Ok(()) = &mut kill, if ended_by.is_none() => {
                    ended_by = Some(Outcome::Killed);
                    if group.is_none() { group = self.exec_pid(&exec.id).await; }
                    Self::kill_group(group, container);
                }
            }
        }
        // One inspection gives both the process group to clean up and, once the exec has
        // ended, its exit code.
        let mut exit_code = None;
        for attempt in 0..50 {
            let e = self
                .engine
                .inspect_exec(&exec.id)
                .await
                .map_err(|e| engine_error("inspecting an exec", e))?;
            if attempt == 0 {
                group = group.or(e.pid.filter(|p| *p > 1).map(|p| p as i32));
                Self::kill_group(group, container);
            }
            if e.running == Some(false) {
                exit_code = e.exit_code.map(|c| c as i32);
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let outcome = match (ended_by, exit_code) {
            (Some(o), _) => o,
            // 126/127: the engine could not start the program (not found, not executable).
            (None, Some(_)) => Outcome::Exited,
            (None, None) => Outcome::SandboxFailure,
        };
        Ok(ExecResult {
            outcome,
            exit_code: if ended_by.is_some() { None } else { exit_code },
            signal: None,
            timed_out: outcome == Outcome::TimedOut,
            stdout_truncated: out.truncated,
            stderr_truncated: err.truncated,
            stdout: out.kept,
            stderr: err.kept,
            duration_ms: start.elapsed().as_millis() as u64,
        })
    }
}
