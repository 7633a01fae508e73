//! `fvd dashboard --repo DIR`: the web dashboard over an embedded state
//! database (`REPO/.fvd/state.db`), opened read-only so it can run beside
//! the `fvd submit` that writes it, or after it ended. The pages follow the
//! database by polling it; answering needs `fvd answer` (no orchestrator
//! runs in this process).

use super::exit::Exit;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use fvd_store::Store;

/// How often the pages look for changes in the database.
const POLL: Duration = Duration::from_millis(250);

#[derive(Debug, Args)]
pub struct DashboardArgs {
    /// The repository whose `.fvd/state.db` to show.
    #[arg(long, default_value = ".")]
    pub repo: PathBuf,
    /// Address to serve on (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:7080")]
    pub listen: String,
    /// A `Host` name to answer to besides the listen address and localhost
    /// (NAME or NAME:PORT); repeatable.
    #[arg(long = "allow-host", value_name = "NAME")]
    pub hosts: Vec<String>,
}

pub fn run(args: DashboardArgs) -> anyhow::Result<Exit> {
    let db = super::port::state_db(&args.repo);
    if !db.exists() {
        anyhow::bail!(
            "no embedded state at {}: run fvd submit --repo {} first",
            db.display(),
            args.repo.display()
        );
    }
    super::server::runtime()?.block_on(async move {
        let store = Store::open_read_only(&db).await?;
        let listener = tokio::net::TcpListener::bind(&args.listen)
            .await
            .with_context(|| format!("cannot listen on {}", args.listen))?;
        let dash = fvd_orchestrator::dashboard::Dashboard::read_only(
            store,
            &db.display().to_string(),
            POLL,
        );
        let options = fvd_orchestrator::dashboard::guard::Options {
            hosts: args.hosts.clone(),
            ..Default::default()
        };
        let d = fvd_orchestrator::dashboard::serve(listener, dash, options)
            .context("cannot start the dashboard")?;
        // The first line names the address, so scripts can use port 0.
        println!("fvd dashboard on {} (read-only: {})", d.url(), db.display());
        tokio::select! {
            r = d.task => match r {
                Ok(Ok(())) => {}
                Ok(Err(e)) => anyhow::bail!("dashboard stopped: {e}"),
                Err(e) => anyhow::bail!("dashboard stopped: {e}"),
            },
            _ = super::server::interrupted() => {}
        }
        Ok(Exit::Success)
    })
}
