//! Real `skillbox node` processes for the tests, registered with a real Core.

use super::{ADMIN, Server, bin, free_port, healthy, release_workspace_mounts};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `skillbox node`.
pub struct Node {
    pub child: Child,
    pub port: u16,
    pub data_dir: PathBuf,
}

impl Node {
    pub fn start(core: &Server, token: &str, data_dir: &Path) -> Node {
        Self::start_with(core, token, data_dir, &[])
    }

    pub fn start_with(core: &Server, token: &str, data_dir: &Path, extra: &[&str]) -> Node {
        Self::start_for(&core.url, token, data_dir, extra)
    }

    /// A node of the Core at `core_url`; returns once it serves.
    pub fn start_for(core_url: &str, token: &str, data_dir: &Path, extra: &[&str]) -> Node {
        Self::start_on_port(core_url, token, data_dir, free_port(), extra)
    }

    /// [`Node::start_for`] listening on `port`.
    pub fn start_on_port(
        core_url: &str,
        token: &str,
        data_dir: &Path,
        port: u16,
        extra: &[&str],
    ) -> Node {
        let child = Command::new(bin())
            .args(["node", "--core", core_url, "--token", token, "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("--data-dir")
            .arg(data_dir)
            .args(extra)
            .env("SKILLBOX_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let mut node = Node {
            child,
            port,
            data_dir: data_dir.to_path_buf(),
        };
        node.wait_serving();
        node
    }

    /// Returns once the node serves: it registers with Core (giving its address) before it
    /// answers anything, so Core knows it by then.
    pub fn wait_serving(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !healthy(self.port) {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("skillbox node exited before it served: {status}");
            }
            assert!(Instant::now() < deadline, "the node did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The identity Core gave this node (kept in its data directory).
    pub fn id(&self) -> String {
        std::fs::read_to_string(self.data_dir.join("node-id"))
            .unwrap()
            .trim()
            .to_string()
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill9();
        release_workspace_mounts(&self.data_dir);
    }
}

/// A node token minted by the admin through the CLI (`skillbox --json token create --role
/// node`), for code that cannot await: the CLI's answer.
pub fn node_token_by_cli(core_url: &str) -> serde_json::Value {
    let out = Command::new(bin())
        .args([
            "--json", "--url", core_url, "--token", ADMIN, "token", "create", "--role", "node",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}
