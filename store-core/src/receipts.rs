//! Receipts: the six closure transitions, and the rules that keep one layer's
//! receipt from standing in for another's. Pure: the database layer gathers a
//! [`ReceiptContext`]; [`check`] decides.
//!
//! A receipt is recorded against one **subject** (the subject of the envelopes
//! it cites) and one **change** (a caller-chosen id such as a ticket or PR
//! number). Per (subject, change) the layers form a chain, each recorded at
//! most once and only after the one before it:
//!
//! | kind | needs before it | fields | evidence it must cite |
//! |---|---|---|---|
//! | `SOURCE_FIXED` | — | `revision` (source commit) | the problem: envelope(s) of the subject |
//! | `MERGED` | `SOURCE_FIXED` | `revision` (merge commit) | envelope(s) of the subject |
//! | `REALIZED` | `MERGED` | `realized_at` (when the change took effect), after every problem capture | envelope(s) captured at or after `realized_at` |
//! | `VERIFIED` | `REALIZED` | — | post-change envelope(s) (captured after `realized_at`), not `identity_race`, none cited by `REALIZED`, each differing (envelope diff non-empty) from every problem envelope |
//! | `SOAKED` | `VERIFIED` | `soak_ms` > 0 | post-change envelope(s), not `identity_race`, none cited by `REALIZED` or `VERIFIED`, the newest captured at least `soak_ms` after `realized_at` |
//! | `CLOSED` | `SOAKED` | — | the subject's newest stored envelope: post-change, not `identity_race`, no open unknowns |
//!
//! Every cited digest must be stored and of the receipt's subject. A field
//! that belongs to another layer (`soak_ms` on `MERGED`, `realized_at` on
//! `VERIFIED`, ...) is refused rather than ignored. Each refusal is a
//! [`ReceiptRefusal`] with a stable code.

use serde::{Deserialize, Serialize};

/// The closure transitions, in chain order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ReceiptKind {
    /// The fix exists in source.
    SourceFixed,
    /// The fix is merged.
    Merged,
    /// The fix is live on the subject.
    Realized,
    /// A post-change capture shows the mechanism changed.
    Verified,
    /// It stayed changed for the soak period.
    Soaked,
    /// Nothing is left open.
    Closed,
}

impl ReceiptKind {
    /// Every kind, in chain order.
    pub const ALL: [ReceiptKind; 6] = [
        ReceiptKind::SourceFixed,
        ReceiptKind::Merged,
        ReceiptKind::Realized,
        ReceiptKind::Verified,
        ReceiptKind::Soaked,
        ReceiptKind::Closed,
    ];

    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            ReceiptKind::SourceFixed => "SOURCE_FIXED",
            ReceiptKind::Merged => "MERGED",
            ReceiptKind::Realized => "REALIZED",
            ReceiptKind::Verified => "VERIFIED",
            ReceiptKind::Soaked => "SOAKED",
            ReceiptKind::Closed => "CLOSED",
        }
    }

    /// Parse a wire name.
    pub fn parse(s: &str) -> Option<ReceiptKind> {
        ReceiptKind::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// The layer that must be recorded first.
    pub fn prior(self) -> Option<ReceiptKind> {
        let i = ReceiptKind::ALL.iter().position(|k| *k == self)?;
        i.checked_sub(1).map(|p| ReceiptKind::ALL[p])
    }
}

impl std::fmt::Display for ReceiptKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `POST /v1/receipts` body.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ReceiptRequest {
    /// Which transition.
    pub kind: ReceiptKind,
    /// The change this chain is about.
    pub change: String,
    /// Envelope digests that prove it.
    pub evidence: Vec<String>,
    /// Source or merge commit (`SOURCE_FIXED`, `MERGED`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// When the change took effect, RFC 3339 UTC (`REALIZED`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub realized_at: Option<String>,
    /// Soak period, ms (`SOAKED`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soak_ms: Option<u64>,
    /// Free text for people (never evidence).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// What the store knows about one cited envelope.
#[derive(Debug, Clone)]
pub struct EvidenceFacts {
    /// Digest.
    pub digest: String,
    /// Its subject key.
    pub subject_key: String,
    /// Capture time, ns.
    pub wall_ns: i64,
    /// Completeness wire name.
    pub completeness: String,
    /// Number of unknowns it carries.
    pub open_unknowns: usize,
}

/// A receipt already recorded for the same (subject, change).
#[derive(Debug, Clone)]
pub struct PriorReceipt {
    /// Its kind.
    pub kind: ReceiptKind,
    /// `realized_at` of a `REALIZED`, ns.
    pub realized_ns: Option<i64>,
    /// What it cited.
    pub evidence: Vec<String>,
}

/// Everything [`check`] needs besides the request.
#[derive(Debug, Clone, Default)]
pub struct ReceiptContext {
    /// Facts per cited digest, in request order; `None` when not stored.
    pub evidence: Vec<Option<EvidenceFacts>>,
    /// Receipts recorded for this (subject, change).
    pub prior: Vec<PriorReceipt>,
    /// Capture times of the `SOURCE_FIXED` problem envelopes, ns.
    pub problem_wall_ns: Vec<i64>,
    /// Digest of the subject's newest stored envelope.
    pub latest_of_subject: Option<String>,
    /// (cited, problem) pairs whose diff is empty (for `VERIFIED`).
    pub unchanged_against_problem: Vec<(String, String)>,
}

/// Why a receipt was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize)]
#[serde(tag = "rule", rename_all = "snake_case")]
pub enum ReceiptRefusal {
    /// No evidence cited.
    #[error("a receipt must cite at least one envelope digest")]
    NoEvidence,
    /// A cited digest is not `sha256:<64 hex>`.
    #[error("{digest:?} is not a sha256:<hex> digest")]
    InvalidDigest { digest: String },
    /// `change` is empty.
    #[error("a receipt must name the change it is about")]
    MissingChange,
    /// `revision` is required for this kind.
    #[error("{kind} needs a revision")]
    MissingRevision { kind: ReceiptKind },
    /// `realized_at` is required for `REALIZED`.
    #[error("REALIZED needs realized_at (when the change took effect)")]
    MissingRealizedAt,
    /// `realized_at` is not RFC 3339 UTC.
    #[error("realized_at {value:?} is not an RFC 3339 UTC time")]
    InvalidRealizedAt { value: String },
    /// `soak_ms` is required (and positive) for `SOAKED`.
    #[error("SOAKED needs soak_ms > 0")]
    MissingSoak,
    /// A field that belongs to another layer.
    #[error("{field} does not belong on a {kind} receipt")]
    FieldNotAllowed { kind: ReceiptKind, field: String },
    /// A cited envelope is not stored.
    #[error("cited envelope {digest} is not in the store")]
    EvidenceNotFound { digest: String },
    /// Cited envelopes are about different subjects.
    #[error("cited envelope {digest} is about a different subject than {first}")]
    EvidenceSubjectMismatch { digest: String, first: String },
    /// The previous layer has not been recorded.
    #[error("{kind} needs a {needs} receipt for the same subject and change first")]
    MissingPriorReceipt {
        kind: ReceiptKind,
        needs: ReceiptKind,
    },
    /// This layer is already recorded.
    #[error("{kind} is already recorded for this subject and change")]
    AlreadyRecorded { kind: ReceiptKind },
    /// `realized_at` precedes a capture of the problem it claims to fix.
    #[error(
        "realized_at precedes problem evidence captured later; a change realized before the problem was seen cannot be its fix"
    )]
    RealizedBeforeProblem,
    /// Evidence captured before the change took effect.
    #[error(
        "{digest} was captured before the change took effect; {kind} needs post-change evidence"
    )]
    NotPostChange { kind: ReceiptKind, digest: String },
    /// Evidence already cited by an earlier layer.
    #[error("{digest} already proves {layer}; {kind} needs its own evidence")]
    EvidenceReused {
        kind: ReceiptKind,
        layer: ReceiptKind,
        digest: String,
    },
    /// An `identity_race` envelope attributes nothing.
    #[error("{digest} is an identity_race envelope and attributes nothing to the subject")]
    IdentityRaceEvidence { digest: String },
    /// A post-change envelope identical (by diff) to the problem.
    #[error("{digest} shows no change against problem evidence {problem}")]
    NoObservedChange { digest: String, problem: String },
    /// The soak period has not been covered by evidence.
    #[error("newest cited evidence is {short_ms} ms short of the {soak_ms} ms soak")]
    SoakNotElapsed { soak_ms: u64, short_ms: i64 },
    /// `CLOSED` must cite the subject's newest envelope.
    #[error("CLOSED must cite the subject's newest envelope {latest}")]
    NotLatestEvidence { latest: String },
    /// The newest envelope still carries unknowns.
    #[error("{digest} still carries {count} open unknown(s)")]
    OpenUnknowns { digest: String, count: usize },
}

impl ReceiptRefusal {
    /// Stable snake_case code.
    pub fn rule(&self) -> &'static str {
        use ReceiptRefusal::*;
        match self {
            NoEvidence => "no_evidence",
            InvalidDigest { .. } => "invalid_digest",
            MissingChange => "missing_change",
            MissingRevision { .. } => "missing_revision",
            MissingRealizedAt => "missing_realized_at",
            InvalidRealizedAt { .. } => "invalid_realized_at",
            MissingSoak => "missing_soak",
            FieldNotAllowed { .. } => "field_not_allowed",
            EvidenceNotFound { .. } => "evidence_not_found",
            EvidenceSubjectMismatch { .. } => "evidence_subject_mismatch",
            MissingPriorReceipt { .. } => "missing_prior_receipt",
            AlreadyRecorded { .. } => "already_recorded",
            RealizedBeforeProblem => "realized_before_problem",
            NotPostChange { .. } => "not_post_change",
            EvidenceReused { .. } => "evidence_reused",
            IdentityRaceEvidence { .. } => "identity_race_evidence",
            NoObservedChange { .. } => "no_observed_change",
            SoakNotElapsed { .. } => "soak_not_elapsed",
            NotLatestEvidence { .. } => "not_latest_evidence",
            OpenUnknowns { .. } => "open_unknowns",
        }
    }

    /// Every code; a test proves each has a fixture that triggers it.
    pub const RULES: &'static [&'static str] = &[
        "no_evidence",
        "invalid_digest",
        "missing_change",
        "missing_revision",
        "missing_realized_at",
        "invalid_realized_at",
        "missing_soak",
        "field_not_allowed",
        "evidence_not_found",
        "evidence_subject_mismatch",
        "missing_prior_receipt",
        "already_recorded",
        "realized_before_problem",
        "not_post_change",
        "evidence_reused",
        "identity_race_evidence",
        "no_observed_change",
        "soak_not_elapsed",
        "not_latest_evidence",
        "open_unknowns",
    ];
}

/// Checks that need no stored state. Returns `realized_at` in ns for `REALIZED`.
pub fn check_request(req: &ReceiptRequest) -> Result<Option<i64>, ReceiptRefusal> {
    use ReceiptKind::*;
    if req.change.trim().is_empty() {
        return Err(ReceiptRefusal::MissingChange);
    }
    if req.evidence.is_empty() {
        return Err(ReceiptRefusal::NoEvidence);
    }
    if let Some(bad) = req
        .evidence
        .iter()
        .find(|d| !pstack_envelope::is_sha256_digest(d))
    {
        return Err(ReceiptRefusal::InvalidDigest {
            digest: bad.clone(),
        });
    }
    let not_allowed = |field: &str| ReceiptRefusal::FieldNotAllowed {
        kind: req.kind,
        field: field.into(),
    };
    let wants_revision = matches!(req.kind, SourceFixed | Merged);
    match (&req.revision, wants_revision) {
        (Some(r), true) if !r.trim().is_empty() => {}
        (_, true) => return Err(ReceiptRefusal::MissingRevision { kind: req.kind }),
        (Some(_), false) => return Err(not_allowed("revision")),
        (None, false) => {}
    }
    if req.kind != Soaked && req.soak_ms.is_some() {
        return Err(not_allowed("soak_ms"));
    }
    if req.kind == Soaked && req.soak_ms.unwrap_or(0) == 0 {
        return Err(ReceiptRefusal::MissingSoak);
    }
    if req.kind != Realized {
        if req.realized_at.is_some() {
            return Err(not_allowed("realized_at"));
        }
        return Ok(None);
    }
    let value = req
        .realized_at
        .as_deref()
        .ok_or(ReceiptRefusal::MissingRealizedAt)?;
    crate::ident::wall_time_ns(value)
        .map(Some)
        .ok_or_else(|| ReceiptRefusal::InvalidRealizedAt {
            value: value.into(),
        })
}

/// The subject a request is about: that of its first stored cited envelope.
pub fn subject_of(ctx: &ReceiptContext) -> Option<&str> {
    ctx.evidence
        .iter()
        .flatten()
        .map(|e| e.subject_key.as_str())
        .next()
}

/// Every rule, against stored state. `Ok` means the receipt may be recorded.
pub fn check(req: &ReceiptRequest, ctx: &ReceiptContext) -> Result<(), ReceiptRefusal> {
    use ReceiptKind::*;
    let realized_req = check_request(req)?;
    let mut facts = Vec::with_capacity(req.evidence.len());
    for (digest, f) in req.evidence.iter().zip(&ctx.evidence) {
        match f {
            Some(f) => facts.push(f),
            None => {
                return Err(ReceiptRefusal::EvidenceNotFound {
                    digest: digest.clone(),
                });
            }
        }
    }
    let first = facts[0];
    if let Some(other) = facts.iter().find(|f| f.subject_key != first.subject_key) {
        return Err(ReceiptRefusal::EvidenceSubjectMismatch {
            digest: other.digest.clone(),
            first: first.digest.clone(),
        });
    }
    let prior = |k: ReceiptKind| ctx.prior.iter().find(|p| p.kind == k);
    if prior(req.kind).is_some() {
        return Err(ReceiptRefusal::AlreadyRecorded { kind: req.kind });
    }
    if let Some(needs) = req.kind.prior()
        && prior(needs).is_none()
    {
        return Err(ReceiptRefusal::MissingPriorReceipt {
            kind: req.kind,
            needs,
        });
    }
    // The change's effective time: from this request (REALIZED) or the chain.
    let realized_ns = realized_req.or_else(|| prior(Realized).and_then(|p| p.realized_ns));
    let post_change = |strict: bool| -> Result<(), ReceiptRefusal> {
        let Some(at) = realized_ns else { return Ok(()) };
        match facts.iter().find(|f| {
            if strict {
                f.wall_ns <= at
            } else {
                f.wall_ns < at
            }
        }) {
            Some(f) => Err(ReceiptRefusal::NotPostChange {
                kind: req.kind,
                digest: f.digest.clone(),
            }),
            None => Ok(()),
        }
    };
    let attributable = || -> Result<(), ReceiptRefusal> {
        match facts.iter().find(|f| f.completeness == "identity_race") {
            Some(f) => Err(ReceiptRefusal::IdentityRaceEvidence {
                digest: f.digest.clone(),
            }),
            None => Ok(()),
        }
    };
    let not_reused = |layers: &[ReceiptKind]| -> Result<(), ReceiptRefusal> {
        for layer in layers {
            if let Some(p) = prior(*layer)
                && let Some(f) = facts.iter().find(|f| p.evidence.contains(&f.digest))
            {
                return Err(ReceiptRefusal::EvidenceReused {
                    kind: req.kind,
                    layer: *layer,
                    digest: f.digest.clone(),
                });
            }
        }
        Ok(())
    };
    match req.kind {
        SourceFixed | Merged => Ok(()),
        Realized => {
            let at = realized_ns.unwrap_or(i64::MIN);
            if ctx.problem_wall_ns.iter().any(|p| *p > at) {
                return Err(ReceiptRefusal::RealizedBeforeProblem);
            }
            post_change(false)
        }
        Verified => {
            post_change(true)?;
            attributable()?;
            not_reused(&[Realized])?;
            if let Some((digest, problem)) = ctx.unchanged_against_problem.first() {
                return Err(ReceiptRefusal::NoObservedChange {
                    digest: digest.clone(),
                    problem: problem.clone(),
                });
            }
            Ok(())
        }
        Soaked => {
            post_change(true)?;
            attributable()?;
            not_reused(&[Realized, Verified])?;
            let soak_ms = req.soak_ms.unwrap_or(0);
            let newest = facts.iter().map(|f| f.wall_ns).max().unwrap_or(i64::MIN);
            let due = realized_ns.unwrap_or(i64::MAX).saturating_add(
                i64::try_from(soak_ms)
                    .unwrap_or(i64::MAX)
                    .saturating_mul(1_000_000),
            );
            if newest < due {
                return Err(ReceiptRefusal::SoakNotElapsed {
                    soak_ms,
                    short_ms: (due - newest + 999_999) / 1_000_000,
                });
            }
            Ok(())
        }
        Closed => {
            post_change(true)?;
            attributable()?;
            let latest = ctx.latest_of_subject.clone().unwrap_or_default();
            let Some(newest) = facts.iter().find(|f| f.digest == latest) else {
                return Err(ReceiptRefusal::NotLatestEvidence { latest });
            };
            if newest.open_unknowns > 0 {
                return Err(ReceiptRefusal::OpenUnknowns {
                    digest: newest.digest.clone(),
                    count: newest.open_unknowns,
                });
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_order_is_total() {
        assert_eq!(ReceiptKind::SourceFixed.prior(), None);
        for w in ReceiptKind::ALL.windows(2) {
            assert_eq!(w[1].prior(), Some(w[0]));
        }
        for k in ReceiptKind::ALL {
            assert_eq!(ReceiptKind::parse(k.as_str()), Some(k));
        }
    }

    #[test]
    fn fields_of_other_layers_are_refused_not_ignored() {
        let d = format!("sha256:{}", "a".repeat(64));
        let req = |kind, revision: Option<&str>, realized: Option<&str>, soak| ReceiptRequest {
            kind,
            change: "c".into(),
            evidence: vec![d.clone()],
            revision: revision.map(Into::into),
            realized_at: realized.map(Into::into),
            soak_ms: soak,
            note: None,
        };
        let t = "2026-12-02T11:00:00Z";
        let cases = [
            (
                req(ReceiptKind::Merged, Some("r"), None, Some(5)),
                "field_not_allowed",
            ),
            (
                req(ReceiptKind::Verified, None, Some(t), None),
                "field_not_allowed",
            ),
            (
                req(ReceiptKind::Realized, Some("r"), Some(t), None),
                "field_not_allowed",
            ),
            (
                req(ReceiptKind::SourceFixed, None, None, None),
                "missing_revision",
            ),
            (
                req(ReceiptKind::Realized, None, None, None),
                "missing_realized_at",
            ),
            (
                req(ReceiptKind::Realized, None, Some("yesterday"), None),
                "invalid_realized_at",
            ),
            (
                req(ReceiptKind::Soaked, None, None, Some(0)),
                "missing_soak",
            ),
        ];
        for (r, rule) in cases {
            assert_eq!(check_request(&r).unwrap_err().rule(), rule, "{r:?}");
        }
    }
}
