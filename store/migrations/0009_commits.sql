-- Code travels by commit (issue #12): a port is pinned to a commit of its
-- repository (the checkout's HEAD at submit, a snapshot of its uncommitted
-- changes, or `fvd submit --commit REV`), and every job names the commit
-- it runs and where the port folder sits inside that repository. Empty
-- for a port whose folder is not in a git repository: its jobs run in the
-- folder itself (a shared file system only).
ALTER TABLE ports ADD COLUMN commit_sha TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN commit_sha TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN code_prefix TEXT NOT NULL DEFAULT '';
