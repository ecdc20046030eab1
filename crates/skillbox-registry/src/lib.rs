//! The registry: metadata store (SQLite, later PostgreSQL), content store on `object_store`,
//! revision cache, publication by compare-and-swap, drafts, runs and pins, deletion,
//! revocation, garbage collection and the event log.
//!
//! Filled in by the registry issue; depends on `skillbox-package` only.
