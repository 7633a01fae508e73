//! Reading a shell command of a Parity Commands row: leading `VAR=value`
//! assignments, the program, and for pytest the test files and flags.

/// Flags of pytest that take the next word as their value.
const VALUE_FLAGS: &[&str] = &[
    "-k",
    "-m",
    "-p",
    "-c",
    "-o",
    "-n",
    "-W",
    "--rootdir",
    "--basetemp",
    "--maxfail",
    "--timeout",
    "--deselect",
    "--ignore",
    "--durations",
    "--log-level",
    "--tb",
    "--capture",
    "--import-mode",
    "--confcutdir",
    "--junitxml",
    "--junit-xml",
];

/// A command as init understands it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Parsed {
    /// pytest on files or folders.
    Pytest(Pytest),
    /// Anything else (`python /tmp/x.py`, `modal run …`, a shell script).
    Other,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Pytest {
    /// `VAR=value` words before the program, in order.
    pub assignments: Vec<(String, String)>,
    /// The interpreter (`python`, `/venv/bin/python`) of `python -m pytest`,
    /// or the `pytest` executable as written.
    pub program: String,
    /// Whether pytest runs as `PROGRAM -m pytest`.
    pub module: bool,
    /// The interpreter's flags before `-m` (`-B`, `-u`), kept in the command.
    pub interpreter_flags: Vec<String>,
    /// `*.py` arguments, node ids cut to their file.
    pub files: Vec<String>,
    /// Node ids (`file.py::test_x`) as written, when some were given.
    pub node_ids: Vec<String>,
    /// Other positional arguments (folders).
    pub dirs: Vec<String>,
    /// Flags, with their values, in order; `--junitxml` left out (the worker
    /// adds its own).
    pub flags: Vec<String>,
    /// Words of the command line before the pytest part (`cd DIR`).
    pub preamble: Vec<String>,
}

/// Splits a command line into words as a POSIX shell would for simple
/// commands: quotes and backslashes; `None` when a quote is left open.
pub(crate) fn words(line: &str) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                loop {
                    match chars.next()? {
                        '\'' => break,
                        ch => cur.push(ch),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next()? {
                        '"' => break,
                        '\\' => cur.push(chars.next()?),
                        ch => cur.push(ch),
                    }
                }
            }
            '\\' => {
                in_word = true;
                if let Some(ch) = chars.next() {
                    cur.push(ch);
                }
            }
            c if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                cur.push(c);
            }
        }
    }
    if in_word {
        out.push(cur);
    }
    Some(out)
}

fn is_assignment(word: &str) -> Option<(String, String)> {
    let (name, value) = word.split_once('=')?;
    let ok = !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    ok.then(|| (name.to_string(), value.to_string()))
}

fn basename(p: &str) -> &str {
    p.rsplit('/').next().unwrap_or(p)
}

fn is_python(p: &str) -> bool {
    let b = basename(p);
    b == "python"
        || b.strip_prefix("python")
            .is_some_and(|v| v.chars().all(|c| c.is_ascii_digit() || c == '.'))
}

fn is_pytest(p: &str) -> bool {
    matches!(basename(p), "pytest" | "py.test")
}

/// The shell command lines of a markdown text's fenced blocks: lines
/// continued with a trailing `\` joined, a leading `$ ` prompt dropped,
/// comments and blank lines left out.
pub(crate) fn fenced_commands(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut open = false;
    let mut cur = String::new();
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with("```") || t.starts_with("~~~") {
            open = !open;
            cur.clear();
            continue;
        }
        if !open || t.starts_with('#') {
            continue;
        }
        let t = t.strip_prefix("$ ").unwrap_or(t);
        match t.strip_suffix('\\') {
            Some(head) => {
                cur.push_str(head.trim_end());
                cur.push(' ');
            }
            None => {
                cur.push_str(t);
                if !cur.trim().is_empty() {
                    out.push(std::mem::take(&mut cur).trim().to_string());
                }
                cur.clear();
            }
        }
    }
    out
}

/// Reads one command. A line of several commands (`cd X && pytest …`) is
/// read at its pytest part; the words before it are kept as `preamble`.
pub(crate) fn parse(line: &str) -> Parsed {
    let Some(all) = words(line) else {
        return Parsed::Other;
    };
    // split at the shell's command separators
    let mut parts: Vec<Vec<String>> = vec![Vec::new()];
    for w in all {
        if matches!(w.as_str(), "&&" | ";" | "||") {
            parts.push(Vec::new());
        } else if let Some(last) = parts.last_mut() {
            last.push(w);
        }
    }
    if parts.iter().flatten().any(|w| w == "|") {
        return Parsed::Other;
    }
    let mut preamble = Vec::new();
    for part in parts {
        if let Some(mut p) = pytest_part(&part) {
            p.preamble = preamble;
            return Parsed::Pytest(p);
        }
        preamble.extend(part);
    }
    Parsed::Other
}

fn pytest_part(words: &[String]) -> Option<Pytest> {
    let mut i = 0;
    if words.first().is_some_and(|w| w == "env") {
        i = 1;
    }
    let mut p = Pytest::default();
    while let Some((k, v)) = words.get(i).and_then(|w| is_assignment(w)) {
        p.assignments.push((k, v));
        i += 1;
    }
    let program = words.get(i)?;
    // `$PY -m pytest`: an interpreter in a variable the README sets
    let variable = program.starts_with('$')
        && words.get(i + 1).is_some_and(|w| w == "-m")
        && words.get(i + 2).is_some_and(|w| is_pytest(w));
    // the interpreter's own flags before `-m` (`python3 -B -u -m pytest`)
    let mut j = i + 1;
    if is_python(program) {
        while let Some(w) = words.get(j) {
            match w.as_str() {
                "-m" => break,
                "-X" | "-W" => j += 2,
                f if f.starts_with('-') && f.len() > 1 && !f.starts_with("--") => j += 1,
                _ => break,
            }
        }
    }
    let args = if variable {
        p.module = true;
        p.program = "python3".into();
        &words[i + 3..]
    } else if is_pytest(program) {
        &words[i + 1..]
    } else if is_python(program)
        && words.get(j).is_some_and(|w| w == "-m")
        && words.get(j + 1).is_some_and(|w| is_pytest(w))
    {
        p.module = true;
        p.interpreter_flags = words[i + 1..j].to_vec();
        &words[j + 2..]
    } else {
        return None;
    };
    if !variable {
        p.program = program.clone();
    }
    let mut it = args.iter().peekable();
    while let Some(a) = it.next() {
        if a.starts_with('-') {
            let junit = a.starts_with("--junitxml") || a.starts_with("--junit-xml");
            let takes_value = VALUE_FLAGS.contains(&a.as_str());
            let value = if takes_value { it.next() } else { None };
            if !junit {
                p.flags.push(a.clone());
                p.flags.extend(value.cloned());
            }
        } else if let Some((file, _)) = a.split_once("::").filter(|(f, _)| f.ends_with(".py")) {
            p.node_ids.push(a.clone());
            if !p.files.iter().any(|f| f == file) {
                p.files.push(file.to_string());
            }
        } else if a.ends_with(".py") {
            if !p.files.iter().any(|f| f == a) {
                p.files.push(a.clone());
            }
        } else {
            p.dirs.push(a.clone());
        }
    }
    Some(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pytest(line: &str) -> Pytest {
        match parse(line) {
            Parsed::Pytest(p) => p,
            Parsed::Other => panic!("not read as pytest: {line}"),
        }
    }

    #[test]
    fn words_follow_shell_quoting() {
        assert_eq!(
            words(r#"A="x y" b\ c 'd "e"' -k "not slow""#).unwrap(),
            ["A=x y", "b c", "d \"e\"", "-k", "not slow"]
        );
        assert_eq!(words("a 'open"), None);
    }

    #[test]
    fn assignments_files_and_flags() {
        let p = pytest(
            "PYTHONPATH=/srv/FastVideo ATTN=SDPA python -m pytest tests/a.py tests/b.py::test_one -q -rs -k 'x and y' --junitxml=out.xml",
        );
        assert_eq!(
            p.assignments,
            [
                ("PYTHONPATH".to_string(), "/srv/FastVideo".to_string()),
                ("ATTN".to_string(), "SDPA".to_string())
            ]
        );
        assert_eq!((p.program.as_str(), p.module), ("python", true));
        assert_eq!(p.files, ["tests/a.py", "tests/b.py"]);
        assert_eq!(p.node_ids, ["tests/b.py::test_one"]);
        assert_eq!(p.flags, ["-q", "-rs", "-k", "x and y"]);
        let p = pytest("/opt/venv/bin/python3.11 -m pytest t.py");
        assert_eq!(p.program, "/opt/venv/bin/python3.11");
        // the interpreter's own flags before -m, as the project's example writes them
        let p = pytest("python3 -B -X dev -m pytest t/test_a.py -q -p no:cacheprovider");
        assert_eq!((p.program.as_str(), p.module), ("python3", true));
        assert_eq!(p.interpreter_flags, ["-B", "-X", "dev"]);
        assert_eq!(p.files, ["t/test_a.py"]);
        assert_eq!(p.flags, ["-q", "-p", "no:cacheprovider"]);
        let p = pytest("cd /srv/FastVideo && pytest tests/local_tests/fam/ -vs");
        assert_eq!(
            (p.module, p.dirs.clone()),
            (false, vec!["tests/local_tests/fam/".to_string()])
        );
        assert_eq!(p.preamble, ["cd", "/srv/FastVideo"]);
    }

    #[test]
    fn fenced_commands_join_continued_lines_with_their_gates() {
        let md = "# T\n\n```bash\ncd \"$HUB\"\nPY=\"$HUB/.venv/bin/python\"\n\nGATE_A=1 \\\n  VARIANT=refiner \\\n  $PY -m pytest -v -s \\\n  tests/local_tests/x/test_x_moe_parity.py\n```\n\nprose `pytest not_this.py`\n";
        let lines = fenced_commands(md);
        assert_eq!(lines.len(), 3, "{lines:?}");
        let p = pytest(&lines[2]);
        assert_eq!(
            p.assignments,
            [
                ("GATE_A".to_string(), "1".to_string()),
                ("VARIANT".to_string(), "refiner".to_string())
            ]
        );
        assert_eq!((p.program.as_str(), p.module), ("python3", true));
        assert_eq!(p.files, ["tests/local_tests/x/test_x_moe_parity.py"]);
        assert_eq!(p.flags, ["-v", "-s"]);
    }

    #[test]
    fn other_commands_are_not_pytest() {
        for line in [
            "PYTHONPATH=/x python /tmp/run_smoke.py",
            "modal run /tmp/job.py",
            "bash scripts/matrix.sh",
            "python -m pytest_benchmark t.py",
            "pytest t.py | tee log",
            "python -c 'import x",
        ] {
            assert_eq!(parse(line), Parsed::Other, "{line}");
        }
    }
}
