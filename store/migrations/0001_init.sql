-- fvd state, version 1. Every state change is committed here before it is
-- acknowledged or acted upon.

CREATE TABLE ports (
    family           TEXT PRIMARY KEY,
    repo             TEXT NOT NULL,
    spec_path        TEXT NOT NULL,
    spec_toml        TEXT NOT NULL,
    state            TEXT NOT NULL,   -- fvd_store::states::PortState: running | ask_user | environment | waiting | blocked | cancelled
    phase            TEXT NOT NULL,   -- P0..P11
    port_status_path TEXT NOT NULL DEFAULT '',
    created_ms       INTEGER NOT NULL,
    updated_ms       INTEGER NOT NULL
);

CREATE TABLE components (
    family     TEXT NOT NULL REFERENCES ports(family),
    name       TEXT NOT NULL,
    status     TEXT NOT NULL,          -- fvd_store::states::ComponentStatus: pending | queued | running | confirming | tracing | agent | ask_user | environment | non_skip_pass | blocked
    verdict    TEXT NOT NULL DEFAULT '',
    reason     TEXT NOT NULL DEFAULT '',
    runs       INTEGER NOT NULL DEFAULT 0,
    worker_id  TEXT NOT NULL DEFAULT '',
    updated_ms INTEGER NOT NULL,
    PRIMARY KEY (family, name)
);

CREATE TABLE jobs (
    job_id       TEXT PRIMARY KEY,
    family       TEXT NOT NULL,
    component    TEXT NOT NULL,
    run_no       INTEGER NOT NULL,
    state        TEXT NOT NULL,        -- fvd_store::states::JobState: queued | running | finished | environment | unplaced | abandoned
    lease_epoch  INTEGER NOT NULL DEFAULT 0,
    worker_id    TEXT NOT NULL DEFAULT '',
    argv         TEXT NOT NULL,        -- JSON list
    cwd          TEXT NOT NULL,
    gpus_needed  INTEGER NOT NULL,
    gpus         TEXT NOT NULL DEFAULT '[]',
    timeout_ms   INTEGER NOT NULL,
    verdict      TEXT NOT NULL DEFAULT '',
    reason       TEXT NOT NULL DEFAULT '',
    exit_code    INTEGER,
    signal       INTEGER,
    duration_ms  INTEGER,
    junit_xml    TEXT NOT NULL DEFAULT '',
    output_tail  TEXT NOT NULL DEFAULT '',
    queued_ms    INTEGER NOT NULL,
    started_ms   INTEGER,
    finished_ms  INTEGER,
    UNIQUE (family, component, run_no)
);
CREATE INDEX jobs_by_component ON jobs (family, component, run_no);

CREATE TABLE job_logs (
    job_id  TEXT NOT NULL,
    seq     INTEGER NOT NULL,
    stream  INTEGER NOT NULL,          -- 1 stdout, 2 stderr
    offset  INTEGER NOT NULL,
    data    BLOB NOT NULL,
    PRIMARY KEY (job_id, seq)
);

CREATE TABLE gate_events (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    family     TEXT NOT NULL,
    phase      TEXT NOT NULL,
    outcome    TEXT NOT NULL,          -- entered | passed | refused | pending
    conditions TEXT NOT NULL,          -- JSON list of strings
    at_ms      INTEGER NOT NULL
);

CREATE TABLE workers (
    worker_id TEXT PRIMARY KEY,
    host      TEXT NOT NULL,
    gpus      TEXT NOT NULL,           -- JSON
    cpu_slots INTEGER NOT NULL,
    last_seen_ms INTEGER NOT NULL
);
