//! Deterministic before/after diff of two envelopes of the same subject.
//!
//! Same inputs give byte-identical output: every list is sorted and every map
//! is a `BTreeMap`. Claims are matched by (kind, code, statement) and unknowns
//! by question, because ids are per-capture and carry no meaning across
//! captures. Envelopes of different subjects are refused.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use crate::error::EnvelopeError;
use crate::model::{Completeness, Envelope, SurfaceStatus};

/// What changed between two captures of one subject.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EnvelopeDiff {
    /// The subject, described.
    pub subject: String,
    /// Digest of the earlier envelope.
    pub before: String,
    /// Digest of the later envelope.
    pub after: String,
    /// Completeness before and after, when it changed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completeness: Option<(Completeness, Completeness)>,
    /// Surface ids only in `after`.
    pub surfaces_added: Vec<String>,
    /// Surface ids only in `before`.
    pub surfaces_removed: Vec<String>,
    /// Surfaces whose status changed.
    pub status_changed: Vec<StatusChange>,
    /// Top-level facts that changed, per surface.
    pub facts_changed: Vec<FactChange>,
    /// Claims only in `after`, as `kind:code: statement`.
    pub claims_new: Vec<String>,
    /// Claims only in `before`.
    pub claims_resolved: Vec<String>,
    /// Unknown questions only in `after`.
    pub unknowns_new: Vec<String>,
    /// Unknown questions only in `before` (answered or no longer blocking).
    pub unknowns_resolved: Vec<String>,
}

/// One surface's status change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StatusChange {
    /// Surface id.
    pub surface: String,
    /// Before.
    pub before: SurfaceStatus,
    /// After.
    pub after: SurfaceStatus,
}

/// One fact's change within a surface present in both envelopes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FactChange {
    /// Surface id.
    pub surface: String,
    /// Fact name.
    pub fact: String,
    /// Value before (absent when added).
    pub before: Option<Value>,
    /// Value after (absent when removed).
    pub after: Option<Value>,
}

impl EnvelopeDiff {
    /// True when nothing but the digests differ.
    pub fn is_empty(&self) -> bool {
        self.completeness.is_none()
            && self.surfaces_added.is_empty()
            && self.surfaces_removed.is_empty()
            && self.status_changed.is_empty()
            && self.facts_changed.is_empty()
            && self.claims_new.is_empty()
            && self.claims_resolved.is_empty()
            && self.unknowns_new.is_empty()
            && self.unknowns_resolved.is_empty()
    }

    /// Human-readable rendering, one change per line.
    pub fn render(&self) -> String {
        let mut out = format!(
            "diff of {}\n  before {}\n  after  {}\n",
            self.subject, self.before, self.after
        );
        if self.is_empty() {
            out.push_str("  no change\n");
            return out;
        }
        if let Some((b, a)) = self.completeness {
            out.push_str(&format!(
                "  completeness: {} -> {}\n",
                b.as_str(),
                a.as_str()
            ));
        }
        for s in &self.surfaces_added {
            out.push_str(&format!("  + surface {s}\n"));
        }
        for s in &self.surfaces_removed {
            out.push_str(&format!("  - surface {s}\n"));
        }
        for c in &self.status_changed {
            out.push_str(&format!(
                "  ~ surface {}: {} -> {}\n",
                c.surface, c.before, c.after
            ));
        }
        for f in &self.facts_changed {
            out.push_str(&render_fact_change(f));
        }
        for c in &self.claims_new {
            out.push_str(&format!("  + claim {c}\n"));
        }
        for c in &self.claims_resolved {
            out.push_str(&format!("  - claim {c}\n"));
        }
        for u in &self.unknowns_new {
            out.push_str(&format!("  + unknown {u}\n"));
        }
        for u in &self.unknowns_resolved {
            out.push_str(&format!("  - unknown {u}\n"));
        }
        out
    }
}

/// Longest one-line `before -> after` before a change is shown item by item.
const ONE_LINE: usize = 120;

/// One fact's change: on one line when short; a list as the items removed
/// and added, an object as the members that changed (one per line), so a
/// 1,000-entry fd list that gained one descriptor shows one line, not two
/// copies of the list.
fn render_fact_change(f: &FactChange) -> String {
    let show = |v: &Option<Value>| v.as_ref().map_or("(absent)".to_string(), Value::to_string);
    let (before, after) = (show(&f.before), show(&f.after));
    let head = format!("  ~ fact {}/{}", f.surface, f.fact);
    if before.len() + after.len() <= ONE_LINE {
        return format!("{head}: {before} -> {after}\n");
    }
    let mut out = String::new();
    match (&f.before, &f.after) {
        (Some(Value::Array(b)), Some(Value::Array(a))) => {
            let texts = |v: &[Value]| v.iter().map(Value::to_string).collect::<Vec<_>>();
            let (bt, at) = (texts(b), texts(a));
            let (bs, as_): (
                std::collections::BTreeSet<&String>,
                std::collections::BTreeSet<&String>,
            ) = (bt.iter().collect(), at.iter().collect());
            out.push_str(&format!("{head}: {} -> {} items\n", b.len(), a.len()));
            for t in bt.iter().filter(|t| !as_.contains(t)) {
                out.push_str(&format!("      - {t}\n"));
            }
            for t in at.iter().filter(|t| !bs.contains(t)) {
                out.push_str(&format!("      + {t}\n"));
            }
        }
        (Some(Value::Object(b)), Some(Value::Object(a))) => {
            out.push_str(&format!("{head}:\n"));
            let keys: std::collections::BTreeSet<&String> = b.keys().chain(a.keys()).collect();
            for k in keys {
                let (bv, av) = (b.get(k), a.get(k));
                if bv != av {
                    let show1 =
                        |v: Option<&Value>| v.map_or("(absent)".to_string(), Value::to_string);
                    out.push_str(&format!("      {k}: {} -> {}\n", show1(bv), show1(av)));
                }
            }
        }
        _ => {
            out.push_str(&format!(
                "{head}:\n      before {before}\n      after  {after}\n"
            ));
        }
    }
    out
}

fn only_in(a: &BTreeMap<String, ()>, b: &BTreeMap<String, ()>) -> Vec<String> {
    a.keys().filter(|k| !b.contains_key(*k)).cloned().collect()
}

/// Diff two envelopes of the same subject.
pub fn diff(before: &Envelope, after: &Envelope) -> Result<EnvelopeDiff, EnvelopeError> {
    if before.subject != after.subject {
        return Err(EnvelopeError::SubjectMismatch {
            before: before.subject.describe(),
            after: after.subject.describe(),
        });
    }
    let b_surfaces: BTreeMap<&str, _> =
        before.surfaces.iter().map(|s| (s.id.as_str(), s)).collect();
    let a_surfaces: BTreeMap<&str, _> = after.surfaces.iter().map(|s| (s.id.as_str(), s)).collect();

    let mut surfaces_added = Vec::new();
    let mut surfaces_removed = Vec::new();
    let mut status_changed = Vec::new();
    let mut facts_changed = Vec::new();
    for (id, a) in &a_surfaces {
        match b_surfaces.get(id) {
            None => surfaces_added.push(id.to_string()),
            Some(b) => {
                if a.status != b.status {
                    status_changed.push(StatusChange {
                        surface: id.to_string(),
                        before: b.status,
                        after: a.status,
                    });
                }
                let names: std::collections::BTreeSet<&String> =
                    a.facts.keys().chain(b.facts.keys()).collect();
                for name in names {
                    let (bv, av) = (b.facts.get(name), a.facts.get(name));
                    if bv != av {
                        facts_changed.push(FactChange {
                            surface: id.to_string(),
                            fact: name.clone(),
                            before: bv.cloned(),
                            after: av.cloned(),
                        });
                    }
                }
            }
        }
    }
    for id in b_surfaces.keys() {
        if !a_surfaces.contains_key(id) {
            surfaces_removed.push(id.to_string());
        }
    }

    let claim_keys = |e: &Envelope| -> BTreeMap<String, ()> {
        e.claims
            .iter()
            .map(|c| {
                (
                    format!("{}:{}: {}", c.kind.as_str(), c.code, c.statement),
                    (),
                )
            })
            .collect()
    };
    let unknown_keys = |e: &Envelope| -> BTreeMap<String, ()> {
        e.unknowns
            .iter()
            .map(|u| (u.question.clone(), ()))
            .collect()
    };
    let (bc, ac) = (claim_keys(before), claim_keys(after));
    let (bu, au) = (unknown_keys(before), unknown_keys(after));

    Ok(EnvelopeDiff {
        subject: after.subject.describe(),
        before: before.digest.clone(),
        after: after.digest.clone(),
        completeness: (before.completeness != after.completeness)
            .then_some((before.completeness, after.completeness)),
        surfaces_added,
        surfaces_removed,
        status_changed,
        facts_changed,
        claims_new: only_in(&ac, &bc),
        claims_resolved: only_in(&bc, &ac),
        unknowns_new: only_in(&au, &bu),
        unknowns_resolved: only_in(&bu, &au),
    })
}

#[cfg(test)]
mod render_tests {
    use super::*;
    use serde_json::json;

    fn change(before: Value, after: Value) -> String {
        render_fact_change(&FactChange {
            surface: "proc/fd".into(),
            fact: "fds".into(),
            before: Some(before),
            after: Some(after),
        })
    }

    /// Issue 19: the text diff printed a whole fd list as one ~1.5 KB line per side.
    #[test]
    fn a_long_list_shows_only_what_was_added_and_removed() {
        let fds: Vec<Value> = (0..40)
            .map(|n| json!({"fd": n, "target": format!("/var/lib/app/data-{n}.db")}))
            .collect();
        let mut after = fds.clone();
        after.remove(3);
        after.push(json!({"fd": 99, "target": "socket:[12345]"}));
        let text = change(Value::Array(fds), Value::Array(after));
        assert_eq!(
            text,
            "  ~ fact proc/fd/fds: 40 -> 40 items\n      - {\"fd\":3,\"target\":\"/var/lib/app/data-3.db\"}\n      + {\"fd\":99,\"target\":\"socket:[12345]\"}\n"
        );
        assert!(text.lines().all(|l| l.len() < 100), "{text}");
    }

    #[test]
    fn a_long_object_shows_the_members_that_changed() {
        let before = json!({"cgroup": "x".repeat(150), "pid": 1, "comm": "a"});
        let after = json!({"cgroup": "x".repeat(150), "pid": 1, "comm": "b"});
        assert_eq!(
            change(before, after),
            "  ~ fact proc/fd/fds:\n      comm: \"a\" -> \"b\"\n"
        );
        assert_eq!(change(json!(1), json!(2)), "  ~ fact proc/fd/fds: 1 -> 2\n");
    }
}
