-- Agent attempts run as fleet jobs (issue #32): each recorded attempt names
-- the worker its agent ran on; empty for one that ran on the orchestrator's
-- host (embedded mode, `--agents host`, and every attempt before this).
ALTER TABLE agent_attempts ADD COLUMN worker_id TEXT NOT NULL DEFAULT '';
