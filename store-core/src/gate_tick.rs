//! The gate's periodic work, run by the 1-minute ticker of `serve` and by
//! `POST /internal/remediations/watchdog`: reap expired incident leases,
//! move lapsed grants to `expired` and overdue claims to
//! `execution_timed_out`, evaluate due watchdog checkpoints, and issue the
//! receipts of host-subject remediations.
//!
//! Invariants:
//! - Idempotent: each checkpoint is evaluated once (a conditional update),
//!   each receipt kind recorded once per proposal; running two ticks
//!   concurrently changes nothing twice.
//! - Operational recovery is only ever `operationally_corroborated`; this
//!   module never writes `counterfactual_verified`.
//! - A receipt cites a post-mutation envelope of the same subject
//!   (captured after completion); `VERIFIED` needs its diff against the
//!   pre-mutation envelope to resolve at least one claim the pre-mutation
//!   envelope made; otherwise the receipt is the typed failure
//!   `FAULT_STANDING`.

use serde::Serialize;
use serde_json::{Value, json};

use crate::clock::Clock;
use crate::db::Store;
use crate::db::StoreError;
use crate::db::analysis::VersionFilter;
use crate::db::gate::{GateReceipt, ProposalFilter, ProposalRow};
use crate::gate::watchdog::{self, Verdict};

/// What one tick did.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TickReport {
    /// Expired leases reaped to `open`.
    pub reaped_leases: u64,
    /// Grants moved to `expired`.
    pub expired_grants: u64,
    /// Claims moved to `execution_timed_out`.
    pub timed_out_executions: u64,
    /// Checkpoints evaluated.
    pub checkpoints_evaluated: u64,
    /// Receipts recorded.
    pub receipts_recorded: u64,
}

/// Run one tick at `clock`'s now (the serving state's clock: tests move it).
pub async fn tick(store: &Store, clock: &Clock) -> Result<TickReport, StoreError> {
    let now = clock.now_ns();
    let mut r = TickReport {
        reaped_leases: store.reap_leases(now).await?,
        ..TickReport::default()
    };
    let (expired, timed_out) = store.expire_grants(now).await?;
    r.expired_grants = expired;
    r.timed_out_executions = timed_out;
    for due in store.due_checkpoints(now).await? {
        let Some(p) = store.proposal(&due.proposal_id).await? else {
            continue;
        };
        let earlier = store.checkpoints(&p.id).await?;
        let start = if due.ord == 0 {
            p.finished_ns.unwrap_or(due.due_ns)
        } else {
            earlier
                .iter()
                .find(|c| c.ord == due.ord - 1)
                .map_or(due.due_ns, |c| c.due_ns)
        };
        let (requests, errors) = match traffic_scope(&p.target) {
            Some((env, service)) => {
                let t = store
                    .request_totals(&env, &service, VersionFilter::Any, start, due.due_ns)
                    .await?;
                (t.requests, t.errors)
            }
            None => (0, 0),
        };
        let v = watchdog::verdict(requests, errors);
        let mut seq: Vec<Verdict> = earlier
            .iter()
            .filter(|c| c.ord < due.ord)
            .filter_map(|c| c.verdict.as_deref().and_then(Verdict::parse))
            .collect();
        seq.push(v);
        let recovery = watchdog::recovery(&seq, watchdog::CHECKPOINTS_NS.len());
        if store
            .record_checkpoint(&p.id, due.ord, requests, errors, v.as_str(), recovery, now)
            .await?
        {
            r.checkpoints_evaluated += 1;
            tracing::info!(proposal = %p.id, checkpoint = due.ord, verdict = v.as_str(), recovery = recovery.0, "watchdog checkpoint");
        }
    }
    let completed = store
        .proposals(&ProposalFilter {
            incident_id: None,
            status: Some("completed".into()),
            limit: 1000,
        })
        .await?;
    for p in completed
        .iter()
        .filter(|p| p.target_key.starts_with("subject:"))
    {
        r.receipts_recorded += subject_receipts(store, clock, p).await?;
    }
    Ok(r)
}

/// (environment, service) whose requests judge recovery.
fn traffic_scope(target: &Value) -> Option<(String, String)> {
    Some((
        target.get("environment")?.as_str()?.to_string(),
        target.get("service")?.as_str()?.to_string(),
    ))
}

async fn subject_receipts(
    store: &Store,
    clock: &Clock,
    p: &ProposalRow,
) -> Result<u64, StoreError> {
    let (Some(subject), Some(pre), Some(done)) = (
        p.target_key.strip_prefix("subject:"),
        p.pre_mutation_envelope.as_deref(),
        p.finished_ns,
    ) else {
        return Ok(0);
    };
    let have: Vec<String> = store
        .gate_receipts(&p.id)
        .await?
        .into_iter()
        .map(|r| r.kind)
        .collect();
    if have.iter().any(|k| k == "VERIFIED") {
        return Ok(0);
    }
    let post = store.subject_envelopes_after(subject, done).await?;
    let Some(first) = post.first() else {
        return Ok(0);
    };
    let now = clock.now_ns();
    let mut n = 0;
    if !have.iter().any(|k| k == "REALIZED") {
        let rec = GateReceipt {
            kind: "REALIZED".into(),
            subject_key: subject.to_string(),
            evidence: first.0.clone(),
            detail: json!({"seen": "a capture of the subject after completion", "completeness": first.2}),
            created_ns: now,
        };
        if store.record_gate_receipt(&p.id, &rec).await? {
            n += 1;
        }
    }
    // The newest usable post-mutation envelope judges the mechanism.
    let Some(judge) = post
        .iter()
        .rev()
        .find(|(_, _, c)| c == "complete" || c == "bounded")
    else {
        return Ok(n);
    };
    if have.iter().any(|k| k == "FAULT_STANDING") {
        // Already judged standing on an earlier capture; a newer one may
        // still verify, so fall through only for a different envelope.
        let prior = store.gate_receipts(&p.id).await?;
        if prior
            .iter()
            .any(|r| r.kind == "FAULT_STANDING" && r.evidence == judge.0)
        {
            return Ok(n);
        }
    }
    let (Some(before), Some(after)) = (
        store.envelope_bytes(pre).await?,
        store.envelope_bytes(&judge.0).await?,
    ) else {
        return Ok(n);
    };
    let parsed = (
        pstack_envelope::parse(&before),
        pstack_envelope::parse(&after),
    );
    let (Ok((b, _)), Ok((a, _))) = parsed else {
        return Ok(n);
    };
    let Ok(d) = pstack_envelope::diff(&b, &a) else {
        return Ok(n);
    };
    let verified = !d.claims_resolved.is_empty();
    let detail = json!({
        "preMutationEnvelope": pre,
        "claimsResolved": d.claims_resolved,
        "claimsNew": d.claims_new,
        "statusChanged": d.status_changed.len(),
        "factsChanged": d.facts_changed.len(),
    });
    let rec = GateReceipt {
        kind: if verified {
            "VERIFIED"
        } else {
            "FAULT_STANDING"
        }
        .into(),
        subject_key: subject.to_string(),
        evidence: judge.0.clone(),
        detail,
        created_ns: now,
    };
    if !verified {
        // FAULT_STANDING is recorded once per proposal (its key); a later
        // capture that resolves the fault still earns VERIFIED.
        if have.iter().any(|k| k == "FAULT_STANDING") {
            return Ok(n);
        }
    }
    if store.record_gate_receipt(&p.id, &rec).await? {
        n += 1;
    }
    Ok(n)
}
