-- Hypothesis variants (issue 19, item 2). When a component with
-- [[component.variant]] tables is red, its test runs once more under every
-- variant's environment overrides, all at once; each set of rows here is
-- one red run's table: the red run itself (`baseline`, position 0) and one
-- row per variant in the spec's order. The variant runs are rows of `jobs`
-- under the component name `<name>#variant`, so they never count as the
-- component's runs.

CREATE TABLE variant_runs (
    family           TEXT NOT NULL,
    component        TEXT NOT NULL,
    red_job_id       TEXT NOT NULL,              -- the red run the table is about
    position         INTEGER NOT NULL,           -- 0: the baseline, then the spec's order
    name             TEXT NOT NULL,              -- `baseline` or the variant's name
    env              TEXT NOT NULL DEFAULT '',   -- JSON list of `KEY=VALUE` (literal, non-secret)
    job_id           TEXT NOT NULL DEFAULT '',   -- the variant's run
    state            TEXT NOT NULL,              -- running | done | abandoned
    verdict          TEXT NOT NULL DEFAULT '',
    reason           TEXT NOT NULL DEFAULT '',
    first_divergence TEXT NOT NULL DEFAULT '',   -- port module, when traced
    stat             TEXT NOT NULL DEFAULT '',
    drift            REAL,
    finding          TEXT NOT NULL DEFAULT '',   -- baseline | passes | moves | same | red | other
    trace_error      TEXT NOT NULL DEFAULT '',   -- why a traced variant has no first divergence
    started_ms       INTEGER NOT NULL,
    finished_ms      INTEGER,
    PRIMARY KEY (family, component, red_job_id, name)
);
CREATE INDEX variant_runs_by_component ON variant_runs (family, component, started_ms);
