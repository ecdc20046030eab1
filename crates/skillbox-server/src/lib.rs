//! The HTTP server (axum): the API of SPEC §5, auth, and the composition of a run's mount set
//! from its pins. Handlers are thin; logic lives in `skillbox-registry` and `skillbox-box`.
//!
//! Filled in by the registry issue.
