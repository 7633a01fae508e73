-- Drill-down trace investigations (issue 4, item 6). A red run of a
-- component with a [component.trace] table is investigated by the port's
-- TraceActor: one row here per investigation, one row in trace_steps per
-- traced rerun with the comparison report of that step. The traced reruns
-- themselves are rows of `jobs` under the component name `<name>#trace`, so
-- they never count as the component's runs.

CREATE TABLE trace_investigations (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    family      TEXT NOT NULL,
    component   TEXT NOT NULL,
    job_id      TEXT NOT NULL,              -- the red run investigated
    state       TEXT NOT NULL,              -- running | done
    outcome     TEXT NOT NULL DEFAULT '',   -- leaf | depth | no_divergence | error | abandoned
    summary     TEXT NOT NULL DEFAULT '',   -- one line, quoted in the component's reason
    started_ms  INTEGER NOT NULL,
    finished_ms INTEGER
);
CREATE INDEX trace_investigations_by_component ON trace_investigations (family, component, id);

CREATE TABLE trace_steps (
    investigation    INTEGER NOT NULL REFERENCES trace_investigations(id),
    step             INTEGER NOT NULL,            -- 1-based
    layers           TEXT NOT NULL,               -- FASTVIDEO_TRACE_LAYERS of the rerun
    reference_layers TEXT NOT NULL,               -- FVD_TRACE_REFERENCE_LAYERS
    job_id           TEXT NOT NULL,               -- the traced rerun
    files_dir        TEXT NOT NULL DEFAULT '',    -- where the gathered files were written
    first_module     TEXT NOT NULL DEFAULT '',    -- port name of the first divergent module
    error            TEXT NOT NULL DEFAULT '',    -- why the step has no report
    report           TEXT NOT NULL DEFAULT '',    -- fvd_trace's report, JSON
    started_ms       INTEGER NOT NULL,
    finished_ms      INTEGER,
    PRIMARY KEY (investigation, step)
);
