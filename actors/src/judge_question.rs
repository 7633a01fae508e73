//! The question a changed judge becomes (issue #39), as text: what a
//! person is asked when an agent's attempt changed what judges its
//! component, and how an answer reads as approve or reject. No actor, no
//! store, no git: the component actor asks and acts, the orchestrator
//! refuses an answer that is neither.

use fvd_store::EscapeRow;
use fvd_store::states::{EscapeAbout, RecordedVerdict};

/// The option that keeps the change.
pub const APPROVE: &str =
    "approve: commit the judge change under your name and rerun the verdict with it";
/// The option that drops it (recommended, and the safe default).
pub const REJECT: &str = "reject: drop the judge change from the branch and tell the agent why";

/// How many changed lines of the patch the question quotes.
const QUOTED_LINES: usize = 6;

/// What attempt `attempt` of `component` changed in its judge, and what
/// its code alone came to under the port's own judge.
#[derive(Debug, Clone, Copy)]
pub struct Changed<'a> {
    pub family: &'a str,
    pub component: &'a str,
    pub attempt: u32,
    pub paths: &'a [String],
    /// The change's patch ([`fvd_workspace::judge::Pinned::diff`]).
    pub diff: &'a str,
    /// The verdict of the run of its code with the port's own judge.
    pub verdict: RecordedVerdict,
}

/// The escape hatch a judge change raises: a person approves or rejects
/// it. Not yet numbered (the store gives the `E###` id).
pub fn escape(c: &Changed<'_>) -> EscapeRow {
    let quoted = quoted_lines(c.diff);
    let quoted = if quoted.is_empty() {
        String::new()
    } else {
        format!(" The change: {}.", quoted.join("; "))
    };
    let question = format!(
        "agent attempt {} changed what judges {} ({}), which a person must decide: its code alone, judged by the port's own, is {}.{quoted} Keep the judge change?",
        c.attempt,
        c.component,
        c.paths.join(", "),
        c.verdict,
    );
    EscapeRow {
        family: c.family.to_string(),
        component: c.component.to_string(),
        attempt: c.attempt,
        phase: fvd_contracts::phase::Phase::ComponentParityDebug.id(),
        // The workflow's ask case: loosening a required tolerance.
        decision_type: fvd_contracts::escape_hatch::DecisionType::Blocker
            .as_str()
            .to_string(),
        question,
        recommended: REJECT.to_string(),
        options: vec![APPROVE.to_string(), REJECT.to_string()],
        safe_default: REJECT.to_string(),
        about: EscapeAbout::Judge,
        ..EscapeRow::default()
    }
}

/// The changed lines of a patch, as `-old` / `+new`, at most
/// [`QUOTED_LINES`], each cut at 80 characters.
fn quoted_lines(diff: &str) -> Vec<String> {
    diff.lines()
        .filter(|l| {
            (l.starts_with('+') || l.starts_with('-'))
                && !l.starts_with("+++")
                && !l.starts_with("---")
                && !l[1..].trim().is_empty()
        })
        .take(QUOTED_LINES)
        .map(|l| {
            let (sign, rest) = l.split_at(1);
            let rest: String = rest.trim().chars().take(80).collect();
            format!("`{sign}{rest}`")
        })
        .collect()
}

/// A person's answer to a judge question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JudgeAnswer {
    pub approve: bool,
    /// What the person said beyond the choice (told to the agent).
    pub why: String,
}

/// Reads a recorded answer (`option N: TEXT` or free text) as approve or
/// reject; `None` when it starts with neither word.
pub fn answer(recorded: &str) -> Option<JudgeAnswer> {
    let text = recorded.trim();
    let text = match text.strip_prefix("option ") {
        Some(rest) => rest.split_once(": ").map_or(rest, |(_, t)| t),
        None => text,
    };
    let lower = text.to_ascii_lowercase();
    let (approve, rest) = if lower.starts_with("approve") {
        (true, &text["approve".len()..])
    } else if lower.starts_with("reject") {
        (false, &text["reject".len()..])
    } else {
        return None;
    };
    let why = rest
        .trim_start_matches(|c: char| c == ':' || c == ',' || c == '-' || c.is_whitespace())
        .trim();
    // The options' own words are not a reason.
    let why = if text == APPROVE || text == REJECT {
        ""
    } else {
        why
    };
    Some(JudgeAnswer {
        approve,
        why: why.to_string(),
    })
}

/// Why an answer to judge question `id` is refused: it must approve or
/// reject.
pub fn refusal(id: &str) -> String {
    format!(
        "{id} asks whether to keep a judge change: answer --option 1 (approve) or --option 2 (reject), or a text that starts with approve or reject (the rest is told to the agent)"
    )
}

/// The approver as a record names them: the credential that answered, or,
/// on a server that checks none, the name the answering command gave.
pub fn approver(e: &EscapeRow) -> &str {
    if e.answered_by.is_empty() {
        "someone unnamed (the orchestrator checks no credential and was given no name)"
    } else {
        &e.answered_by
    }
}

/// The message of the commit that keeps an approved judge change.
pub fn approved_message(e: &EscapeRow, paths: &[String], why: &str) -> String {
    let mut m = format!(
        "{}: judge change of agent attempt {}, approved by {} ({})\n\nChanged: {}\n",
        e.component,
        e.attempt,
        approver(e),
        e.id,
        paths.join(", ")
    );
    if !why.is_empty() {
        m.push_str(&format!("Why: {why}\n"));
    }
    m
}

/// The message of the commit of an attempt's code without its judge
/// change.
pub fn code_message(e: &EscapeRow, approved: bool) -> String {
    let what = if approved {
        "its judge change follows as its own commit".to_string()
    } else {
        format!("its judge change was rejected by {}", approver(e))
    };
    format!(
        "fvd: {} agent attempt {}, its code ({}: {what})",
        e.component, e.attempt, e.id
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_reads_as_approve_or_reject_with_its_reason() {
        assert_eq!(
            answer(&format!("option 1: {APPROVE}")),
            Some(JudgeAnswer {
                approve: true,
                why: String::new()
            })
        );
        assert_eq!(
            answer(&format!("option 2: {REJECT}")),
            Some(JudgeAnswer {
                approve: false,
                why: String::new()
            })
        );
        assert_eq!(
            answer("Reject: the tolerance stays 1e-5; fix eps"),
            Some(JudgeAnswer {
                approve: false,
                why: "the tolerance stays 1e-5; fix eps".into()
            })
        );
        assert_eq!(
            answer("approve - bf16 needs 1e-3 here").map(|a| (a.approve, a.why)),
            Some((true, "bf16 needs 1e-3 here".into()))
        );
        assert_eq!(answer("yes"), None);
        assert_eq!(answer("option 1: keep it"), None);
    }

    #[test]
    fn the_question_names_the_paths_the_verdict_and_the_changed_lines() {
        let paths = vec!["tests/test_x.py".to_string()];
        let diff = "diff --git a/tests/test_x.py b/tests/test_x.py\n--- a/tests/test_x.py\n+++ b/tests/test_x.py\n@@ -1 +1 @@\n-    atol=1e-4,\n+    atol=10.0,\n";
        let e = escape(&Changed {
            family: "f",
            component: "c",
            attempt: 2,
            paths: &paths,
            diff,
            verdict: RecordedVerdict::DebugRed,
        });
        assert!(e.question.contains("agent attempt 2"), "{}", e.question);
        assert!(e.question.contains("tests/test_x.py"), "{}", e.question);
        assert!(e.question.contains("debug_red"), "{}", e.question);
        assert!(
            e.question.contains("`-atol=1e-4,`; `+atol=10.0,`"),
            "{}",
            e.question
        );
        assert_eq!(e.options, vec![APPROVE.to_string(), REJECT.to_string()]);
        assert_eq!(e.recommended, REJECT);
        assert_eq!(e.about, EscapeAbout::Judge);
        assert_eq!(e.decision_type, "blocker");
    }
}
