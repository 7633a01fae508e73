//! Which contract a text is, and checking any of them through one entry
//! point: what `fvd contracts check` calls.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::Serialize;

use crate::block::{self, Map, Value};
use crate::component::{ComponentContext, ComponentSkillHandoff, ParityStatus};
use crate::contract::Contract;
use crate::conversion::{ConversionHandoff, ConversionRequest, ConversionRetryRequest};
use crate::escape_hatch::EscapeHatch;
use crate::fields::BlockStruct;
use crate::final_handoff::FinalHandoff;
use crate::findings::{ContractError, Finding};
use crate::pipeline::{PipelineContext, PipelineHandoff};
use crate::port_status;
use crate::prep::PrepHandoff;
use crate::secrets::redact;

/// Every contract fvd can check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ContractKind {
    PrepHandoff,
    /// A `PORT_STATUS.md` file, following the `port_state` contract.
    PortStatus,
    EscapeHatch,
    ComponentContext,
    ParityStatus,
    ConversionRequest,
    ConversionRetryRequest,
    ConversionHandoff,
    ComponentSkillHandoff,
    PipelineContext,
    PipelineHandoff,
    FinalHandoff,
}

impl ContractKind {
    pub const ALL: [ContractKind; 12] = [
        ContractKind::PrepHandoff,
        ContractKind::PortStatus,
        ContractKind::EscapeHatch,
        ContractKind::ComponentContext,
        ContractKind::ParityStatus,
        ContractKind::ConversionRequest,
        ContractKind::ConversionRetryRequest,
        ContractKind::ConversionHandoff,
        ContractKind::ComponentSkillHandoff,
        ContractKind::PipelineContext,
        ContractKind::PipelineHandoff,
        ContractKind::FinalHandoff,
    ];

    /// The contract's name (`prep_handoff`); `port_status` for the status file.
    pub fn as_str(self) -> &'static str {
        match self {
            ContractKind::PrepHandoff => "prep_handoff",
            ContractKind::PortStatus => "port_status",
            ContractKind::EscapeHatch => "escape_hatch",
            ContractKind::ComponentContext => "component_context",
            ContractKind::ParityStatus => "parity_status",
            ContractKind::ConversionRequest => "conversion_request",
            ContractKind::ConversionRetryRequest => "conversion_retry_request",
            ContractKind::ConversionHandoff => "conversion_handoff",
            ContractKind::ComponentSkillHandoff => "component_skill_handoff",
            ContractKind::PipelineContext => "pipeline_context",
            ContractKind::PipelineHandoff => "pipeline_handoff",
            ContractKind::FinalHandoff => "final_handoff",
        }
    }

    /// The key a rooted block is nested under, `None` for flat blocks.
    pub fn root(self) -> Option<&'static str> {
        match self {
            ContractKind::EscapeHatch => EscapeHatch::ROOT,
            ContractKind::ComponentContext => ComponentContext::ROOT,
            ContractKind::ConversionRetryRequest => ConversionRetryRequest::ROOT,
            ContractKind::PipelineContext => PipelineContext::ROOT,
            ContractKind::PipelineHandoff => PipelineHandoff::ROOT,
            ContractKind::FinalHandoff => FinalHandoff::ROOT,
            _ => None,
        }
    }

    fn flat_fields(self) -> &'static [&'static str] {
        match self {
            ContractKind::PrepHandoff => PrepHandoff::FIELDS,
            ContractKind::ParityStatus => ParityStatus::FIELDS,
            ContractKind::ConversionRequest => ConversionRequest::FIELDS,
            ContractKind::ConversionHandoff => ConversionHandoff::FIELDS,
            ContractKind::ComponentSkillHandoff => ComponentSkillHandoff::FIELDS,
            _ => &[],
        }
    }
}

impl fmt::Display for ContractKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ContractKind {
    type Err = ContractError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim().to_ascii_lowercase().replace('-', "_");
        let s = s.trim_end_matches(".md");
        match s {
            "port_state" | "port_status" => return Ok(ContractKind::PortStatus),
            "conversion_retry" => return Ok(ContractKind::ConversionRetryRequest),
            _ => {}
        }
        ContractKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| ContractError::UnknownKind(s.to_owned()))
    }
}

impl Serialize for ContractKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// The kind a parsed block most plausibly is: its root key when it has one,
/// else the flat contract sharing the most field names (at least two).
pub fn infer_block_kind(map: &Map) -> Option<ContractKind> {
    if let Some(first) = map.entries.first()
        && matches!(first.value, Value::Map(_))
        && let Some(kind) = ContractKind::ALL
            .into_iter()
            .find(|k| k.root() == Some(first.key.as_str()))
    {
        return Some(kind);
    }
    let mut best: Option<(usize, ContractKind)> = None;
    for kind in ContractKind::ALL {
        let fields = kind.flat_fields();
        let hits = map
            .entries
            .iter()
            .filter(|e| fields.contains(&e.key.as_str()))
            .count();
        if hits >= 2 && best.is_none_or(|(b, _)| hits > b) {
            best = Some((hits, kind));
        }
    }
    best.map(|(_, k)| k)
}

/// Whether a markdown text is a `PORT_STATUS.md`: a `# … Port Status`
/// title or at least two of the contract's section headings outside fences.
pub fn looks_like_port_status(text: &str) -> bool {
    let mut fenced = false;
    let mut sections = 0;
    for line in text.lines() {
        let t = line.trim_start();
        if t.starts_with("```") || t.starts_with("~~~") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let lower = t.to_ascii_lowercase();
        if lower.starts_with("# ") && lower.trim_end().ends_with("port status") {
            return true;
        }
        if let Some(h) = lower.strip_prefix("##")
            && port_status::SectionId::from_heading(h).is_some()
        {
            sections += 1;
        }
    }
    sections >= 2
}

/// What `check` found out about an input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    pub kind: ContractKind,
    pub valid: bool,
    pub findings: Vec<Finding>,
    pub summary: Summary,
}

/// The headline facts of the checked input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Summary {
    /// A `PORT_STATUS.md`: values as written, backticks stripped.
    PortStatus {
        model_family: Option<String>,
        phase: Option<String>,
        status: Option<String>,
        components: Vec<port_status::ComponentSummary>,
    },
    /// A handoff block: its top-level single-line fields.
    Block(BTreeMap<String, String>),
}

/// Why an input could not be checked at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckError {
    #[error("input is empty")]
    Empty,
    #[error(
        "no contract block found; expected a port status file, a fenced ```text block or a bare `key: value` block (pass --kind to choose)"
    )]
    NoBlock,
}

/// Checks `text` as `kind`, or as the kind inferred from it.
pub fn check(text: &str, kind: Option<ContractKind>) -> Result<Report, CheckError> {
    if text.trim().is_empty() {
        return Err(CheckError::Empty);
    }
    let kind = match kind {
        Some(k) => k,
        None if looks_like_port_status(text) => ContractKind::PortStatus,
        None => locate(text, None).ok_or(CheckError::NoBlock)?.2,
    };
    if kind == ContractKind::PortStatus {
        let (status, findings) = port_status::import(text);
        return Ok(Report {
            kind,
            valid: findings.is_empty(),
            findings,
            summary: Summary::PortStatus {
                // the summary repeats values, so secret-looking ones are masked
                model_family: status.model_family().map(|v| redact(&v)),
                phase: status.phase_text().map(|v| redact(&v)),
                status: status.current_phase.get_plain("status").map(|v| redact(&v)),
                components: status
                    .components()
                    .into_iter()
                    .map(|c| port_status::ComponentSummary {
                        name: redact(&c.name),
                        parity: c.parity.map(|p| redact(&p)),
                        parity_status: c.parity_status,
                    })
                    .collect(),
            },
        });
    }
    let (body, first_line, _) = locate(text, Some(kind)).ok_or(CheckError::NoBlock)?;
    let findings = check_block(kind, &body, first_line);
    let parsed = block::parse(&body, first_line);
    let top = match kind.root() {
        Some(root) => crate::contract::nested(&parsed.map, root).clone(),
        None => parsed.map,
    };
    let fields = top
        .entries
        .iter()
        .filter_map(|e| match &e.value {
            // A token can sit where the key belongs too (found by fvd-fuzz).
            Value::Scalar(s)
                if !s.is_empty()
                    && crate::secrets::scan_line(s).is_none()
                    && crate::secrets::scan_line(&e.key).is_none() =>
            {
                Some((e.key.clone(), s.clone()))
            }
            _ => None,
        })
        .collect();
    Ok(Report {
        kind,
        valid: findings.is_empty(),
        findings,
        summary: Summary::Block(fields),
    })
}

/// The findings of checking `body` (starting at file line `first_line`) as
/// the block contract `kind`.
pub fn check_block(kind: ContractKind, body: &str, first_line: usize) -> Vec<Finding> {
    fn run<T: Contract>(body: &str, first_line: usize) -> Vec<Finding> {
        T::check(body, first_line).findings
    }
    match kind {
        ContractKind::PrepHandoff => run::<PrepHandoff>(body, first_line),
        ContractKind::EscapeHatch => run::<EscapeHatch>(body, first_line),
        ContractKind::ComponentContext => run::<ComponentContext>(body, first_line),
        ContractKind::ParityStatus => run::<ParityStatus>(body, first_line),
        ContractKind::ConversionRequest => run::<ConversionRequest>(body, first_line),
        ContractKind::ConversionRetryRequest => run::<ConversionRetryRequest>(body, first_line),
        ContractKind::ConversionHandoff => run::<ConversionHandoff>(body, first_line),
        ContractKind::ComponentSkillHandoff => run::<ComponentSkillHandoff>(body, first_line),
        ContractKind::PipelineContext => run::<PipelineContext>(body, first_line),
        ContractKind::PipelineHandoff => run::<PipelineHandoff>(body, first_line),
        ContractKind::FinalHandoff => run::<FinalHandoff>(body, first_line),
        ContractKind::PortStatus => port_status::import(body).1,
    }
}

/// Finds the block to check: the first fenced block (or the bare text when
/// there is no fence) of the wanted kind, or of any recognisable kind.
fn locate(text: &str, want: Option<ContractKind>) -> Option<(String, usize, ContractKind)> {
    let fences = block::fenced_blocks(text);
    let candidates: Vec<(String, usize)> = if fences.is_empty() {
        vec![(text.to_owned(), 1)]
    } else {
        fences.into_iter().map(|f| (f.body, f.first_line)).collect()
    };
    let inferred: Vec<Option<ContractKind>> = candidates
        .iter()
        .map(|(body, first)| infer_block_kind(&block::parse(body, *first).map))
        .collect();
    let pick = match want {
        Some(k) => inferred
            .iter()
            .position(|i| *i == Some(k))
            .or_else(|| (!candidates.is_empty()).then_some(0))
            .map(|i| (i, k)),
        None => inferred
            .iter()
            .enumerate()
            .find_map(|(i, k)| k.map(|k| (i, k))),
    }?;
    let (body, first) = candidates.into_iter().nth(pick.0)?;
    Some((body, first, pick.1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_as_a_key_stays_out_of_the_summary() {
        let token = "hf_AbrStUvWxYz0123456789component";
        let text = format!("model_family: tinyport\nofficial_env_status: imports_ok\n{token}: x\n");
        let r = check(&text, None).unwrap();
        let Summary::Block(fields) = &r.summary else {
            panic!("a block: {:?}", r.summary)
        };
        assert_eq!(
            fields.get("model_family").map(String::as_str),
            Some("tinyport")
        );
        assert!(!fields.contains_key(token), "{fields:?}");
        assert!(r.findings.iter().all(|f| !f.field.contains(token)));
    }

    #[test]
    fn kind_names_parse() {
        for k in ContractKind::ALL {
            assert_eq!(k.as_str().parse::<ContractKind>().unwrap(), k);
        }
        assert_eq!(
            "port_state".parse::<ContractKind>().unwrap(),
            ContractKind::PortStatus
        );
        assert_eq!(
            "prep-handoff".parse::<ContractKind>().unwrap(),
            ContractKind::PrepHandoff
        );
        let err = "nope".parse::<ContractKind>().unwrap_err();
        assert_eq!(err.to_string(), "unknown contract kind `nope`");
    }
}
