-- How each traced rerun's files were compared (issue 19, item 3): a worker
-- compares the files of its traced rerun where they lie and sends back the
-- report, so a step records where it was compared, what the worker's
-- folder held and what crossed the wire.
ALTER TABLE trace_steps ADD COLUMN compared_on TEXT NOT NULL DEFAULT '';   -- `worker W` | `orchestrator`
ALTER TABLE trace_steps ADD COLUMN files_bytes INTEGER NOT NULL DEFAULT 0; -- bytes in the worker's folder
ALTER TABLE trace_steps ADD COLUMN files INTEGER NOT NULL DEFAULT 0;       -- regular files in it
ALTER TABLE trace_steps ADD COLUMN wire_bytes INTEGER NOT NULL DEFAULT 0;  -- size of the result message
ALTER TABLE trace_steps ADD COLUMN compare_ms INTEGER NOT NULL DEFAULT 0;  -- time spent comparing
