//! The component actor's steps, each one transaction: a step's record and
//! the component's state it leads to are committed together, so a crash
//! between them cannot happen (issue #27). Before, a kill after an agent's
//! attempt was recorded and before its question was raised lost the
//! question (the attempt was retried with no answer), and a kill after a
//! red verdict was recorded and before the component moved on tested the
//! same commit again.
//!
//! The statement helpers take a connection, so the steps here and the
//! plain writes of the crate root ([`Store::queue_jobs`],
//! [`Store::raise_escape`]) share them.

use sqlx::SqliteConnection;

use crate::model::{GpuHistory, JobRecord, JobResult};
use crate::states::{AttemptState, ComponentStatus, EscapeStatus, JobState, RecordedVerdict};
use crate::{AttemptRow, EscapeRow, Store, StoreError, escape_id_after, now_ms};

/// A component's state as one step sets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ComponentNext<'a> {
    pub status: ComponentStatus,
    pub verdict: RecordedVerdict,
    pub reason: &'a str,
    pub worker_id: &'a str,
}

/// What a recorded agent attempt leads to, committed with its ledger row.
#[derive(Debug, Clone, Copy)]
pub enum AttemptNext<'a> {
    /// The agent asked a person: `escape` is raised under the next `E###`
    /// id (above `floor`) and the component waits in `ask_user` for it
    /// (reason `waiting for an answer to E###: QUESTION`).
    Ask {
        escape: &'a EscapeRow,
        floor: u32,
        verdict: RecordedVerdict,
        worker_id: &'a str,
    },
    /// The component ends (blocked, with the reason).
    End(ComponentNext<'a>),
    /// The attempt's commit is tested by a new run: `job` is queued and
    /// named the attempt's `job_after`.
    Test(&'a JobRecord),
}

/// What a recorded verdict leads to, committed with it.
#[derive(Debug, Clone, Copy)]
pub enum VerdictNext<'a> {
    /// The component's next state.
    Set(ComponentNext<'a>),
    /// A question: `escape` is raised under the next `E###` id (above
    /// `floor`) and the component waits in `ask_user` for it, with the
    /// run's verdict.
    Ask {
        escape: &'a EscapeRow,
        floor: u32,
        worker_id: &'a str,
    },
}

/// What [`Store::record_verdict_then`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VerdictRecorded {
    /// The job no longer runs under that lease: nothing was written.
    Stale,
    /// The verdict and the component's next state are recorded.
    Set,
    /// The verdict is recorded and the question raised under this id.
    Asked(String),
}

/// What acting on a judge answer leads to ([`Store::judge_decided`]).
#[derive(Debug, Clone, Copy)]
pub enum JudgeNext<'a> {
    /// The component's next state (an agent turn, or its end).
    Set(ComponentNext<'a>),
    /// A run of the branch as the answer left it.
    Test(&'a JobRecord),
}

/// What [`Store::record_attempt_step`] did beside recording the attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum AttemptRecorded {
    /// The question was raised under this id.
    Asked(String),
    /// The component ended.
    Ended,
    /// This run tests the attempt.
    Queued(JobRecord),
    /// The component was already final (the port was cancelled while the
    /// agent ran): the attempt is recorded, nothing else changed.
    AlreadyFinal,
}

impl Store {
    /// Records a run's verdict (only while the job still runs under
    /// `epoch`), the component's next state and, for an agent component,
    /// the verdict of the attempt the run tested (`attempt_gpu_ms`: the
    /// run's GPU time), in one transaction. False, with nothing written,
    /// for a stale or duplicate result.
    pub async fn record_verdict(
        &self,
        job_id: &str,
        epoch: u64,
        result: &JobResult,
        next: ComponentNext<'_>,
        attempt_gpu_ms: Option<u64>,
    ) -> Result<bool, StoreError> {
        let done = self
            .record_verdict_then(
                job_id,
                epoch,
                result,
                VerdictNext::Set(next),
                attempt_gpu_ms,
            )
            .await?;
        Ok(done != VerdictRecorded::Stale)
    }

    /// [`Store::record_verdict`], where the verdict may also raise a
    /// question ([`VerdictNext::Ask`]: the judge change of the attempt the
    /// run tested, issue #39) in the same transaction.
    pub async fn record_verdict_then(
        &self,
        job_id: &str,
        epoch: u64,
        result: &JobResult,
        then: VerdictNext<'_>,
        attempt_gpu_ms: Option<u64>,
    ) -> Result<VerdictRecorded, StoreError> {
        self.write("record verdict", || async move {
            let mut tx = self.write_tx().await?;
            let now = now_ms();
            if !finish_running_job(&mut tx, job_id, epoch, JobState::Finished, result, now).await? {
                return Ok(VerdictRecorded::Stale);
            }
            let (family, component): (String, String) =
                sqlx::query_as("SELECT family, component FROM jobs WHERE job_id = ?")
                    .bind(job_id)
                    .fetch_one(&mut *tx)
                    .await?;
            let done = match then {
                VerdictNext::Set(next) => {
                    set_component(&mut tx, &family, &component, next, now).await?;
                    VerdictRecorded::Set
                }
                VerdictNext::Ask {
                    escape,
                    floor,
                    worker_id,
                } => {
                    let asked = Asked {
                        escape,
                        floor,
                        verdict: result.verdict,
                        worker_id,
                    };
                    VerdictRecorded::Asked(ask(&mut tx, &family, &component, asked, now).await?)
                }
            };
            if let Some(gpu_ms) = attempt_gpu_ms {
                sqlx::query(
                    "UPDATE agent_attempts SET verdict_after = ?, error_kind_after = ?, reason_after = ?, gpu_ms_after = ? WHERE job_after = ?",
                )
                .bind(result.verdict.as_str())
                .bind(result.verdict.error_kind_str())
                .bind(&result.reason)
                .bind(gpu_ms as i64)
                .bind(job_id)
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await?;
            Ok(done)
        })
        .await
    }

    /// Acts on the answer to a judge question (issue #39), in one
    /// transaction: the escape hatch `id` (still `answered`) is resolved for
    /// `attempt`, with `judge_commit` the approved change's commit (empty
    /// when rejected), and the component goes on ([`JudgeNext`]). Refused
    /// for a hatch that is not waiting to be acted on.
    pub async fn judge_decided(
        &self,
        family: &str,
        id: &str,
        attempt: u32,
        judge_commit: &str,
        then: JudgeNext<'_>,
    ) -> Result<Option<JobRecord>, StoreError> {
        self.write("act on a judge answer", || async move {
            let mut tx = self.write_tx().await?;
            let now = now_ms();
            let component = escape_in(&mut tx, family, id, EscapeStatus::Answered).await?;
            sqlx::query("UPDATE escape_hatches SET status = ?, resolved_attempt = ?, judge_commit = ? WHERE family = ? AND id = ?")
                .bind(EscapeStatus::Resolved.as_str())
                .bind(attempt as i64)
                .bind(judge_commit)
                .bind(family)
                .bind(id)
                .execute(&mut *tx)
                .await?;
            let queued = match then {
                JudgeNext::Set(next) => {
                    set_component(&mut tx, family, &component, next, now).await?;
                    None
                }
                JudgeNext::Test(job) => {
                    let job = insert_job(&mut tx, job, now).await?;
                    // The attempt's verdict becomes the run's with its
                    // judge change approved.
                    if !judge_commit.is_empty() {
                        sqlx::query("UPDATE agent_attempts SET job_after = ? WHERE family = ? AND component = ? AND attempt = ?")
                            .bind(&job.job_id)
                            .bind(family)
                            .bind(&component)
                            .bind(attempt as i64)
                            .execute(&mut *tx)
                            .await?;
                    }
                    Some(job)
                }
            };
            tx.commit().await?;
            Ok(queued)
        })
        .await
    }

    /// Completes an attempt's ledger row (state `recorded`) with what the
    /// agent did, marks the answers it was given resolved (`resolve`), and
    /// commits what the attempt leads to ([`AttemptNext`]) in the same
    /// transaction, unless the component is already final.
    pub async fn record_attempt_step(
        &self,
        a: &AttemptRow,
        resolve: bool,
        then: AttemptNext<'_>,
    ) -> Result<AttemptRecorded, StoreError> {
        self.write("record attempt", || async move {
            let mut tx = self.write_tx().await?;
            let now = now_ms();
            sqlx::query("UPDATE agent_attempts SET commit_sha = ?, diff_stat = ?, diff = ?, exit_code = ?, signal = ?, timed_out = ?, duration_ms = ?, handoff_status = ?, handoff_summary = ?, handoff_text = ?, finished_ms = ?, state = ?, worker_id = ?, judge_changed = ?, judge_diff = ? WHERE family = ? AND component = ? AND attempt = ?")
                .bind(&a.commit_sha)
                .bind(&a.diff_stat)
                .bind(&a.diff)
                .bind(a.exit_code)
                .bind(a.signal)
                .bind(a.timed_out)
                .bind(a.duration_ms as i64)
                .bind(a.handoff_status.as_str())
                .bind(&a.handoff_summary)
                .bind(&a.handoff_text)
                .bind(a.finished_ms)
                .bind(AttemptState::Recorded.as_str())
                .bind(&a.worker_id)
                .bind(a.judge_changed.join("\n"))
                .bind(&a.judge_diff)
                .bind(&a.family)
                .bind(&a.component)
                .bind(a.attempt as i64)
                .execute(&mut *tx)
                .await?;
            if resolve {
                sqlx::query("UPDATE escape_hatches SET status = ?, resolved_attempt = ? WHERE family = ? AND component = ? AND status = ?")
                    .bind(EscapeStatus::Resolved.as_str())
                    .bind(a.attempt as i64)
                    .bind(&a.family)
                    .bind(&a.component)
                    .bind(EscapeStatus::Answered.as_str())
                    .execute(&mut *tx)
                    .await?;
            }
            let status: String =
                sqlx::query_scalar("SELECT status FROM components WHERE family = ? AND name = ?")
                    .bind(&a.family)
                    .bind(&a.component)
                    .fetch_one(&mut *tx)
                    .await?;
            let status: ComponentStatus =
                status.parse().map_err(|source| StoreError::State {
                    column: "components.status",
                    source,
                })?;
            let done = if status.is_final() {
                AttemptRecorded::AlreadyFinal
            } else {
                match then {
                    AttemptNext::Ask {
                        escape,
                        floor,
                        verdict,
                        worker_id,
                    } => {
                        let asked = Asked {
                            escape,
                            floor,
                            verdict,
                            worker_id,
                        };
                        AttemptRecorded::Asked(ask(&mut tx, &a.family, &a.component, asked, now).await?)
                    }
                    AttemptNext::End(next) => {
                        set_component(&mut tx, &a.family, &a.component, next, now).await?;
                        AttemptRecorded::Ended
                    }
                    AttemptNext::Test(job) => {
                        let job = insert_job(&mut tx, job, now).await?;
                        sqlx::query("UPDATE agent_attempts SET job_after = ? WHERE family = ? AND component = ? AND attempt = ?")
                            .bind(&job.job_id)
                            .bind(&a.family)
                            .bind(&a.component)
                            .bind(a.attempt as i64)
                            .execute(&mut *tx)
                            .await?;
                        AttemptRecorded::Queued(job)
                    }
                }
            };
            tx.commit().await?;
            Ok(done)
        })
        .await
    }
}

/// Ends a run's job in state `to` (`finished`, or `environment` for a run
/// that could not test the code) with `result`, only while it still runs
/// under `epoch`: false, with nothing written, for a stale or duplicate
/// result. The one statement behind [`Store::finish_job`],
/// [`Store::finish_job_environment`] and [`Store::record_verdict`].
pub(crate) async fn finish_running_job(
    conn: &mut SqliteConnection,
    job_id: &str,
    epoch: u64,
    to: JobState,
    result: &JobResult,
    now: i64,
) -> Result<bool, StoreError> {
    let done = sqlx::query("UPDATE jobs SET state = ?, verdict = ?, error_kind = ?, reason = ?, exit_code = ?, signal = ?, duration_ms = ?, junit_xml = ?, output_tail = ?, peak_gpu_mib = ?, next_gpu_mib = ?, finished_ms = ? WHERE job_id = ? AND lease_epoch = ? AND state = ?")
        .bind(to.as_str())
        .bind(result.verdict.as_str())
        .bind(result.verdict.error_kind_str())
        .bind(&result.reason)
        .bind(result.exit_code)
        .bind(result.signal)
        .bind(result.duration_ms as i64)
        .bind(&result.junit_xml)
        .bind(&result.output_tail)
        .bind(result.peak_gpu_mib.map(mib_column))
        .bind(result.next_gpu_mib.map(mib_column))
        .bind(now)
        .bind(job_id)
        .bind(epoch as i64)
        .bind(JobState::Running.as_str())
        .execute(&mut *conn)
        .await?
        .rows_affected();
    Ok(done > 0)
}

pub(crate) async fn set_component(
    conn: &mut SqliteConnection,
    family: &str,
    name: &str,
    next: ComponentNext<'_>,
    now: i64,
) -> Result<(), StoreError> {
    sqlx::query("UPDATE components SET status = ?, verdict = ?, error_kind = ?, reason = ?, worker_id = ?, updated_ms = ? WHERE family = ? AND name = ?")
        .bind(next.status.as_str())
        .bind(next.verdict.as_str())
        .bind(next.verdict.error_kind_str())
        .bind(next.reason)
        .bind(next.worker_id)
        .bind(now)
        .bind(family)
        .bind(name)
        .execute(conn)
        .await?;
    Ok(())
}

/// Inserts a queued run of `job`'s component under the next run number
/// (dense per component, from 1) and sets the component `queued`.
pub(crate) async fn insert_job(
    conn: &mut SqliteConnection,
    job: &JobRecord,
    now: i64,
) -> Result<JobRecord, StoreError> {
    let last: Option<i64> =
        sqlx::query_scalar("SELECT MAX(run_no) FROM jobs WHERE family = ? AND component = ?")
            .bind(&job.family)
            .bind(&job.component)
            .fetch_one(&mut *conn)
            .await?;
    let run_no = last.unwrap_or(0) + 1;
    let job_id = format!("{}.{}.{}", job.family, job.component, run_no);
    sqlx::query("INSERT INTO jobs (job_id, family, component, run_no, state, argv, cwd, gpus_needed, timeout_ms, queued_ms, commit_sha, code_prefix) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
        .bind(&job_id)
        .bind(&job.family)
        .bind(&job.component)
        .bind(run_no)
        .bind(JobState::Queued.as_str())
        .bind(serde_json::to_string(&job.argv).unwrap_or_default())
        .bind(&job.cwd)
        .bind(job.gpus_needed as i64)
        .bind(job.timeout_ms as i64)
        .bind(now)
        .bind(&job.commit)
        .bind(&job.code_prefix)
        .execute(&mut *conn)
        .await?;
    sqlx::query("UPDATE components SET status = ?, updated_ms = ? WHERE family = ? AND name = ?")
        .bind(ComponentStatus::Queued.as_str())
        .bind(now)
        .bind(&job.family)
        .bind(&job.component)
        .execute(&mut *conn)
        .await?;
    let recent: Vec<i64> = sqlx::query_scalar(
        "SELECT duration_ms FROM jobs WHERE family = ? AND component = ? AND state = ? AND duration_ms IS NOT NULL ORDER BY run_no DESC LIMIT ?",
    )
    .bind(&job.family)
    .bind(&job.component)
    .bind(JobState::Finished.as_str())
    .bind(crate::RECENT_RUNS as i64)
    .fetch_all(&mut *conn)
    .await?;
    Ok(JobRecord {
        job_id,
        run_no: run_no as u32,
        state: JobState::Queued,
        queued_ms: now,
        expected_ms: median_ms(recent),
        gpu_history: gpu_history(&mut *conn, &job.family, &job.component).await?,
        ..job.clone()
    })
}

/// A MiB count as SQLite's signed integer (saturating).
fn mib_column(mib: u64) -> i64 {
    i64::try_from(mib).unwrap_or(i64::MAX)
}

/// What a component's recorded runs say of the GPU memory its next run
/// needs: the most its last [`crate::RECENT_RUNS`] finished runs with a
/// known ask say, the most its `shared_oom` runs say (those never fall:
/// the raise outlives the runs after it), and whether its latest recorded
/// run is a `shared_oom` one (the next then runs alone).
pub(crate) async fn gpu_history(
    conn: &mut SqliteConnection,
    family: &str,
    component: &str,
) -> Result<GpuHistory, StoreError> {
    let learned: Option<i64> = sqlx::query_scalar(
        "SELECT MAX(next_gpu_mib) FROM (SELECT next_gpu_mib FROM jobs WHERE family = ? AND component = ? AND state = ? AND next_gpu_mib IS NOT NULL ORDER BY run_no DESC LIMIT ?)",
    )
    .bind(family)
    .bind(component)
    .bind(JobState::Finished.as_str())
    .bind(crate::RECENT_RUNS as i64)
    .fetch_one(&mut *conn)
    .await?;
    let raised: Option<i64> = sqlx::query_scalar(
        "SELECT MAX(next_gpu_mib) FROM jobs WHERE family = ? AND component = ? AND state = ?",
    )
    .bind(family)
    .bind(component)
    .bind(JobState::SharedOom.as_str())
    .fetch_one(&mut *conn)
    .await?;
    let latest: Option<(i64, String)> = sqlx::query_as(
        "SELECT run_no, state FROM jobs WHERE family = ? AND component = ? AND state IN (?, ?) ORDER BY run_no DESC LIMIT 1",
    )
    .bind(family)
    .bind(component)
    .bind(JobState::Finished.as_str())
    .bind(JobState::SharedOom.as_str())
    .fetch_optional(&mut *conn)
    .await?;
    Ok(GpuHistory {
        learned_mib: learned.map(|m| m.max(0) as u64),
        raised_mib: raised.map(|m| m.max(0) as u64),
        after_shared_oom: latest
            .filter(|(_, state)| state == JobState::SharedOom.as_str())
            .map(|(run_no, _)| u32::try_from(run_no).unwrap_or_default()),
    })
}

/// The median of some durations (the mean of the middle two of an even
/// count), `None` for none; negative ones count as zero.
fn median_ms(ms: Vec<i64>) -> Option<u64> {
    let mut ms: Vec<u64> = ms.into_iter().map(|m| m.max(0) as u64).collect();
    ms.sort_unstable();
    match ms.len() {
        0 => None,
        n if n % 2 == 1 => Some(ms[n / 2]),
        n => Some(ms[n / 2 - 1] / 2 + ms[n / 2] / 2),
    }
}

/// A question a step raises, and the component's state while it waits.
struct Asked<'a> {
    escape: &'a EscapeRow,
    floor: u32,
    verdict: RecordedVerdict,
    worker_id: &'a str,
}

/// Raises `q.escape` under the next `E###` id and sets the component
/// `ask_user` (reason `waiting for an answer to E###: QUESTION`); returns
/// the id. The one statement pair behind every step that asks.
async fn ask(
    conn: &mut SqliteConnection,
    family: &str,
    component: &str,
    q: Asked<'_>,
    now: i64,
) -> Result<String, StoreError> {
    let id = insert_escape(&mut *conn, q.escape, q.floor).await?;
    let reason = format!("waiting for an answer to {id}: {}", q.escape.question);
    let next = ComponentNext {
        status: ComponentStatus::AskUser,
        verdict: q.verdict,
        reason: &reason,
        worker_id: q.worker_id,
    };
    set_component(conn, family, component, next, now).await?;
    Ok(id)
}

/// The component of escape hatch `id` of `family`, refused unless the
/// hatch is in state `want` (unknown: [`StoreError::UnknownEscape`];
/// another state: [`StoreError::EscapeNotOpen`]).
pub(crate) async fn escape_in(
    conn: &mut SqliteConnection,
    family: &str,
    id: &str,
    want: EscapeStatus,
) -> Result<String, StoreError> {
    let row: Option<(String, String)> =
        sqlx::query_as("SELECT component, status FROM escape_hatches WHERE family = ? AND id = ?")
            .bind(family)
            .bind(id)
            .fetch_optional(&mut *conn)
            .await?;
    let Some((component, status)) = row else {
        return Err(StoreError::UnknownEscape {
            family: family.into(),
            id: id.into(),
        });
    };
    let status: EscapeStatus = status.parse().map_err(|source| StoreError::State {
        column: "escape_hatches.status",
        source,
    })?;
    if status != want {
        return Err(StoreError::EscapeNotOpen {
            family: family.into(),
            id: id.into(),
            status,
        });
    }
    Ok(component)
}

/// Inserts `e` as an open escape hatch under the next `E###` id of its
/// port (above `floor`); returns the id.
pub(crate) async fn insert_escape(
    conn: &mut SqliteConnection,
    e: &EscapeRow,
    floor: u32,
) -> Result<String, StoreError> {
    let ids: Vec<String> = sqlx::query_scalar("SELECT id FROM escape_hatches WHERE family = ?")
        .bind(&e.family)
        .fetch_all(&mut *conn)
        .await?;
    let id = escape_id_after(&ids, floor);
    let options = serde_json::to_string(&e.options).expect("strings serialize");
    sqlx::query("INSERT INTO escape_hatches (family, id, component, attempt, phase, decision_type, question, recommended, options, safe_default, status, asked_ms, about) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
        .bind(&e.family)
        .bind(&id)
        .bind(&e.component)
        .bind(e.attempt as i64)
        .bind(&e.phase)
        .bind(&e.decision_type)
        .bind(&e.question)
        .bind(&e.recommended)
        .bind(options)
        .bind(&e.safe_default)
        .bind(EscapeStatus::Open.as_str())
        .bind(now_ms())
        .bind(e.about.as_str())
        .execute(&mut *conn)
        .await?;
    Ok(id)
}
