-- Why the port's PORT_STATUS.md could not be written the last time fvd
-- tried (issue #27, item 9): empty once a write succeeds. `fvd submit`
-- exits 7 while it is set, so a porter's record that fvd could not update
-- never passes for an up-to-date one.
ALTER TABLE ports ADD COLUMN status_write_error TEXT NOT NULL DEFAULT '';
