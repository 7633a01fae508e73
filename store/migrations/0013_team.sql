-- One orchestrator for a team (issue #30): a port belongs to one checkout
-- of one repository and to the credential that first submitted it, and
-- every submit, answer, cancel and reset says who made it.

-- The repository a port was submitted from: `remote:HOST/PATH` (its
-- remote's URL without credentials), `root:SHA@/abs/path` (no remote), or
-- `path:/abs/path` (not in git). Empty for ports from before this migration
-- until their checkout submits again.
ALTER TABLE ports ADD COLUMN repo_identity TEXT NOT NULL DEFAULT '';
-- The credential name that created the port (empty: no credential, or from
-- before this migration); porters act only on their own ports.
ALTER TABLE ports ADD COLUMN owner TEXT NOT NULL DEFAULT '';
-- Who submitted the port last.
ALTER TABLE ports ADD COLUMN submitted_by TEXT NOT NULL DEFAULT '';

-- Who answered an escape hatch.
ALTER TABLE escape_hatches ADD COLUMN answered_by TEXT NOT NULL DEFAULT '';

-- Every change a person made to a port, oldest first. Kept when the port
-- is reset (`fvd reset`), so a reset is on record too.
CREATE TABLE port_actions (
    seq     INTEGER PRIMARY KEY AUTOINCREMENT,
    family  TEXT NOT NULL,
    action  TEXT NOT NULL,             -- fvd_store::team::Action: submit | rerun | answer | cancel | reset
    actor   TEXT NOT NULL,             -- the credential's name; empty without credentials
    detail  TEXT NOT NULL DEFAULT '',  -- one line: the commit submitted, the hatch answered
    at_ms   INTEGER NOT NULL
);
CREATE INDEX port_actions_by_family ON port_actions (family, seq);
