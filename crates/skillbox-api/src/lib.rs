//! The skillbox wire types: every request body, query and answer of the HTTP API (SPEC §5),
//! as `Serialize + Deserialize` structs, and the error codes with their HTTP statuses.
//!
//! The server answers with these types and the CLI client reads them back, so a field renamed
//! here is renamed on both sides (and the tests, which use them too, notice). The names are the
//! SPEC's: outside clients depend on them.
//!
//! - [`error`]: [`ErrorCode`] (code ↔ status in one place) and the `{"error": {...}}` envelope;
//! - [`skills`]: skills, revisions, the current pointer, revocation;
//! - [`drafts`]: drafts and run drafts;
//! - [`runs`]: runs, activations, the prompt index, executions;
//! - [`admin`]: tokens, garbage collection, fsck, identity, health, events.

pub mod admin;
pub mod drafts;
pub mod error;
pub mod runs;
pub mod skills;

pub use admin::*;
pub use drafts::*;
pub use error::{ErrorBody, ErrorCode, ErrorEnvelope};
pub use runs::*;
pub use skills::*;
