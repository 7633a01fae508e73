//! What a test file says about itself: whether its name marks it as
//! something other than a component parity test, which component its name
//! names, and what its code shows (FastVideo's production loaders, classes
//! built directly, CUDA).

use std::collections::BTreeSet;

/// The file name of a repo-relative path.
pub(crate) fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// The component a file's name names: `test_<family>_<component>_parity.py`
/// or `test_<family>_<component>.py`; `None` for `test_<family>.py` and for
/// files named otherwise.
pub(crate) fn component_of_file(family: &str, path: &str) -> Option<String> {
    let stem = file_name(path).strip_suffix(".py")?;
    let rest = stem.strip_prefix("test_")?.strip_prefix(family)?;
    let rest = rest.strip_prefix('_')?;
    let rest = rest.strip_suffix("_parity").unwrap_or(rest);
    (!rest.is_empty()).then(|| rest.to_string())
}

/// Why a file is not a component parity test, from its path and (when it
/// could be read) its text; `None` when nothing says so.
pub(crate) fn not_parity(path: &str, text: Option<&str>) -> Option<&'static str> {
    let name = file_name(path).to_ascii_lowercase();
    let has = |w: &str| name.contains(w);
    let reason = if has("registry") {
        "registry check"
    } else if has("preflight") {
        "preflight check"
    } else if has("ssim") || has("similarity") {
        "quality regression (SSIM)"
    } else if has("conversion") || has("convert") {
        "conversion script test"
    } else if has("smoke") {
        if has("pipeline") {
            "pipeline smoke"
        } else {
            "smoke test"
        }
    } else if path.contains("/pipelines/") || has("pipeline") {
        if has("config") {
            "pipeline config check"
        } else {
            "pipeline test (pipeline phases are not component parity)"
        }
    } else if has("loader") {
        "loader smoke"
    } else if has("example") {
        "example run"
    } else if text.is_some_and(|t| !t.contains("def test")) {
        "defines no test function"
    } else {
        return None;
    };
    Some(reason)
}

/// What a test file's code shows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Evidence {
    /// FastVideo production loaders the file calls (`TextEncoderLoader`,
    /// `VideoGenerator.from_pretrained`).
    pub loaders: BTreeSet<String>,
    /// FastVideo classes and functions it builds or calls directly.
    pub direct: BTreeSet<String>,
    /// Whether it mentions CUDA.
    pub cuda: bool,
}

/// One `from MODULE import A, B as C` statement: its module, the names
/// bound, and the byte range it spans.
struct Import {
    module: String,
    names: Vec<String>,
    span: std::ops::Range<usize>,
}

fn imports(text: &str) -> Vec<Import> {
    let mut out = Vec::new();
    let mut offset = 0;
    let mut lines = text.split_inclusive('\n');
    while let Some(line) = lines.next() {
        let start = offset;
        offset += line.len();
        let t = line.trim_start();
        let Some(rest) = t.strip_prefix("from ") else {
            continue;
        };
        let Some((module, names)) = rest.split_once(" import ") else {
            continue;
        };
        let mut names = names.to_string();
        if names.trim_start().starts_with('(') {
            while !names.contains(')') {
                let Some(more) = lines.next() else { break };
                offset += more.len();
                names.push_str(more);
            }
        }
        let names = names
            .split([',', '(', ')', '\n'])
            .map(|n| n.split('#').next().unwrap_or_default().trim())
            .filter(|n| !n.is_empty())
            .map(|n| {
                n.rsplit_once(" as ")
                    .map_or(n, |(_, alias)| alias)
                    .trim()
                    .to_string()
            })
            .collect();
        out.push(Import {
            module: module.trim().to_string(),
            names,
            span: start..offset,
        });
    }
    out
}

/// Whether `name(` or `name.attr(` occurs in `code`, as a whole name.
fn called(code: &str, name: &str) -> bool {
    let mut from = 0;
    while let Some(pos) = code[from..].find(name) {
        let at = from + pos;
        from = at + name.len();
        let before_ok = code[..at]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'));
        if !before_ok {
            continue;
        }
        let after = &code[from..];
        let after = after.trim_start_matches(' ');
        if after.starts_with('(') {
            return true;
        }
        if let Some(attr) = after.strip_prefix('.') {
            let rest = attr.trim_start_matches(|c: char| c.is_ascii_alphanumeric() || c == '_');
            if rest.len() < attr.len() && rest.starts_with('(') {
                return true;
            }
        }
    }
    false
}

/// Reads a test file's evidence.
pub(crate) fn evidence(text: &str) -> Evidence {
    let imports = imports(text);
    // the code without its import statements, so an import is no call
    let mut code = String::with_capacity(text.len());
    let mut at = 0;
    for i in &imports {
        code.push_str(&text[at..i.span.start]);
        at = i.span.end;
    }
    code.push_str(&text[at..]);
    let mut ev = Evidence {
        cuda: text.contains("cuda"),
        ..Evidence::default()
    };
    for i in &imports {
        if !(i.module == "fastvideo" || i.module.starts_with("fastvideo.")) {
            continue;
        }
        let loader_module = i.module.starts_with("fastvideo.models.loader");
        let model_module = (i.module.starts_with("fastvideo.models.")
            && !loader_module
            && !i.module.starts_with("fastvideo.models.registry"))
            || i.module.starts_with("fastvideo.pipelines.basic.");
        for n in &i.names {
            if n == "VideoGenerator" && code.contains("VideoGenerator.from_pretrained") {
                ev.loaders.insert("VideoGenerator.from_pretrained".into());
            } else if loader_module && n.ends_with("Loader") && called(&code, n) {
                ev.loaders.insert(n.clone());
            } else if model_module && called(&code, n) {
                ev.direct.insert(n.clone());
            }
        }
    }
    ev
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_name_components() {
        assert_eq!(
            component_of_file("wan", "t/test_wan_vae_parity.py").as_deref(),
            Some("vae")
        );
        assert_eq!(
            component_of_file("wan", "test_wan_text_encoder.py").as_deref(),
            Some("text_encoder")
        );
        assert_eq!(component_of_file("wan", "test_wan.py"), None);
        assert_eq!(component_of_file("wan", "test_other_vae.py"), None);
    }

    #[test]
    fn reasons_from_names_and_text() {
        let r = |p: &str| not_parity(p, Some("def test_x(): pass"));
        assert_eq!(r("test_f_registry.py"), Some("registry check"));
        assert_eq!(r("test_f_pipeline_smoke.py"), Some("pipeline smoke"));
        assert_eq!(
            r("tests/local_tests/pipelines/test_f_pipeline_parity.py"),
            Some("pipeline test (pipeline phases are not component parity)")
        );
        assert_eq!(
            r("test_f_pipeline_config.py"),
            Some("pipeline config check")
        );
        assert_eq!(r("test_f_ar_conversion.py"), Some("conversion script test"));
        assert_eq!(r("test_f_causal_preflight.py"), Some("preflight check"));
        assert_eq!(r("test_f_vae_parity.py"), None);
        assert_eq!(
            not_parity("test_f_helpers.py", Some("X = 1\n")),
            Some("defines no test function")
        );
        assert_eq!(not_parity("test_f_vae.py", None), None);
    }

    #[test]
    fn loaders_direct_builds_and_cuda() {
        let text = "from fastvideo.models.loader.component_loader import (\n    TextEncoderLoader,\n    VAELoader,  # unused here\n)\nfrom fastvideo.models.vaes.wanvae import AutoencoderKLWan as FVVae\nfrom fastvideo.models.loader.fsdp_load import load_model_from_full_model_state_dict\nfrom official.models import Official\nimport torch\n\ndef test_x():\n    enc = TextEncoderLoader().load(path, args)\n    vae = FVVae(cfg)\n    ref = Official()\n    assert torch.cuda.is_available()\n";
        let ev = evidence(text);
        assert_eq!(ev.loaders.iter().collect::<Vec<_>>(), ["TextEncoderLoader"]);
        assert_eq!(ev.direct.iter().collect::<Vec<_>>(), ["FVVae"]);
        assert!(ev.cuda);
        let generator = evidence(
            "from fastvideo import VideoGenerator\n\ndef test_p():\n    g = VideoGenerator.from_pretrained(p)\n",
        );
        assert!(generator.loaders.contains("VideoGenerator.from_pretrained"));
        assert!(!generator.cuda);
        assert_eq!(evidence("import os\n"), Evidence::default());
    }
}
