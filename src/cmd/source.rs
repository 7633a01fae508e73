//! Where a command's answers come from, chosen once: an orchestrator
//! (`--orchestrator URL`, or `FVD_ORCHESTRATOR`) or the embedded state of a
//! repository (`REPO/.fvd/state.db`). Every read command asks a [`Source`]
//! and gets the same domain views ([`fvd_orchestrator::query`]) either way:
//! the local source calls `query` on the store, the remote one calls
//! `PortService` and converts the answers with [`fvd_orchestrator::wire`].
//!
//! [`Target`] is the one set of arguments every port command shares (the
//! repository, the orchestrator, its token and CA), flattened into each;
//! [`Target::hint`] writes a follow-up command with exactly those, so a
//! hint can be pasted as it is.

use std::path::{Path, PathBuf};

use clap::Args;
use fvd_orchestrator::query::{self, Fleet, PortSnapshot, Queue};
use fvd_orchestrator::wire;
use fvd_proto::v1 as pb;
use fvd_store::dashboard::RunRow;
use fvd_store::model::Worktree;
use fvd_store::traces::TraceInvestigation;
use fvd_store::{AttemptRow, Store};
use tokio::sync::mpsc;

use super::port::{Client, client, open_local};
use super::server::{ClientTls, TokenArgs};

/// The arguments every port command shares: where the port's state is.
#[derive(Debug, Clone, Args)]
pub struct Target {
    /// The port's repository (its embedded state is REPO/.fvd/state.db,
    /// found from here or any folder below it); default: the current
    /// directory.
    #[arg(long, default_value = ".", value_name = "DIR")]
    pub repo: PathBuf,
    /// Orchestrator URL (`http://HOST:PORT`); without it the command works
    /// on the embedded state of --repo (and `submit` and `answer` run the
    /// port in this process).
    #[arg(long, env = "FVD_ORCHESTRATOR", value_name = "URL", value_parser = orchestrator_url)]
    pub orchestrator: Option<String>,
    #[command(flatten)]
    pub token: TokenArgs,
    #[command(flatten)]
    pub tls: ClientTls,
}

impl Target {
    /// A client of the orchestrator, with this target's token and CA.
    pub async fn client(&self, url: &str) -> anyhow::Result<Client> {
        client(url, self.token.load_client()?, self.tls.load()?).await
    }

    /// The repository of `family`'s port (found from --repo upwards), or of
    /// any embedded state when `family` is `None`.
    pub fn repo_of(&self, family: Option<&str>) -> PathBuf {
        match family {
            Some(f) => super::find_repo(&self.repo, f),
            None => super::find_state(&self.repo),
        }
    }

    /// `fvd ARGS…` with this target's flags: `--orchestrator` (and the
    /// token and CA flags it was given) for a fleet, `--repo` of `repo`
    /// otherwise. Each word is quoted for a POSIX shell when it needs it.
    pub fn hint(&self, repo: &Path, args: &[&str]) -> String {
        let mut words: Vec<String> = vec!["fvd".into()];
        words.extend(args.iter().map(|a| a.to_string()));
        match &self.orchestrator {
            Some(url) => {
                words.extend(["--orchestrator".into(), url.clone()]);
                if let Some(f) = &self.token.token_file {
                    words.extend(["--token-file".into(), f.display().to_string()]);
                }
                if let Some(e) = &self.token.token_env {
                    words.extend(["--token-env".into(), e.clone()]);
                }
                if let Some(ca) = &self.tls.tls_ca {
                    words.extend(["--tls-ca".into(), ca.display().to_string()]);
                }
            }
            None => {
                let repo = repo.canonicalize().unwrap_or_else(|_| repo.to_path_buf());
                words.extend(["--repo".into(), repo.display().to_string()]);
            }
        }
        words
            .iter()
            .map(|w| shell_quote(w))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// `word` as a POSIX shell reads it back: as it is when it holds only safe
/// characters, else in single quotes.
pub fn shell_quote(word: &str) -> String {
    let safe = !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./:=@,+%".contains(&b));
    if safe {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// Where the answers come from.
#[derive(Debug)]
pub enum Source {
    /// An orchestrator, over `PortService`.
    Remote(Client),
    /// The embedded state of `repo`.
    Local { store: Store, repo: PathBuf },
}

/// A run's output as it arrives: `(stream, bytes)` chunks.
pub type Output = mpsc::Receiver<anyhow::Result<(i32, Vec<u8>)>>;

impl Source {
    /// The orchestrator of `target`, or the embedded state of `family`'s
    /// repository (of any port when `family` is `None`).
    pub async fn open(target: &Target, family: Option<&str>) -> anyhow::Result<Self> {
        match &target.orchestrator {
            Some(url) => Ok(Source::Remote(target.client(url).await?)),
            None => {
                let repo = target.repo_of(family);
                let store = open_local(&repo).await?;
                Ok(Source::Local { store, repo })
            }
        }
    }

    /// One port, or every port when `family` is `None`.
    pub async fn status(&mut self, family: Option<&str>) -> anyhow::Result<Vec<PortSnapshot>> {
        match self {
            Source::Local { store, .. } => Ok(query::status(store, family).await?),
            Source::Remote(c) => {
                let r = c
                    .status(pb::StatusRequest {
                        family: family.unwrap_or_default().to_string(),
                    })
                    .await
                    .map_err(|e| c.fail(e))?
                    .into_inner();
                Ok(r.ports
                    .into_iter()
                    .map(wire::from_snapshot)
                    .collect::<Result<_, _>>()?)
            }
        }
    }

    /// Every run of a component (or of every component), oldest first.
    pub async fn runs(
        &mut self,
        family: &str,
        component: Option<&str>,
    ) -> anyhow::Result<Vec<RunRow>> {
        match self {
            Source::Local { store, .. } => Ok(query::runs(store, family, component).await?),
            Source::Remote(c) => {
                let r = c
                    .runs(pb::RunsRequest {
                        family: family.to_string(),
                        component: component.unwrap_or_default().to_string(),
                    })
                    .await
                    .map_err(|e| c.fail(e))?
                    .into_inner();
                Ok(r.runs
                    .into_iter()
                    .map(wire::from_run)
                    .collect::<Result<_, _>>()?)
            }
        }
    }

    /// The output of job `run` (one of [`Source::runs`]); with `follow`,
    /// until the run ends.
    pub async fn output(&mut self, run: &RunRow, follow: bool) -> anyhow::Result<Output> {
        let (tx, rx) = mpsc::channel(64);
        match self {
            Source::Local { store, .. } => {
                let mut chunks = query::log_pump(store.clone(), run.job_id.clone(), follow);
                fvd_telemetry::spawn(async move {
                    while let Some(c) = chunks.recv().await {
                        if tx.send(c.map_err(anyhow::Error::from)).await.is_err() {
                            return;
                        }
                    }
                });
            }
            Source::Remote(c) => {
                let mut stream = c
                    .logs(pb::LogsRequest {
                        family: run.family.clone(),
                        component: run.component.clone(),
                        run: run.run_no,
                        follow,
                    })
                    .await
                    .map_err(|e| c.fail(e))?
                    .into_inner();
                let client = c.clone();
                fvd_telemetry::spawn(async move {
                    loop {
                        let next = match stream.message().await {
                            Ok(Some(chunk)) => Ok((chunk.stream, chunk.data)),
                            Ok(None) => return,
                            Err(e) => Err(client.fail(e)),
                        };
                        let failed = next.is_err();
                        if tx.send(next).await.is_err() || failed {
                            return;
                        }
                    }
                });
            }
        }
        Ok(rx)
    }

    /// The agent-attempt ledger of a component and its worktree.
    pub async fn attempts(
        &mut self,
        family: &str,
        component: &str,
    ) -> anyhow::Result<(Option<Worktree>, Vec<AttemptRow>)> {
        match self {
            Source::Local { store, .. } => Ok(query::attempts(store, family, component).await?),
            Source::Remote(c) => {
                let r = c
                    .attempts(pb::AttemptsRequest {
                        family: family.to_string(),
                        component: component.to_string(),
                    })
                    .await
                    .map_err(|e| c.fail(e))?
                    .into_inner();
                Ok((
                    r.worktree.map(wire::from_worktree),
                    r.attempts
                        .into_iter()
                        .map(|a| wire::from_attempt(family, component, a))
                        .collect::<Result<_, _>>()?,
                ))
            }
        }
    }

    /// The latest drill-down investigation of a component.
    pub async fn trace_report(
        &mut self,
        family: &str,
        component: &str,
    ) -> anyhow::Result<TraceInvestigation> {
        match self {
            Source::Local { store, .. } => Ok(query::trace_report(store, family, component).await?),
            Source::Remote(c) => {
                let r = c
                    .trace_report(pb::TraceReportRequest {
                        family: family.to_string(),
                        component: component.to_string(),
                    })
                    .await
                    .map_err(|e| c.fail(e))?
                    .into_inner();
                wire::from_investigation(r).map_err(anyhow::Error::msg)
            }
        }
    }

    /// The workers: the orchestrator's connected fleet, or those of the
    /// workers an embedded state recorded whose process still runs here
    /// (each past `fvd submit` registered one; they are not listed).
    pub async fn fleet(&mut self) -> anyhow::Result<Fleet> {
        match self {
            Source::Local { store, .. } => Ok(query::roster(store, None).await?.fleet),
            Source::Remote(c) => {
                let r = c
                    .workers(pb::WorkersRequest {})
                    .await
                    .map_err(|e| c.fail(e))?
                    .into_inner();
                Ok(wire::from_fleet(r))
            }
        }
    }

    /// The runs waiting for a lease (of one port, or of every port).
    pub async fn queue(&mut self, family: Option<&str>) -> anyhow::Result<Queue> {
        match self {
            Source::Local { store, .. } => Ok(query::queue(store, None, family).await?),
            Source::Remote(c) => {
                let r = c
                    .queue(pb::QueueRequest {
                        family: family.unwrap_or_default().to_string(),
                    })
                    .await
                    .map_err(|e| c.fail(e))?
                    .into_inner();
                Ok(wire::from_queue(r))
            }
        }
    }

    /// The embedded state's repository; `None` for an orchestrator.
    pub fn local_repo(&self) -> Option<&Path> {
        match self {
            Source::Local { repo, .. } => Some(repo),
            Source::Remote(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_quoted_only_when_a_shell_would_split_them() {
        assert_eq!(shell_quote("tinyport"), "tinyport");
        assert_eq!(shell_quote("/tmp/a b"), "'/tmp/a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(
            shell_quote("http://127.0.0.1:7070"),
            "http://127.0.0.1:7070"
        );
    }

    #[test]
    fn a_hint_carries_the_flags_that_reach_the_same_state() {
        let local = Target {
            repo: PathBuf::from("/nonexistent/repo dir"),
            orchestrator: None,
            token: TokenArgs::default(),
            tls: ClientTls::default(),
        };
        assert_eq!(
            local.hint(&local.repo, &["logs", "f", "c", "--run", "2"]),
            "fvd logs f c --run 2 --repo '/nonexistent/repo dir'"
        );
        let remote = Target {
            orchestrator: Some("http://10.0.0.1:7070".into()),
            token: TokenArgs {
                token_file: Some(PathBuf::from("/etc/fvd/token")),
                token_env: None,
            },
            ..local
        };
        assert_eq!(
            remote.hint(
                Path::new("/ignored"),
                &["answer", "f", "E001", "--option", "1"]
            ),
            "fvd answer f E001 --option 1 --orchestrator http://10.0.0.1:7070 --token-file /etc/fvd/token"
        );
    }
}

/// An orchestrator URL as `--orchestrator` (or `FVD_ORCHESTRATOR`) takes
/// it: `http://` or `https://`, then a host. One without a scheme is a
/// usage error (exit 2) that says which URL was meant, not an unreachable
/// orchestrator (exit 5).
pub fn orchestrator_url(s: &str) -> Result<String, String> {
    let t = s.trim();
    match t.split_once("://") {
        Some(("http" | "https", rest)) if !rest.is_empty() => Ok(t.to_string()),
        Some((scheme, _)) => Err(format!(
            "{t:?} has scheme {scheme:?}: an orchestrator URL is http://HOST:PORT or https://HOST:PORT"
        )),
        None if t.is_empty() => Err("an empty orchestrator URL".into()),
        None => Err(format!(
            "{t:?} has no scheme: did you mean http://{t} (or https://{t} for an orchestrator serving TLS)?"
        )),
    }
}

#[cfg(test)]
mod url_tests {
    #[test]
    fn an_orchestrator_url_needs_its_scheme() {
        assert_eq!(
            super::orchestrator_url("http://127.0.0.1:7070").unwrap(),
            "http://127.0.0.1:7070"
        );
        assert!(super::orchestrator_url("https://fvd.lab:443").is_ok());
        let e = super::orchestrator_url("127.0.0.1:27070").unwrap_err();
        assert!(e.contains("did you mean http://127.0.0.1:27070"), "{e}");
        assert!(
            super::orchestrator_url("grpc://h:1")
                .unwrap_err()
                .contains("scheme \"grpc\"")
        );
        assert!(super::orchestrator_url("http://").is_err());
    }
}
