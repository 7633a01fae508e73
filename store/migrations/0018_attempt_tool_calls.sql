-- The tool calls an agent made during its attempt (issue #32: `fvd mcp`):
-- each one recorded on the attempt, with the GPU time of the parity runs it
-- asked for, which counts against the component's GPU-second budget (those
-- runs have no row in `jobs`: an agent's own run is never a verdict).
CREATE TABLE attempt_tool_calls (
    family      TEXT NOT NULL,
    component   TEXT NOT NULL,
    attempt     INTEGER NOT NULL,
    seq         INTEGER NOT NULL,
    tool        TEXT NOT NULL,
    arguments   TEXT NOT NULL,          -- JSON, as the agent sent it (redacted)
    outcome     TEXT NOT NULL,          -- ok | error
    detail      TEXT NOT NULL,          -- one line: a run's verdict, an error
    duration_ms INTEGER NOT NULL,
    gpu_ms      INTEGER NOT NULL DEFAULT 0,
    at_ms       INTEGER NOT NULL,
    PRIMARY KEY (family, component, attempt, seq)
);
