-- An error's kind is a column of its own beside every verdict column
-- (fvd_contracts::recorded::RecordedVerdict::Error): it used to be read back
-- out of the reason's words (`error:collection: …`). Existing rows get the
-- kind their reason names, read once here the way that reader read it (the
-- reason, or the reason after a leading `error: `, starts `error:KIND:`);
-- an error whose reason names no known kind is fvd's own failure (no kind).
ALTER TABLE jobs ADD COLUMN error_kind TEXT NOT NULL DEFAULT '';
ALTER TABLE components ADD COLUMN error_kind TEXT NOT NULL DEFAULT '';
ALTER TABLE agent_attempts ADD COLUMN error_kind_before TEXT NOT NULL DEFAULT '';
ALTER TABLE agent_attempts ADD COLUMN error_kind_after TEXT NOT NULL DEFAULT '';
ALTER TABLE variant_runs ADD COLUMN error_kind TEXT NOT NULL DEFAULT '';

UPDATE jobs SET error_kind = CASE
        WHEN substr(ltrim(reason), 1, 15) = 'error:no_tests:' OR substr(ltrim(reason), 1, 22) = 'error: error:no_tests:' THEN 'no_tests'
        WHEN substr(ltrim(reason), 1, 17) = 'error:collection:' OR substr(ltrim(reason), 1, 24) = 'error: error:collection:' THEN 'collection'
        WHEN substr(ltrim(reason), 1, 12) = 'error:setup:' OR substr(ltrim(reason), 1, 19) = 'error: error:setup:' THEN 'setup'
        WHEN substr(ltrim(reason), 1, 15) = 'error:teardown:' OR substr(ltrim(reason), 1, 22) = 'error: error:teardown:' THEN 'teardown'
        WHEN substr(ltrim(reason), 1, 20) = 'error:junit_missing:' OR substr(ltrim(reason), 1, 27) = 'error: error:junit_missing:' THEN 'junit_missing'
        WHEN substr(ltrim(reason), 1, 23) = 'error:junit_unreadable:' OR substr(ltrim(reason), 1, 30) = 'error: error:junit_unreadable:' THEN 'junit_unreadable'
        WHEN substr(ltrim(reason), 1, 20) = 'error:junit_invalid:' OR substr(ltrim(reason), 1, 27) = 'error: error:junit_invalid:' THEN 'junit_invalid'
        WHEN substr(ltrim(reason), 1, 14) = 'error:crashed:' OR substr(ltrim(reason), 1, 21) = 'error: error:crashed:' THEN 'crashed'
        WHEN substr(ltrim(reason), 1, 20) = 'error:exit_mismatch:' OR substr(ltrim(reason), 1, 27) = 'error: error:exit_mismatch:' THEN 'exit_mismatch'
        WHEN substr(ltrim(reason), 1, 13) = 'error:pytest:' OR substr(ltrim(reason), 1, 20) = 'error: error:pytest:' THEN 'pytest'
        WHEN substr(ltrim(reason), 1, 16) = 'error:cancelled:' OR substr(ltrim(reason), 1, 23) = 'error: error:cancelled:' THEN 'cancelled'
        ELSE '' END
WHERE verdict = 'error';

UPDATE components SET error_kind = CASE
        WHEN substr(ltrim(reason), 1, 15) = 'error:no_tests:' OR substr(ltrim(reason), 1, 22) = 'error: error:no_tests:' THEN 'no_tests'
        WHEN substr(ltrim(reason), 1, 17) = 'error:collection:' OR substr(ltrim(reason), 1, 24) = 'error: error:collection:' THEN 'collection'
        WHEN substr(ltrim(reason), 1, 12) = 'error:setup:' OR substr(ltrim(reason), 1, 19) = 'error: error:setup:' THEN 'setup'
        WHEN substr(ltrim(reason), 1, 15) = 'error:teardown:' OR substr(ltrim(reason), 1, 22) = 'error: error:teardown:' THEN 'teardown'
        WHEN substr(ltrim(reason), 1, 20) = 'error:junit_missing:' OR substr(ltrim(reason), 1, 27) = 'error: error:junit_missing:' THEN 'junit_missing'
        WHEN substr(ltrim(reason), 1, 23) = 'error:junit_unreadable:' OR substr(ltrim(reason), 1, 30) = 'error: error:junit_unreadable:' THEN 'junit_unreadable'
        WHEN substr(ltrim(reason), 1, 20) = 'error:junit_invalid:' OR substr(ltrim(reason), 1, 27) = 'error: error:junit_invalid:' THEN 'junit_invalid'
        WHEN substr(ltrim(reason), 1, 14) = 'error:crashed:' OR substr(ltrim(reason), 1, 21) = 'error: error:crashed:' THEN 'crashed'
        WHEN substr(ltrim(reason), 1, 20) = 'error:exit_mismatch:' OR substr(ltrim(reason), 1, 27) = 'error: error:exit_mismatch:' THEN 'exit_mismatch'
        WHEN substr(ltrim(reason), 1, 13) = 'error:pytest:' OR substr(ltrim(reason), 1, 20) = 'error: error:pytest:' THEN 'pytest'
        WHEN substr(ltrim(reason), 1, 16) = 'error:cancelled:' OR substr(ltrim(reason), 1, 23) = 'error: error:cancelled:' THEN 'cancelled'
        ELSE '' END
WHERE verdict = 'error';

UPDATE agent_attempts SET error_kind_before = CASE
        WHEN substr(ltrim(reason_before), 1, 15) = 'error:no_tests:' OR substr(ltrim(reason_before), 1, 22) = 'error: error:no_tests:' THEN 'no_tests'
        WHEN substr(ltrim(reason_before), 1, 17) = 'error:collection:' OR substr(ltrim(reason_before), 1, 24) = 'error: error:collection:' THEN 'collection'
        WHEN substr(ltrim(reason_before), 1, 12) = 'error:setup:' OR substr(ltrim(reason_before), 1, 19) = 'error: error:setup:' THEN 'setup'
        WHEN substr(ltrim(reason_before), 1, 15) = 'error:teardown:' OR substr(ltrim(reason_before), 1, 22) = 'error: error:teardown:' THEN 'teardown'
        WHEN substr(ltrim(reason_before), 1, 20) = 'error:junit_missing:' OR substr(ltrim(reason_before), 1, 27) = 'error: error:junit_missing:' THEN 'junit_missing'
        WHEN substr(ltrim(reason_before), 1, 23) = 'error:junit_unreadable:' OR substr(ltrim(reason_before), 1, 30) = 'error: error:junit_unreadable:' THEN 'junit_unreadable'
        WHEN substr(ltrim(reason_before), 1, 20) = 'error:junit_invalid:' OR substr(ltrim(reason_before), 1, 27) = 'error: error:junit_invalid:' THEN 'junit_invalid'
        WHEN substr(ltrim(reason_before), 1, 14) = 'error:crashed:' OR substr(ltrim(reason_before), 1, 21) = 'error: error:crashed:' THEN 'crashed'
        WHEN substr(ltrim(reason_before), 1, 20) = 'error:exit_mismatch:' OR substr(ltrim(reason_before), 1, 27) = 'error: error:exit_mismatch:' THEN 'exit_mismatch'
        WHEN substr(ltrim(reason_before), 1, 13) = 'error:pytest:' OR substr(ltrim(reason_before), 1, 20) = 'error: error:pytest:' THEN 'pytest'
        WHEN substr(ltrim(reason_before), 1, 16) = 'error:cancelled:' OR substr(ltrim(reason_before), 1, 23) = 'error: error:cancelled:' THEN 'cancelled'
        ELSE '' END
WHERE verdict_before = 'error';

UPDATE agent_attempts SET error_kind_after = CASE
        WHEN substr(ltrim(reason_after), 1, 15) = 'error:no_tests:' OR substr(ltrim(reason_after), 1, 22) = 'error: error:no_tests:' THEN 'no_tests'
        WHEN substr(ltrim(reason_after), 1, 17) = 'error:collection:' OR substr(ltrim(reason_after), 1, 24) = 'error: error:collection:' THEN 'collection'
        WHEN substr(ltrim(reason_after), 1, 12) = 'error:setup:' OR substr(ltrim(reason_after), 1, 19) = 'error: error:setup:' THEN 'setup'
        WHEN substr(ltrim(reason_after), 1, 15) = 'error:teardown:' OR substr(ltrim(reason_after), 1, 22) = 'error: error:teardown:' THEN 'teardown'
        WHEN substr(ltrim(reason_after), 1, 20) = 'error:junit_missing:' OR substr(ltrim(reason_after), 1, 27) = 'error: error:junit_missing:' THEN 'junit_missing'
        WHEN substr(ltrim(reason_after), 1, 23) = 'error:junit_unreadable:' OR substr(ltrim(reason_after), 1, 30) = 'error: error:junit_unreadable:' THEN 'junit_unreadable'
        WHEN substr(ltrim(reason_after), 1, 20) = 'error:junit_invalid:' OR substr(ltrim(reason_after), 1, 27) = 'error: error:junit_invalid:' THEN 'junit_invalid'
        WHEN substr(ltrim(reason_after), 1, 14) = 'error:crashed:' OR substr(ltrim(reason_after), 1, 21) = 'error: error:crashed:' THEN 'crashed'
        WHEN substr(ltrim(reason_after), 1, 20) = 'error:exit_mismatch:' OR substr(ltrim(reason_after), 1, 27) = 'error: error:exit_mismatch:' THEN 'exit_mismatch'
        WHEN substr(ltrim(reason_after), 1, 13) = 'error:pytest:' OR substr(ltrim(reason_after), 1, 20) = 'error: error:pytest:' THEN 'pytest'
        WHEN substr(ltrim(reason_after), 1, 16) = 'error:cancelled:' OR substr(ltrim(reason_after), 1, 23) = 'error: error:cancelled:' THEN 'cancelled'
        ELSE '' END
WHERE verdict_after = 'error';

UPDATE variant_runs SET error_kind = CASE
        WHEN substr(ltrim(reason), 1, 15) = 'error:no_tests:' OR substr(ltrim(reason), 1, 22) = 'error: error:no_tests:' THEN 'no_tests'
        WHEN substr(ltrim(reason), 1, 17) = 'error:collection:' OR substr(ltrim(reason), 1, 24) = 'error: error:collection:' THEN 'collection'
        WHEN substr(ltrim(reason), 1, 12) = 'error:setup:' OR substr(ltrim(reason), 1, 19) = 'error: error:setup:' THEN 'setup'
        WHEN substr(ltrim(reason), 1, 15) = 'error:teardown:' OR substr(ltrim(reason), 1, 22) = 'error: error:teardown:' THEN 'teardown'
        WHEN substr(ltrim(reason), 1, 20) = 'error:junit_missing:' OR substr(ltrim(reason), 1, 27) = 'error: error:junit_missing:' THEN 'junit_missing'
        WHEN substr(ltrim(reason), 1, 23) = 'error:junit_unreadable:' OR substr(ltrim(reason), 1, 30) = 'error: error:junit_unreadable:' THEN 'junit_unreadable'
        WHEN substr(ltrim(reason), 1, 20) = 'error:junit_invalid:' OR substr(ltrim(reason), 1, 27) = 'error: error:junit_invalid:' THEN 'junit_invalid'
        WHEN substr(ltrim(reason), 1, 14) = 'error:crashed:' OR substr(ltrim(reason), 1, 21) = 'error: error:crashed:' THEN 'crashed'
        WHEN substr(ltrim(reason), 1, 20) = 'error:exit_mismatch:' OR substr(ltrim(reason), 1, 27) = 'error: error:exit_mismatch:' THEN 'exit_mismatch'
        WHEN substr(ltrim(reason), 1, 13) = 'error:pytest:' OR substr(ltrim(reason), 1, 20) = 'error: error:pytest:' THEN 'pytest'
        WHEN substr(ltrim(reason), 1, 16) = 'error:cancelled:' OR substr(ltrim(reason), 1, 23) = 'error: error:cancelled:' THEN 'cancelled'
        ELSE '' END
WHERE verdict = 'error';
