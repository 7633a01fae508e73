//! The snapshot of uncommitted changes is visible and bounded (issue #28,
//! item 6): `--dry-run` says what it will hold and every refusal `submit`
//! would make, a large snapshot is warned about, refs no verdict names are
//! pruned and `fvd reset` removes the port's, and every command finds the
//! repository from a folder inside it.

use std::path::Path;
use std::process::Output;

use crate::agent::git;
use crate::record::{parts, repo};
use crate::support::fvd;

fn out(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn submit_in(dir: &Path, extra: &[&str]) -> Output {
    fvd()
        .args(["submit", "--family", "widget", "--wait"])
        .args(extra)
        .current_dir(dir)
        .output()
        .unwrap()
}

fn refs(root: &Path) -> Vec<String> {
    git(
        root,
        &[
            "for-each-ref",
            "--format=%(refname)",
            "refs/fvd/snapshots/widget/",
        ],
    )
    .lines()
    .map(str::to_owned)
    .collect()
}

#[test]
fn the_snapshot_is_visible_bounded_and_found_from_any_subfolder() {
    let dir = repo("# Widget\n", &parts([&[], &[], &[], &[]]));
    let root = dir.path();
    let family_dir = root.join("tests/local_tests/widget");

    // an output folder of many small files and a 2 MiB data file, not ignored
    std::fs::create_dir_all(root.join("outputs")).unwrap();
    for i in 0..50 {
        std::fs::write(root.join(format!("outputs/{i}.txt")), vec![b'x'; 1000]).unwrap();
    }
    std::fs::File::create(root.join("outputs/latents.bin"))
        .unwrap()
        .set_len(2 * 1024 * 1024)
        .unwrap();
    // from inside the family folder, as a porter runs it
    let dry = submit_in(&family_dir, &["--dry-run", "--snapshot-warn-mib", "1"]);
    let text = out(&dry);
    assert!(
        text.contains("snapshot: 51 file(s) differ from HEAD, 2.0 MiB")
            && text.contains("largest: outputs/latents.bin 2.0 MiB"),
        "{text}"
    );
    assert!(
        text.contains("warning: the snapshot of uncommitted changes adds 51 file(s)"),
        "{text}"
    );
    assert!(
        !text.contains("tests/local_tests/widget/tests/local_tests"),
        "{text}"
    );
    // a file the snapshot refuses: the dry run says so and exits 1
    std::fs::File::create(root.join("outputs/weights.bin"))
        .unwrap()
        .set_len(100 * 1024 * 1024)
        .unwrap();
    let dry = submit_in(&family_dir, &["--dry-run"]);
    let text = out(&dry);
    assert_eq!(dry.status.code(), Some(1), "{text}");
    assert!(
        text.contains("submit would refuse: ")
            && text.contains("weights.bin is untracked, not ignored and 100 MiB"),
        "{text}"
    );
    let refused = submit_in(&family_dir, &[]);
    assert_eq!(refused.status.code(), Some(2), "{}", out(&refused));
    assert!(
        out(&refused).contains("weights.bin is untracked"),
        "{}",
        out(&refused)
    );
    std::fs::remove_file(root.join("outputs/weights.bin")).unwrap();

    // a real submit warns once about the size, then runs
    let first = submit_in(&family_dir, &["--snapshot-warn-mib", "1"]);
    let text = out(&first);
    assert_eq!(first.status.code(), Some(1), "{text}");
    assert_eq!(
        text.matches("fvd: warning: the snapshot").count(),
        1,
        "{text}"
    );
    assert_eq!(refs(root).len(), 1, "{text}");
    // two more snapshots: refs no recorded verdict names are pruned (the
    // new commit's, and the one the verdicts recorded until now name)
    for i in 0..2 {
        std::fs::write(root.join("outputs/0.txt"), format!("run {i}")).unwrap();
        let again = submit_in(root, &["--rerun"]);
        assert_eq!(again.status.code(), Some(1), "{}", out(&again));
        assert!(refs(root).len() <= 2, "after {i}: {:?}", refs(root));
    }
    // status and logs from the subfolder too
    let status = fvd()
        .args(["status", "widget"])
        .current_dir(&family_dir)
        .output()
        .unwrap();
    assert!(status.status.success(), "{}", out(&status));
    // reset removes the port's refs
    let reset = fvd()
        .args(["reset", "widget"])
        .current_dir(&family_dir)
        .output()
        .unwrap();
    assert!(reset.status.success(), "{}", out(&reset));
    assert!(
        out(&reset).contains("snapshot ref(s) refs/fvd/snapshots/widget/* removed"),
        "{}",
        out(&reset)
    );
    assert!(refs(root).is_empty());
}
