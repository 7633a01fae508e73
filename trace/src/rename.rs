//! Module-name rewriting from the port's naming into the reference's.
//!
//! A rule is `REGEX=>TEMPLATE` in Rust `regex` syntax; every rule is applied,
//! in the order given, to the output of the previous one (like a chain of
//! `sed` substitutions), replacing every match. Templates use `$1` for
//! captures; `$1` directly followed by a letter, digit or `_` would otherwise
//! be read as a *named* group by the regex crate, so numbered references are
//! braced (`${1}`) before use.

use std::collections::HashMap;
use std::sync::Mutex;

use regex::Regex;

use crate::error::TraceError;

/// One `REGEX=>TEMPLATE` rule.
#[derive(Debug, Clone)]
pub struct RenameRule {
    pub source: String,
    regex: Regex,
    template: String,
}

impl RenameRule {
    pub fn parse(rule: &str) -> Result<Self, TraceError> {
        let (pat, tpl) = rule.split_once("=>").ok_or_else(|| TraceError::Rename {
            rule: rule.to_string(),
            message: "expected REGEX=>TEMPLATE".to_string(),
        })?;
        let regex = Regex::new(pat).map_err(|e| TraceError::Rename {
            rule: rule.to_string(),
            message: e.to_string(),
        })?;
        Ok(RenameRule {
            source: rule.to_string(),
            regex,
            template: brace_numbered_refs(tpl),
        })
    }
}

fn brace_numbered_refs(tpl: &str) -> String {
    // `$$` is a literal dollar and stays as is; `$12` becomes `${12}`.
    let re = Regex::new(r"\$(\$|\d+)").expect("static regex");
    re.replace_all(tpl, |c: &regex::Captures<'_>| {
        if &c[1] == "$" {
            "$$".to_string()
        } else {
            format!("${{{}}}", &c[1])
        }
    })
    .into_owned()
}

/// An ordered rule list with a cache: real traces repeat the same few
/// thousand names across hundreds of thousands of records.
#[derive(Debug, Default)]
pub struct Renamer {
    rules: Vec<RenameRule>,
    cache: Mutex<HashMap<String, String>>,
}

impl Clone for Renamer {
    fn clone(&self) -> Self {
        Renamer {
            rules: self.rules.clone(),
            cache: Mutex::new(HashMap::new()),
        }
    }
}

impl Renamer {
    pub fn new(rules: Vec<RenameRule>) -> Self {
        Renamer {
            rules,
            cache: Mutex::new(HashMap::new()),
        }
    }

    pub fn parse(rules: &[String]) -> Result<Self, TraceError> {
        Ok(Self::new(
            rules
                .iter()
                .map(|r| RenameRule::parse(r))
                .collect::<Result<_, _>>()?,
        ))
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The reference name of a port module.
    pub fn apply(&self, name: &str) -> String {
        if self.rules.is_empty() {
            return name.to_string();
        }
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(hit) = cache.get(name) {
            return hit.clone();
        }
        let mut cur = name.to_string();
        for rule in &self.rules {
            cur = rule
                .regex
                .replace_all(&cur, rule.template.as_str())
                .into_owned();
        }
        cache.insert(name.to_string(), cur.clone());
        cur
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpt2() -> Renamer {
        Renamer::parse(&[
            r"^blocks\.(\d+)=>transformer.h.$1".to_string(),
            r"\.norm(\d)$=>.ln_$1".to_string(),
            r"\.attention$=>.attn".to_string(),
            r"\.ffn\b=>.mlp".to_string(),
            r"^tok_embed$=>transformer.wte".to_string(),
        ])
        .unwrap()
    }

    #[test]
    fn rules_chain_in_order() {
        let r = gpt2();
        assert_eq!(r.apply("blocks.3.norm2"), "transformer.h.3.ln_2");
        assert_eq!(r.apply("blocks.10.ffn.c_fc"), "transformer.h.10.mlp.c_fc");
        assert_eq!(r.apply("tok_embed"), "transformer.wte");
        assert_eq!(r.apply("lm_head"), "lm_head");
    }

    #[test]
    fn numbered_capture_followed_by_letters() {
        let r = Renamer::parse(&["^l(\\d+)$=>layer$1_out".to_string()]).unwrap();
        assert_eq!(r.apply("l7"), "layer7_out");
    }

    #[test]
    fn bad_rule_is_an_error() {
        assert!(RenameRule::parse("no arrow").is_err());
        assert!(RenameRule::parse("(=>x").is_err());
    }
}
