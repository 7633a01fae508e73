-- An agent attempt on the fleet outlives a restart of the orchestrator
-- (issue #38): the try's fleet job, its lease (worker, epoch, GPUs, written
-- with the lease like a run's) and the SHA-256 digests of the tokens its
-- agent was given for its model proxy and its tools. A restarted
-- orchestrator holds the lease for the worker to report, starts the proxy
-- and the tools again admitting the same tokens, and the agent goes on. No
-- token value is stored: a digest cannot be sent in its place.
ALTER TABLE agent_attempts ADD COLUMN fleet_job TEXT NOT NULL DEFAULT '';
ALTER TABLE agent_attempts ADD COLUMN lease_epoch INTEGER;
ALTER TABLE agent_attempts ADD COLUMN lease_gpus TEXT;
ALTER TABLE agent_attempts ADD COLUMN proxy_token_sha256 TEXT NOT NULL DEFAULT '';
ALTER TABLE agent_attempts ADD COLUMN tools_token_sha256 TEXT NOT NULL DEFAULT '';
CREATE INDEX agent_attempts_fleet_job ON agent_attempts (fleet_job) WHERE fleet_job <> '';
