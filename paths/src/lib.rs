//! Names and relative paths that come from a port spec or over the wire
//! (from a worker, from a client), before fvd builds a file path out of
//! them.
//!
//! - [`is_identifier`]: the rule for family and component names, which
//!   become folder names (`.fvd/trace/<family>/<component>/`), branch names
//!   (`fvd/<family>/<component>`) and job ids (`<family>.<component>`, and
//!   `<component>#trace` for traced reruns, which the rule keeps out of
//!   reach of a spec).
//! - [`join_under`]: the one join of a root with a relative path that
//!   refuses whatever would leave the root (an absolute path, a `..`
//!   component, an empty path), lexically.
//! - [`join_under_no_links`]: the same, and no existing entry between the
//!   root and the end of the path is a symbolic link, for paths fvd writes
//!   to inside a checkout it does not own (a cloned repository can carry a
//!   link to anywhere).
//!
//! A crate of its own because the orchestrator's actors, the worker and
//! the gRPC edge all need it and share no lower crate but `fvd-contracts`,
//! which is pure (no IO) where the link check has to look at the disk.

use std::path::{Component, Path, PathBuf};

/// Longest family or component name: they become path components and
/// parts of branch names and job ids.
pub const MAX_IDENTIFIER_LEN: usize = 64;

/// Characters of an offending input echoed in an error; the rest is cut.
const ECHO_CHARS: usize = 64;

/// Whether `s` is a family or component name: 1 to [`MAX_IDENTIFIER_LEN`]
/// lowercase ascii letters, digits and `_`.
pub fn is_identifier(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_IDENTIFIER_LEN
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// `s` cut to a few dozen characters with `…`: errors name the input
/// without echoing kilobytes of it.
pub fn cut(s: &str) -> String {
    if s.chars().count() <= ECHO_CHARS {
        return s.to_string();
    }
    let mut head: String = s.chars().take(ECHO_CHARS).collect();
    head.push('…');
    head
}

/// `s` as `{:?}` shows it, cut like [`cut`].
pub fn shown(s: &str) -> String {
    if s.chars().count() <= ECHO_CHARS {
        return format!("{s:?}");
    }
    let head: String = s.chars().take(ECHO_CHARS).collect();
    format!("{head:?}…")
}

/// Longest message [`cut_quoted`] returns, whatever is outside quotes.
pub const MAX_MESSAGE_CHARS: usize = 1024;

/// `message` with every part between backticks or double quotes cut like
/// [`cut`] (a `\"` inside double quotes does not end them), and the whole
/// cut at [`MAX_MESSAGE_CHARS`]: for messages of parsers (serde, toml) that
/// quote the input.
pub fn cut_quoted(message: &str) -> String {
    let mut out = String::with_capacity(message.len().min(MAX_MESSAGE_CHARS));
    let mut rest = message;
    while let Some(open) = rest.find(['`', '"']) {
        let q = rest.as_bytes()[open];
        out.push_str(&rest[..=open]);
        rest = &rest[open + 1..];
        let bytes = rest.as_bytes();
        let mut close = 0;
        while close < bytes.len() && bytes[close] != q {
            // Debug-quoted text escapes its quotes; backticks have no escapes.
            close += if q == b'"' && bytes[close] == b'\\' {
                2
            } else {
                1
            };
        }
        let close = close.min(rest.len());
        // `close` may sit inside a multi-byte char only after a backslash
        // at the very end; step back to a boundary.
        let close = (0..=close)
            .rev()
            .find(|&i| rest.is_char_boundary(i))
            .unwrap_or(0);
        out.push_str(&cut(&rest[..close]));
        rest = &rest[close..];
        if let Some(r) = rest.strip_prefix(q as char) {
            out.push(q as char);
            rest = r;
        }
    }
    out.push_str(rest);
    if out.chars().count() > MAX_MESSAGE_CHARS {
        out = out.chars().take(MAX_MESSAGE_CHARS).collect();
        out.push('…');
    }
    out
}

/// Why a relative path was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("path {path} must stay inside {root}: {why}")]
pub struct PathError {
    /// The refused path, cut (see [`shown`]).
    pub path: String,
    pub root: PathBuf,
    pub why: String,
}

/// `root` joined with `rel`, refused when `rel` could leave `root`: an
/// absolute path, a `..` component or nothing but `.`. The check is
/// lexical; see [`join_under_no_links`] for links on the disk.
pub fn join_under(root: &Path, rel: impl AsRef<Path>) -> Result<PathBuf, PathError> {
    let rel = rel.as_ref();
    let refuse = |why: &str| PathError {
        path: shown(&rel.to_string_lossy()),
        root: root.to_path_buf(),
        why: why.to_string(),
    };
    let mut out = root.to_path_buf();
    let mut named = false;
    for c in rel.components() {
        match c {
            Component::Normal(part) => {
                if part.as_encoded_bytes().contains(&0) {
                    return Err(refuse("it holds a NUL byte"));
                }
                out.push(part);
                named = true;
            }
            Component::CurDir => {}
            Component::ParentDir => return Err(refuse("it has a `..` component")),
            Component::RootDir | Component::Prefix(_) => return Err(refuse("it is absolute")),
        }
    }
    if !named {
        return Err(refuse("it names nothing below the root"));
    }
    Ok(out)
}

/// [`join_under`], and none of the entries below `root` on the way to the
/// result that exist now is a symbolic link (the root itself may be one).
/// Checked when called: fvd then writes at once, and whoever could swap an
/// entry for a link in between could write there directly.
pub fn join_under_no_links(root: &Path, rel: impl AsRef<Path>) -> Result<PathBuf, PathError> {
    let rel = rel.as_ref();
    let full = join_under(root, rel)?;
    let mut at = root.to_path_buf();
    for c in rel.components() {
        let Component::Normal(part) = c else { continue };
        at.push(part);
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.file_type().is_symlink() => {
                let below = at.strip_prefix(root).unwrap_or(&at);
                return Err(PathError {
                    path: shown(&rel.to_string_lossy()),
                    root: root.to_path_buf(),
                    why: format!("{} is a symbolic link", below.display()),
                });
            }
            Ok(_) => {}
            // The rest does not exist yet: fvd creates it, as folders and
            // files, never as links.
            Err(_) => break,
        }
    }
    Ok(full)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_lowercase_ascii_digits_and_underscores() {
        for ok in ["tinyport", "decoder_norm", "v2", "_x", "a"] {
            assert!(is_identifier(ok), "{ok}");
        }
        let long = "a".repeat(MAX_IDENTIFIER_LEN + 1);
        for bad in [
            "",
            "..",
            "a/b",
            "/abs",
            "c#trace",
            "Embed",
            "a-b",
            "a.b",
            "a b",
            "é",
            long.as_str(),
        ] {
            assert!(!is_identifier(bad), "{bad:?}");
        }
    }

    #[test]
    fn quoted_parts_of_a_message_are_cut() {
        let key = "k".repeat(10_000);
        let msg =
            format!("unknown field `{key}`, expected `name` or \"{key}\" and `unclosed {key}");
        let cut = cut_quoted(&msg);
        let k = "k".repeat(ECHO_CHARS);
        assert_eq!(
            cut,
            format!(
                "unknown field `{k}…`, expected `name` or \"{k}…\" and `unclosed {}…",
                &k[..ECHO_CHARS - 9]
            )
        );
        assert_eq!(cut_quoted("no quotes"), "no quotes");
        // An escaped quote does not end a Debug-quoted value.
        let value = format!("a\\\"{}", "b".repeat(3000));
        let msg = format!("invalid type: string \"{value}\", expected u64");
        let cut = cut_quoted(&msg);
        assert!(cut.ends_with("…\", expected u64"), "{cut}");
        assert!(cut.len() < 200, "{cut}");
        // Outside quotes, the whole is bounded.
        let plain = "x ".repeat(5000);
        assert_eq!(cut_quoted(&plain).chars().count(), MAX_MESSAGE_CHARS + 1);
        assert_eq!(cut_quoted("ends in \"é\\"), "ends in \"é\\");
    }

    #[test]
    fn plain_relative_paths_join() {
        let root = Path::new("/r");
        assert_eq!(
            join_under(root, "a/b.jsonl").unwrap(),
            Path::new("/r/a/b.jsonl")
        );
        assert_eq!(join_under(root, "./a//b").unwrap(), Path::new("/r/a/b"));
        assert_eq!(join_under(root, "a..b").unwrap(), Path::new("/r/a..b"));
    }

    #[test]
    fn paths_that_leave_the_root_are_refused() {
        let root = Path::new("/r");
        for (bad, why) in [
            ("../x", "`..`"),
            ("a/../../x", "`..`"),
            ("a/..", "`..`"),
            ("/etc/passwd", "absolute"),
            ("", "names nothing"),
            (".", "names nothing"),
            ("a/\0b", "NUL"),
        ] {
            let err = join_under(root, bad).unwrap_err().to_string();
            assert!(err.contains(why), "{bad:?}: {err}");
            assert!(err.contains("must stay inside /r"), "{err}");
        }
    }

    #[test]
    fn a_long_path_is_cut_in_the_error() {
        let long = format!("../{}", "x".repeat(10_000));
        let err = join_under(Path::new("/r"), &long).unwrap_err().to_string();
        assert!(err.len() < 200, "{err}");
        assert!(err.contains('…'), "{err}");
    }

    #[test]
    fn links_below_the_root_are_refused_only_by_the_strict_join() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("real")).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join("out")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("f"), root.join("real/f")).unwrap();
        // Lexically fine: the plain join lets both through.
        assert!(join_under(&root, "out/x").is_ok());
        let err = join_under_no_links(&root, "out/x").unwrap_err().to_string();
        assert!(err.contains("out is a symbolic link"), "{err}");
        let err = join_under_no_links(&root, "real/f")
            .unwrap_err()
            .to_string();
        assert!(err.contains("real/f is a symbolic link"), "{err}");
        // Entries that do not exist yet, and a linked root, are fine.
        assert_eq!(
            join_under_no_links(&root, "real/new/deeper").unwrap(),
            root.join("real/new/deeper")
        );
        let linked_root = dir.path().join("linked");
        std::os::unix::fs::symlink(&root, &linked_root).unwrap();
        assert!(join_under_no_links(&linked_root, "real/x").is_ok());
    }
}
