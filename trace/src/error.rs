//! The one error type of the crate. Every variant names the input it came
//! from, because a trace comparison reads many files and an error without a
//! path sends the user hunting.

use std::path::PathBuf;

/// Everything that can go wrong reading, merging or comparing traces and dumps.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("cannot read {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}: malformed trace record: {message}")]
    Malformed {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("invalid rename rule {rule:?}: {message}")]
    Rename { rule: String, message: String },
    #[error("invalid option {option:?}: {message}")]
    Option { option: String, message: String },
    #[error("{path}: {message}")]
    Dump { path: PathBuf, message: String },
    #[error("no input files given for the {side} side")]
    NoInput { side: &'static str },
    #[error("{0:?} is not a step number")]
    Step(String),
}

impl TraceError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        TraceError::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn dump(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        TraceError::Dump {
            path: path.into(),
            message: message.into(),
        }
    }
}
