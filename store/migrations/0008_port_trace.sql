-- The W3C trace context of a port's first traced run (its `port` span), so
-- that every later run of the port (a resume in a new process, an answer,
-- an orchestrator restart) continues the same trace. Empty when none was
-- recorded (export off, or never sampled); a rerun replaces it.
ALTER TABLE ports ADD COLUMN traceparent TEXT NOT NULL DEFAULT '';
