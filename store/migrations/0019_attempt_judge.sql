-- The judge, pinned (issue #39): an attempt whose commit changed what judges
-- its component (its parity test, a conftest.py on the way to it, pytest's
-- configuration, the official reference, the spec or PORT_STATUS.md) lists
-- those paths, one a line; its verdict runs with the port's own judge.
ALTER TABLE agent_attempts ADD COLUMN judge_changed TEXT NOT NULL DEFAULT '';
