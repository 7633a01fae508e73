-- Lease epochs are reserved in blocks (issue #33): the reservation is the
-- one synced commit of a block, the leases under it commit without an
-- fsync of their own (synchronous = NORMAL). A restarted orchestrator
-- starts above reserved_to, so no epoch it hands out can equal one an
-- earlier process sent, even when a power cut lost that lease's row.
CREATE TABLE lease_epochs (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    reserved_to INTEGER NOT NULL
);
INSERT INTO lease_epochs (id, reserved_to) SELECT 1, COALESCE(MAX(lease_epoch), 0) FROM jobs;
