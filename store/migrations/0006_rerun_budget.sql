-- `fvd submit --rerun` starts a port's components over; the agent budgets
-- (attempts, wall time, GPU-seconds) start over with them. The ledger keeps
-- every attempt as history; only those after `reset_ms` count.
ALTER TABLE ports ADD COLUMN reset_ms INTEGER NOT NULL DEFAULT 0;
