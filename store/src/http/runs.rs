//! HTTP routes of supervised investigation runs (seed 003 on seed 001's
//! agent loop): graphs, runs, steps, the run report and its schema.
//!
//! Invariants:
//! - Every route authenticates before it reads a body.
//! - What an agent attempted (tool, command, stdout, a step it was not
//!   allowed to take) is judged and dropped: it reaches neither the
//!   database, nor a log line, nor an error body — a malformed step gets
//!   the field's path and a fixed message, never the value.
//! - A run changes by one conditional update on its revision; a lost race
//!   is `409 run_conflict` and nothing is applied.
//! - Time comes from `AppState::clock` only, and only here: the core takes
//!   `now` as an argument.
//! - An advance citing an expired handoff is refused (`410
//!   handoff_expired`) and the run does not move (only its count of stale
//!   handoffs grows).
//! - A MUTATE step is judged by the store's one pre-mutation rule
//!   (`pstack_store_core::runs::freshness`); a refusal answers `verdict: block` with the
//!   typed error as `refusal` (`{code, message, field, completeness?}`).
//! - Every envelope a run records is judged against its subject's
//!   hypothesis ledger (`pstack_store_core::runs::hypotheses`) once: the ledger is
//!   written before the run, so a step that loses its revision race leaves
//!   the ledger moved and the retry finds the same moves, counting them once.
//! - Every report this edge returns validated against
//!   `runbook-run-report/v1`; one that cannot be classified is `422`.

#![allow(
    clippy::result_large_err,
    reason = "the error is the HTTP response itself, built once on the way out"
)]

use std::collections::BTreeMap;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use schemars::JsonSchema;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::http::error::{Reply, err, store_err, unprocessable};
use crate::http::extract::{auth, bad_query, only_params};
use crate::http::{ApiError, AppState, Scope};
use pstack_store_core::analysis::ledger::rfc3339;
use pstack_store_core::db::analysis::new_id;
use pstack_store_core::db::runs::{FailureReceiptRow, GraphPut, LedgerMove, RunRow};
use pstack_store_core::runs::acceptance::{self, StaleHandoff};
use pstack_store_core::runs::deviation::Escalation;
use pstack_store_core::runs::freshness::EnvelopeFacts;
use pstack_store_core::runs::graph::{StepGraph, investigation_loop};
use pstack_store_core::runs::hypotheses::{self, HypothesisState};
use pstack_store_core::runs::report::{
    self, EnvClass, ExecutorKind, FailureClass, Outcome, Profile, ReportContext, ReportError,
    ReportHypothesis, RuntimeProfile,
};
use pstack_store_core::runs::supervisor::{
    self, Capture, Decided, EventKind, Observation, RunState, RunStatus, StartOptions,
};

/// The routes (merged into [`crate::http::api_router`]).
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/internal/graphs", post(post_graph))
        .route("/internal/runs", post(post_run))
        .route("/internal/runs/{id}", get(get_run))
        .route("/internal/runs/{id}/steps", post(post_step))
        .route("/internal/runs/{id}/report", get(get_report))
        .route(
            "/internal/schemas/runbook-run-report-v1.json",
            get(get_report_schema),
        )
        .route(
            "/internal/subjects/{subject}/hypotheses",
            get(get_hypotheses),
        )
}

/// Read a JSON body (≤ 256 KiB) into `T`; on failure name the field, never
/// echo the value.
async fn quiet_body<T: DeserializeOwned>(body: Body) -> Result<T, Response> {
    let bytes = axum::body::to_bytes(body, 256 << 10).await.map_err(|_| {
        err(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            "JSON bodies here are at most 256 KiB",
            None,
        )
    })?;
    let de = &mut serde_json::Deserializer::from_slice(&bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let mut path = e.path().to_string();
        // An unknown field's name is the caller's text: name its parent
        // object instead, never the key.
        let unknown = e.inner().to_string().starts_with("unknown field");
        if unknown {
            path = path
                .rsplit_once('.')
                .map(|(p, _)| p.to_string())
                .unwrap_or_default();
        }
        let field = (path != "." && !path.is_empty()).then_some(path);
        let what = match e.inner().classify() {
            _ if unknown => "an unknown field (see openapi.json for this body's fields)",
            serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
                "the body is not JSON"
            }
            _ => "missing, unknown or of the wrong type (see openapi.json)",
        };
        err(
            StatusCode::BAD_REQUEST,
            "invalid_body",
            what,
            field.as_deref(),
        )
    })
}

fn content_hash(graph: &StepGraph) -> String {
    let bytes = serde_json::to_vec(graph).unwrap_or_default();
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

fn is_default(name: &str, version: &str) -> bool {
    let d = investigation_loop();
    name == d.name && version == d.version
}

async fn load_graph(
    state: &AppState,
    name: &str,
    version: &str,
    field: &str,
) -> Result<(StepGraph, String), Response> {
    if is_default(name, version) {
        let g = investigation_loop();
        let h = content_hash(&g);
        return Ok((g, h));
    }
    let Some((hash, json)) = state
        .store
        .run_graph(name, version)
        .await
        .map_err(store_err)?
    else {
        return Err(err(
            StatusCode::NOT_FOUND,
            "graph_not_found",
            "no graph registered under this name and version",
            Some(field),
        ));
    };
    let g: StepGraph = serde_json::from_str(&json).map_err(|e| {
        err(
            StatusCode::INTERNAL_SERVER_ERROR,
            "graph_corrupt",
            e.to_string(),
            None,
        )
    })?;
    Ok((g, hash))
}

// ---- graphs ----

/// `POST /internal/graphs` body.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GraphRequest {
    /// The graph.
    pub graph: StepGraph,
}

async fn post_graph(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Reply {
    let key_id = auth(&state, &headers, Scope::Analysis).await?;
    let req: GraphRequest = quiet_body(body).await?;
    let g = req.graph;
    g.validate()
        .map_err(|e| unprocessable("invalid_graph", e.message, &format!("graph.{}", e.field)))?;
    if is_default(&g.name, &g.version) {
        return Err(err(
            StatusCode::CONFLICT,
            "graph_exists",
            "the built-in investigation loop cannot be replaced",
            Some("graph.name"),
        ));
    }
    let hash = content_hash(&g);
    let json = serde_json::to_string(&g).unwrap_or_default();
    let now = state.clock.now_ns();
    let put = state
        .store
        .put_run_graph(&g.name, &g.version, &hash, &json, &key_id, now)
        .await
        .map_err(store_err)?;
    let body = json!({"name": g.name, "version": g.version, "contentHash": hash});
    match put {
        GraphPut::Created => Ok((StatusCode::CREATED, Json(body)).into_response()),
        GraphPut::Same => Ok((StatusCode::OK, Json(body)).into_response()),
        GraphPut::Conflict => Err(err(
            StatusCode::CONFLICT,
            "graph_exists",
            "another graph is registered under this name and version",
            Some("graph.version"),
        )),
    }
}

// ---- runs ----

/// Which graph a run follows.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GraphRef {
    /// publisher/slug.
    pub name: String,
    /// Version.
    pub version: String,
}

/// `POST /internal/runs` body.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunRequest {
    /// Who runs it.
    pub agent_identity: String,
    /// The graph (default: `pstack/investigation-loop` version 1).
    #[serde(default)]
    pub graph: Option<GraphRef>,
    /// The operator's escalation policy (default: control flow aborts,
    /// tool deviations block and continue, `maxTotal` 5).
    #[serde(default)]
    pub escalation: Option<Escalation>,
    /// Require a step's check before leaving it (default true).
    #[serde(default)]
    pub evaluate_postconditions: Option<bool>,
}

fn run_json(
    row: &RunRow,
    st: &RunState,
    graph: &StepGraph,
    receipt: Option<&FailureReceiptRow>,
) -> Value {
    let next: Vec<&String> = graph
        .steps
        .get(&st.current)
        .map(|s| s.next.iter().collect())
        .unwrap_or_default();
    json!({
        "id": row.id,
        "graph": {"name": row.graph_name, "version": row.graph_version, "contentHash": row.content_hash},
        "status": st.status,
        "current": st.current,
        "outcome": st.outcome,
        "reportOutcome": report::outcome_of(st),
        "legalNext": if st.status == RunStatus::Running { json!(next) } else { json!([]) },
        "deviations": st.deviations,
        "events": st.events,
        "subject": st.subject,
        "hypotheses": st.subject.as_ref().map(|s| format!("/internal/subjects/{s}/hypotheses")),
        "captures": st.captures.iter().map(|c| json!({"digest": c.digest, "uri": format!("/v1/envelopes/{}", c.digest), "epoch": c.epoch, "completeness": c.completeness.map(|c| c.as_str()), "expiresAt": rfc3339(c.expires_ns)})).collect::<Vec<_>>(),
        "account": supervisor::local_account(graph, st),
        "acceptance": acceptance::summarize(st, row.created_ns, row.updated_ns),
        "failureReceipt": receipt.map(|r| json!({
            "failedStepId": r.failed_step_id,
            "failureClass": r.failure_class,
            "subject": r.subject_key,
            "preMutationEnvelope": r.pre_digest,
            "postMutationEnvelope": r.post_digest,
            "createdAt": rfc3339(r.created_ns),
        })),
        "createdAt": rfc3339(row.created_ns),
        "updatedAt": rfc3339(row.updated_ns),
        "endedAt": row.ended_ns.map(rfc3339),
    })
}

fn status_str(s: RunStatus) -> &'static str {
    match s {
        RunStatus::Running => "running",
        RunStatus::Ended => "ended",
    }
}

async fn post_run(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Reply {
    let key_id = auth(&state, &headers, Scope::Analysis).await?;
    let req: RunRequest = quiet_body(body).await?;
    let (name, version) = match &req.graph {
        Some(g) => (g.name.clone(), g.version.clone()),
        None => {
            let d = investigation_loop();
            (d.name, d.version)
        }
    };
    let (graph, hash) = load_graph(&state, &name, &version, "graph").await?;
    let st = supervisor::start_run(
        &graph,
        StartOptions {
            agent_identity: req.agent_identity,
            escalation: req.escalation,
            evaluate_postconditions: req.evaluate_postconditions.unwrap_or(true),
            subject: None,
        },
    )
    .map_err(|refusals| {
        let first = &refusals[0];
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "run_refused",
            first.message.clone(),
        )
        .field(first.field.clone())
        .member("refusals", &refusals)
        .member("reason", first.code)
        .into_response()
    })?;
    let now = state.clock.now_ns();
    let row = RunRow {
        id: new_id("run").map_err(store_err)?,
        graph_name: name,
        graph_version: version,
        content_hash: hash,
        status: status_str(st.status).into(),
        state_json: serde_json::to_string(&st).unwrap_or_default(),
        revision: 0,
        created_ns: now,
        updated_ns: now,
        ended_ns: None,
    };
    state
        .store
        .create_run(&row, &key_id)
        .await
        .map_err(store_err)?;
    Ok((
        StatusCode::CREATED,
        Json(json!({"run": run_json(&row, &st, &graph, None)})),
    )
        .into_response())
}

async fn load_run(state: &AppState, id: &str) -> Result<(RunRow, RunState, StepGraph), Response> {
    let not_found = || {
        err(
            StatusCode::NOT_FOUND,
            "run_not_found",
            "no such run",
            Some("id"),
        )
    };
    if id.len() > 64 {
        return Err(not_found());
    }
    let row = state
        .store
        .run(id)
        .await
        .map_err(store_err)?
        .ok_or_else(not_found)?;
    let st: RunState = serde_json::from_str(&row.state_json).map_err(|e| {
        err(
            StatusCode::INTERNAL_SERVER_ERROR,
            "run_corrupt",
            e.to_string(),
            None,
        )
    })?;
    let (graph, _) = load_graph(state, &row.graph_name, &row.graph_version, "graph").await?;
    Ok((row, st, graph))
}

async fn get_run(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Reply {
    auth(&state, &headers, Scope::Read).await?;
    let (row, st, graph) = load_run(&state, &id).await?;
    let receipt = state.store.failure_receipt(&id).await.map_err(store_err)?;
    Ok(Json(json!({"run": run_json(&row, &st, &graph, receipt.as_ref())})).into_response())
}

/// The five step kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum StepKind {
    /// The agent proposes to use a tool (`tool`).
    Propose,
    /// The agent proposes a command line (`command`).
    ProposeCommand,
    /// The agent moves to a step (`step`, optional `handoff`).
    Advance,
    /// The agent reports what its step observed (`exitCode`, `stdout`,
    /// `envelope`, each optional).
    Observe,
    /// The agent says it is done.
    Conclude,
}

/// `POST /internal/runs/{id}/steps` body: one step of the run. Flat, so
/// an error names the field; which fields a kind needs is checked after.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StepRequest {
    /// What kind of step.
    pub kind: StepKind,
    /// `propose`: the tool (`cli:…`, `mcp:…`, `http:…`, `pstack:…`).
    #[serde(default)]
    pub tool: Option<String>,
    /// `proposeCommand`: the command line (judged, never stored).
    #[serde(default)]
    pub command: Option<String>,
    /// `advance`: the step id to move to.
    #[serde(default)]
    pub step: Option<String>,
    /// `advance`: the digest of the handoff (envelope) acted on; an
    /// expired one is refused.
    #[serde(default)]
    pub handoff: Option<String>,
    /// `observe`: the step's exit code.
    #[serde(default)]
    pub exit_code: Option<i32>,
    /// `observe`: the step's output (compared with its check, never
    /// stored).
    #[serde(default)]
    pub stdout: Option<String>,
    /// `observe`: the digest of a sealed envelope the step captured.
    #[serde(default)]
    pub envelope: Option<String>,
}

impl StepRequest {
    /// Fields that are not this kind's are refused, the kind's required
    /// field must be present.
    fn check(&self) -> Result<(), Response> {
        let allowed: &[&str] = match self.kind {
            StepKind::Propose => &["tool"],
            StepKind::ProposeCommand => &["command"],
            StepKind::Advance => &["step", "handoff"],
            StepKind::Observe => &["exitCode", "stdout", "envelope"],
            StepKind::Conclude => &[],
        };
        let present = [
            ("tool", self.tool.is_some()),
            ("command", self.command.is_some()),
            ("step", self.step.is_some()),
            ("handoff", self.handoff.is_some()),
            ("exitCode", self.exit_code.is_some()),
            ("stdout", self.stdout.is_some()),
            ("envelope", self.envelope.is_some()),
        ];
        if let Some((f, _)) = present.iter().find(|(f, p)| *p && !allowed.contains(f)) {
            return Err(err(
                StatusCode::BAD_REQUEST,
                "invalid_body",
                "this field does not belong to this kind of step",
                Some(f),
            ));
        }
        let required = match self.kind {
            StepKind::Propose => Some(("tool", self.tool.is_some())),
            StepKind::ProposeCommand => Some(("command", self.command.is_some())),
            StepKind::Advance => Some(("step", self.step.is_some())),
            _ => None,
        };
        if let Some((f, false)) = required {
            return Err(err(
                StatusCode::BAD_REQUEST,
                "invalid_body",
                "required for this kind of step",
                Some(f),
            ));
        }
        Ok(())
    }
}

fn valid_digest(d: &str) -> bool {
    d.strip_prefix("sha256:").is_some_and(|h| {
        h.len() == 64
            && h.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    })
}

/// Look a cited envelope up: a malformed digest is `400`; `None`: the
/// store holds no envelope with it.
async fn lookup_envelope(
    state: &AppState,
    digest: &str,
    field: &str,
) -> Result<Option<EnvelopeFacts>, Response> {
    if !valid_digest(digest) {
        return Err(bad_query(
            field,
            "a digest is sha256: and 64 lowercase hex digits",
        ));
    }
    state.store.envelope_facts(digest).await.map_err(store_err)
}

fn envelope_unknown(field: &str) -> Response {
    unprocessable(
        "envelope_unknown",
        "no stored envelope with this digest",
        field,
    )
}

/// Count a stale handoff on `/metrics` and in the run (which does not
/// otherwise move). Best effort in the run: the refusal stands whether or
/// not the count lands.
async fn note_stale_handoff(
    state: &AppState,
    row: &RunRow,
    mut st: RunState,
    why: StaleHandoff,
    now: i64,
) {
    state.metrics.acceptance.add_stale_handoff(why);
    st.acceptance.stale_handoffs = st.acceptance.stale_handoffs.saturating_add(1);
    if let Err(e) = state
        .store
        .update_run(
            &row.id,
            row.revision,
            &row.status,
            &serde_json::to_string(&st).unwrap_or_default(),
            st.subject.as_deref(),
            report::outcome_of(&st).as_str(),
            now,
        )
        .await
    {
        tracing::warn!(run = %row.id, error = %e, "a stale handoff was not counted in its run");
    }
}

/// Apply one step to a run (shared by HTTP and MCP).
pub async fn apply_step(
    state: &AppState,
    id: &str,
    req: StepRequest,
) -> Result<(Value, Decided), Response> {
    let (row, st, graph) = load_run(state, id).await?;
    let now = state.clock.now_ns();
    let too_long = |field: &str| {
        err(
            StatusCode::BAD_REQUEST,
            "invalid_body",
            "at most 4096 bytes",
            Some(field),
        )
    };
    req.check()?;
    let narration = acceptance::narration_tokens(&[req.command.as_deref(), req.stdout.as_deref()]);
    let bound_before = st.subject.is_some();
    let captures_before = st.captures.len();
    let mut decided = match req.kind {
        StepKind::Propose => {
            let tool = req.tool.unwrap_or_default();
            if tool.len() > 4096 {
                return Err(too_long("tool"));
            }
            supervisor::propose(&graph, st, &tool)
        }
        StepKind::ProposeCommand => {
            let command = req.command.unwrap_or_default();
            if command.len() > 4096 {
                return Err(too_long("command"));
            }
            supervisor::propose_command(&graph, st, &command)
        }
        StepKind::Advance => {
            let step = req.step.unwrap_or_default();
            if step.len() > 128 {
                return Err(too_long("step"));
            }
            if let Some(d) = req.handoff {
                let Some(facts) = lookup_envelope(state, &d, "handoff").await? else {
                    note_stale_handoff(state, &row, st, StaleHandoff::Unbound, now).await;
                    return Err(envelope_unknown("handoff"));
                };
                let expires = state.freshness.expires_ns(&facts.kind, facts.wall_ns);
                if now >= expires {
                    note_stale_handoff(state, &row, st, StaleHandoff::Expired, now).await;
                    return Err(err(
                        StatusCode::GONE,
                        "handoff_expired",
                        format!(
                            "the handoff expired at {}; capture the subject again and act on the new handoff",
                            rfc3339(expires)
                        ),
                        Some("handoff"),
                    ));
                }
            }
            supervisor::advance(&graph, st, &step, now)
        }
        StepKind::Observe => {
            if req.stdout.as_ref().is_some_and(|s| s.len() > 65536) {
                return Err(err(
                    StatusCode::BAD_REQUEST,
                    "invalid_body",
                    "at most 64 KiB",
                    Some("stdout"),
                ));
            }
            let capture = match req.envelope {
                Some(d) => {
                    let Some(facts) = lookup_envelope(state, &d, "envelope").await? else {
                        return Err(envelope_unknown("envelope"));
                    };
                    if facts.wall_ns > now {
                        return Err(unprocessable(
                            "envelope_not_before",
                            "the envelope was captured after this request",
                            "envelope",
                        ));
                    }
                    Some(Capture {
                        expires_ns: state.freshness.expires_ns(&facts.kind, facts.wall_ns),
                        digest: d,
                        subject: facts.subject_key,
                        kind: facts.kind,
                        completeness: Some(facts.completeness),
                        wall_ns: facts.wall_ns,
                        epoch: 0,
                    })
                }
                None => None,
            };
            supervisor::observe(
                &graph,
                st,
                Observation {
                    exit_code: req.exit_code,
                    stdout: req.stdout,
                    capture,
                },
            )
        }
        StepKind::Conclude => supervisor::conclude(&graph, st),
    };
    let new = &mut decided.state;
    new.acceptance.narration_tokens = new.acceptance.narration_tokens.saturating_add(narration);
    let judged = judge_new_capture(state, &row, new, captures_before, now).await?;
    let mut repeated = false;
    if !bound_before && let Some(subject) = new.subject.as_deref() {
        let settled = state
            .store
            .settled_runs_on(
                subject,
                &row.graph_name,
                now - acceptance::REPEAT_WINDOW_NS,
                &row.id,
            )
            .await
            .map_err(store_err)?;
        if settled > 0 {
            new.acceptance.repeated_investigation = true;
            repeated = true;
        }
    }
    let new = &decided.state;
    let applied = state
        .store
        .update_run(
            &row.id,
            row.revision,
            status_str(new.status),
            &serde_json::to_string(new).unwrap_or_default(),
            new.subject.as_deref(),
            report::outcome_of(new).as_str(),
            now,
        )
        .await
        .map_err(store_err)?;
    if !applied {
        return Err(err(
            StatusCode::CONFLICT,
            "run_conflict",
            "the run moved on since it was read; read it again and retry",
            None,
        ));
    }
    // Counted only once the step applied: a lost race counts nothing.
    let m = &state.metrics.acceptance;
    let entered = decided
        .events
        .iter()
        .filter(|e| e.kind == EventKind::Entered)
        .count();
    m.add_step(
        u64::try_from(entered).unwrap_or(0),
        now - row.updated_ns,
        narration,
    );
    m.add_retractions(judged.retractions);
    if let Some(seconds) = judged.first_discriminating_s {
        m.observe_first_discriminating(seconds);
    }
    if repeated {
        m.add_repeated();
    }
    if new.status == RunStatus::Ended && report::outcome_of(new) == Outcome::Failed {
        state
            .store
            .put_failure_receipt(&failure_receipt(&row.id, new, now))
            .await
            .map_err(store_err)?;
    }
    let row = state
        .store
        .run(&row.id)
        .await
        .map_err(store_err)?
        .unwrap_or(row);
    let receipt = state
        .store
        .failure_receipt(&row.id)
        .await
        .map_err(store_err)?;
    Ok((run_json(&row, new, &graph, receipt.as_ref()), decided))
}

/// What judging a step's new capture did to the run's acceptance counts.
#[derive(Debug, Default)]
struct Judged {
    retractions: u64,
    first_discriminating_s: Option<f64>,
}

/// Judge the capture this step recorded (if it recorded a new one) against
/// its subject's hypothesis ledger and fold the moves into the run's
/// acceptance counts.
async fn judge_new_capture(
    state: &AppState,
    row: &RunRow,
    new: &mut RunState,
    captures_before: usize,
    now: i64,
) -> Result<Judged, Response> {
    let mut out = Judged::default();
    let Some(cap) = new.captures.get(captures_before).cloned() else {
        return Ok(out);
    };
    if new.captures[..captures_before]
        .iter()
        .any(|c| c.digest == cap.digest)
    {
        // Already judged for this run.
        return Ok(out);
    }
    let Some(env) = state.store.envelope(&cap.digest).await.map_err(store_err)? else {
        // Deleted since it was resolved: nothing to judge.
        return Ok(out);
    };
    let mutation_ns = new
        .last_mutation_ns
        .filter(|_| new.mutations > 0 && new.subject.as_deref() == Some(cap.subject.as_str()));
    let moves = state
        .store
        .record_hypotheses(&cap.subject, &cap.digest, &row.id, now, |ledger| {
            hypotheses::judge(ledger, &env, cap.wall_ns, mutation_ns)
        })
        .await
        .map_err(store_err)?;
    let a = &mut new.acceptance;
    a.unknowns_without_owner_or_probe = a
        .unknowns_without_owner_or_probe
        .saturating_add(acceptance::unknowns_without_owner_or_probe(&env));
    let retractions = moves
        .iter()
        .filter(|m| hypotheses::retracts(m.from))
        .count();
    a.retractions = a
        .retractions
        .saturating_add(u32::try_from(retractions).unwrap_or(u32::MAX));
    out.retractions = u64::try_from(retractions).unwrap_or(0);
    if a.first_discriminating_after_ns.is_none()
        && moves
            .iter()
            .any(|m| hypotheses::discriminates(m.from, m.to))
    {
        let after = now - row.created_ns;
        a.first_discriminating_after_ns = Some(after);
        out.first_discriminating_s = Some(after as f64 / 1e9);
    }
    Ok(out)
}

/// The ledger moves of a run's envelopes of its subject, per hypothesis
/// (in the order first moved): where the run left it and what moved it.
fn report_hypotheses(moves: &[LedgerMove], subject: Option<&str>) -> Vec<ReportHypothesis> {
    let mut out: Vec<ReportHypothesis> = Vec::new();
    for m in moves
        .iter()
        .filter(|m| Some(m.subject_key.as_str()) == subject)
    {
        let i = match out.iter().position(|h| h.hypothesis == m.hypothesis) {
            Some(i) => i,
            None => {
                out.push(ReportHypothesis {
                    hypothesis: m.hypothesis.clone(),
                    state: m.to,
                    moved_by: Vec::new(),
                });
                out.len() - 1
            }
        };
        let h = &mut out[i];
        h.state = m.to;
        if h.moved_by.last() != Some(&m.digest) {
            h.moved_by.push(m.digest.clone());
        }
    }
    out
}

/// The typed-failure receipt of a failed run: where, which class (the
/// report's derivation; `None` if the run recorded no classifiable cause),
/// the last pre- and post-mutation envelopes of the run's subject.
fn failure_receipt(run_id: &str, st: &RunState, now: i64) -> FailureReceiptRow {
    let ctx = ReportContext {
        runbook: String::new(),
        version: String::new(),
        content_hash: String::new(),
        profile: Profile::P0,
        runtime_profile: RuntimeProfile::R0,
        executor_kind: ExecutorKind::Autonomous,
        env_class: EnvClass::Local,
        reported_at: String::new(),
        elapsed_seconds: None,
        failure_class: None,
        agent_seconds: None,
        hypotheses: Vec::new(),
    };
    let (step, class) = match report::build_run_report(st, &ctx) {
        Ok(r) => (r.failed_step_id, r.failure_class),
        Err(ReportError::UnclassifiableFailure(step)) => (step, None),
        Err(_) => (Some(st.current.clone()), None),
    };
    let ours = |c: &&Capture| st.subject.as_deref() == Some(c.subject.as_str());
    let pre = st
        .captures
        .iter()
        .filter(ours)
        .rfind(|c| c.epoch + 1 == st.mutations.max(1))
        .map(|c| c.digest.clone());
    let post = st
        .captures
        .iter()
        .filter(ours)
        .rfind(|c| st.mutations > 0 && c.epoch == st.mutations)
        .map(|c| c.digest.clone());
    FailureReceiptRow {
        run_id: run_id.into(),
        failed_step_id: step,
        failure_class: class
            .and_then(|c| serde_json::to_value(c).ok())
            .and_then(|v| v.as_str().map(String::from)),
        subject_key: st.subject.clone(),
        pre_digest: pre,
        post_digest: post,
        created_ns: now,
    }
}

async fn post_step(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Body,
) -> Reply {
    auth(&state, &headers, Scope::Analysis).await?;
    let req: StepRequest = quiet_body(body).await?;
    let (run, decided) = apply_step(&state, &id, req).await?;
    let mut body = json!({
        "verdict": decided.verdict,
        "events": decided.events,
        "run": run,
    });
    if let Some(r) = &decided.refusal {
        // The typed error of the pre-mutation rule, in the store's error
        // shape (the field is the step the run could not enter).
        let mut e = json!({"code": r.code(), "message": r.to_string(), "field": "step"});
        if let Some(c) = r.completeness() {
            e["completeness"] = json!(c.as_str());
        }
        body["refusal"] = e;
    }
    Ok(Json(body).into_response())
}

fn parse_enum<T: DeserializeOwned>(
    q: &BTreeMap<String, String>,
    name: &str,
    allowed: &str,
) -> Result<Option<T>, Response> {
    match q.get(name) {
        None => Ok(None),
        Some(v) => serde_json::from_value(json!(v))
            .map(Some)
            .map_err(|_| bad_query(name, format!("one of {allowed}"))),
    }
}

async fn get_report(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<BTreeMap<String, String>>,
) -> Reply {
    auth(&state, &headers, Scope::Read).await?;
    only_params(
        &q,
        &[
            "executorKind",
            "envClass",
            "profile",
            "runtimeProfile",
            "failureClass",
        ],
    )?;
    let executor_kind: ExecutorKind =
        parse_enum(&q, "executorKind", "human, agent-assisted, autonomous")?.ok_or_else(|| {
            bad_query(
                "executorKind",
                "required (no default): human, agent-assisted or autonomous",
            )
        })?;
    let env_class: EnvClass =
        parse_enum(&q, "envClass", "local, ci, staging, prod")?.ok_or_else(|| {
            bad_query(
                "envClass",
                "required (no default): local, ci, staging or prod",
            )
        })?;
    let profile = parse_enum(&q, "profile", "P0, P1")?.unwrap_or(Profile::P0);
    let runtime_profile =
        parse_enum(&q, "runtimeProfile", "R0, R1, R2")?.unwrap_or(RuntimeProfile::R1);
    let failure_class: Option<FailureClass> = parse_enum(
        &q,
        "failureClass",
        "precondition_unmet, tool_missing, permission_denied, expectation_mismatch, timeout, human_abort, upstream_changed",
    )?;
    let (row, st, _) = load_run(&state, &id).await?;
    let moves = state
        .store
        .hypothesis_moves(None, Some(&row.id))
        .await
        .map_err(store_err)?;
    let now = state.clock.now_ns();
    let end = row.ended_ns.unwrap_or(now);
    let ctx = ReportContext {
        runbook: row.graph_name.clone(),
        version: row.graph_version.clone(),
        content_hash: row.content_hash.clone(),
        profile,
        runtime_profile,
        executor_kind,
        env_class,
        reported_at: rfc3339(now).chars().take(10).collect(),
        elapsed_seconds: Some((end - row.created_ns) as f64 / 1e9),
        failure_class,
        agent_seconds: Some((row.updated_ns - row.created_ns) as f64 / 1e9),
        hypotheses: report_hypotheses(&moves, st.subject.as_deref()),
    };
    match report::emit(&st, &ctx) {
        Ok(r) => Ok(Json(r).into_response()),
        Err(ReportError::UnmappedReason(code)) => Err(unprocessable(
            "unmapped_reason",
            format!("{code} has no failure class: refusing to emit"),
            "events",
        )),
        Err(e @ ReportError::UnclassifiableFailure(_)) => Err(unprocessable(
            "unclassifiable_failure",
            e.to_string(),
            "failureClass",
        )),
        Err(e @ ReportError::Invalid(_)) => Err(err(
            StatusCode::INTERNAL_SERVER_ERROR,
            "report_invalid",
            e.to_string(),
            None,
        )),
    }
}

async fn get_report_schema(State(state): State<AppState>, headers: HeaderMap) -> Reply {
    auth(&state, &headers, Scope::Read).await?;
    Ok((
        [(header::CONTENT_TYPE, "application/schema+json")],
        report::SCHEMA_JSON,
    )
        .into_response())
}

/// `GET /internal/subjects/{subject}/hypotheses[?state=]`: the subject's
/// hypothesis ledger, each hypothesis with every move and the envelope
/// that made it.
async fn get_hypotheses(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(subject): Path<String>,
    Query(q): Query<BTreeMap<String, String>>,
) -> Reply {
    auth(&state, &headers, Scope::Read).await?;
    only_params(&q, &["state"])?;
    let only = match q.get("state") {
        None => None,
        Some(v) => Some(
            HypothesisState::parse(v)
                .ok_or_else(|| bad_query("state", "one of standing, falsified, confirmed"))?,
        ),
    };
    if !valid_digest(&subject) {
        return Err(err(
            StatusCode::BAD_REQUEST,
            "invalid_subject",
            "a subject key is sha256: and 64 lowercase hex digits",
            Some("subject"),
        ));
    }
    let ledger = state
        .store
        .hypotheses_of(&subject)
        .await
        .map_err(store_err)?;
    if ledger.is_empty()
        && !state
            .store
            .subject_known(&subject)
            .await
            .map_err(store_err)?
    {
        return Err(err(
            StatusCode::NOT_FOUND,
            "subject_not_found",
            "the store holds no envelope of this subject",
            Some("subject"),
        ));
    }
    let moves = state
        .store
        .hypothesis_moves(Some(&subject), None)
        .await
        .map_err(store_err)?;
    let mut counts = BTreeMap::from([("confirmed", 0u32), ("falsified", 0), ("standing", 0)]);
    for h in &ledger {
        *counts.entry(h.state.as_str()).or_insert(0) += 1;
    }
    let hypotheses: Vec<Value> = ledger
        .iter()
        .filter(|h| only.is_none_or(|s| h.state == s))
        .map(|h| {
            let moved: Vec<Value> = moves
                .iter()
                .filter(|m| m.hypothesis == h.key)
                .map(|m| {
                    json!({
                        "digest": m.digest,
                        "uri": format!("/v1/envelopes/{}", m.digest),
                        "run": m.run_id,
                        "from": m.from.map(HypothesisState::as_str),
                        "to": m.to.as_str(),
                        "rule": m.rule.as_str(),
                        "at": rfc3339(m.at_ns),
                    })
                })
                .collect();
            json!({
                "key": h.key,
                "code": h.code,
                "statement": h.statement,
                "falsifier": h.falsifier,
                "surfaces": h.surfaces,
                "effects": h.effects,
                "state": h.state.as_str(),
                "openedAt": rfc3339(h.opened_wall_ns),
                "moves": moved,
            })
        })
        .collect();
    Ok(Json(json!({
        "subject": subject,
        "counts": counts,
        "hypotheses": hypotheses,
    }))
    .into_response())
}
