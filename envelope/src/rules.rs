//! The closed-world validator.
//!
//! Two layers. [`from_value`] turns strict JSON into the typed model and maps
//! serde's failures onto typed rules (unknown field, missing field, missing
//! identity field, unmapped status, invalid value), stopping at the first. Then
//! [`check_rules`] checks the semantic rules on the typed model and reports
//! every violation, so a fixture can prove it triggers exactly one rule.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::error::EnvelopeError;
use crate::form::{check_schema, is_sha256_digest};
use crate::model::{ClaimKind, Completeness, Envelope, Scope, SurfaceStatus, Termination};

/// Typed envelope from a strictly parsed value, or the first structural error.
pub fn from_value(value: &Value) -> Result<Envelope, EnvelopeError> {
    if !value.is_object() {
        return Err(EnvelopeError::InvalidField {
            path: "$".into(),
            reason: "an envelope is a JSON object".into(),
        });
    }
    check_schema(value)?;
    let _stale = crate::strict::take_facts_failure();
    serde_path_to_error::deserialize(value).map_err(|err| {
        let path = err.path().to_string();
        if let Some(mut typed) = crate::strict::take_facts_failure() {
            typed.prefix_path(&format!("$.{path}"));
            return typed;
        }
        let message = err.inner().to_string();
        classify(value, &path, &message)
    })
}

/// First backtick-quoted word of a serde message.
fn quoted(message: &str) -> String {
    message.split('`').nth(1).unwrap_or_default().to_string()
}

fn classify(value: &Value, path: &str, message: &str) -> EnvelopeError {
    let json_path = if path == "." || path.is_empty() {
        "$".to_string()
    } else {
        format!("$.{path}")
    };
    if message.starts_with("unknown field") {
        // serde_path_to_error's path already ends at the unknown member.
        let field = quoted(message);
        let parent = json_path
            .strip_suffix(&format!(".{field}"))
            .unwrap_or(&json_path)
            .to_string();
        return EnvelopeError::UnknownField {
            path: parent,
            field,
        };
    }
    if path.starts_with("subject") && message.contains(r#"expected "kind" or "identity""#) {
        // serde's adjacently tagged enum reports a stray member this way.
        let field = message.split('"').nth(1).unwrap_or_default().to_string();
        return EnvelopeError::UnknownField {
            path: "$.subject".into(),
            field,
        };
    }
    if message.starts_with("missing field") {
        let field = quoted(message);
        if path.starts_with("subject.identity") || path == "subject" && field != "kind" {
            let kind = value
                .pointer("/subject/kind")
                .and_then(Value::as_str)
                .unwrap_or("?")
                .to_string();
            if field != "identity" {
                return EnvelopeError::MissingIdentityField { kind, field };
            }
        }
        return EnvelopeError::MissingField {
            path: json_path,
            field,
        };
    }
    if message.starts_with("unknown variant") && path.ends_with(".status") {
        return EnvelopeError::UnmappedStatus {
            path: json_path,
            value: quoted(message),
        };
    }
    EnvelopeError::InvalidField {
        path: json_path,
        reason: message.to_string(),
    }
}

fn is_decimal(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 20
        && s.bytes().all(|b| b.is_ascii_digit())
        && s.parse::<u64>().is_ok()
}

/// Every semantic rule, every violation (empty when valid). The digest is
/// checked by [`crate::verify`], not here.
pub fn check_rules(env: &Envelope) -> Vec<EnvelopeError> {
    let mut errors = Vec::new();
    let invalid = |path: &str, reason: &str| EnvelopeError::InvalidField {
        path: path.into(),
        reason: reason.into(),
    };

    if let Some(trigger) = &env.collector.trigger {
        if !crate::model::TRIGGER_KINDS.contains(&trigger.kind.as_str()) {
            errors.push(invalid(
                "$.collector.trigger.kind",
                &format!(
                    "{:?} is not a watch rule kind ({})",
                    trigger.kind,
                    crate::model::TRIGGER_KINDS.join(", ")
                ),
            ));
        }
        if trigger.rule.trim().is_empty() {
            errors.push(invalid("$.collector.trigger.rule", "names no rule"));
        }
        if crate::wall_time::parse(&trigger.fired_at).is_none() {
            errors.push(invalid(
                "$.collector.trigger.fired_at",
                "is not an RFC 3339 UTC time",
            ));
        }
    }
    for field in env.subject.empty_identity_fields() {
        errors.push(EnvelopeError::MissingIdentityField {
            kind: env.subject.kind().into(),
            field: field.into(),
        });
    }
    // Typed integer members must be exact in an IEEE double too (the strict
    // parser enforces this on bytes; this covers envelopes built in memory).
    let mut integers = vec![
        ("$.clock.bundle_deadline_ms", env.clock.bundle_deadline_ms),
        ("$.universe.expected_count", env.universe.expected_count),
        ("$.universe.observed_count", env.universe.observed_count),
        (
            "$.bounds.surface_deadline_ms",
            env.bounds.surface_deadline_ms,
        ),
        ("$.bounds.bundle_deadline_ms", env.bounds.bundle_deadline_ms),
        ("$.bounds.max_threads", env.bounds.max_threads),
        (
            "$.bounds.max_bytes_per_surface",
            env.bounds.max_bytes_per_surface,
        ),
        ("$.bounds.leak_budget", env.bounds.leak_budget),
    ];
    integers.extend(env.bounds.caps.values().map(|v| ("$.bounds.caps", *v)));
    for name in env
        .bounds
        .caps
        .keys()
        .filter(|n| !crate::model::is_cap_name(n))
    {
        errors.push(invalid(
            "$.bounds.caps",
            &format!("cap name {name:?} is not [a-z][a-z0-9_]* or repeats a named bound"),
        ));
    }
    if let crate::model::Subject::Process(p) = &env.subject {
        integers.push(("$.subject.identity.start_ticks", p.start_ticks));
    }
    if let crate::model::Subject::Thread(t) = &env.subject {
        integers.push((
            "$.subject.identity.process.start_ticks",
            t.process.start_ticks,
        ));
    }
    for s in &env.surfaces {
        integers.push(("$.surfaces[].deadline_ms", s.deadline_ms));
        integers.push(("$.surfaces[].elapsed_us", s.elapsed_us));
        integers.push(("$.surfaces[].bytes", s.bytes));
    }
    for (path, v) in integers {
        if v > crate::strict::MAX_SAFE_INTEGER {
            errors.push(EnvelopeError::NumberOutOfRange {
                path: path.into(),
                value: v.to_string(),
            });
        }
    }
    if crate::wall_time::parse(&env.clock.wall_time).is_none() {
        errors.push(invalid(
            "$.clock.wall_time",
            "not RFC 3339 UTC (YYYY-MM-DDTHH:MM:SS[.f]Z)",
        ));
    }
    for (path, v) in [
        ("$.clock.monotonic_start_ns", &env.clock.monotonic_start_ns),
        ("$.clock.monotonic_end_ns", &env.clock.monotonic_end_ns),
    ] {
        if !is_decimal(v) {
            errors.push(invalid(path, "not an unsigned decimal string"));
        }
    }
    if !is_sha256_digest(&env.universe.selector_digest) {
        errors.push(invalid(
            "$.universe.selector_digest",
            "not sha256:<64 lowercase hex>",
        ));
    }

    // Surfaces: unique ids, well-formed digests, causes for errors.
    let mut status_by_id: BTreeMap<&str, SurfaceStatus> = BTreeMap::new();
    for (i, s) in env.surfaces.iter().enumerate() {
        if status_by_id.insert(&s.id, s.status).is_some() {
            errors.push(EnvelopeError::DuplicateId {
                what: "surface".into(),
                id: s.id.clone(),
            });
        }
        if let Some(d) = &s.digest
            && !is_sha256_digest(d)
        {
            errors.push(invalid(
                &format!("$.surfaces[{i}].digest"),
                "not sha256:<64 lowercase hex>",
            ));
        }
        if s.status == SurfaceStatus::Error
            && s.cause.as_ref().is_none_or(|c| c.message.trim().is_empty())
        {
            errors.push(EnvelopeError::ErrorWithoutCause {
                surface: s.id.clone(),
            });
        }
    }

    // Completeness.
    if env.completeness == Completeness::Complete {
        for s in &env.surfaces {
            if s.status != SurfaceStatus::Ok {
                errors.push(EnvelopeError::CompleteWithNonOkSurface {
                    surface: s.id.clone(),
                    status: s.status.as_str().into(),
                });
            } else if s.truncated {
                errors.push(EnvelopeError::CompleteWithTruncatedSurface {
                    surface: s.id.clone(),
                });
            }
        }
        if env.universe.termination != Termination::Exhausted {
            errors.push(EnvelopeError::CompleteWithNonExhaustedUniverse {
                termination: env.universe.termination.as_str().into(),
            });
        }
    }

    // Claims.
    let mut claim_ids = BTreeSet::new();
    for c in &env.claims {
        if !claim_ids.insert(&c.id) {
            errors.push(EnvelopeError::DuplicateId {
                what: "claim".into(),
                id: c.id.clone(),
            });
        }
        if env.completeness == Completeness::IdentityRace && c.kind != ClaimKind::Hypothesis {
            errors.push(EnvelopeError::AttributionInIdentityRace {
                claim: c.id.clone(),
            });
        }
        if c.surfaces.is_empty() {
            errors.push(if c.kind == ClaimKind::Fact {
                EnvelopeError::FactUnbound {
                    claim: c.id.clone(),
                }
            } else {
                EnvelopeError::ClaimUnbound {
                    claim: c.id.clone(),
                    kind: c.kind.as_str().into(),
                }
            });
        }
        if c.kind != ClaimKind::Hypothesis && c.falsifier.is_some() {
            errors.push(EnvelopeError::FalsifierOutsideHypothesis {
                claim: c.id.clone(),
                kind: c.kind.as_str().into(),
            });
        }
        for sid in &c.surfaces {
            match status_by_id.get(sid.as_str()) {
                None => errors.push(EnvelopeError::ClaimCitesMissingSurface {
                    claim: c.id.clone(),
                    surface: sid.clone(),
                }),
                Some(status)
                    if c.kind == ClaimKind::Fact
                        && !matches!(status, SurfaceStatus::Ok | SurfaceStatus::Truncated) =>
                {
                    errors.push(EnvelopeError::FactBoundToNonOkSurface {
                        claim: c.id.clone(),
                        surface: sid.clone(),
                        status: status.as_str().into(),
                    })
                }
                Some(status)
                    if c.kind == ClaimKind::Inference
                        && !matches!(status, SurfaceStatus::Ok | SurfaceStatus::Truncated) =>
                {
                    errors.push(EnvelopeError::InferenceBoundToUnreadSurface {
                        claim: c.id.clone(),
                        surface: sid.clone(),
                        status: status.as_str().into(),
                    })
                }
                Some(_) => {}
            }
        }
        if c.scope == Scope::Universal && env.completeness != Completeness::Complete {
            errors.push(EnvelopeError::UniversalClaimOutsideComplete {
                claim: c.id.clone(),
                completeness: env.completeness.as_str().into(),
            });
        }
        if c.kind == ClaimKind::Hypothesis
            && c.falsifier.as_deref().is_none_or(|f| f.trim().is_empty())
        {
            errors.push(EnvelopeError::HypothesisWithoutFalsifier {
                claim: c.id.clone(),
            });
        }
    }

    // Unknowns.
    let mut unknown_ids = BTreeSet::new();
    for u in &env.unknowns {
        if !unknown_ids.insert(&u.id) {
            errors.push(EnvelopeError::DuplicateId {
                what: "unknown".into(),
                id: u.id.clone(),
            });
        }
        if u.probe.trim().is_empty() {
            errors.push(EnvelopeError::UnknownWithoutProbe {
                unknown: u.id.clone(),
            });
        }
        // The builder's other refusals of an unknown no one could act on.
        for (field, value) in [
            ("owner", &u.owner),
            ("question", &u.question),
            ("blocks", &u.blocks),
        ] {
            if value.trim().is_empty() {
                errors.push(EnvelopeError::UnknownIncomplete {
                    unknown: u.id.clone(),
                    field: field.into(),
                });
            }
        }
        if let Some(sid) = &u.surface
            && !status_by_id.contains_key(sid.as_str())
        {
            errors.push(EnvelopeError::UnknownCitesMissingSurface {
                unknown: u.id.clone(),
                surface: sid.clone(),
            });
        }
    }
    let next = &env.next_transition;
    if next.action.trim().is_empty() {
        errors.push(invalid("$.next_transition.action", "empty"));
    }
    if next.success_receipt.trim().is_empty() {
        errors.push(EnvelopeError::NextWithoutReceipt);
    }
    if next.abort_conditions.iter().all(|a| a.trim().is_empty()) {
        errors.push(EnvelopeError::NextWithoutAbort);
    }
    errors
}
