//! The box: the sandbox runtime. It knows packages (digest + manifest + source) and mounts,
//! not skills, runs or workspaces. Backends: bwrap, docker, remote, none.
//!
//! Filled in by the box issue; depends on `skillbox-package` only.
