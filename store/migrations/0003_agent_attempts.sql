-- The agent loop (issue #5): each agent component's worktree, and the
-- durable ledger of its attempts. An attempt row is written once the agent
-- exited and its work is committed; the verdict after it is filled in when
-- the rerun of the parity test is classified.

CREATE TABLE agent_worktrees (
    family      TEXT NOT NULL,
    component   TEXT NOT NULL,
    path        TEXT NOT NULL,
    branch      TEXT NOT NULL,
    base_commit TEXT NOT NULL,
    created_ms  INTEGER NOT NULL,
    PRIMARY KEY (family, component)
);

CREATE TABLE agent_attempts (
    family          TEXT NOT NULL,
    component       TEXT NOT NULL,
    attempt         INTEGER NOT NULL,   -- 1-based, dense per component
    commit_sha      TEXT NOT NULL,
    diff_stat       TEXT NOT NULL,
    diff            TEXT NOT NULL,      -- cut at 64 KiB
    exit_code       INTEGER,
    signal          INTEGER,
    timed_out       INTEGER NOT NULL,
    duration_ms     INTEGER NOT NULL,
    job_before      TEXT NOT NULL,      -- the run whose verdict the agent was given
    verdict_before  TEXT NOT NULL,
    reason_before   TEXT NOT NULL,
    job_after       TEXT NOT NULL DEFAULT '',
    verdict_after   TEXT NOT NULL DEFAULT '',
    reason_after    TEXT NOT NULL DEFAULT '',
    handoff_status  TEXT NOT NULL,      -- valid | invalid | missing
    handoff_summary TEXT NOT NULL,
    handoff_text    TEXT NOT NULL,
    started_ms      INTEGER NOT NULL,
    finished_ms     INTEGER NOT NULL,
    PRIMARY KEY (family, component, attempt)
);
