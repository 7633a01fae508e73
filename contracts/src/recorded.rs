//! The outcomes fvd records, each an enum with one mapping to the text the
//! database (and the wire) holds, and the macro that makes such an enum.
//!
//! [`RecordedVerdict`] is what a run, a component, an attempt or a variant
//! row says about the code: the status of a classified run, or how fvd
//! ended a run that has none. An `error` carries its [`ErrorKind`] beside
//! it (a column of its own), so no reader ever parses a kind back out of a
//! reason. The store's own states (`fvd_store::states`) are made with
//! [`recorded_enum!`](crate::recorded_enum!) too. A text none of them knows is an
//! [`UnknownState`], never a default.

use std::fmt;
use std::str::FromStr;

use crate::verdict::{ErrorKind, Verdict, VerdictStatus};

/// A text the database held that is no value of its kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {kind} {value:?}")]
pub struct UnknownState {
    /// `port state`, `verdict`, `error kind`, …
    pub kind: &'static str,
    pub value: String,
}

/// An enum stored as text: the variants, each with its text and its doc;
/// `ALL`, `as_str`, `FromStr` (an [`UnknownState`] naming `$kind`),
/// `Display`, `Serialize` and `Deserialize` as that text.
#[macro_export]
macro_rules! recorded_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident ($kind:literal) {
            $( $(#[$vmeta:meta])* $variant:ident = $text:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )+
        }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: &[Self] = &[$(Self::$variant),+];

            /// The text the database and the wire hold.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $text,)+
                }
            }
        }

        impl ::std::str::FromStr for $name {
            type Err = $crate::recorded::UnknownState;
            fn from_str(s: &str) -> Result<Self, $crate::recorded::UnknownState> {
                match s {
                    $($text => Ok(Self::$variant),)+
                    _ => Err($crate::recorded::UnknownState {
                        kind: $kind,
                        value: s.to_string(),
                    }),
                }
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl ::serde::Serialize for $name {
            fn serialize<S: ::serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $name {
            fn deserialize<D: ::serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = <::std::borrow::Cow<'de, str> as ::serde::Deserialize>::deserialize(d)?;
                text.parse().map_err(::serde::de::Error::custom)
            }
        }
    };
}

/// What a run, a component, an agent attempt (before and after) or a
/// variant row records about the code (`verdict` columns). `NonSkipPass`
/// to `Tampered` are a classified run's [`VerdictStatus`]; the rest are
/// fvd's own ends of a run that has no verdict of its report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum RecordedVerdict {
    /// No verdict yet (`""`).
    #[default]
    None,
    NonSkipPass,
    ScaffoldSkip,
    DebugRed,
    /// An error; its kind is the `error_kind` column. `None`: fvd failed
    /// to run or record it (an agent loop that cannot start, a worktree
    /// that cannot be reset), so it tested nothing.
    Error(Option<ErrorKind>),
    Timeout,
    InfraError,
    /// The run's environment, not the code, failed it.
    Environment,
    /// The run swapped out what judges it: never a pass.
    Tampered,
    /// The port was cancelled before the run had a verdict.
    Cancelled,
    /// A pass the cleanup gate refused (an agent component's worktree).
    CleanupRefused,
    /// No worker of a fixed fleet can hold the run: it never started.
    Unplaced,
    /// The port stopped under it: its `REPO/.fvd` went away.
    Stopped,
}

impl RecordedVerdict {
    /// Every verdict text, each once (`Error` stands for every kind).
    pub const ALL: &[Self] = &[
        Self::None,
        Self::NonSkipPass,
        Self::ScaffoldSkip,
        Self::DebugRed,
        Self::Error(None),
        Self::Timeout,
        Self::InfraError,
        Self::Environment,
        Self::Tampered,
        Self::Cancelled,
        Self::CleanupRefused,
        Self::Unplaced,
        Self::Stopped,
    ];

    /// The `verdict` column's text.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::None => "",
            Self::NonSkipPass => "non_skip_pass",
            Self::ScaffoldSkip => "scaffold_skip",
            Self::DebugRed => "debug_red",
            Self::Error(_) => "error",
            Self::Timeout => "timeout",
            Self::InfraError => "infra_error",
            Self::Environment => "environment",
            Self::Tampered => "tampered",
            Self::Cancelled => "cancelled",
            Self::CleanupRefused => "cleanup_refused",
            Self::Unplaced => "unplaced",
            Self::Stopped => "stopped",
        }
    }

    /// The `error_kind` column's text: the kind of an error, else `""`.
    pub fn error_kind_str(self) -> &'static str {
        match self {
            Self::Error(Some(k)) => k.as_str(),
            _ => "",
        }
    }

    /// The verdict of a `verdict` and an `error_kind` column. Each unknown
    /// text is an [`UnknownState`] of its kind (`verdict`, `error kind`).
    pub fn from_columns(verdict: &str, error_kind: &str) -> Result<Self, UnknownState> {
        let v: Self = verdict.parse()?;
        match v {
            Self::Error(_) if !error_kind.is_empty() => Ok(Self::Error(Some(error_kind.parse()?))),
            v => Ok(v),
        }
    }

    pub fn is_pass(self) -> bool {
        self == Self::NonSkipPass
    }

    pub fn is_none(self) -> bool {
        self == Self::None
    }
}

/// The verdict text alone: an `error` reads without its kind.
impl FromStr for RecordedVerdict {
    type Err = UnknownState;
    fn from_str(s: &str) -> Result<Self, UnknownState> {
        Self::ALL
            .iter()
            .copied()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| UnknownState {
                kind: "verdict",
                value: s.to_string(),
            })
    }
}

impl fmt::Display for RecordedVerdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for RecordedVerdict {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// The verdict text alone (an `error` without its kind): for JSON views
/// that show a verdict, never for a record that decides on it.
impl<'de> serde::Deserialize<'de> for RecordedVerdict {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str> as serde::Deserialize>::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl From<VerdictStatus> for RecordedVerdict {
    /// A status without its error's kind: use `From<&Verdict>` for a run.
    fn from(s: VerdictStatus) -> Self {
        match s {
            VerdictStatus::NonSkipPass => Self::NonSkipPass,
            VerdictStatus::ScaffoldSkip => Self::ScaffoldSkip,
            VerdictStatus::DebugRed => Self::DebugRed,
            VerdictStatus::Error => Self::Error(None),
            VerdictStatus::Timeout => Self::Timeout,
            VerdictStatus::InfraError => Self::InfraError,
            VerdictStatus::Environment => Self::Environment,
            VerdictStatus::Tampered => Self::Tampered,
        }
    }
}

impl From<&Verdict> for RecordedVerdict {
    fn from(v: &Verdict) -> Self {
        match v {
            Verdict::Error { kind, .. } => Self::Error(Some(*kind)),
            other => other.status().into(),
        }
    }
}

impl FromStr for ErrorKind {
    type Err = UnknownState;
    fn from_str(s: &str) -> Result<Self, UnknownState> {
        ErrorKind::ALL
            .iter()
            .copied()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| UnknownState {
                kind: "error kind",
                value: s.to_string(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_verdict_and_kind_reads_back_as_itself() {
        let mut seen = std::collections::BTreeSet::new();
        for v in RecordedVerdict::ALL {
            assert!(seen.insert(v.as_str()), "{v} names two verdicts");
            assert_eq!(RecordedVerdict::from_columns(v.as_str(), ""), Ok(*v));
        }
        for k in ErrorKind::ALL {
            let v = RecordedVerdict::Error(Some(*k));
            assert_eq!(
                RecordedVerdict::from_columns(v.as_str(), v.error_kind_str()),
                Ok(v)
            );
        }
        assert_eq!(
            seen.into_iter().collect::<Vec<_>>().join(" "),
            " cancelled cleanup_refused debug_red environment error infra_error non_skip_pass scaffold_skip stopped tampered timeout unplaced",
            "the database's texts stay as they were"
        );
    }

    #[test]
    fn an_unknown_verdict_or_kind_is_named() {
        let e = RecordedVerdict::from_columns("passed", "").unwrap_err();
        assert_eq!(e.to_string(), "unknown verdict \"passed\"");
        let e = RecordedVerdict::from_columns("error", "boom").unwrap_err();
        assert_eq!(e.to_string(), "unknown error kind \"boom\"");
        // A kind beside a verdict that is no error is not read.
        assert_eq!(
            RecordedVerdict::from_columns("timeout", "collection"),
            Ok(RecordedVerdict::Timeout)
        );
    }

    #[test]
    fn a_classified_run_keeps_its_kind() {
        let v = Verdict::Error {
            kind: ErrorKind::Collection,
            detail: "x".into(),
        };
        assert_eq!(
            RecordedVerdict::from(&v),
            RecordedVerdict::Error(Some(ErrorKind::Collection))
        );
        assert_eq!(
            RecordedVerdict::from(&Verdict::Timeout),
            RecordedVerdict::Timeout
        );
    }
}
