//! The envelope builder: surfaces, claims and unknowns are added one at a
//! time and each misuse is refused when it is added, with its own typed
//! [`BuildError`] — not found afterwards by the validator.
//!
//! Invariants:
//! - **A claim binds only what can bear it.** Every surface a claim binds was
//!   added before it; a fact or inference binds only surfaces that were read
//!   (`ok` or `truncated`); a surface added with
//!   [`EnvelopeBuilder::hypothesis_surface`] (CPU load, say) bears only
//!   hypotheses; a hypothesis carries a falsifier and nothing else does.
//! - **One completeness rule** for every subject kind
//!   ([`EnvelopeBuilder::completeness`]): `identity_race` when declared;
//!   else `partial` when a surface was not read; else `bounded` when a
//!   surface was truncated or the universe was cut; else `complete`.
//!   A universal claim is refused at [`EnvelopeBuilder::seal`] unless the
//!   envelope is complete.
//! - **Every unknown is actionable**: an owner, a probe and the transition
//!   it blocks, and a surface it names exists. The next transition has a
//!   success receipt and at least one abort condition.
//! - Pure, like the rest of the crate: no clock, no I/O; the caller passes
//!   the clock and universe in. [`EnvelopeBuilder::seal`] still runs every
//!   validator rule ([`Envelope::seal`]) on the result.

use std::collections::{BTreeMap, BTreeSet};

use crate::{
    Bounds, Claim, ClaimKind, Clock, Collector, Completeness, Envelope, NextTransition, Rejection,
    SCHEMA_ID, Scope, Subject, Surface, SurfaceStatus, Termination, Universe, Unknown,
};

/// A misuse the builder refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// Two surfaces with one id.
    #[error("surface {id} added twice")]
    DuplicateSurface {
        /// The id.
        id: String,
    },
    /// Two claims (or two unknowns) with one id.
    #[error("{what} id {id} used twice")]
    DuplicateId {
        /// `claim` or `unknown`.
        what: &'static str,
        /// The id.
        id: String,
    },
    /// A claim binds no surface.
    #[error("claim {claim} binds no surface")]
    ClaimWithoutSurface {
        /// The claim id.
        claim: String,
    },
    /// A claim binds a surface that was not added (yet).
    #[error("claim {claim} binds {surface}, which is not a surface of this envelope")]
    NoSuchSurface {
        /// The claim id.
        claim: String,
        /// The surface id.
        surface: String,
    },
    /// A fact or inference binds a surface that was not read.
    #[error("{kind} {claim} binds {surface}, which was not read (status {status})")]
    UnreadSurface {
        /// The claim id.
        claim: String,
        /// `fact` or `inference`.
        kind: &'static str,
        /// The surface id.
        surface: String,
        /// Its status.
        status: SurfaceStatus,
    },
    /// A fact or inference binds a hypothesis-only surface.
    #[error("{kind} {claim} binds {surface}, which bears only hypotheses")]
    HypothesisOnlySurface {
        /// The claim id.
        claim: String,
        /// `fact` or `inference`.
        kind: &'static str,
        /// The surface id.
        surface: String,
    },
    /// A hypothesis without a falsifier.
    #[error("hypothesis {claim} has no falsifier")]
    HypothesisWithoutFalsifier {
        /// The claim id.
        claim: String,
    },
    /// A fact or inference with a falsifier.
    #[error("{kind} {claim} carries a falsifier; only a hypothesis does")]
    FalsifierOutsideHypothesis {
        /// The claim id.
        claim: String,
        /// `fact` or `inference`.
        kind: &'static str,
    },
    /// A universal claim in an envelope that is not complete.
    #[error("universal claim {claim} in a {completeness} envelope")]
    UniversalNotComplete {
        /// The claim id.
        claim: String,
        /// The completeness it would have.
        completeness: &'static str,
    },
    /// An unknown with an empty owner, probe, question or blocked transition.
    #[error("unknown {unknown} has an empty {field}")]
    UnknownIncomplete {
        /// The unknown id.
        unknown: String,
        /// Which field is empty.
        field: &'static str,
    },
    /// An unknown names a surface that was not added.
    #[error("unknown {unknown} names {surface}, which is not a surface of this envelope")]
    UnknownOnNoSuchSurface {
        /// The unknown id.
        unknown: String,
        /// The surface id.
        surface: String,
    },
    /// The next transition has no success receipt.
    #[error("next transition {action} has no success receipt")]
    NextWithoutReceipt {
        /// Its action.
        action: String,
    },
    /// The next transition has no abort condition.
    #[error("next transition {action} has no abort condition")]
    NextWithoutAbort {
        /// Its action.
        action: String,
    },
    /// A cap declared with a name that is not `[a-z][a-z0-9_]*`, or that
    /// repeats one of the five named bounds.
    #[error("cap name {name:?} is not [a-z][a-z0-9_]* or repeats a named bound")]
    BadCapName {
        /// The name.
        name: String,
    },
    /// One cap declared twice with two values.
    #[error("cap {name} declared as {first} and as {second}")]
    CapTwice {
        /// The name.
        name: String,
        /// The value first declared.
        first: u64,
        /// The value declared again.
        second: u64,
    },
    /// The validator refused the result (a rule this builder does not check).
    #[error("the validator refused the envelope: {0}")]
    Rejected(#[from] Rejection),
}

/// Builds one envelope; see the module doc for what it refuses.
#[derive(Debug, Clone)]
pub struct EnvelopeBuilder {
    subject: Subject,
    collector: Collector,
    clock: Clock,
    universe: Universe,
    bounds: Bounds,
    surfaces: Vec<Surface>,
    hypothesis_only: BTreeSet<String>,
    claims: Vec<Claim>,
    unknowns: Vec<Unknown>,
    identity_race: bool,
}

fn read(status: SurfaceStatus) -> bool {
    matches!(status, SurfaceStatus::Ok | SurfaceStatus::Truncated)
}

impl EnvelopeBuilder {
    /// Start an envelope of `subject`.
    pub fn new(
        subject: Subject,
        collector: Collector,
        clock: Clock,
        universe: Universe,
        bounds: Bounds,
    ) -> EnvelopeBuilder {
        EnvelopeBuilder {
            subject,
            collector,
            clock,
            universe,
            bounds,
            surfaces: Vec::new(),
            hypothesis_only: BTreeSet::new(),
            claims: Vec::new(),
            unknowns: Vec::new(),
            identity_race: false,
        }
    }

    /// Add a surface.
    pub fn surface(&mut self, s: Surface) -> Result<&mut Self, BuildError> {
        if self.surfaces.iter().any(|x| x.id == s.id) {
            return Err(BuildError::DuplicateSurface { id: s.id });
        }
        self.surfaces.push(s);
        Ok(self)
    }

    /// Add a surface that may bind hypotheses only (e.g. host CPU load
    /// under a stream's envelope).
    pub fn hypothesis_surface(&mut self, s: Surface) -> Result<&mut Self, BuildError> {
        let id = s.id.clone();
        self.surface(s)?;
        self.hypothesis_only.insert(id);
        Ok(self)
    }

    /// Declare a cap in force beyond the five every envelope names
    /// ([`Bounds::caps`]). Declaring one cap twice with the same value is
    /// harmless; with another value it is refused.
    pub fn cap(&mut self, name: &str, value: u64) -> Result<&mut Self, BuildError> {
        if !crate::model::is_cap_name(name) {
            return Err(BuildError::BadCapName { name: name.into() });
        }
        match self.bounds.caps.get(name) {
            Some(&first) if first != value => Err(BuildError::CapTwice {
                name: name.into(),
                first,
                second: value,
            }),
            _ => {
                self.bounds.caps.insert(name.into(), value);
                Ok(self)
            }
        }
    }

    /// Declare that the subject's identity changed between the reads.
    pub fn identity_race(&mut self) -> &mut Self {
        self.identity_race = true;
        self
    }

    /// Add a claim; refused when it binds what cannot bear it.
    pub fn claim(&mut self, c: Claim) -> Result<&mut Self, BuildError> {
        if self.claims.iter().any(|x| x.id == c.id) {
            return Err(BuildError::DuplicateId {
                what: "claim",
                id: c.id,
            });
        }
        if c.surfaces.is_empty() {
            return Err(BuildError::ClaimWithoutSurface { claim: c.id });
        }
        let kind = c.kind.as_str();
        match (c.kind, &c.falsifier) {
            (ClaimKind::Hypothesis, None) => {
                return Err(BuildError::HypothesisWithoutFalsifier { claim: c.id });
            }
            (ClaimKind::Fact | ClaimKind::Inference, Some(_)) => {
                return Err(BuildError::FalsifierOutsideHypothesis { claim: c.id, kind });
            }
            _ => {}
        }
        let statuses: BTreeMap<&str, SurfaceStatus> = self
            .surfaces
            .iter()
            .map(|s| (s.id.as_str(), s.status))
            .collect();
        for id in &c.surfaces {
            let Some(status) = statuses.get(id.as_str()).copied() else {
                return Err(BuildError::NoSuchSurface {
                    claim: c.id,
                    surface: id.clone(),
                });
            };
            if c.kind == ClaimKind::Hypothesis {
                continue;
            }
            if !read(status) {
                return Err(BuildError::UnreadSurface {
                    claim: c.id,
                    kind,
                    surface: id.clone(),
                    status,
                });
            }
            if self.hypothesis_only.contains(id) {
                return Err(BuildError::HypothesisOnlySurface {
                    claim: c.id,
                    kind,
                    surface: id.clone(),
                });
            }
        }
        self.claims.push(c);
        Ok(self)
    }

    /// Add an unknown; refused when it cannot be acted on.
    pub fn unknown(&mut self, u: Unknown) -> Result<&mut Self, BuildError> {
        if self.unknowns.iter().any(|x| x.id == u.id) {
            return Err(BuildError::DuplicateId {
                what: "unknown",
                id: u.id,
            });
        }
        for (field, value) in [
            ("owner", &u.owner),
            ("probe", &u.probe),
            ("question", &u.question),
            ("blocks", &u.blocks),
        ] {
            if value.trim().is_empty() {
                return Err(BuildError::UnknownIncomplete {
                    unknown: u.id,
                    field,
                });
            }
        }
        if let Some(s) = &u.surface
            && !self.surfaces.iter().any(|x| x.id == *s)
        {
            return Err(BuildError::UnknownOnNoSuchSurface {
                unknown: u.id.clone(),
                surface: s.clone(),
            });
        }
        self.unknowns.push(u);
        Ok(self)
    }

    /// The one completeness rule (see the module doc).
    pub fn completeness(&self) -> Completeness {
        if self.identity_race {
            Completeness::IdentityRace
        } else if self.surfaces.iter().any(|s| !read(s.status)) {
            Completeness::Partial
        } else if self
            .surfaces
            .iter()
            .any(|s| s.truncated || s.status == SurfaceStatus::Truncated)
            || self.universe.termination != Termination::Exhausted
        {
            Completeness::Bounded
        } else {
            Completeness::Complete
        }
    }

    /// Seal with `next` as the one next transition.
    pub fn seal(self, next: NextTransition) -> Result<Envelope, BuildError> {
        if next.success_receipt.trim().is_empty() {
            return Err(BuildError::NextWithoutReceipt {
                action: next.action,
            });
        }
        if next.abort_conditions.iter().all(|a| a.trim().is_empty()) {
            return Err(BuildError::NextWithoutAbort {
                action: next.action,
            });
        }
        let completeness = self.completeness();
        if completeness != Completeness::Complete
            && let Some(c) = self.claims.iter().find(|c| c.scope == Scope::Universal)
        {
            return Err(BuildError::UniversalNotComplete {
                claim: c.id.clone(),
                completeness: completeness.as_str(),
            });
        }
        let env = Envelope {
            schema: SCHEMA_ID.into(),
            completeness,
            subject: self.subject,
            collector: self.collector,
            clock: self.clock,
            universe: self.universe,
            bounds: self.bounds,
            surfaces: self.surfaces,
            claims: self.claims,
            unknowns: self.unknowns,
            next_transition: next,
            digest: String::new(),
        };
        Ok(env.seal()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Map;

    fn surface(id: &str, status: SurfaceStatus) -> Surface {
        Surface {
            id: id.into(),
            authority: format!("test:{id}"),
            status,
            cause: (status != SurfaceStatus::Ok).then(|| crate::StatusCause {
                errno: None,
                message: "not read".into(),
            }),
            deadline_ms: 100,
            elapsed_us: 1,
            digest: None,
            bytes: 0,
            truncated: status == SurfaceStatus::Truncated,
            facts: Map::new(),
        }
    }

    fn claim(id: &str, kind: ClaimKind, binds: &[&str]) -> Claim {
        Claim {
            id: id.into(),
            kind,
            code: "test_code".into(),
            statement: "a statement".into(),
            surfaces: binds.iter().map(|s| s.to_string()).collect(),
            scope: Scope::Existential,
            falsifier: (kind == ClaimKind::Hypothesis).then(|| "an observation".into()),
        }
    }

    fn unknown(id: &str) -> Unknown {
        Unknown {
            id: id.into(),
            question: "what?".into(),
            blocks: "CLASSIFY".into(),
            owner: "node operator".into(),
            probe: "look".into(),
            surface: None,
        }
    }

    fn next() -> NextTransition {
        NextTransition {
            action: "CAPTURE_AGAIN".into(),
            success_receipt: "a second envelope".into(),
            abort_conditions: vec!["the subject changes".into()],
        }
    }

    fn builder() -> EnvelopeBuilder {
        let e = crate::example::example_unsealed();
        let mut b = EnvelopeBuilder::new(e.subject, e.collector, e.clock, e.universe, e.bounds);
        b.surface(surface("read", SurfaceStatus::Ok)).unwrap();
        b.surface(surface("late", SurfaceStatus::Timeout)).unwrap();
        b.hypothesis_surface(surface("host/cpu", SurfaceStatus::Ok))
            .unwrap();
        b
    }

    /// Every misuse the builder refuses, each with its own typed error.
    #[test]
    fn every_misuse_is_refused_when_added_with_its_typed_error() {
        let mut b = builder();
        let e = b.surface(surface("read", SurfaceStatus::Ok)).unwrap_err();
        assert!(matches!(e, BuildError::DuplicateSurface { .. }), "{e}");
        let e = b.claim(claim("c1", ClaimKind::Fact, &[])).unwrap_err();
        assert!(matches!(e, BuildError::ClaimWithoutSurface { .. }), "{e}");
        let e = b
            .claim(claim("c1", ClaimKind::Fact, &["nope"]))
            .unwrap_err();
        assert!(matches!(e, BuildError::NoSuchSurface { .. }), "{e}");
        let e = b
            .claim(claim("c1", ClaimKind::Fact, &["late"]))
            .unwrap_err();
        assert!(
            matches!(
                e,
                BuildError::UnreadSurface {
                    status: SurfaceStatus::Timeout,
                    ..
                }
            ),
            "{e}"
        );
        let e = b
            .claim(claim("c1", ClaimKind::Inference, &["host/cpu"]))
            .unwrap_err();
        assert!(matches!(e, BuildError::HypothesisOnlySurface { .. }), "{e}");
        let mut h = claim("c1", ClaimKind::Hypothesis, &["host/cpu"]);
        h.falsifier = None;
        let e = b.claim(h).unwrap_err();
        assert!(
            matches!(e, BuildError::HypothesisWithoutFalsifier { .. }),
            "{e}"
        );
        let mut f = claim("c1", ClaimKind::Fact, &["read"]);
        f.falsifier = Some("x".into());
        let e = b.claim(f).unwrap_err();
        assert!(
            matches!(e, BuildError::FalsifierOutsideHypothesis { .. }),
            "{e}"
        );
        b.claim(claim("c1", ClaimKind::Fact, &["read"])).unwrap();
        let e = b
            .claim(claim("c1", ClaimKind::Fact, &["read"]))
            .unwrap_err();
        assert!(
            matches!(e, BuildError::DuplicateId { what: "claim", .. }),
            "{e}"
        );
        for field in ["owner", "probe", "question", "blocks"] {
            let mut u = unknown("u1");
            match field {
                "owner" => u.owner = " ".into(),
                "probe" => u.probe = String::new(),
                "question" => u.question = String::new(),
                _ => u.blocks = String::new(),
            }
            let e = b.unknown(u).unwrap_err();
            assert_eq!(
                e,
                BuildError::UnknownIncomplete {
                    unknown: "u1".into(),
                    field
                }
            );
        }
        let mut u = unknown("u1");
        u.surface = Some("nope".into());
        let e = b.unknown(u).unwrap_err();
        assert!(
            matches!(e, BuildError::UnknownOnNoSuchSurface { .. }),
            "{e}"
        );
        b.unknown(unknown("u1")).unwrap();
        let e = b.unknown(unknown("u1")).unwrap_err();
        assert!(
            matches!(
                e,
                BuildError::DuplicateId {
                    what: "unknown",
                    ..
                }
            ),
            "{e}"
        );

        let mut n = next();
        n.success_receipt = String::new();
        let e = b.clone().seal(n).unwrap_err();
        assert!(matches!(e, BuildError::NextWithoutReceipt { .. }), "{e}");
        let mut n = next();
        n.abort_conditions.clear();
        let e = b.clone().seal(n).unwrap_err();
        assert!(matches!(e, BuildError::NextWithoutAbort { .. }), "{e}");
        let mut universal = claim("c2", ClaimKind::Fact, &["read"]);
        universal.scope = Scope::Universal;
        b.claim(universal).unwrap();
        let e = b.clone().seal(next()).unwrap_err();
        assert_eq!(
            e,
            BuildError::UniversalNotComplete {
                claim: "c2".into(),
                completeness: "partial"
            }
        );
    }

    #[test]
    fn one_completeness_rule_and_a_valid_seal() {
        let e = crate::example::example_unsealed();
        let fresh = || {
            EnvelopeBuilder::new(
                e.subject.clone(),
                e.collector.clone(),
                e.clock.clone(),
                e.universe.clone(),
                e.bounds.clone(),
            )
        };
        let mut b = fresh();
        b.surface(surface("a", SurfaceStatus::Ok)).unwrap();
        assert_eq!(b.completeness(), Completeness::Complete);
        let mut universal = claim("c1", ClaimKind::Fact, &["a"]);
        universal.scope = Scope::Universal;
        b.claim(universal).unwrap();
        let sealed = b.clone().seal(next()).unwrap();
        assert_eq!(
            crate::verify(sealed.to_json_pretty().as_slice()).unwrap(),
            sealed
        );
        b.surface(surface("t", SurfaceStatus::Truncated)).unwrap();
        assert_eq!(b.completeness(), Completeness::Bounded);
        b.surface(surface("d", SurfaceStatus::PermissionDenied))
            .unwrap();
        assert_eq!(b.completeness(), Completeness::Partial);
        b.identity_race();
        assert_eq!(b.completeness(), Completeness::IdentityRace);
        let mut cut = fresh();
        cut.universe.termination = Termination::Cap;
        assert_eq!(cut.completeness(), Completeness::Bounded);
    }

    #[test]
    fn caps_are_declared_by_name_and_misnamed_or_conflicting_caps_are_refused() {
        let mut b = builder();
        b.cap("max_fds", 1024).unwrap();
        b.cap("max_fds", 1024).unwrap();
        assert_eq!(
            b.cap("max_fds", 7).unwrap_err(),
            BuildError::CapTwice {
                name: "max_fds".into(),
                first: 1024,
                second: 7
            }
        );
        for bad in ["", "Max", "9lives", "max-fds", "max_threads", "leak_budget"] {
            assert_eq!(
                b.cap(bad, 1).unwrap_err(),
                BuildError::BadCapName { name: bad.into() },
                "{bad:?}"
            );
        }
        let sealed = b.seal(next()).unwrap();
        assert_eq!(sealed.bounds.caps.get("max_fds"), Some(&1024));
        // The fast digest (fields streamed as declared) and the general one
        // (a JSON value, members sorted) agree with caps present.
        assert_eq!(
            sealed.digest,
            crate::compute_digest(&serde_json::to_value(&sealed).unwrap()).unwrap()
        );
        // Declared caps survive the strict parser and the digest.
        assert_eq!(
            crate::verify(sealed.to_json_pretty().as_slice()).unwrap(),
            sealed
        );
        // A cap smuggled in with a bad name is refused by the validator too.
        let mut e = crate::example::example_unsealed();
        e.bounds.caps.insert("Bad Name".into(), 1);
        assert!(e.seal().is_err());
    }
}
