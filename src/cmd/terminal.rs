//! `fvd completions` and `fvd man`: shell completion scripts and roff
//! manual pages, both generated from the CLI's own clap definition, so
//! they name exactly the subcommands and flags the binary takes.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, CommandFactory};

use super::Cli;
use super::exit::Exit;

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell whose completion script to print to stdout: bash, zsh,
    /// fish, elvish or powershell (e.g. `fvd completions bash >
    /// ~/.local/share/bash-completion/completions/fvd`).
    #[arg(value_name = "SHELL")]
    pub shell: clap_complete::Shell,
}

#[derive(Debug, Args)]
pub struct ManArgs {
    /// Write one page per command and subcommand (`fvd.1`,
    /// `fvd-submit.1`, `fvd-orchestrator-serve.1`, …) into this existing
    /// folder, replacing pages of those names, instead of printing `fvd.1`
    /// to stdout.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// `fvd completions SHELL`.
pub fn completions(args: CompletionsArgs) -> anyhow::Result<Exit> {
    let mut cmd = Cli::command();
    let mut out = std::io::stdout().lock();
    clap_complete::generate(args.shell, &mut cmd, "fvd", &mut out);
    out.flush()
        .context("cannot write the completion script to stdout")?;
    Ok(Exit::Success)
}

/// The command's pages carry the build day as their date.
fn page(cmd: clap::Command) -> clap_mangen::Man {
    clap_mangen::Man::new(cmd).date(env!("FVD_BUILD_DATE"))
}

/// `fvd man [--dir DIR]`.
pub fn man(args: ManArgs) -> anyhow::Result<Exit> {
    // `help` has no page of its own: a page that names `fvd-help(1)`
    // would point at nothing.
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    let Some(dir) = args.dir else {
        let mut out = std::io::stdout().lock();
        let mut text = Vec::new();
        render_page(&cmd, &mut text).context("cannot render the man page")?;
        out.write_all(&text)
            .and_then(|()| out.flush())
            .context("cannot write the man page to stdout")?;
        return Ok(Exit::Success);
    };
    if !dir.is_dir() {
        anyhow::bail!(
            "man page folder {} is not a folder (create it first)",
            dir.display()
        );
    }
    let mut written = 0;
    write_pages(&cmd, &dir, &mut written)?;
    eprintln!("fvd: wrote {written} man pages to {}", dir.display());
    Ok(Exit::Success)
}

/// Writes the page of `cmd` and of each subcommand below it into `dir`.
fn write_pages(
    cmd: &clap::Command,
    dir: &std::path::Path,
    written: &mut usize,
) -> anyhow::Result<()> {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_pages(sub, dir, written)?;
    }
    let man = page(cmd.clone());
    let path = dir.join(man.get_filename());
    let mut text = Vec::new();
    render_page(cmd, &mut text)
        .and_then(|()| std::fs::write(&path, &text))
        .with_context(|| format!("cannot write man page {}", path.display()))?;
    *written += 1;
    Ok(())
}

/// The page of `cmd` as clap_mangen renders it, with fvd's own EXIT
/// STATUS and ENVIRONMENT sections (on `fvd`'s page) in place of its EXTRA
/// section.
fn render_page(cmd: &clap::Command, w: &mut Vec<u8>) -> std::io::Result<()> {
    let man = page(cmd.clone());
    man.render_title(w)?;
    man.render_name_section(w)?;
    man.render_synopsis_section(w)?;
    man.render_description_section(w)?;
    man.render_options_section(w)?;
    if cmd.has_subcommands() {
        man.render_subcommands_section(w)?;
    }
    if cmd.get_name() == "fvd" {
        w.extend_from_slice(b".SH \"EXIT STATUS\"\n");
        for (code, meaning) in super::exit::STATUSES {
            w.extend_from_slice(format!(".TP\n\\fB{code}\\fR\n{}\n", roff(meaning)).as_bytes());
        }
        w.extend_from_slice(b".SH ENVIRONMENT\n");
        for (name, meaning) in super::ENVIRONMENT {
            w.extend_from_slice(
                format!(".TP\n\\fB{}\\fR\n{}\n", roff(name), roff(meaning)).as_bytes(),
            );
        }
    }
    if cmd.get_version().is_some() {
        man.render_version_section(w)?;
    }
    Ok(())
}

/// Text safe in a roff line: backslashes doubled, no line starting with a
/// control character.
fn roff(s: &str) -> String {
    let s = s.replace('\\', "\\\\").replace('-', "\\-");
    if s.starts_with('.') || s.starts_with('\'') {
        format!("\\&{s}")
    } else {
        s
    }
}
