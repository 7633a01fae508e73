//! `fvd auth`: the credentials file of `fvd orchestrator serve --auth`,
//! without writing hashes by hand. `add` makes a token from 32 random
//! bytes, prints it once on stdout (nothing else keeps it), or writes it
//! to a new file of mode 0600 with `--out`, and appends its SHA-256 under
//! the name and role; `remove` deletes an entry; `list` shows names and
//! roles. A running server sees a change after SIGHUP.

use super::exit::Exit;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;

use clap::{Args, Subcommand};
use fvd_proto::credentials::{self, Role};

#[derive(Debug, Subcommand)]
pub enum AuthCmd {
    /// Add a credential and print its token once (keep it: only its hash
    /// is written).
    Add(AddArgs),
    /// Remove a credential (the server refuses it after SIGHUP).
    Remove(RemoveArgs),
    /// List the credentials' names and roles.
    List(ListArgs),
}

#[derive(Debug, Args)]
pub struct AddArgs {
    /// The name calls are recorded under (submits, answers, cancels,
    /// resets): 1 to 32 of letters, digits, `.`, `_`, `-`, `@`.
    pub name: String,
    /// worker (connect only), viewer (read), porter (read, and change its
    /// own ports) or admin (everything).
    #[arg(long, value_parser = parse_role)]
    pub role: Role,
    /// The credentials file (created with mode 0600 when missing).
    #[arg(long)]
    pub file: PathBuf,
    /// Write the token to this new file, mode 0600 (a file that exists is
    /// refused), instead of stdout: the token file a worker or a client reads.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct RemoveArgs {
    /// The name of the credential to remove (as `fvd auth list` shows it).
    pub name: String,
    /// The credentials file to remove it from (the one `fvd orchestrator
    /// serve --auth` reads).
    #[arg(long)]
    pub file: PathBuf,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// The credentials file to list (the one `fvd orchestrator serve
    /// --auth` reads).
    #[arg(long)]
    pub file: PathBuf,
}

/// A new file only its owner can read (0600 from its creation, whatever
/// the umask); one that exists is refused, never overwritten.
fn create_private(path: &Path) -> anyhow::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| {
            format!(
                "cannot create the token file {} (an existing file is never overwritten)",
                path.display()
            )
        })
}

fn parse_role(s: &str) -> Result<Role, String> {
    Role::parse(s).ok_or_else(|| format!("{s:?} is no role: worker, viewer, porter or admin"))
}

pub fn run(cmd: AuthCmd) -> anyhow::Result<Exit> {
    match cmd {
        AuthCmd::Add(a) => {
            if a.out.as_deref() == Some(a.file.as_path()) {
                anyhow::bail!("--out names the credentials file: give the token a file of its own");
            }
            // The token file first: no credential is added whose token
            // has nowhere to go.
            let out = a
                .out
                .as_deref()
                .map(|p| create_private(p).map(|f| (f, p)))
                .transpose()?;
            let token = match credentials::add(&a.file, &a.name, a.role) {
                Ok(t) => t,
                Err(e) => {
                    if let Some(p) = &a.out {
                        let _ = std::fs::remove_file(p);
                    }
                    return Err(e.into());
                }
            };
            let shown = match out {
                Some((mut f, p)) => {
                    writeln!(f, "{}", token.value())
                        .and_then(|()| f.sync_all())
                        .with_context(|| format!("cannot write the token to {}", p.display()))?;
                    format!("its token is in {} (mode 0600)", p.display())
                }
                None => {
                    // The token alone on stdout, so `fvd auth add … >
                    // file` keeps exactly it; the rest on stderr.
                    println!("{}", token.value());
                    "the token above is shown once".to_string()
                }
            };
            eprintln!(
                "added {} ({}) to {}: {shown}; give it to {} (--token-file or --token-env), and send the orchestrator SIGHUP if it runs",
                a.name,
                a.role,
                a.file.display(),
                a.name
            );
        }
        AuthCmd::Remove(a) => {
            let gone = credentials::remove(&a.file, &a.name)?;
            eprintln!(
                "removed {} ({}) from {}: send the orchestrator SIGHUP to refuse it from now on",
                gone.name,
                gone.role,
                a.file.display()
            );
        }
        AuthCmd::List(a) => {
            for e in credentials::list(&a.file)? {
                println!("{}\t{}", e.name, e.role);
            }
        }
    }
    Ok(Exit::Success)
}
