//! Activation-trace algorithms: read FastVideo-shaped JSONL stat traces, merge
//! per-rank shards, compare two implementations in execution order, and
//! compare full-tensor dumps.
//!
//! The library knows nothing of actors, gRPC or the orchestrator: it is usable
//! offline from the `fvd trace` CLI. The entry points an orchestrator needs
//! are [`compare`](fn@compare) (returns a serde-serializable [`Report`], whose
//! [`Report::drill_down`] is the regex of the next, narrower trace),
//! [`merge_ranks`] and [`dumps::compare_dumps`]. Both comparisons run the
//! comparator checks of [`signature`] before they name a first divergence,
//! and a comparison of nothing is never a success ([`Verdict`]).

pub mod compare;
pub mod diag;
pub mod dumps;
pub mod error;
mod fastparse;
pub mod folder;
pub mod hash;
pub mod merge;
pub mod plot;
pub mod record;
pub mod rename;
pub mod report;
pub mod signature;

pub use compare::{CompareOptions, compare, compare_records, drift, parse_steps};
pub use diag::Diagnostic;
pub use error::TraceError;
pub use folder::{FolderSpec, compare_folder, glob_match, trimmed_json};
pub use merge::{MergeOptions, Merged, ShapeIndex, merge_ranks};
pub use record::{Record, StatValue, TraceFile, read_side, read_trace, write_trace};
pub use rename::{RenameRule, Renamer};
pub use report::{FirstDivergence, Report, Row, Unmatched, UnmatchedSides, Verdict};
pub use signature::{Evidence, Signature};
