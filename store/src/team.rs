//! The store's side of a team's orchestrator (issue #30): where a port
//! comes from (its repository's identity and the checkout's path are in
//! `ports`), whose it is, and the log of who submitted, answered,
//! cancelled and reset it. A child module of `store`, like `traces`.
//!
//! Invariants:
//! - No port's repository, identity or owner is changed by a write of this
//!   module after its creation, except [`Store::adopt_checkout`], which only
//!   an embedded store (it lives inside its checkout) calls.
//! - No row of `port_actions` is deleted: a reset removes the port's state
//!   and leaves its history.

use sqlx::Row;

use super::{Store, StoreError, now_ms};
use crate::model::PortRow;

/// What a person did to a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Submit,
    /// A submit with `--rerun`.
    Rerun,
    Answer,
    Cancel,
    Reset,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Submit => "submit",
            Action::Rerun => "rerun",
            Action::Answer => "answer",
            Action::Cancel => "cancel",
            Action::Reset => "reset",
        }
    }
}

/// Where a port comes from and whose it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortOrigin {
    /// `remote:…`, `root:…@path` or `path:…`; empty for a port from before
    /// identities were recorded.
    pub repo_identity: String,
    /// The credential that created it; empty when none was checked.
    pub owner: String,
    /// Who submitted it last.
    pub submitted_by: String,
}

/// One entry of a port's action log.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ActionRow {
    pub family: String,
    pub action: String,
    pub actor: String,
    pub detail: String,
    pub at_ms: i64,
}

impl Store {
    /// Creates a port (as [`Store::create_port`]) with its origin, and logs
    /// the submit (`action`), in one transaction. False when the family
    /// exists.
    pub async fn create_port_from(
        &self,
        port: &PortRow,
        components: &[String],
        origin: &PortOrigin,
        action: Action,
    ) -> Result<bool, StoreError> {
        self.insert_port(port, components, Some((origin, action)))
            .await
    }

    /// Where the port comes from and whose it is; `None` when there is no
    /// such port.
    pub async fn port_origin(&self, family: &str) -> Result<Option<PortOrigin>, StoreError> {
        let row =
            sqlx::query("SELECT repo_identity, owner, submitted_by FROM ports WHERE family = ?")
                .bind(family)
                .fetch_optional(&self.pool)
                .await?;
        Ok(row.map(|r| PortOrigin {
            repo_identity: r.get("repo_identity"),
            owner: r.get("owner"),
            submitted_by: r.get("submitted_by"),
        }))
    }

    /// Records the identity of a port's repository, for a port from before
    /// identities were recorded, resubmitted from its own checkout. Never
    /// replaces one already recorded.
    pub async fn record_repo_identity(
        &self,
        family: &str,
        identity: &str,
    ) -> Result<(), StoreError> {
        sqlx::query("UPDATE ports SET repo_identity = ? WHERE family = ? AND repo_identity = ''")
            .bind(identity)
            .bind(family)
            .execute(&self.writer)
            .await?;
        Ok(())
    }

    /// An embedded store follows its checkout when it moves: the state
    /// lives inside it, so a new path is the same checkout moved, never
    /// another one. No fleet orchestrator calls this.
    pub async fn adopt_checkout(
        &self,
        family: &str,
        repo: &str,
        identity: &str,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE ports SET repo = ?, repo_identity = ?, updated_ms = ? WHERE family = ?",
        )
        .bind(repo)
        .bind(identity)
        .bind(now_ms())
        .bind(family)
        .execute(&self.writer)
        .await?;
        Ok(())
    }

    /// Logs `action` by `actor` on `family`; a submit also becomes the
    /// port's `submitted_by`.
    pub async fn record_action(
        &self,
        family: &str,
        action: Action,
        actor: &str,
        detail: &str,
    ) -> Result<(), StoreError> {
        let mut tx = self.write_tx().await?;
        if matches!(action, Action::Submit | Action::Rerun) {
            sqlx::query("UPDATE ports SET submitted_by = ? WHERE family = ?")
                .bind(actor)
                .bind(family)
                .execute(&mut *tx)
                .await?;
        }
        insert_action(&mut tx, family, action, actor, detail).await?;
        tx.commit().await?;
        Ok(())
    }

    /// The port's action log, oldest first (also what came before a reset).
    pub async fn actions(&self, family: &str) -> Result<Vec<ActionRow>, StoreError> {
        let rows = sqlx::query(
            "SELECT family, action, actor, detail, at_ms FROM port_actions WHERE family = ? ORDER BY seq",
        )
        .bind(family)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .iter()
            .map(|r| ActionRow {
                family: r.get("family"),
                action: r.get("action"),
                actor: r.get("actor"),
                detail: r.get("detail"),
                at_ms: r.get("at_ms"),
            })
            .collect())
    }
}

pub(crate) async fn set_origin(
    tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>,
    family: &str,
    origin: &PortOrigin,
) -> Result<(), StoreError> {
    sqlx::query("UPDATE ports SET repo_identity = ?, owner = ?, submitted_by = ? WHERE family = ?")
        .bind(&origin.repo_identity)
        .bind(&origin.owner)
        .bind(&origin.owner)
        .bind(family)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

pub(crate) async fn insert_action(
    tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>,
    family: &str,
    action: Action,
    actor: &str,
    detail: &str,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO port_actions (family, action, actor, detail, at_ms) VALUES (?, ?, ?, ?, ?)",
    )
    .bind(family)
    .bind(action.as_str())
    .bind(actor)
    .bind(detail)
    .bind(now_ms())
    .execute(&mut **tx)
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::EscapeRow;

    fn row(family: &str, repo: &str) -> PortRow {
        PortRow {
            family: family.into(),
            repo: repo.into(),
            ..PortRow::default()
        }
    }

    #[tokio::test]
    async fn a_port_keeps_its_origin_and_its_history_outlives_a_reset() {
        let (_dir, store) = crate::tests::temp_store().await;
        let origin = PortOrigin {
            repo_identity: "remote:example.org/team/repo".into(),
            owner: "alice".into(),
            submitted_by: String::new(),
        };
        assert!(
            store
                .create_port_from(&row("p", "/a"), &["c".into()], &origin, Action::Submit)
                .await
                .unwrap()
        );
        // A second create is no create, and changes nothing.
        let other = PortOrigin {
            repo_identity: "path:/b".into(),
            owner: "bob".into(),
            submitted_by: String::new(),
        };
        assert!(
            !store
                .create_port_from(&row("p", "/b"), &[], &other, Action::Submit)
                .await
                .unwrap()
        );
        store.record_repo_identity("p", "path:/b").await.unwrap();
        let got = store.port_origin("p").await.unwrap().unwrap();
        assert_eq!(
            (
                got.repo_identity.as_str(),
                got.owner.as_str(),
                got.submitted_by.as_str()
            ),
            ("remote:example.org/team/repo", "alice", "alice")
        );
        assert_eq!(store.port("p").await.unwrap().unwrap().repo, "/a");

        store
            .record_action("p", Action::Rerun, "root", "abc")
            .await
            .unwrap();
        assert_eq!(
            store.port_origin("p").await.unwrap().unwrap().submitted_by,
            "root"
        );
        store
            .raise_escape(
                &EscapeRow {
                    family: "p".into(),
                    component: "c".into(),
                    options: vec!["yes".into()],
                    ..EscapeRow::default()
                },
                0,
            )
            .await
            .unwrap();
        let e = store
            .answer_escape_by("p", "E001", "option 1: yes", "alice")
            .await
            .unwrap();
        assert_eq!(e.answered_by, "alice");
        store
            .record_action("p", Action::Reset, "alice", "")
            .await
            .unwrap();
        assert!(store.delete_port("p").await.unwrap());
        let log: Vec<(String, String, String)> = store
            .actions("p")
            .await
            .unwrap()
            .into_iter()
            .map(|a| (a.action, a.actor, a.detail))
            .collect();
        assert_eq!(
            log,
            [
                ("submit".into(), "alice".into(), String::new()),
                ("rerun".into(), "root".into(), "abc".into()),
                ("answer".into(), "alice".into(), "E001".into()),
                ("reset".into(), "alice".into(), String::new()),
            ]
        );
        assert_eq!(store.port_origin("p").await.unwrap(), None);
    }
}
