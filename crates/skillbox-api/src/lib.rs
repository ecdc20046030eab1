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

/// A string enum of the wire: its variants, their wire names, `ALL`, `as_str`, `parse`,
/// `Display` and serde, from one list.
macro_rules! wire_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $($(#[$vmeta:meta])* $variant:ident = $text:literal,)*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
        pub enum $name {
            $($(#[$vmeta])* #[serde(rename = $text)] $variant,)*
        }

        impl $name {
            pub const ALL: &[$name] = &[$($name::$variant),*];

            /// The wire name.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),*
                }
            }

            pub fn parse(s: &str) -> Option<$name> {
                Self::ALL.iter().copied().find(|v| v.as_str() == s)
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

pub mod admin;
pub mod drafts;
pub mod error;
pub mod nodes;
pub mod runs;
pub mod skills;

pub use admin::*;
pub use drafts::*;
pub use error::{ErrorBody, ErrorCode, ErrorEnvelope};
pub use nodes::*;
pub use runs::*;
pub use skills::*;
