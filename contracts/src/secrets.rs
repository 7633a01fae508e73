//! Detection of raw credential values.
//!
//! The contracts allow token *environment variable names* only. A value that
//! looks like a Hugging Face token or another bearer secret is reported by
//! field and line, and the value itself never reaches a finding, a log or an
//! error message: repeating it would leak it a second time.
//!
//! This finds values that *look* like secrets; [`crate::redactor`] replaces
//! the values fvd *knows* are secrets (its token, the variables a spec
//! names), in every common spelling.

use crate::findings::Finding;

/// What kind of secret a line appears to contain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecretKind {
    /// `hf_` followed by 30 or more letters and digits.
    HuggingFaceToken,
    /// `Bearer <opaque>` as in an HTTP authorization header.
    BearerToken,
    /// `token=<opaque>`, `api_key: <opaque>` and similar assignments.
    AssignedSecret,
}

impl SecretKind {
    /// The finding message; deliberately free of the offending value.
    pub fn message(self) -> &'static str {
        match self {
            SecretKind::HuggingFaceToken => {
                "looks like a raw hugging face token; refer to it by env var name (HF_TOKEN, HUGGINGFACE_HUB_TOKEN or HF_API_KEY) and rotate it"
            }
            SecretKind::BearerToken => {
                "looks like a raw bearer token; refer to it by env var name and rotate it"
            }
            SecretKind::AssignedSecret => {
                "looks like a raw secret value; refer to it by env var name and rotate it"
            }
        }
    }
}

/// The first secret-looking value in `line`, if any.
pub fn scan_line(line: &str) -> Option<SecretKind> {
    if has_hf_token(line) {
        return Some(SecretKind::HuggingFaceToken);
    }
    if has_bearer(line) {
        return Some(SecretKind::BearerToken);
    }
    if has_assigned_secret(line) {
        return Some(SecretKind::AssignedSecret);
    }
    None
}

/// Scans every line of `text`; `first_line` is the number of its first line.
/// The field of each finding is guessed from the line's shape (`key: value`,
/// `- key: value`, a table row) so the value never has to be shown.
pub fn scan_text(text: &str, first_line: usize) -> Vec<Finding> {
    text.lines()
        .enumerate()
        .filter_map(|(i, line)| {
            scan_line(line)
                .map(|kind| Finding::new(first_line + i, field_of_line(line), kind.message()))
        })
        .collect()
}

/// A field name for a line: its key when it has one, else what it is.
pub fn field_of_line(line: &str) -> String {
    let t = line.trim_start();
    if t.starts_with('|') {
        return "table row".to_owned();
    }
    let t = t.strip_prefix("- ").unwrap_or(t);
    if let Some((key, _)) = t.split_once(':') {
        let key = key.trim().trim_matches('`');
        if !key.is_empty()
            && scan_line(key).is_none()
            && key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        {
            return key.to_owned();
        }
    }
    "line".to_owned()
}

/// What replaces a secret-looking value wherever fvd would otherwise show it.
pub const REDACTED: &str = "[redacted]";

/// `value`, or [`REDACTED`] when it holds something secret-looking.
pub fn redact(value: &str) -> String {
    if scan_line(value).is_some() {
        REDACTED.to_owned()
    } else {
        value.to_owned()
    }
}

/// Redacts finding fields built from keys: a pasted token can sit where a
/// key belongs, and the field name must not repeat it.
pub fn redact_findings(findings: &mut [Finding]) {
    for f in findings {
        if scan_line(&f.field).is_some() {
            f.field = REDACTED.to_owned();
        }
    }
}

fn is_token_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '~' | '+' | '/' | '=')
}

fn has_hf_token(line: &str) -> bool {
    let bytes = line.as_bytes();
    let mut from = 0;
    while let Some(pos) = line[from..].find("hf_") {
        let start = from + pos;
        let boundary = start == 0 || !bytes[start - 1].is_ascii_alphanumeric();
        let run = bytes[start + 3..]
            .iter()
            .take_while(|b| b.is_ascii_alphanumeric())
            .count();
        if boundary && run >= 30 {
            return true;
        }
        from = start + 3;
    }
    false
}

fn has_bearer(line: &str) -> bool {
    let lower = line.to_ascii_lowercase();
    let mut from = 0;
    while let Some(pos) = lower[from..].find("bearer") {
        let start = from + pos;
        from = start + 6;
        let rest = &line[from..];
        let trimmed = rest.trim_start_matches([' ', '\t', ':']);
        if trimmed.len() == rest.len() {
            continue;
        }
        let value: String = trimmed.chars().take_while(|c| is_token_char(*c)).collect();
        if is_opaque(&value, 8) {
            return true;
        }
    }
    false
}

const SECRET_KEYS: [&str; 6] = ["token", "secret", "password", "passwd", "api_key", "apikey"];

fn has_assigned_secret(line: &str) -> bool {
    for (idx, c) in line.char_indices() {
        if c != '=' && c != ':' {
            continue;
        }
        let key: String = line[..idx]
            .chars()
            .rev()
            .skip_while(|c| matches!(c, ' ' | '"' | '\'' | '`'))
            .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'))
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        let key = key.to_ascii_lowercase();
        if !SECRET_KEYS.iter().any(|k| key.contains(k)) {
            continue;
        }
        let value: String = line[idx + 1..]
            .trim_start_matches([' ', '\t', '"', '\'', '`'])
            .chars()
            .take_while(|c| is_token_char(*c))
            .collect();
        if is_opaque(&value, 20) {
            return true;
        }
    }
    false
}

/// Long enough, mixing letters and digits, and not an env var reference: env
/// var names (`HF_TOKEN`) and paths are the legitimate values in contracts.
fn is_opaque(value: &str, min_len: usize) -> bool {
    let len = value.chars().count();
    if len < min_len || value.starts_with('$') || value.contains('/') {
        return false;
    }
    let digit = value.chars().any(|c| c.is_ascii_digit());
    let alpha = value.chars().any(|c| c.is_ascii_alphabetic());
    let env_name = value
        .chars()
        .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
    alpha && (digit || len >= 24) && !env_name
}

#[cfg(test)]
mod tests {
    use super::*;

    const HF: &str = "hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789";

    #[test]
    fn hugging_face_tokens_are_found_without_echo() {
        let text = format!("model_family: x\nhf_token_env: {HF}\n");
        let f = scan_text(&text, 1);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].line, 2);
        assert_eq!(f[0].field, "hf_token_env");
        assert!(!f[0].message.contains(HF));
        assert!(!f[0].message.contains("aBcDeF"));
    }

    #[test]
    fn env_var_names_are_not_secrets() {
        for ok in [
            "hf_token_env: HF_TOKEN",
            "- Refer only to HF_API_KEY or HUGGINGFACE_HUB_TOKEN",
            "hf_token_env: $HF_TOKEN",
            "bearer auth is not used here",
            "token_values_committed: no",
            "hf_weights_path: GD-ML/DreamX-World-5B-Cam",
            "path: hf_short_name",
            "api_key: ${HF_API_KEY}",
        ] {
            assert_eq!(scan_line(ok), None, "{ok}");
        }
    }

    #[test]
    fn bearer_and_assigned_secrets_are_found() {
        assert_eq!(
            scan_line("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9abc123"),
            Some(SecretKind::BearerToken)
        );
        assert_eq!(
            scan_line("curl -H token=a8f3b2c9d0e1f4a5b6c7d8e9f0 https://x"),
            Some(SecretKind::AssignedSecret)
        );
        assert_eq!(
            scan_line("api_key: 9f8e7d6c5b4a39281706f5e4d3c2b1a0"),
            Some(SecretKind::AssignedSecret)
        );
        assert_eq!(
            scan_line(&format!("| I001 | {HF} |")),
            Some(SecretKind::HuggingFaceToken)
        );
        assert_eq!(field_of_line(&format!("| I001 | {HF} |")), "table row");
    }
}

#[cfg(test)]
mod redaction_tests {
    use super::*;

    #[test]
    fn keys_and_values_holding_tokens_are_redacted() {
        let token = format!("hf_{}", "x7Y".repeat(11));
        assert_eq!(redact(&token), REDACTED);
        assert_eq!(redact("non_skip_pass"), "non_skip_pass");
        let line = format!("{token}: 1");
        assert_eq!(field_of_line(&line), "line");
        let mut f = vec![Finding::new(
            3,
            token.clone(),
            "unknown field for this contract",
        )];
        redact_findings(&mut f);
        assert_eq!(f[0].field, REDACTED);
    }
}
