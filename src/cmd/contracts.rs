//! `fvd contracts …`: validate handoff blocks and `PORT_STATUS.md` files.
//!
//! Exit codes: 0 when the input is valid, 1 when it has findings, 2 (through
//! an `Err`) when the file cannot be read or holds nothing checkable.

use super::exit::Exit;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow};
use clap::{Args, Subcommand};
use fvd_contracts::kind::{self, ContractKind, Report};

#[derive(Debug, Subcommand)]
pub enum ContractsCmd {
    /// Validate a handoff block (bare or in a ```text fence) or a PORT_STATUS.md.
    Check(CheckArgs),
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The file to check.
    pub file: PathBuf,
    /// The contract to check against (prep_handoff, port_status, final_handoff, …);
    /// inferred from the file when absent.
    #[arg(long, value_parser = parse_kind)]
    pub kind: Option<ContractKind>,
    /// Print one JSON object instead of `FILE:LINE: field: message` lines.
    #[arg(long)]
    pub json: bool,
}

fn parse_kind(s: &str) -> Result<ContractKind, String> {
    s.parse()
        .map_err(|e: fvd_contracts::findings::ContractError| {
            let names: Vec<&str> = ContractKind::ALL.iter().map(|k| k.as_str()).collect();
            format!("{e}; expected one of {}", names.join(", "))
        })
}

pub fn run(cmd: ContractsCmd) -> anyhow::Result<Exit> {
    match cmd {
        ContractsCmd::Check(args) => check(&args),
    }
}

fn check(args: &CheckArgs) -> anyhow::Result<Exit> {
    let report = check_file(&args.file, args.kind)?;
    let code = Exit::success_if(report.valid);
    let mut out = std::io::stdout().lock();
    let written = if args.json {
        serde_json::to_writer_pretty(&mut out, &report)
            .map_err(std::io::Error::from)
            .and_then(|()| writeln!(out))
    } else {
        write_human(&mut out, &args.file, &report)
    };
    match written {
        // `fvd contracts check … | head` closing the pipe is not a failure
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(code),
        Err(e) => Err(e).context("cannot write the report to stdout"),
        Ok(()) => Ok(code),
    }
}

/// Reads and checks one file; every error names the file.
pub fn check_file(path: &Path, kind: Option<ContractKind>) -> anyhow::Result<Report> {
    let shown = path.display();
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {shown}"))?;
    let text = fvd_contracts::text::utf8(&bytes)
        .map_err(|e| anyhow!("{shown}:{}:{}: {e}", e.line, e.column))?;
    kind::check(text, kind).map_err(|e| anyhow!("cannot parse {shown}: {e}"))
}

fn write_human(out: &mut impl Write, file: &Path, report: &Report) -> std::io::Result<()> {
    let shown = file.display();
    for f in &report.findings {
        writeln!(out, "{shown}:{}: {}: {}", f.line, f.field, f.message)?;
    }
    if report.valid {
        writeln!(out, "{shown}: valid {}", report.kind)?;
    } else {
        writeln!(
            out,
            "{shown}: {} finding(s) in {}",
            report.findings.len(),
            report.kind
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_that_is_not_utf8_is_refused_with_its_line_and_column() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("handoff.md");
        std::fs::write(
            &path,
            b"```text\nprep_handoff:\n  model_family: t\xe9st\n```\n",
        )
        .unwrap();
        let err = check_file(&path, None).unwrap_err().to_string();
        assert_eq!(
            err,
            format!("{}:3:18: not utf-8 text (byte 0xe9)", path.display())
        );
    }
}
