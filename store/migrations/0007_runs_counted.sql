-- A component's `runs` is counted from its jobs when read (runs that
-- started and tested the code), no longer stored: the stored number was
-- the last run number handed out, which counted queued, cancelled,
-- unplaced and environment-failed runs too.
ALTER TABLE components DROP COLUMN runs;
