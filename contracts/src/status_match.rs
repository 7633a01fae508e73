//! Which row of a `PORT_STATUS.md` is about which spec component.
//!
//! People label rows their own way: `` `vae` ``, `Transformer
//! (`SomeDiTClass`)`, `text_encoder/tokenizer`, `Text encoder`, `VAE and
//! scheduler`. A spec component (its `name` and `aliases`) matches a row
//! whose label, normalised by [`normalise_label`], is one of those names,
//! or whose label splits (on `/`, `+`, `,`, ` and `) into parts one of which
//! is. A Parity Commands row also matches when its command runs one of the
//! component's parity test files. [`assign`] gives each component at most
//! one row and each row at most one component, better matches first.

/// How a spec component is named and tested.
#[derive(Debug, Clone, Copy)]
pub struct Identity<'a> {
    pub name: &'a str,
    pub aliases: &'a [String],
    pub parity_tests: &'a [String],
}

impl Identity<'_> {
    fn names(&self) -> impl Iterator<Item = String> + '_ {
        std::iter::once(self.name)
            .chain(self.aliases.iter().map(String::as_str))
            .map(normalise_label)
    }
}

/// How well a row matches, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Match {
    /// The whole label is the name or an alias.
    Label,
    /// One part of a composite label (`text_encoder/tokenizer`) is.
    Part,
    /// The row's command runs one of the component's parity test files.
    Command,
    /// Every word of a name or alias is a word of the label (`MMAudio
    /// transformer` for `transformer`, `Qwen3-VL encoder` for `qwen3_vl`;
    /// a plural `s` aside), taken only by rows nothing matched better.
    Words,
    /// Another cell of the row names a code file whose name holds a word
    /// of the component and whose name and folder hold them all
    /// (`fastvideo/models/audio/chirp_vae.py` for `audio_vae` in a row
    /// labelled `44.1 kHz VAE`): the weakest match.
    Path,
}

/// The label as a name: markdown emphasis and backticks stripped, the part
/// before ` (` kept, lowercased, blanks and hyphens as `_`, and fvd's old
/// `component:` scope prefix dropped.
///
/// ```
/// use fvd_contracts::status_match::normalise_label;
/// assert_eq!(normalise_label("Transformer (`SomeDiTClass`)"), "transformer");
/// assert_eq!(normalise_label("**Text encoder**"), "text_encoder");
/// assert_eq!(normalise_label("`component:vae`"), "vae");
/// ```
pub fn normalise_label(label: &str) -> String {
    let stripped = strip_markup(label);
    let head = cut_parenthesis(&stripped);
    squash(head)
}

/// The parts of a composite label, each normalised; a plain label is one part.
pub fn label_parts(label: &str) -> Vec<String> {
    let stripped = strip_markup(label);
    let head = cut_parenthesis(&stripped);
    head.split(" and ")
        .flat_map(|p| p.split(['/', '+', ',', '&']))
        .map(squash)
        .filter(|p| !p.is_empty())
        .collect()
}

fn strip_markup(label: &str) -> String {
    label
        .replace("\\|", "|")
        .chars()
        .filter(|c| !matches!(c, '`' | '*'))
        .collect()
}

fn cut_parenthesis(s: &str) -> &str {
    let s = s.trim();
    match s.find(" (") {
        Some(i) if i > 0 => &s[..i],
        _ => s,
    }
}

fn squash(s: &str) -> String {
    let mut out = String::new();
    for ch in s.trim().to_lowercase().chars() {
        let ch = if ch.is_whitespace() || ch == '-' {
            '_'
        } else {
            ch
        };
        if ch == '_' && (out.is_empty() || out.ends_with('_')) {
            continue;
        }
        out.push(ch);
    }
    let out = out.trim_end_matches('_');
    out.strip_prefix("component:").unwrap_or(out).to_owned()
}

/// How a row label matches a component, if it does.
pub fn match_label(label: &str, who: &Identity<'_>) -> Option<Match> {
    let whole = normalise_label(label);
    if whole.is_empty() {
        return None;
    }
    if who.names().any(|n| n == whole) {
        return Some(Match::Label);
    }
    let parts = label_parts(label);
    if parts.len() > 1 && who.names().any(|n| parts.contains(&n)) {
        return Some(Match::Part);
    }
    // words of prose (`MMAudio transformer`), not of an identifier
    // (`text_encoder_2` is another component's name)
    if !strip_markup(label).trim().contains(char::is_whitespace) {
        return None;
    }
    let words = word_set(&whole);
    who.names()
        .any(|n| {
            let want = word_set(&n);
            !want.is_empty() && want.iter().all(|w| words.contains(w))
        })
        .then_some(Match::Words)
}

/// How a row matches by the code files its other cells name (see
/// [`Match::Path`]): a path is a word with a `/` that ends in a file name
/// with an extension (`.py`), backticks and quotes aside.
pub fn match_paths<'c>(
    cells: impl IntoIterator<Item = &'c str>,
    who: &Identity<'_>,
) -> Option<Match> {
    let names: Vec<Vec<String>> = who
        .names()
        .map(|n| word_set(&n))
        .filter(|w| !w.is_empty())
        .collect();
    let hit = cells
        .into_iter()
        .flat_map(|c| {
            c.split(|ch: char| ch.is_whitespace() || matches!(ch, '`' | '\'' | '"' | ';' | ','))
        })
        .filter_map(code_file_words)
        .any(|(file, folder)| {
            names.iter().any(|want| {
                want.iter().any(|w| file.contains(w))
                    && want.iter().all(|w| file.contains(w) || folder.contains(w))
            })
        });
    hit.then_some(Match::Path)
}

/// The words of a code file's name (its extension cut) and of the folder
/// that holds it, for a word that is a path to a file; `None` otherwise.
fn code_file_words(word: &str) -> Option<(Vec<String>, Vec<String>)> {
    let word = word.trim_end_matches(['.', ':', ')']);
    let (dir, file) = word.rsplit_once('/')?;
    let (stem, ext) = file.rsplit_once('.')?;
    if stem.is_empty() || ext.is_empty() || !ext.chars().all(|c| c.is_ascii_alphanumeric()) {
        return None;
    }
    let folder = dir.rsplit('/').next().unwrap_or_default();
    Some((word_set(&squash(stem)), word_set(&squash(folder))))
}

/// The words of a normalised name, a plural `s` cut (`schedulers`).
fn word_set(name: &str) -> Vec<String> {
    name.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(|w| match w.strip_suffix('s') {
            Some(stem) if stem.len() > 3 => stem.to_owned(),
            _ => w.to_owned(),
        })
        .collect()
}

/// Whether `command` runs the test file `test`: the path appears in it as
/// a whole word (after a blank, `/`, `=` or a backtick; before a blank, a
/// backtick, `::` or the end), so `a/test_x.py` does not match
/// `a/test_x.py2` or `a/other_test_x.py`.
pub fn command_runs(command: &str, test: &str) -> bool {
    let test = test.trim().trim_start_matches("./");
    if test.is_empty() {
        return false;
    }
    let mut from = 0;
    while let Some(i) = command[from..].find(test) {
        let start = from + i;
        let end = start + test.len();
        let before = command[..start].chars().next_back();
        let after = command[end..].chars().next();
        let ok_before =
            before.is_none_or(|c| c.is_whitespace() || matches!(c, '/' | '=' | '`' | '\'' | '"'));
        let ok_after =
            after.is_none_or(|c| c.is_whitespace() || matches!(c, '`' | ':' | '\'' | '"' | ';'));
        if ok_before && ok_after {
            return true;
        }
        from = start + 1;
    }
    false
}

/// How a Parity Commands row (its Scope and Command cells) matches.
pub fn match_command_row(scope: &str, command: &str, who: &Identity<'_>) -> Option<Match> {
    match_label(scope, who).or_else(|| {
        who.parity_tests
            .iter()
            .any(|t| command_runs(command, t))
            .then_some(Match::Command)
    })
}

/// Pairs components with rows: for each match strength, best first, each
/// component (in order) takes the first row not taken yet. A component
/// gets at most one row and a row at most one component. `matches(c, r)`
/// says how component `c` matches row `r`.
pub fn assign(
    components: usize,
    rows: usize,
    matches: impl Fn(usize, usize) -> Option<Match>,
) -> Vec<Option<usize>> {
    let mut out = vec![None; components];
    let mut taken = vec![false; rows];
    for level in [
        Match::Label,
        Match::Part,
        Match::Command,
        Match::Words,
        Match::Path,
    ] {
        for (c, slot) in out.iter_mut().enumerate() {
            if slot.is_some() {
                continue;
            }
            if let Some(r) = (0..rows).find(|&r| !taken[r] && matches(c, r) == Some(level)) {
                taken[r] = true;
                *slot = Some(r);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who<'a>(name: &'a str, aliases: &'a [String], tests: &'a [String]) -> Identity<'a> {
        Identity {
            name,
            aliases,
            parity_tests: tests,
        }
    }

    #[test]
    fn labels_normalise_to_names() {
        for (label, name) in [
            ("vae", "vae"),
            ("`vae`", "vae"),
            ("VAE", "vae"),
            ("**VAE**", "vae"),
            ("Transformer (`WidgetTransformer3DModel`)", "transformer"),
            ("Text encoder", "text_encoder"),
            ("text-encoder", "text_encoder"),
            ("  Camera   utility ", "camera_utility"),
            ("component:scheduler", "scheduler"),
            ("`component:scheduler`", "scheduler"),
            ("ar_transformer", "ar_transformer"),
            ("(weird)", "(weird)"),
        ] {
            assert_eq!(normalise_label(label), name, "{label}");
        }
    }

    #[test]
    fn composite_labels_match_any_part() {
        let none: Vec<String> = vec![];
        let te = who("text_encoder", &none, &none);
        let tok = who("tokenizer", &none, &none);
        let vae = who("vae", &none, &none);
        for label in [
            "text_encoder/tokenizer",
            "`text_encoder/tokenizer`",
            "text_encoder + tokenizer",
            "Text encoder and tokenizer",
            "tokenizer, text encoder",
            "Text encoder / tokenizer (`SomeT5`)",
        ] {
            assert_eq!(match_label(label, &te), Some(Match::Part), "{label}");
            assert_eq!(match_label(label, &tok), Some(Match::Part), "{label}");
            assert_eq!(match_label(label, &vae), None, "{label}");
        }
        assert_eq!(match_label("Text encoder", &te), Some(Match::Label));
        // a name inside a word is no match
        assert_eq!(match_label("text_encoder_2", &te), None);
        assert_eq!(match_label("vae_decoder", &vae), None);
        // every word of the name in the label: the weakest match
        assert_eq!(
            match_label("MMAudio transformer", &who("transformer", &none, &none)),
            Some(Match::Words)
        );
        assert_eq!(
            match_label("Qwen3-VL encoder", &who("qwen3_vl", &none, &none)),
            Some(Match::Words)
        );
        assert_eq!(
            match_label("Video/audio schedulers", &who("scheduler", &none, &none)),
            Some(Match::Words)
        );
        assert_eq!(
            match_label("Euler flow schedule", &who("scheduler", &none, &none)),
            None
        );
        assert_eq!(
            match_label("Audio VAE decode", &who("audio_vae", &none, &none)),
            Some(Match::Words)
        );
        assert_eq!(match_label("", &vae), None);
    }

    #[test]
    fn code_files_a_row_names_match_by_their_words() {
        let none: Vec<String> = vec![];
        let audio_vae = who("audio_vae", &none, &none);
        let clip = who("clip", &none, &none);
        let vae = who("vae", &none, &none);
        let row = [
            "44.1 kHz VAE",
            "`fastvideo/models/audio/chirp_vae.py`",
            "exact",
        ];
        assert_eq!(match_paths(row, &audio_vae), Some(Match::Path));
        assert_eq!(match_paths(row, &vae), Some(Match::Path));
        assert_eq!(match_paths(row, &clip), None);
        let enc = [
            "DFN text/vision",
            "fastvideo/models/encoders/chirp_clip.py; shared core",
        ];
        assert_eq!(match_paths(enc, &clip), Some(Match::Path));
        // a folder alone names no component, nor does a word inside a word
        assert_eq!(
            match_paths(["`fastvideo/models/vaes/wanvae2.py`"], &vae),
            None
        );
        assert_eq!(match_paths(["fastvideo/models/vae/"], &vae), None);
        assert_eq!(match_paths(["a vae/decoder split"], &vae), None);
        // taken only by a component nothing else matched
        let m = |c: usize, r: usize| match (c, r) {
            (0, 0) => Some(Match::Path),
            (1, 0) => Some(Match::Words),
            _ => None,
        };
        assert_eq!(assign(2, 1, m), vec![None, Some(0)]);
    }

    #[test]
    fn aliases_match_whole_labels_and_parts() {
        let aliases = vec!["Text encoder/tokenizer".to_string(), "umt5".to_string()];
        let none: Vec<String> = vec![];
        let te = who("text_encoder", &aliases, &none);
        assert_eq!(
            match_label("text_encoder/tokenizer", &te),
            Some(Match::Label)
        );
        assert_eq!(
            match_label("UMT5 (`UMT5EncoderModel`)", &te),
            Some(Match::Label)
        );
        assert_eq!(match_label("umt5 + clip", &te), Some(Match::Part));
    }

    #[test]
    fn commands_match_their_test_files_as_whole_words() {
        let a = "tests/local_tests/w/test_w_a_parity.py";
        assert!(command_runs(&format!("`python -m pytest {a} -v -s`"), a));
        assert!(command_runs(
            &format!("PYTHONPATH=/src python -m pytest /src/{a}::test_one -q"),
            a
        ));
        assert!(command_runs(&format!("pytest {a}"), a));
        assert!(!command_runs(&format!("pytest {a}x"), a));
        assert!(!command_runs(
            "pytest tests/local_tests/w/test_w_a_parity.py2",
            a
        ));
        assert!(!command_runs(
            "pytest tests/local_tests/w/other_test_w_a_parity.py",
            "test_w_a_parity.py"
        ));
        // a command that runs two files matches either
        let two = "PYTHONPATH=/src python -m pytest t/test_conv.py t/test_fwd.py -q -rs";
        let none: Vec<String> = vec![];
        let conv = vec!["t/test_conv.py".to_string()];
        let fwd = vec!["t/test_fwd.py".to_string()];
        assert_eq!(
            match_command_row("ar stack", two, &who("ar_conv", &none, &conv)),
            Some(Match::Command)
        );
        assert_eq!(
            match_command_row("ar stack", two, &who("ar_fwd", &none, &fwd)),
            Some(Match::Command)
        );
        // the scope wins over the command
        assert_eq!(
            match_command_row("ar_fwd", two, &who("ar_fwd", &none, &fwd)),
            Some(Match::Label)
        );
    }

    #[test]
    fn assign_prefers_better_matches_and_gives_each_row_once() {
        // rows: 0 "vae/text_encoder", 1 "vae", 2 command of text_encoder
        let m = |c: usize, r: usize| match (c, r) {
            (0, 0) => Some(Match::Part),
            (0, 1) => Some(Match::Label),
            (1, 0) => Some(Match::Part),
            (1, 2) => Some(Match::Command),
            _ => None,
        };
        assert_eq!(assign(2, 3, m), vec![Some(1), Some(0)]);
        // two components on one row: the first takes it, the other none
        let both = |_c: usize, r: usize| (r == 0).then_some(Match::Command);
        assert_eq!(assign(2, 1, both), vec![Some(0), None]);
    }
}
