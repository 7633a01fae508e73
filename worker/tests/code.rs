//! The worker's code cache against a real repository: a job whose checkout
//! the worker sees at the job's commit runs there; otherwise the commit is
//! fetched (as the orchestrator would send it: a thin pack against the
//! commits the worker has, in chunks) into the worker's clone and checked
//! out, weights are linked in, a checkout is reset before reuse, and
//! eviction keeps under the cap without touching a checkout in use.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use fvd_worker::code::{
    Chunk, CodeCache, DEFAULT_CACHE_BYTES, FETCH_TRIES_ON_LOST_STREAM, JobCode, Mode, Provide,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
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

/// A thin pack of `commit` against `have`, made in `repo` as the
/// orchestrator makes it.
fn pack(repo: &Path, commit: &str, have: &[String]) -> Vec<u8> {
    use std::io::Write;
    let mut child = Command::new("git")
        .args([
            "pack-objects",
            "--revs",
            "--thin",
            "--stdout",
            "--delta-base-offset",
            "-q",
        ])
        .current_dir(repo)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut revs = format!("{commit}\n");
    for h in have {
        revs.push_str(&format!("^{h}\n"));
    }
    child
        .stdin
        .take()
        .unwrap()
        .write_all(revs.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    out.stdout
}

/// The fetches a test's cache made: the `have` lists it sent.
type Asked = Arc<Mutex<Vec<Vec<String>>>>;

fn fetcher(
    repo: PathBuf,
    commit: String,
    asked: Asked,
) -> impl FnMut(Vec<String>) -> std::future::Ready<Result<mpsc::UnboundedReceiver<Chunk>, String>> {
    move |have| {
        let data = pack(&repo, &commit, &have);
        asked.lock().unwrap().push(have);
        let (tx, rx) = mpsc::unbounded_channel();
        for piece in data.chunks(1000) {
            tx.send(Chunk {
                data: piece.to_vec(),
                last: false,
                error: String::new(),
            })
            .unwrap();
        }
        tx.send(Chunk {
            data: Vec::new(),
            last: true,
            error: String::new(),
        })
        .unwrap();
        std::future::ready(Ok(rx))
    }
}

fn job(cwd: &Path, commit: &str) -> JobCode {
    JobCode {
        job_id: "p.c.1".into(),
        cwd: cwd.display().to_string(),
        commit: commit.into(),
        prefix: "port/".into(),
        worker_paths: vec!["weights/tiny".into()],
        fvd_writes: vec!["STATUS.md".into()],
    }
}

#[tokio::test]
async fn code_is_shared_when_seen_at_its_commit_and_fetched_incrementally_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("port/weights/tiny")).unwrap();
    std::fs::write(src.join(".gitignore"), "weights/\n").unwrap();
    let body: String = (0..3000).map(|i| format!("v{i} = {i}\n")).collect();
    std::fs::write(src.join("port/m.py"), &body).unwrap();
    std::fs::write(src.join("port/STATUS.md"), "s\n").unwrap();
    std::fs::write(src.join("port/weights/tiny/w.bin"), b"w").unwrap();
    git(&src, &["init", "-q", "-b", "main"]);
    git(&src, &["add", "-A"]);
    git(&src, &["commit", "-q", "-m", "one"]);
    let one = git(&src, &["rev-parse", "HEAD"]);
    std::fs::write(src.join("port/m.py"), format!("{body}fixed = True\n")).unwrap();
    git(&src, &["commit", "-q", "-am", "two"]);
    let two = git(&src, &["rev-parse", "HEAD"]);

    let weights = dir.path().join("node-weights");
    std::fs::create_dir_all(&weights).unwrap();
    std::fs::write(weights.join("w.bin"), b"node").unwrap();
    let provides = vec![Provide::parse(&format!("weights/tiny={}", weights.display())).unwrap()];
    let ws = dir.path().join("ws");
    let cache = CodeCache::open(&ws, u64::MAX, provides.clone())
        .await
        .unwrap();
    let asked: Asked = Arc::default();
    let cancel = CancellationToken::new();
    let hidden = dir.path().join("not-here/port");

    // Not seen: fetched, checked out, the port folder is the cwd, the
    // weights linked in from where this worker has them.
    let a = cache
        .place(
            &job(&hidden, &one),
            fetcher(src.clone(), one.clone(), asked.clone()),
            &cancel,
        )
        .await
        .unwrap();
    let Mode::ByCommit { fetched: first } = a.mode else {
        panic!("{:?}", a.mode)
    };
    assert!(first > 1000, "{first}");
    assert_eq!(a.cwd, ws.join("code/checkouts").join(&one).join("port"));
    assert_eq!(std::fs::read_to_string(a.cwd.join("m.py")).unwrap(), body);
    assert_eq!(
        std::fs::read(a.cwd.join("weights/tiny/w.bin")).unwrap(),
        b"node"
    );
    assert_eq!(asked.lock().unwrap().as_slice(), [Vec::<String>::new()]);

    // The next commit costs about its diff: the first is named as a have.
    let b = cache
        .place(
            &job(&hidden, &two),
            fetcher(src.clone(), two.clone(), asked.clone()),
            &cancel,
        )
        .await
        .unwrap();
    let Mode::ByCommit { fetched: next } = b.mode else {
        panic!("{:?}", b.mode)
    };
    assert!(next < 1024, "a one-line change cost {next} bytes");
    assert_eq!(asked.lock().unwrap()[1], std::slice::from_ref(&one));
    assert!(
        std::fs::read_to_string(b.cwd.join("m.py"))
            .unwrap()
            .ends_with("fixed = True\n")
    );

    // A commit the clone holds is not fetched again.
    let never = |_: Vec<String>| async {
        Err::<mpsc::UnboundedReceiver<Chunk>, _>("fetched twice".to_string())
    };
    let again = cache
        .place(&job(&hidden, &one), never, &cancel)
        .await
        .unwrap();
    assert_eq!(again.mode, Mode::ByCommit { fetched: 0 });
    drop((a, again));

    // A checkout no job uses is reset before the next job: what a test
    // changed in tracked files or left untracked is gone.
    let stale = ws.join("code/checkouts").join(&one).join("port");
    std::fs::write(stale.join("m.py"), "broken\n").unwrap();
    std::fs::write(stale.join("left.txt"), "x").unwrap();
    let reused = cache
        .place(&job(&hidden, &one), never, &cancel)
        .await
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(reused.cwd.join("m.py")).unwrap(),
        body
    );
    assert!(!reused.cwd.join("left.txt").exists());
    assert!(reused.cwd.join("weights/tiny/w.bin").exists());
    drop(reused);

    // The source checkout at HEAD (`two`): shared, even with fvd's status
    // file changed and ignored weights present; not once a file changes.
    std::fs::write(src.join("port/STATUS.md"), "s\nfvd wrote this\n").unwrap();
    let port = src.join("port");
    let shared = cache
        .place(&job(&port, &two), never, &cancel)
        .await
        .unwrap();
    assert_eq!(
        (shared.mode, shared.cwd.clone()),
        (Mode::Shared, port.clone())
    );
    let at_one = cache
        .place(&job(&port, &one), never, &cancel)
        .await
        .unwrap();
    assert_eq!(
        at_one.mode,
        Mode::ByCommit { fetched: 0 },
        "HEAD is not the job's commit"
    );
    drop(at_one);
    std::fs::write(port.join("m.py"), "edited after submit\n").unwrap();
    let edited = cache
        .place(&job(&port, &two), never, &cancel)
        .await
        .unwrap();
    assert_eq!(edited.mode, Mode::ByCommit { fetched: 0 });
    assert!(
        std::fs::read_to_string(edited.cwd.join("m.py"))
            .unwrap()
            .ends_with("fixed = True\n")
    );

    // A worker that provides no target for a path the job needs, and
    // cannot see the checkout, says so.
    let bare = CodeCache::open(
        &dir.path().join("ws2"),
        u64::MAX,
        vec![Provide::parse("weights/tiny").unwrap()],
    )
    .await
    .unwrap();
    let err = bare
        .place(&job(&hidden, &one), never, &cancel)
        .await
        .unwrap_err();
    assert!(err.starts_with("needs worker path weights/tiny:"), "{err}");

    // Eviction: a tiny cap keeps only what is in use.
    drop(edited);
    let small = CodeCache::open(&ws, 1, provides).await.unwrap();
    assert_eq!(
        small.checkouts().len(),
        2,
        "the checkouts of the first run count"
    );
    let held = small
        .place(&job(&hidden, &two), never, &cancel)
        .await
        .unwrap();
    assert_eq!(
        small.checkouts(),
        std::slice::from_ref(&two),
        "the unused one went"
    );
    assert!(!ws.join("code/checkouts").join(&one).exists());
    let back = small
        .place(&job(&hidden, &one), never, &cancel)
        .await
        .unwrap();
    assert_eq!(
        back.mode,
        Mode::ByCommit { fetched: 0 },
        "objects stay after eviction"
    );
    let mut kept = small.checkouts();
    kept.sort();
    let mut both = vec![one.clone(), two.clone()];
    both.sort();
    assert_eq!(kept, both, "a checkout in use is never evicted");
    drop(held);
}

#[tokio::test]
async fn a_fetch_that_fails_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let cache = CodeCache::open(dir.path(), u64::MAX, Vec::new())
        .await
        .unwrap();
    let cancel = CancellationToken::new();
    let mut j = job(&dir.path().join("nowhere"), &"a".repeat(40));
    j.worker_paths.clear();
    let refused = |_: Vec<String>| async {
        let (tx, rx) = mpsc::unbounded_channel();
        tx.send(Chunk {
            data: Vec::new(),
            last: false,
            error: "job p.c.1 is not leased to worker w".into(),
        })
        .unwrap();
        Ok(rx)
    };
    let err = cache.place(&j, refused, &cancel).await.unwrap_err();
    assert_eq!(
        err,
        "cannot fetch commit aaaaaaaaaaaa from the orchestrator: job p.c.1 is not leased to worker w"
    );
    j.commit = "HEAD".into();
    let err = cache.place(&j, refused, &cancel).await.unwrap_err();
    assert!(err.contains("not a full sha"), "{err}");
}

/// A repository with one commit holding `port/x.py`, and its sha.
fn one_commit(dir: &Path) -> String {
    std::fs::create_dir_all(dir.join("port")).unwrap();
    std::fs::write(dir.join("port/x.py"), "x = 1\n").unwrap();
    git(dir, &["init", "-q", "-b", "main"]);
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "one"]);
    git(dir, &["rev-parse", "HEAD"])
}

/// A stream that closes in the middle of a fetch (the orchestrator
/// restarted) is no verdict on the commit: the fetch is asked again and
/// the job is placed, where it used to end as an environment failure that
/// a restarted orchestrator adopted.
#[tokio::test]
async fn a_fetch_cut_by_a_lost_stream_is_asked_again() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let sha = one_commit(&src);
    let whole = pack(&src, &sha, &[]);
    let cache = CodeCache::open(&tmp.path().join("ws"), DEFAULT_CACHE_BYTES, vec![])
        .await
        .unwrap();
    let mut asked = 0;
    let fetch = |_have: Vec<String>| {
        asked += 1;
        let (to, from) = mpsc::unbounded_channel();
        // The first time half the pack, then the session ends.
        let (data, last) = match asked {
            1 => (whole[..whole.len() / 2].to_vec(), false),
            _ => (whole.clone(), true),
        };
        to.send(Chunk {
            data,
            last,
            error: String::new(),
        })
        .unwrap();
        std::future::ready(Ok::<_, String>(from))
    };
    let job = JobCode {
        worker_paths: vec![],
        ..job(&tmp.path().join("nowhere"), &sha)
    };
    let placed = cache
        .place(&job, fetch, &CancellationToken::new())
        .await
        .expect("placed after the fetch was asked again");
    assert!(
        placed.cwd.join("x.py").is_file(),
        "{}",
        placed.cwd.display()
    );
    assert_eq!(asked, 2);
}

/// A stream that keeps closing ends the job's placement with the cause
/// after the bounded number of tries, not a wait without end.
#[tokio::test]
async fn a_stream_that_keeps_closing_ends_the_fetch() {
    let tmp = tempfile::tempdir().unwrap();
    let sha = one_commit(&tmp.path().join("src"));
    let cache = CodeCache::open(&tmp.path().join("ws"), DEFAULT_CACHE_BYTES, vec![])
        .await
        .unwrap();
    let mut asked = 0;
    let fetch = |_have: Vec<String>| {
        asked += 1;
        let (_, from) = mpsc::unbounded_channel::<Chunk>();
        std::future::ready(Ok::<_, String>(from))
    };
    let job = JobCode {
        worker_paths: vec![],
        ..job(&tmp.path().join("nowhere"), &sha)
    };
    let why = cache
        .place(&job, fetch, &CancellationToken::new())
        .await
        .expect_err("no pack ever came");
    assert!(
        why.contains("the stream to the orchestrator closed"),
        "{why}"
    );
    assert_eq!(asked, 1 + FETCH_TRIES_ON_LOST_STREAM);
}
