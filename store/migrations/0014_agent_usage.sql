-- What each agent attempt spent on its model API (issue 29): tokens and
-- USD as fvd's model proxy metered them from the API's replies (`source`
-- 'proxy'), or as the CLI reported them when it reached its model itself
-- ('cli'), with the CLI's own figures beside them for comparison, how the
-- attempt ended on the model side, and the tool calls the CLI refused.
-- One row per attempt row of agent_attempts, written while the attempt
-- runs (after every metered reply) and completed when it ends; a try after
-- a crash adds to the figures of the tries before it.

CREATE TABLE agent_usage (
    family             TEXT NOT NULL,
    component          TEXT NOT NULL,
    attempt            INTEGER NOT NULL,
    preset             TEXT NOT NULL DEFAULT '',   -- '' for a raw command
    model              TEXT NOT NULL DEFAULT '',
    input_tokens       INTEGER NOT NULL DEFAULT 0, -- not read from a cache
    output_tokens      INTEGER NOT NULL DEFAULT 0,
    cache_read_tokens  INTEGER NOT NULL DEFAULT 0,
    cache_write_tokens INTEGER NOT NULL DEFAULT 0,
    cost_usd           REAL,                       -- NULL: no price known
    unpriced_tokens    INTEGER NOT NULL DEFAULT 0, -- tokens of models without a price
    source             TEXT NOT NULL DEFAULT '',   -- proxy | cli
    cost_source        TEXT NOT NULL DEFAULT '',   -- prices | cli | ''
    requests           INTEGER NOT NULL DEFAULT 0,
    retries            INTEGER NOT NULL DEFAULT 0,
    turns              INTEGER,                    -- as the CLI counts them
    cli_cost_usd       REAL,                       -- the CLI's own figure
    outcome            TEXT NOT NULL DEFAULT '',   -- running | completed | turn_cap | budget_cap | auth | upstream | timed_out | error
    stop_reason        TEXT NOT NULL DEFAULT '',
    permission_denials TEXT NOT NULL DEFAULT '[]', -- JSON list of "TOOL: input"
    handoff_source     TEXT NOT NULL DEFAULT '',   -- structured_output | file | output | ''
    updated_ms         INTEGER NOT NULL,
    PRIMARY KEY (family, component, attempt)
);
