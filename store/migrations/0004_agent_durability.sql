-- The agent loop made durable across a crash (issue #5): an attempt row is
-- written *before* the agent starts (state `running`, with the worktree's
-- head and the agent's cookie) and completed in place once its work is
-- committed, so a restart finds the attempt that was cut off, kills what is
-- left of its agent, resets the worktree to `head_before` and runs the same
-- attempt again (`tries` counts the runs) instead of losing or duplicating
-- it. Escape hatches a component's agent raised wait here for `fvd answer`.

ALTER TABLE agent_attempts ADD COLUMN state TEXT NOT NULL DEFAULT 'recorded'; -- running | recorded
ALTER TABLE agent_attempts ADD COLUMN head_before TEXT NOT NULL DEFAULT '';
ALTER TABLE agent_attempts ADD COLUMN cookie TEXT NOT NULL DEFAULT '';
ALTER TABLE agent_attempts ADD COLUMN tries INTEGER NOT NULL DEFAULT 1;
-- GPU-seconds (in ms) of the run that tested the attempt.
ALTER TABLE agent_attempts ADD COLUMN gpu_ms_after INTEGER NOT NULL DEFAULT 0;
-- What kind of turn it was: `fix` after a red run, `cleanup` after a pass the
-- cleanup gate refused.
ALTER TABLE agent_attempts ADD COLUMN kind TEXT NOT NULL DEFAULT 'fix';

CREATE TABLE escape_hatches (
    family         TEXT NOT NULL,
    id             TEXT NOT NULL,         -- E001, E002, ... per port
    component      TEXT NOT NULL,
    attempt        INTEGER NOT NULL,      -- the attempt whose handoff asked
    phase          TEXT NOT NULL,
    decision_type  TEXT NOT NULL,
    question       TEXT NOT NULL,
    recommended    TEXT NOT NULL,
    options        TEXT NOT NULL,         -- JSON array of strings
    safe_default   TEXT NOT NULL,
    status         TEXT NOT NULL,         -- open | answered | resolved
    answer         TEXT NOT NULL DEFAULT '',
    asked_ms       INTEGER NOT NULL,
    answered_ms    INTEGER,
    resolved_attempt INTEGER,             -- the attempt that was given the answer
    PRIMARY KEY (family, id)
);
