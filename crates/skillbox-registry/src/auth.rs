//! Tokens and roles (SPEC §5). Workspace tokens are random 256-bit secrets stored only as their
//! SHA-256; the admin token is compared in constant time.

use crate::Registry;
use crate::error::{RegistryError, Result};
use skillbox_package::Sha256;

/// Roles, each including the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    Reader,
    Author,
    Runner,
    Admin,
}

impl Role {
    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "reader" => Some(Role::Reader),
            "author" => Some(Role::Author),
            "runner" => Some(Role::Runner),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Reader => "reader",
            Role::Author => "author",
            Role::Runner => "runner",
            Role::Admin => "admin",
        }
    }
}

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// The server's admin token: every workspace, every operation.
    ServerAdmin,
    /// An execution node's token (its hash: the nodes registered with it are its own):
    /// registration, heartbeats and what nodes fetch; no workspace's skills by name.
    Node {
        token_hash: String,
    },
    Workspace {
        workspace: String,
        role: Role,
    },
}

impl Principal {
    /// A short description for `publisher` fields and logs.
    pub fn label(&self) -> String {
        match self {
            Principal::ServerAdmin => "admin".into(),
            Principal::Node { .. } => "node".into(),
            Principal::Workspace { workspace, role } => format!("{workspace}:{}", role.as_str()),
        }
    }
}

/// Constant-time equality of two byte strings (length is not secret).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// How a node token's role is stored (its workspace is empty).
const NODE_ROLE: &str = "node";

fn token_hash(token: &str) -> String {
    Sha256::of(token.as_bytes()).to_hex()
}

/// A fresh random token.
pub fn generate_token() -> String {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b).expect("the OS random source is available");
    format!("sbx_{}", skillbox_package::digest::to_hex(&b))
}

impl Registry {
    /// Mints a workspace token; the plain token is returned once and stored hashed.
    pub async fn create_token(&self, workspace: &str, role: Role) -> Result<String> {
        if !skillbox_package::is_valid_name(workspace) {
            return Err(RegistryError::BadRequest(format!(
                "invalid workspace name {workspace:?}"
            )));
        }
        let token = generate_token();
        self.meta
            .insert_token(&token_hash(&token), workspace, role.as_str())
            .await?;
        Ok(token)
    }

    /// Mints a node token (SPEC §7.3): of no workspace; shown once, stored hashed.
    pub async fn create_node_token(&self) -> Result<String> {
        let token = generate_token();
        self.meta
            .insert_token(&token_hash(&token), "", NODE_ROLE)
            .await?;
        Ok(token)
    }

    /// Resolves a bearer token. `admin_token` is the server's admin secret.
    pub async fn authenticate(&self, token: &str, admin_token: &str) -> Result<Option<Principal>> {
        if constant_time_eq(token.as_bytes(), admin_token.as_bytes()) {
            return Ok(Some(Principal::ServerAdmin));
        }
        // Lookup by the hash of a 256-bit secret: timing reveals nothing usable about it.
        // Tokens never change once minted, so a hit is cached for the process's lifetime.
        // Cached by the hash's bytes: its hex (the stored key) is made only on a miss.
        let digest = Sha256::of(token.as_bytes());
        if let Some(p) = self
            .tokens
            .lock()
            .ok()
            .and_then(|c| c.get(&digest).cloned())
        {
            return Ok(Some(p));
        }
        let hash = digest.to_hex();
        let principal = self.meta.token(&hash).await?.and_then(|(workspace, role)| {
            if role == NODE_ROLE {
                return Some(Principal::Node {
                    token_hash: hash.clone(),
                });
            }
            Role::parse(&role).map(|role| Principal::Workspace { workspace, role })
        });
        if let (Some(p), Ok(mut c)) = (&principal, self.tokens.lock()) {
            if c.len() >= 100_000 {
                c.clear();
            }
            c.insert(digest, p.clone());
        }
        Ok(principal)
    }
}
