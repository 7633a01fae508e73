//! git plumbing that both sides of code by commit need (issue #12): the
//! submitting side pins a port to a commit, a worker decides whether the
//! checkout it sees is at a job's commit. Both ask the same question, "what
//! tree would `git add -A` record for this work tree?", and must get the
//! same answer, so it is answered here once: [`work_tree_id`] writes that
//! tree through a temporary copy of the index (the index, HEAD and the work
//! tree are never touched), and [`same_tree`] compares it with a commit.
//!
//! It is also the one place fvd starts git from (issue #38): [`command`]
//! and [`blocking_command`] build every git process fvd runs, on the
//! orchestrator, on workers and in `fvd mcp`, with a fixed configuration
//! ([`CONFIG`]) that runs no program a repository names: no hook, no
//! fsmonitor, no credential helper, pager or askpass, no signing program,
//! no transport but local files. `tests/layout` fails on any other
//! `Command::new("git")`.
//!
//! - Depends on no workspace crate (the two sides, `fvd-workspace` and
//!   `fvd-worker`, sit on the same layer and share no lower crate that
//!   runs processes).
//! - Never reads the system or the user's global git configuration: only
//!   the user's `safe.directory` entries are carried over, so a checkout
//!   the user has declared safe stays usable.
//! - Never follows the `.git` file of a linked worktree fvd made
//!   ([`trust_worktree`]): a job or an agent that can write the work tree
//!   can rewrite that file to send git to a repository of its making, whose
//!   own configuration (a filter or diff driver) git would run.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::process::Command;

#[derive(Debug, thiserror::Error)]
pub enum GitError {
    #[error("git {args} in {dir}: {detail}")]
    Failed {
        args: String,
        dir: PathBuf,
        detail: String,
    },
}

impl GitError {
    /// What git said on stderr (or why it did not start).
    pub fn detail(&self) -> &str {
        match self {
            GitError::Failed { detail, .. } => detail,
        }
    }
}

/// The configuration every git fvd starts runs with, given as `-c` (the
/// command line outranks every configuration file, the repository's own
/// included). Each entry turns off a way a repository's configuration, or
/// a file a job wrote into it, could make git run a program:
///
/// - `core.hooksPath=/dev/null`: every hook is looked up below a file, so
///   none is ever found (`hooks/`, a `core.hooksPath` of the repository
///   and the user's are all ignored);
/// - `core.fsmonitor=false`: no fsmonitor hook or daemon;
/// - `credential.helper=` (an empty value clears the list), `core.askPass=`
///   and `core.sshCommand=false`: no helper, prompt or ssh;
/// - `protocol.allow=never` with `protocol.file.allow=always`: git reaches
///   no transport but local paths (`ext::` and the network included);
/// - `commit.gpgSign`, `tag.gpgSign`, `log.showSignature`: no signing
///   program;
/// - `core.pager=cat`: no pager;
/// - `core.alternateRefsCommand=`: no program to list alternates' refs.
///
/// A repository's filter and diff drivers (`filter.*.clean`, `smudge`,
/// `process`, `diff.*.textconv`) cannot be listed ahead, so they are
/// still honoured: jobs and agents get the git directories they run in
/// read-only (`fvd_sandbox::Jail::read_only`), so only the repository's
/// owner can have written them.
pub const CONFIG: &[(&str, &str)] = &[
    ("core.hooksPath", "/dev/null"),
    ("core.fsmonitor", "false"),
    ("credential.helper", ""),
    ("core.askPass", ""),
    ("core.sshCommand", "false"),
    ("protocol.allow", "never"),
    ("protocol.file.allow", "always"),
    ("commit.gpgSign", "false"),
    ("tag.gpgSign", "false"),
    ("log.showSignature", "false"),
    ("core.pager", "cat"),
    ("core.alternateRefsCommand", ""),
];

/// The variables every git fvd starts gets (after every inherited `GIT_*`
/// variable is removed): no system or global configuration, no prompt, no
/// optional lock (a status refresh must not lock the index of a checkout
/// someone else uses), no replace refs (an object means what it holds),
/// no pager.
const ENV: &[(&str, &str)] = &[
    ("GIT_CONFIG_NOSYSTEM", "1"),
    ("GIT_CONFIG_GLOBAL", "/dev/null"),
    ("GIT_TERMINAL_PROMPT", "0"),
    ("GIT_OPTIONAL_LOCKS", "0"),
    ("GIT_NO_REPLACE_OBJECTS", "1"),
    ("GIT_ATTR_NOSYSTEM", "1"),
    ("GIT_PAGER", "cat"),
    ("GIT_EDITOR", "false"),
    ("GIT_SEQUENCE_EDITOR", "false"),
];

/// The user's own `safe.directory` entries (system and global), read once
/// with the same configuration otherwise: git honours them only from
/// protected configuration, which fvd's runs no longer read.
fn safe_directories() -> &'static [String] {
    static SAFE: OnceLock<Vec<String>> = OnceLock::new();
    SAFE.get_or_init(|| {
        let mut found = Vec::new();
        for scope in ["--system", "--global"] {
            let mut cmd = std::process::Command::new("git");
            cmd.args(["config", scope, "--get-all", "safe.directory"]);
            for (k, _) in std::env::vars_os() {
                if k.to_string_lossy().starts_with("GIT_") {
                    cmd.env_remove(&k);
                }
            }
            cmd.current_dir("/")
                .env("GIT_TERMINAL_PROMPT", "0")
                .stdin(std::process::Stdio::null())
                .stderr(std::process::Stdio::null());
            if let Ok(out) = cmd.output()
                && out.status.success()
            {
                found.extend(
                    String::from_utf8_lossy(&out.stdout)
                        .lines()
                        .filter(|l| !l.is_empty())
                        .map(str::to_string),
                );
            }
        }
        found
    })
}

/// Linked worktrees fvd made, and their administrative folders as found
/// from the repository's side: `(work tree, admin)`.
static TRUSTED_WORKTREES: std::sync::Mutex<Vec<(PathBuf, PathBuf)>> =
    std::sync::Mutex::new(Vec::new());

/// From now on, git run anywhere in `work_tree` (a linked worktree of the
/// repository whose common folder is `common`) uses the administrative
/// folder the repository lists for it ([`worktree_admin`]), whatever the
/// work tree's `.git` file says. `false` when the repository lists no such
/// worktree.
pub fn trust_worktree(common: &Path, work_tree: &Path) -> bool {
    let Some(admin) = worktree_admin(common, work_tree) else {
        return false;
    };
    let top = std::path::absolute(work_tree).unwrap_or_else(|_| work_tree.to_path_buf());
    let mut all = TRUSTED_WORKTREES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    all.retain(|(t, _)| *t != top);
    all.push((top, admin));
    true
}

/// The variables of [`worktree_env`] for `dir` when it lies in a worktree
/// given to [`trust_worktree`].
fn trusted_env(dir: &Path) -> Option<[(&'static str, OsString); 2]> {
    let dir = std::path::absolute(dir).ok()?;
    let all = TRUSTED_WORKTREES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    all.iter()
        .filter(|(top, _)| dir.starts_with(top))
        .max_by_key(|(top, _)| top.as_os_str().len())
        .map(|(top, admin)| worktree_env(admin, top))
}

/// A git process in `dir` with fvd's fixed configuration ([`CONFIG`]),
/// nothing of fvd's `GIT_*` environment, and standard input closed (the
/// caller may pipe it). The caller adds the arguments: they come after
/// fvd's `-c` pairs. In a worktree given to [`trust_worktree`], git is
/// told its folders rather than reading its `.git` file.
pub fn blocking_command(dir: &Path) -> std::process::Command {
    let mut cmd = std::process::Command::new("git");
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("GIT_") {
            cmd.env_remove(&k);
        }
    }
    cmd.envs(ENV.iter().copied())
        .current_dir(dir)
        .stdin(std::process::Stdio::null());
    if let Some(env) = trusted_env(dir) {
        cmd.envs(env);
    }
    for (k, v) in CONFIG {
        cmd.arg("-c").arg(format!("{k}={v}"));
    }
    for s in safe_directories() {
        cmd.arg("-c").arg(format!("safe.directory={s}"));
    }
    cmd
}

/// [`blocking_command`] for tokio; killed when dropped.
pub fn command(dir: &Path) -> Command {
    let mut cmd = Command::from(blocking_command(dir));
    cmd.kill_on_drop(true);
    cmd
}

/// Runs git in `dir` with extra variables; its stdout without the trailing
/// newline.
pub async fn run(dir: &Path, args: &[&str], envs: &[(&str, &OsStr)]) -> Result<String, GitError> {
    let mut cmd = command(dir);
    cmd.args(args);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let failed = |detail: String| GitError::Failed {
        args: args.join(" "),
        dir: dir.to_path_buf(),
        detail,
    };
    let out = cmd.output().await.map_err(|e| failed(e.to_string()))?;
    if !out.status.success() {
        return Err(failed(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim_end().to_string())
}

/// Runs git in `dir` with `input` on its standard input; its whole stdout.
pub async fn run_with_input(
    dir: &Path,
    args: &[&str],
    envs: &[(&str, &OsStr)],
    input: &[u8],
) -> Result<Vec<u8>, GitError> {
    use tokio::io::AsyncWriteExt;
    let mut cmd = command(dir);
    cmd.args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let failed = |detail: String| GitError::Failed {
        args: args.join(" "),
        dir: dir.to_path_buf(),
        detail,
    };
    let mut child = cmd.spawn().map_err(|e| failed(e.to_string()))?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    let input = input.to_vec();
    // Written beside the reads: a large input and a large output would
    // otherwise wait on each other.
    let writer = async move {
        let r = stdin.write_all(&input).await;
        drop(stdin);
        r
    };
    let (written, out) = tokio::join!(writer, child.wait_with_output());
    let out = out.map_err(|e| failed(e.to_string()))?;
    if !out.status.success() {
        return Err(failed(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ));
    }
    written.map_err(|e| failed(e.to_string()))?;
    Ok(out.stdout)
}

/// The git paths of the work tree that holds `dir`, found by reading files
/// (no git is run on a tree a job may have written): the `.git` entry
/// nearest above `dir`; for a linked worktree (a `.git` file) also its
/// administrative folder and the repository's common folder. What a job
/// writes below these changes what fvd's own git does there later, so a
/// jail leaves them read-only (issue #38). Empty outside a work tree.
pub fn git_paths(dir: &Path) -> Vec<PathBuf> {
    let Ok(dir) = std::path::absolute(dir) else {
        return Vec::new();
    };
    let Some(dot_git) = dir
        .ancestors()
        .map(|d| d.join(".git"))
        .find(|p| p.symlink_metadata().is_ok())
    else {
        return Vec::new();
    };
    let mut out = vec![dot_git.clone()];
    if dot_git.is_dir() {
        return out;
    }
    let Ok(text) = std::fs::read_to_string(&dot_git) else {
        return out;
    };
    let Some(admin) = text.lines().next().and_then(|l| l.strip_prefix("gitdir: ")) else {
        return out;
    };
    let base = dot_git.parent().unwrap_or(Path::new("/"));
    let admin = base.join(admin.trim());
    let common = match std::fs::read_to_string(admin.join("commondir")) {
        Ok(c) => admin.join(c.trim()),
        Err(_) => admin.clone(),
    };
    let common = common.canonicalize().unwrap_or(common);
    let admin = admin.canonicalize().unwrap_or(admin);
    if !admin.starts_with(&common) {
        out.push(admin);
    }
    out.push(common);
    out
}

/// The administrative folder of the linked worktree at `work_tree`, found
/// from the repository's side: the entry of `common/worktrees/` whose
/// `gitdir` names `work_tree/.git`. The worktree's own `.git` file is
/// never read, so a job that rewrote it cannot send fvd's git to a
/// repository of its making.
pub fn worktree_admin(common: &Path, work_tree: &Path) -> Option<PathBuf> {
    let want = std::path::absolute(work_tree).ok()?.join(".git");
    let want_real = want.parent()?.canonicalize().ok().map(|p| p.join(".git"));
    std::fs::read_dir(common.join("worktrees"))
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|admin| {
            std::fs::read_to_string(admin.join("gitdir")).is_ok_and(|g| {
                let g = PathBuf::from(g.trim());
                g == want || Some(&g) == want_real.as_ref()
            })
        })
}

/// The variables that make git use the linked worktree at `work_tree`
/// whose administrative folder is `admin`, whatever its `.git` file says.
pub fn worktree_env(admin: &Path, work_tree: &Path) -> [(&'static str, OsString); 2] {
    [
        ("GIT_DIR", admin.as_os_str().to_owned()),
        ("GIT_WORK_TREE", work_tree.as_os_str().to_owned()),
    ]
}

/// Where `dir` sits inside its repository (`examples/tinyport/`, empty at
/// the top); `None` when it is not inside a git work tree.
pub async fn prefix(dir: &Path) -> Option<String> {
    run(dir, &["rev-parse", "--show-prefix"], &[]).await.ok()
}

/// Whether the repository of `dir` holds commit `sha`.
pub async fn has_commit(dir: &Path, sha: &str) -> bool {
    run(dir, &["cat-file", "-e", &format!("{sha}^{{commit}}")], &[])
        .await
        .is_ok()
}

/// Whether `s` is a full hex object id (sha-1 or sha-256).
pub fn is_full_sha(s: &str) -> bool {
    (s.len() == 40 || s.len() == 64)
        && s.bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

static NEXT_INDEX: AtomicU64 = AtomicU64::new(0);

/// Where new objects go while a tree is taken: the repository's own object
/// store, or a folder of the caller's (the repository's objects are then
/// read through it as alternates, and the repository gets no write at all).
#[derive(Debug, Clone, Copy)]
pub enum Objects<'a> {
    Repository,
    Aside(&'a Path),
}

/// Where a work tree keeps things, from one `git rev-parse`.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    /// The top of the work tree.
    pub top: PathBuf,
    /// Its index file.
    pub index: PathBuf,
    /// The repository's common folder (its objects are under it).
    pub common: PathBuf,
    /// The commit checked out; `None` before the first commit.
    pub head: Option<String>,
}

/// The layout of the work tree that holds `dir`.
pub async fn layout(dir: &Path) -> Result<Layout, GitError> {
    let args = [
        "rev-parse",
        "--path-format=absolute",
        "--show-toplevel",
        "--git-path",
        "index",
        "--git-common-dir",
    ];
    let out = run(dir, &args, &[]).await?;
    let mut lines = out.lines().map(PathBuf::from);
    let (Some(top), Some(index), Some(common)) = (lines.next(), lines.next(), lines.next()) else {
        return Err(GitError::Failed {
            args: args.join(" "),
            dir: dir.to_path_buf(),
            detail: format!("unexpected output {out:?}"),
        });
    };
    let head = run(
        dir,
        &["rev-parse", "--verify", "--quiet", "HEAD^{commit}"],
        &[],
    )
    .await
    .ok();
    Ok(Layout {
        top,
        index,
        common,
        head,
    })
}

/// The variables that send new objects to `objects` for a repository
/// whose common folder is `common`.
fn object_env(common: &Path, objects: Objects<'_>) -> Vec<(&'static str, OsString)> {
    match objects {
        Objects::Repository => Vec::new(),
        Objects::Aside(dir) => vec![
            ("GIT_OBJECT_DIRECTORY", dir.as_os_str().to_owned()),
            (
                "GIT_ALTERNATE_OBJECT_DIRECTORIES",
                common.join("objects").into_os_string(),
            ),
        ],
    }
}

fn as_env<'a>(envs: &'a [(&'static str, OsString)]) -> Vec<(&'static str, &'a OsStr)> {
    envs.iter().map(|(k, v)| (*k, v.as_os_str())).collect()
}

/// The id of the tree `git add -A` would record for the work tree of
/// `layout` (tracked files as they are on disk, untracked ones that are
/// not ignored), written through a temporary copy of its index: the index,
/// HEAD and the work tree are left as they are.
pub async fn work_tree_id(layout: &Layout, objects: Objects<'_>) -> Result<String, GitError> {
    let tmp = std::env::temp_dir().join(format!(
        "fvd-index-{}-{}",
        std::process::id(),
        NEXT_INDEX.fetch_add(1, Ordering::Relaxed)
    ));
    let mut envs = object_env(&layout.common, objects);
    envs.push(("GIT_INDEX_FILE", tmp.clone().into_os_string()));
    let envs = as_env(&envs);
    // The copied index lets git skip files whose stat data did not change;
    // without one (or if the copy is unusable: torn by a concurrent write,
    // a split index) every file is hashed. The copy keeps the index's
    // modification time: git re-hashes an entry whose file is as new as the
    // index ("racily clean"), and a copy dated now would hide a same-size
    // edit made in the second the index was written.
    let copied = layout.index.is_file() && copy_keeping_mtime(&layout.index, &tmp).is_ok();
    let mut result = add_all(&layout.top, &envs).await;
    if result.is_err() && copied {
        let _ = std::fs::remove_file(&tmp);
        result = add_all(&layout.top, &envs).await;
    }
    let _ = std::fs::remove_file(&tmp);
    result
}

/// Copies `from` to `to` and dates the copy as `from`.
fn copy_keeping_mtime(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::copy(from, to)?;
    let modified = std::fs::metadata(from)?.modified()?;
    std::fs::OpenOptions::new()
        .write(true)
        .open(to)?
        .set_modified(modified)
}

async fn add_all(top: &Path, envs: &[(&str, &OsStr)]) -> Result<String, GitError> {
    run(top, &["add", "-A", "--", "."], envs).await?;
    run(top, &["write-tree"], envs).await
}

/// `.` and an exclude pathspec per `ignore` (paths from the top).
fn pathspec(ignore: &[String]) -> Vec<String> {
    let mut v = vec![".".to_string()];
    v.extend(ignore.iter().map(|p| format!(":(top,exclude,literal){p}")));
    v
}

/// Whether commit (or tree) `a` and tree `b` hold the same files, leaving
/// out `ignore` (paths from the repository's top). `envs`: those of the
/// objects `b` was written to, when aside.
pub async fn same_tree(
    top: &Path,
    a: &str,
    b: &str,
    ignore: &[String],
    envs: &[(&str, &OsStr)],
) -> Result<bool, GitError> {
    let mut args: Vec<String> = ["diff-tree", "-r", "--quiet", a, b, "--"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(pathspec(ignore));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match run(top, &args, envs).await {
        Ok(_) => Ok(true),
        // diff-tree --quiet exits 1 on a difference, with nothing on stderr.
        Err(e) if e.detail().is_empty() => Ok(false),
        Err(e) => Err(e),
    }
}

/// Whether the work tree of `layout` holds the files of commit `sha`
/// (as [`work_tree_id`] sees them), but for `ignore` (paths from the top).
/// New objects go to `objects`.
pub async fn tree_is_commit(
    layout: &Layout,
    sha: &str,
    ignore: &[String],
    objects: Objects<'_>,
) -> Result<bool, GitError> {
    let tree = work_tree_id(layout, objects).await?;
    let envs = object_env(&layout.common, objects);
    same_tree(&layout.top, sha, &tree, ignore, &as_env(&envs)).await
}

/// Whether the work tree that holds `dir` is at commit `sha`: its files
/// are those of the commit, but for `ignore` (paths from the repository's
/// top); ignored files do not count. Asked without writing to the
/// repository (new objects go to a temporary folder under `scratch`).
/// `Ok(false)` when the repository lacks the commit.
///
/// When HEAD is the commit, one `git status` answers (clean but for
/// `ignore`: at the commit; anything else: not, even a change undone in
/// the work tree but kept in the index). Otherwise (a snapshot of
/// uncommitted changes on top of HEAD) the work tree's tree is taken and
/// compared.
pub async fn is_at_commit(
    dir: &Path,
    sha: &str,
    ignore: &[String],
    scratch: &Path,
) -> Result<bool, GitError> {
    let layout = layout(dir).await?;
    if layout.head.as_deref() == Some(sha) {
        let mut args: Vec<String> = ["status", "--porcelain", "-z", "--untracked-files=all", "--"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.extend(pathspec(ignore));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        return Ok(run(&layout.top, &args, &[]).await?.is_empty());
    }
    if !has_commit(&layout.top, sha).await {
        return Ok(false);
    }
    let aside = scratch.join(format!(
        "fvd-objects-{}-{}",
        std::process::id(),
        NEXT_INDEX.fetch_add(1, Ordering::Relaxed)
    ));
    if let Err(e) = std::fs::create_dir_all(&aside) {
        return Err(GitError::Failed {
            args: "(objects folder)".into(),
            dir: aside,
            detail: e.to_string(),
        });
    }
    let answer = tree_is_commit(&layout, sha, ignore, Objects::Aside(&aside)).await;
    let _ = std::fs::remove_dir_all(&aside);
    answer
}

#[cfg(test)]
mod tests {
    use super::*;

    fn git(dir: &Path, args: &[&str]) -> String {
        let out = std::process::Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@t"])
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim_end().to_string()
    }

    /// A commit of the work tree as it is, on top of `head`, made through
    /// a temporary index (as `fvd submit` snapshots uncommitted changes).
    fn snapshot_of(top: &Path, head: &str) -> String {
        let index = std::env::temp_dir().join(format!("fvd-git-test-{}", std::process::id()));
        let with_index = |args: &[&str]| {
            let out = std::process::Command::new("git")
                .args(["-c", "user.name=t", "-c", "user.email=t@t"])
                .args(args)
                .env("GIT_INDEX_FILE", &index)
                .current_dir(top)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).trim_end().to_string()
        };
        with_index(&["add", "-A"]);
        let tree = with_index(&["write-tree"]);
        let sha = with_index(&["commit-tree", &tree, "-p", head, "-m", "snapshot"]);
        let _ = std::fs::remove_file(&index);
        sha
    }

    fn repo() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let top = dir.path();
        std::fs::create_dir_all(top.join("port")).unwrap();
        std::fs::write(top.join("port/m.py"), "x = 1\n").unwrap();
        std::fs::write(top.join("port/STATUS.md"), "s\n").unwrap();
        std::fs::write(top.join(".gitignore"), "weights/\n").unwrap();
        git(top, &["init", "-q", "-b", "main"]);
        git(top, &["add", "-A"]);
        git(top, &["commit", "-q", "-m", "base"]);
        dir
    }

    #[tokio::test]
    async fn a_work_tree_is_at_its_commit_until_a_file_a_job_reads_changes() {
        let dir = repo();
        let top = dir.path();
        let port = top.join("port");
        let scratch = tempfile::tempdir().unwrap();
        let head = git(top, &["rev-parse", "HEAD"]);
        let index_before = std::fs::read(top.join(".git/index")).unwrap();
        let ignore = vec!["port/STATUS.md".to_string()];
        let at = |ignore: Vec<String>| {
            let (port, head, s) = (port.clone(), head.clone(), scratch.path().to_path_buf());
            async move { is_at_commit(&port, &head, &ignore, &s).await.unwrap() }
        };
        assert!(at(ignore.clone()).await);
        // Ignored files and the files fvd writes do not count.
        std::fs::create_dir_all(top.join("weights")).unwrap();
        std::fs::write(top.join("weights/w.bin"), b"w").unwrap();
        std::fs::write(port.join("STATUS.md"), "s\nmore\n").unwrap();
        assert!(at(ignore.clone()).await);
        assert!(!at(Vec::new()).await);
        // An edit, or a new file that is not ignored, does.
        std::fs::write(port.join("m.py"), "x = 2\n").unwrap();
        assert!(!at(ignore.clone()).await);
        std::fs::write(port.join("m.py"), "x = 1\n").unwrap();
        assert!(at(ignore.clone()).await);
        std::fs::write(port.join("extra.py"), "").unwrap();
        assert!(!at(ignore.clone()).await);
        // A commit that is not HEAD (a snapshot of the uncommitted changes,
        // the untracked extra.py too, on top of it): the work tree's tree
        // is taken and compared.
        std::fs::write(port.join("m.py"), "x = 3\n").unwrap();
        let snapshot = snapshot_of(top, &head);
        let objects_before = git(top, &["count-objects"]);
        let at_snapshot = |ignore: Vec<String>| {
            let (port, sha, s) = (port.clone(), snapshot.clone(), scratch.path().to_path_buf());
            async move { is_at_commit(&port, &sha, &ignore, &s).await.unwrap() }
        };
        assert!(at_snapshot(ignore.clone()).await);
        std::fs::write(port.join("m.py"), "x = 1\n").unwrap();
        assert!(!at_snapshot(ignore.clone()).await);
        std::fs::remove_file(port.join("extra.py")).unwrap();
        assert!(at(ignore.clone()).await);
        // Asking wrote nothing to the repository and left no folder behind.
        assert_eq!(git(top, &["count-objects"]), objects_before);
        assert_eq!(std::fs::read(top.join(".git/index")).unwrap(), index_before);
        assert_eq!(std::fs::read_dir(scratch.path()).unwrap().count(), 0);
        // A commit the repository lacks is not where the tree is.
        assert!(
            !is_at_commit(&port, &"a".repeat(40), &[], scratch.path())
                .await
                .unwrap()
        );
        assert!(is_full_sha(&head));
        assert!(!is_full_sha("HEAD") && !is_full_sha(&head.to_uppercase()));
    }

    /// A same-size edit made in the second the index was written, asked
    /// about in a later second: git must hash the file again (the entry is
    /// "racily clean"), which it does only if the copied index keeps the
    /// index's date. CI once saw the stale content under load.
    #[tokio::test]
    async fn a_same_size_edit_in_the_index_s_second_is_seen_later() {
        use std::os::unix::fs::MetadataExt;
        let scratch = tempfile::tempdir().unwrap();
        // the edit must land in the same second as the index and the
        // file's first write (a slow machine may need a few tries)
        let (dir, head) = (0..20)
            .find_map(|_| {
                let dir = repo();
                let top = dir.path();
                std::fs::write(top.join("port/m.py"), "x = 3\n").unwrap();
                let index = std::fs::metadata(top.join(".git/index")).unwrap();
                let file = std::fs::metadata(top.join("port/m.py")).unwrap();
                let same = file.ctime() == index.mtime() && file.mtime() == index.mtime();
                let head = git(top, &["rev-parse", "HEAD"]);
                same.then_some((dir, head))
            })
            .expect("an edit in the index's second");
        let top = dir.path();
        let snapshot = snapshot_of(top, &head);
        // a later second: a copy dated now would make the entry look clean
        let index_s = std::fs::metadata(top.join(".git/index")).unwrap().mtime();
        while std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
            <= index_s
        {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let port = top.join("port");
        assert!(
            is_at_commit(&port, &snapshot, &[], scratch.path())
                .await
                .unwrap()
        );
        assert!(
            !is_at_commit(&port, &head, &[], scratch.path())
                .await
                .unwrap()
        );
    }

    /// Issue #38: a repository whose hooks folder, `core.hooksPath` and
    /// `core.fsmonitor` all name a program: none of them runs for any git
    /// fvd starts, through the commands the worker and the orchestrator
    /// use.
    #[tokio::test]
    async fn no_program_a_repository_names_runs() {
        use std::os::unix::fs::PermissionsExt;
        let dir = repo();
        let top = dir.path();
        let marks = tempfile::tempdir().unwrap();
        let evil = marks.path().join("evil.sh");
        std::fs::write(
            &evil,
            format!(
                "#!/bin/sh\necho \"$0 $*\" >> {}/ran\n",
                marks.path().display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&evil, std::fs::Permissions::from_mode(0o755)).unwrap();
        let hooks = top.join(".git/hooks");
        let other_hooks = marks.path().join("hooks");
        std::fs::create_dir_all(&other_hooks).unwrap();
        for h in [
            "pre-commit",
            "post-commit",
            "post-checkout",
            "post-index-change",
            "reference-transaction",
            "pre-auto-gc",
            "post-rewrite",
        ] {
            for d in [&hooks, &other_hooks] {
                std::fs::copy(&evil, d.join(h)).unwrap();
            }
        }
        git(top, &["config", "core.fsmonitor", evil.to_str().unwrap()]);
        // Unhardened, the hooks run (the test can fail).
        let out = std::process::Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@t"])
            .args(["commit", "-q", "--allow-empty", "-m", "plain"])
            .current_dir(top)
            .output()
            .unwrap();
        assert!(out.status.success());
        assert!(
            marks.path().join("ran").exists(),
            "the plain commit ran no hook"
        );
        std::fs::remove_file(marks.path().join("ran")).unwrap();
        // Through the runner, with `core.hooksPath` of the repository
        // naming a second folder of hooks: nothing runs.
        git(
            top,
            &["config", "core.hooksPath", other_hooks.to_str().unwrap()],
        );
        std::fs::write(top.join("port/m.py"), "x = 5\n").unwrap();
        let id = [
            ("GIT_AUTHOR_NAME", OsStr::new("t")),
            ("GIT_AUTHOR_EMAIL", OsStr::new("t@t")),
            ("GIT_COMMITTER_NAME", OsStr::new("t")),
            ("GIT_COMMITTER_EMAIL", OsStr::new("t@t")),
        ];
        run(top, &["status", "--porcelain"], &[]).await.unwrap();
        run(top, &["add", "-A"], &[]).await.unwrap();
        run(top, &["commit", "-q", "-m", "runner"], &id)
            .await
            .unwrap();
        run(top, &["update-ref", "refs/fvd/x", "HEAD"], &[])
            .await
            .unwrap();
        let wt = marks.path().join("wt");
        run(
            top,
            &[
                "worktree",
                "add",
                "-q",
                "--detach",
                wt.to_str().unwrap(),
                "HEAD",
            ],
            &[],
        )
        .await
        .unwrap();
        run(&wt, &["reset", "-q", "--hard", "HEAD~1"], &[])
            .await
            .unwrap();
        run(&wt, &["clean", "-q", "-fd"], &[]).await.unwrap();
        let layout = layout(&wt).await.unwrap();
        work_tree_id(&layout, Objects::Repository).await.unwrap();
        assert!(
            !marks.path().join("ran").exists(),
            "a program ran: {}",
            std::fs::read_to_string(marks.path().join("ran")).unwrap_or_default()
        );
    }

    /// A linked worktree's administrative folder is found from the
    /// repository's side; a rewritten `.git` file changes nothing.
    #[tokio::test]
    async fn a_worktree_is_found_from_its_repository_not_its_git_file() {
        let dir = repo();
        let top = dir.path();
        let other = tempfile::tempdir().unwrap();
        let wt = other.path().join("wt");
        git(
            top,
            &[
                "worktree",
                "add",
                "-q",
                "--detach",
                wt.to_str().unwrap(),
                "HEAD",
            ],
        );
        let common = top.join(".git").canonicalize().unwrap();
        let admin = worktree_admin(&common, &wt).expect("the worktree is registered");
        assert!(admin.starts_with(common.join("worktrees")), "{admin:?}");
        assert_eq!(
            git_paths(&wt.join("port")),
            vec![wt.join(".git"), common.clone()]
        );
        assert_eq!(git_paths(&top.join("port")), vec![top.join(".git")]);
        assert!(git_paths(other.path()).is_empty());
        // A job rewrites the `.git` file to a repository of its own.
        let fake = other.path().join("fake.git");
        git(
            other.path(),
            &["init", "-q", "--bare", fake.to_str().unwrap()],
        );
        std::fs::write(wt.join(".git"), format!("gitdir: {}\n", fake.display())).unwrap();
        assert_eq!(worktree_admin(&common, &wt), Some(admin.clone()));
        let env = worktree_env(&admin, &wt);
        let env: Vec<(&str, &OsStr)> = env.iter().map(|(k, v)| (*k, v.as_os_str())).collect();
        let head = run(&wt, &["rev-parse", "HEAD"], &env).await.unwrap();
        assert_eq!(head, git(top, &["rev-parse", "HEAD"]));
        assert_eq!(worktree_admin(&common, other.path()), None);
    }

    #[tokio::test]
    async fn outside_a_repository_there_is_no_prefix() {
        let bare = tempfile::tempdir().unwrap();
        assert_eq!(prefix(bare.path()).await, None);
        let dir = repo();
        assert_eq!(
            prefix(&dir.path().join("port")).await.as_deref(),
            Some("port/")
        );
        assert_eq!(prefix(dir.path()).await.as_deref(), Some(""));
    }
}
