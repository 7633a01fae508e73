-- A changed judge is a person's question (issue #39). An escape hatch is
-- about what an agent asked (`agent`) or about the judge change an attempt
-- made (`judge`): approved, the change is committed under the person's name
-- as `judge_commit`, and later attempts are judged by it; rejected, it is
-- dropped from the branch. An attempt keeps the patch of its judge change.
ALTER TABLE escape_hatches ADD COLUMN about TEXT NOT NULL DEFAULT 'agent';
ALTER TABLE escape_hatches ADD COLUMN judge_commit TEXT NOT NULL DEFAULT '';
ALTER TABLE agent_attempts ADD COLUMN judge_diff TEXT NOT NULL DEFAULT '';
