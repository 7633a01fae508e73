-- When the worker actually started the job's process (worker clock), so the
-- dispatch latency from queue to process start can be measured.
ALTER TABLE jobs ADD COLUMN spawned_ms INTEGER;
