//! Storage of supervised runs (migration `0004_runs`) and of the
//! hypothesis ledger (migration `0008_hypotheses`).
//!
//! Invariants: a registered graph's (name, version) never changes body; a
//! run changes only by [`Store::update_run`], one conditional update on its
//! revision, so two racing steps cannot both apply; an ended run's row is
//! never set back to running (the update's predicate refuses it); a run has
//! at most one typed-failure receipt. The ledger of a subject changes only
//! in [`Store::record_hypotheses`], one transaction that holds the subject
//! (PostgreSQL: a transaction advisory lock per subject; SQLite: `BEGIN
//! IMMEDIATE`), so two envelopes of one subject are judged one after the
//! other, each against the ledger the other left; moves are append-only.

use crate::runs::freshness::{EnvelopeFacts, completeness_from_wire};
use crate::runs::hypotheses::{Effect, Hypothesis, HypothesisState, Judgement, MoveRule};

use super::{Pools, Store, StoreError};

/// One stored move of the hypothesis ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerMove {
    /// The subject.
    pub subject_key: String,
    /// The hypothesis key.
    pub hypothesis: String,
    /// Its position among the hypothesis's moves (from 1).
    pub seq: i64,
    /// The envelope that moved it.
    pub digest: String,
    /// The run that recorded the envelope.
    pub run_id: String,
    /// Before (`None`: opened).
    pub from: Option<HypothesisState>,
    /// After.
    pub to: HypothesisState,
    /// Why.
    pub rule: MoveRule,
    /// When the store recorded it.
    pub at_ns: i64,
}

fn bad_value(what: &str, v: &str) -> StoreError {
    StoreError::Db(sqlx::Error::Decode(
        format!("stored {what} {v:?} is not one the store writes").into(),
    ))
}

fn state_of(s: &str) -> Result<HypothesisState, StoreError> {
    HypothesisState::parse(s).ok_or_else(|| bad_value("hypothesis state", s))
}

type MoveTuple = (
    String,
    String,
    i64,
    String,
    String,
    Option<String>,
    String,
    String,
    i64,
);

fn move_of(r: MoveTuple) -> Result<LedgerMove, StoreError> {
    Ok(LedgerMove {
        subject_key: r.0,
        hypothesis: r.1,
        seq: r.2,
        digest: r.3,
        run_id: r.4,
        from: r.5.as_deref().map(state_of).transpose()?,
        to: state_of(&r.6)?,
        rule: MoveRule::parse(&r.7).ok_or_else(|| bad_value("move rule", &r.7))?,
        at_ns: r.8,
    })
}

type HypothesisTuple = (String, String, String, String, String, String, String, i64);

fn hypothesis_of(r: HypothesisTuple) -> Result<Hypothesis, StoreError> {
    let surfaces: Vec<String> =
        serde_json::from_str(&r.4).map_err(|_| bad_value("hypothesis surfaces", &r.4))?;
    let effects: Vec<Effect> =
        serde_json::from_str(&r.5).map_err(|_| bad_value("hypothesis effects", &r.5))?;
    Ok(Hypothesis {
        key: r.0,
        code: r.1,
        statement: r.2,
        falsifier: r.3,
        surfaces,
        effects,
        state: state_of(&r.6)?,
        opened_wall_ns: r.7,
    })
}

const MOVE_COLUMNS: &str =
    "subject_key, hyp_key, seq, digest, run_id, from_state, to_state, rule, at_ns";

/// A stored run.
#[derive(Debug, Clone)]
pub struct RunRow {
    /// Id.
    pub id: String,
    /// Graph name.
    pub graph_name: String,
    /// Graph version.
    pub graph_version: String,
    /// Graph content hash.
    pub content_hash: String,
    /// `running` / `ended`.
    pub status: String,
    /// The supervisor state (`runs::supervisor::RunState` as JSON).
    pub state_json: String,
    /// Bumped by every update.
    pub revision: i64,
    /// Started.
    pub created_ns: i64,
    /// Last step.
    pub updated_ns: i64,
    /// Ended.
    pub ended_ns: Option<i64>,
}

/// A typed-failure receipt.
#[derive(Debug, Clone)]
pub struct FailureReceiptRow {
    /// The run.
    pub run_id: String,
    /// Where it failed.
    pub failed_step_id: Option<String>,
    /// The failure class, if one was derivable.
    pub failure_class: Option<String>,
    /// The run's subject key.
    pub subject_key: Option<String>,
    /// The last pre-mutation envelope.
    pub pre_digest: Option<String>,
    /// The last post-mutation envelope.
    pub post_digest: Option<String>,
    /// When.
    pub created_ns: i64,
}

/// Whether a graph registration stored, matched, or conflicted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GraphPut {
    /// New.
    Created,
    /// The same body was already registered.
    Same,
    /// Another body is registered under this name and version.
    Conflict,
}

impl Store {
    /// Register a graph.
    pub async fn put_run_graph(
        &self,
        name: &str,
        version: &str,
        content_hash: &str,
        graph_json: &str,
        key_id: &str,
        now_ns: i64,
    ) -> Result<GraphPut, StoreError> {
        let r = with_pool!(self, write, |pool, pg| {
            sqlx::query(
                "INSERT INTO run_graphs (name, version, content_hash, graph_json, key_id, created_ns) VALUES ($1, $2, $3, $4, $5, $6)",
            )
            .bind(name)
            .bind(version)
            .bind(content_hash)
            .bind(graph_json)
            .bind(key_id)
            .bind(now_ns)
            .execute(pool)
            .await
            .map(|_| ())
            .map_err(StoreError::from)
        });
        match r {
            Ok(()) => Ok(GraphPut::Created),
            Err(e) if e.is_unique_violation() => match self.run_graph(name, version).await? {
                Some((hash, _)) if hash == content_hash => Ok(GraphPut::Same),
                _ => Ok(GraphPut::Conflict),
            },
            Err(e) => Err(e),
        }
    }

    /// A registered graph: (content hash, JSON).
    pub async fn run_graph(
        &self,
        name: &str,
        version: &str,
    ) -> Result<Option<(String, String)>, StoreError> {
        with_pool!(self, read, |pool, pg| {
            Ok(sqlx::query_as(
                "SELECT content_hash, graph_json FROM run_graphs WHERE name = $1 AND version = $2",
            )
            .bind(name)
            .bind(version)
            .fetch_optional(pool)
            .await?)
        })
    }

    /// Store a new run.
    pub async fn create_run(&self, row: &RunRow, key_id: &str) -> Result<(), StoreError> {
        with_pool!(self, write, |pool, pg| {
            sqlx::query(
                "INSERT INTO runs (id, graph_name, graph_version, content_hash, status, state_json, revision, key_id, created_ns, updated_ns, ended_ns) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
            )
            .bind(&row.id)
            .bind(&row.graph_name)
            .bind(&row.graph_version)
            .bind(&row.content_hash)
            .bind(&row.status)
            .bind(&row.state_json)
            .bind(row.revision)
            .bind(key_id)
            .bind(row.created_ns)
            .bind(row.updated_ns)
            .bind(row.ended_ns)
            .execute(pool)
            .await?;
            Ok(())
        })
    }

    /// A run.
    pub async fn run(&self, id: &str) -> Result<Option<RunRow>, StoreError> {
        type Row = (
            String,
            String,
            String,
            String,
            String,
            String,
            i64,
            i64,
            i64,
            Option<i64>,
        );
        let r: Option<Row> = with_pool!(self, read, |pool, pg| {
            sqlx::query_as(
                "SELECT id, graph_name, graph_version, content_hash, status, state_json, revision, created_ns, updated_ns, ended_ns FROM runs WHERE id = $1",
            )
            .bind(id)
            .fetch_optional(pool)
            .await?
        });
        Ok(r.map(|r| RunRow {
            id: r.0,
            graph_name: r.1,
            graph_version: r.2,
            content_hash: r.3,
            status: r.4,
            state_json: r.5,
            revision: r.6,
            created_ns: r.7,
            updated_ns: r.8,
            ended_ns: r.9,
        }))
    }

    /// Apply a step: `false` if the run moved on since `revision` was read
    /// (or is ended and the new status would be running). `subject_key`
    /// and `outcome` (the report's four words) are kept beside the state.
    #[allow(
        clippy::too_many_arguments,
        reason = "one conditional UPDATE of one row: its columns are the arguments"
    )]
    pub async fn update_run(
        &self,
        id: &str,
        revision: i64,
        status: &str,
        state_json: &str,
        subject_key: Option<&str>,
        outcome: &str,
        now_ns: i64,
    ) -> Result<bool, StoreError> {
        let ended = (status == "ended").then_some(now_ns);
        with_pool!(self, write, |pool, pg| {
            let r = sqlx::query(
                "UPDATE runs SET status = $1, state_json = $2, revision = revision + 1, updated_ns = $3, ended_ns = COALESCE(ended_ns, $4),
                        subject_key = $7, outcome = $8
                 WHERE id = $5 AND revision = $6 AND NOT (status = 'ended' AND $1 <> 'ended')",
            )
            .bind(status)
            .bind(state_json)
            .bind(now_ns)
            .bind(ended)
            .bind(id)
            .bind(revision)
            .bind(subject_key)
            .bind(outcome)
            .execute(pool)
            .await?;
            Ok(r.rows_affected() == 1)
        })
    }

    /// Runs other than `except_id` of graph `graph_name` on `subject_key`
    /// that ended `success` or `failed` at or after `since_ns`.
    pub async fn settled_runs_on(
        &self,
        subject_key: &str,
        graph_name: &str,
        since_ns: i64,
        except_id: &str,
    ) -> Result<i64, StoreError> {
        with_pool!(self, read, |pool, pg| {
            Ok(sqlx::query_scalar(
                "SELECT COUNT(*) FROM runs WHERE subject_key = $1 AND graph_name = $2 AND ended_ns >= $3
                   AND id <> $4 AND outcome IN ('success', 'failed')",
            )
            .bind(subject_key)
            .bind(graph_name)
            .bind(since_ns)
            .bind(except_id)
            .fetch_one(pool)
            .await?)
        })
    }

    /// Record a run's typed-failure receipt (once; a second is ignored).
    pub async fn put_failure_receipt(&self, r: &FailureReceiptRow) -> Result<(), StoreError> {
        with_pool!(self, write, |pool, pg| {
            sqlx::query(
                "INSERT INTO run_failure_receipts (run_id, failed_step_id, failure_class, subject_key, pre_digest, post_digest, created_ns) VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (run_id) DO NOTHING",
            )
            .bind(&r.run_id)
            .bind(&r.failed_step_id)
            .bind(&r.failure_class)
            .bind(&r.subject_key)
            .bind(&r.pre_digest)
            .bind(&r.post_digest)
            .bind(r.created_ns)
            .execute(pool)
            .await?;
            Ok(())
        })
    }

    /// A run's typed-failure receipt.
    pub async fn failure_receipt(
        &self,
        run_id: &str,
    ) -> Result<Option<FailureReceiptRow>, StoreError> {
        type Row = (
            String,
            Option<String>,
            Option<String>,
            Option<String>,
            Option<String>,
            Option<String>,
            i64,
        );
        let r: Option<Row> = with_pool!(self, read, |pool, pg| {
            sqlx::query_as(
                "SELECT run_id, failed_step_id, failure_class, subject_key, pre_digest, post_digest, created_ns FROM run_failure_receipts WHERE run_id = $1",
            )
            .bind(run_id)
            .fetch_optional(pool)
            .await?
        });
        Ok(r.map(|r| FailureReceiptRow {
            run_id: r.0,
            failed_step_id: r.1,
            failure_class: r.2,
            subject_key: r.3,
            pre_digest: r.4,
            post_digest: r.5,
            created_ns: r.6,
        }))
    }

    /// What the pre-mutation rule needs of a stored envelope.
    pub async fn envelope_facts(&self, digest: &str) -> Result<Option<EnvelopeFacts>, StoreError> {
        let row: Option<(String, String, i64, String)> = with_pool!(self, read, |pool, pg| {
            sqlx::query_as(
                "SELECT subject_key, kind, wall_ns, completeness FROM envelopes WHERE digest = $1",
            )
            .bind(digest)
            .fetch_optional(pool)
            .await?
        });
        row.map(|(subject_key, kind, wall_ns, c)| {
            Ok(EnvelopeFacts {
                digest: digest.to_string(),
                subject_key,
                kind,
                wall_ns,
                completeness: completeness_from_wire(&c).ok_or_else(|| StoreError::Corrupt {
                    digest: digest.to_string(),
                    reason: format!("completeness {c:?}"),
                })?,
            })
        })
        .transpose()
    }

    /// Whether the store holds an envelope of `subject_key`.
    pub async fn subject_known(&self, subject_key: &str) -> Result<bool, StoreError> {
        with_pool!(self, read, |pool, pg| {
            let n: Option<i32> =
                sqlx::query_scalar("SELECT 1 FROM subjects WHERE subject_key = $1")
                    .bind(subject_key)
                    .fetch_optional(pool)
                    .await?;
            Ok(n.is_some())
        })
    }

    /// The ledger of a subject, by key.
    pub async fn hypotheses_of(&self, subject_key: &str) -> Result<Vec<Hypothesis>, StoreError> {
        let rows: Vec<HypothesisTuple> = with_pool!(self, read, |pool, pg| {
            sqlx::query_as(
                "SELECT hyp_key, code, statement, falsifier, surfaces_json, effects_json, state, opened_wall_ns
                 FROM hypotheses WHERE subject_key = $1 ORDER BY hyp_key",
            )
            .bind(subject_key)
            .fetch_all(pool)
            .await?
        });
        rows.into_iter().map(hypothesis_of).collect()
    }

    /// Moves of one subject's ledger, or those of one run's envelopes, in
    /// the order they were made.
    pub async fn hypothesis_moves(
        &self,
        subject_key: Option<&str>,
        run_id: Option<&str>,
    ) -> Result<Vec<LedgerMove>, StoreError> {
        let rows: Vec<MoveTuple> = with_pool!(self, read, |pool, pg| {
            sqlx::query_as(&format!(
                "SELECT {MOVE_COLUMNS} FROM hypothesis_moves
                 WHERE ($1 IS NULL OR subject_key = $1) AND ($2 IS NULL OR run_id = $2)
                 ORDER BY at_ns, subject_key, hyp_key, seq"
            ))
            .bind(subject_key)
            .bind(run_id)
            .fetch_all(pool)
            .await?
        });
        rows.into_iter().map(move_of).collect()
    }

    /// Judge envelope `digest`, recorded by run `run_id`, against the ledger
    /// of `subject_key` ([`crate::runs::hypotheses::judge`] as `judge`) and
    /// store the result, in one transaction holding the subject. Returns
    /// every move this envelope made for this run — also those of an earlier
    /// attempt whose run update then lost its race, so a retry counts them.
    pub async fn record_hypotheses<F>(
        &self,
        subject_key: &str,
        digest: &str,
        run_id: &str,
        now_ns: i64,
        judge: F,
    ) -> Result<Vec<LedgerMove>, StoreError>
    where
        F: FnOnce(&[Hypothesis]) -> Judgement,
    {
        with_pool!(self, write, |pool, pg| {
            let mut tx = begin_write!(pool, pg);
            if pg {
                sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 7470530029))")
                    .bind(subject_key)
                    .execute(&mut *tx)
                    .await?;
            }
            let rows: Vec<HypothesisTuple> = sqlx::query_as(
                "SELECT hyp_key, code, statement, falsifier, surfaces_json, effects_json, state, opened_wall_ns
                 FROM hypotheses WHERE subject_key = $1 ORDER BY hyp_key",
            )
            .bind(subject_key)
            .fetch_all(&mut *tx)
            .await?;
            let ledger = rows
                .into_iter()
                .map(hypothesis_of)
                .collect::<Result<Vec<_>, _>>()?;
            let j = judge(&ledger);
            for h in &j.rows {
                sqlx::query(
                    "INSERT INTO hypotheses (subject_key, hyp_key, code, statement, falsifier, surfaces_json, effects_json, state, opened_wall_ns, updated_ns)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
                     ON CONFLICT (subject_key, hyp_key) DO UPDATE SET statement = excluded.statement,
                       falsifier = excluded.falsifier, effects_json = excluded.effects_json, state = excluded.state,
                       opened_wall_ns = excluded.opened_wall_ns, updated_ns = excluded.updated_ns",
                )
                .bind(subject_key)
                .bind(&h.key)
                .bind(&h.code)
                .bind(&h.statement)
                .bind(&h.falsifier)
                .bind(serde_json::to_string(&h.surfaces).unwrap_or_default())
                .bind(serde_json::to_string(&h.effects).unwrap_or_default())
                .bind(h.state.as_str())
                .bind(h.opened_wall_ns)
                .bind(now_ns)
                .execute(&mut *tx)
                .await?;
            }
            for m in &j.moves {
                sqlx::query(&format!(
                    "INSERT INTO hypothesis_moves ({MOVE_COLUMNS})
                     SELECT $1, $2, COALESCE(MAX(seq), 0) + 1, $3, $4, $5, $6, $7, $8
                     FROM hypothesis_moves WHERE subject_key = $1 AND hyp_key = $2"
                ))
                .bind(subject_key)
                .bind(&m.key)
                .bind(digest)
                .bind(run_id)
                .bind(m.from.map(HypothesisState::as_str))
                .bind(m.to.as_str())
                .bind(m.rule.as_str())
                .bind(now_ns)
                .execute(&mut *tx)
                .await?;
            }
            let rows: Vec<MoveTuple> = sqlx::query_as(&format!(
                "SELECT {MOVE_COLUMNS} FROM hypothesis_moves
                 WHERE subject_key = $1 AND digest = $2 AND run_id = $3 ORDER BY hyp_key, seq"
            ))
            .bind(subject_key)
            .bind(digest)
            .bind(run_id)
            .fetch_all(&mut *tx)
            .await?;
            tx.commit().await?;
            rows.into_iter().map(move_of).collect()
        })
    }

    /// An envelope's (subject key, kind, wall ns).
    pub async fn envelope_subject(
        &self,
        digest: &str,
    ) -> Result<Option<(String, String, i64)>, StoreError> {
        with_pool!(self, read, |pool, pg| {
            Ok(
                sqlx::query_as(
                    "SELECT subject_key, kind, wall_ns FROM envelopes WHERE digest = $1",
                )
                .bind(digest)
                .fetch_optional(pool)
                .await?,
            )
        })
    }
}
