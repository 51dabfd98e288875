//! The hypothesis ledger (seed 001, agent loop: "after mutation … updated
//! hypothesis state"): per subject, every hypothesis an envelope recorded by
//! a supervised run put forward, whether it stands, was falsified or was
//! confirmed, and the envelopes that moved it. Pure: [`judge`] takes the
//! subject's ledger and one envelope and returns the new rows and the moves;
//! storage is `crate::db::runs`, the edge `pstack_store::http::runs`.
//!
//! A hypothesis is identified across envelopes by its code and the surfaces
//! it binds ([`hypothesis_key`]): claim ids are per capture and statements
//! carry readings (counts, percentages) that change between captures, while
//! the mechanism (code) and the evidence it rests on (surfaces) do not.
//!
//! The rules, from the envelope model (`pstack_envelope::model`) only. Let
//! `E` be an envelope of the subject recorded by a run:
//! - `identity_race`: nothing is attributed to the subject, so `E` moves
//!   nothing.
//! - Every hypothesis claim of `E` is *asserted*: a new one opens
//!   `standing` (rule `opened`); a `falsified` or `confirmed` one goes back
//!   to `standing` (`reopened`, a retraction); a standing one stays, its
//!   statement, falsifier and effects refreshed. Its *effects* are the
//!   `(code, surface)` of every fact of `E` that binds one of its surfaces
//!   (the observation it was put forward to explain).
//! - Only a `complete` or `bounded` `E` judges (a `partial` one asserts but
//!   cannot speak to what it did not read). Each hypothesis standing before
//!   `E` and not asserted by it, in this order:
//!   1. `confirmed_by_claim`: `E` has a fact or inference with its code (or
//!      a code in [`CONFIRMED_BY`]) bound to one of its surfaces — a
//!      collector now reads as evidence what it could only hypothesize →
//!      `confirmed`.
//!   2. Not every surface it binds is in `E`, `ok` and untruncated: `E` did
//!      not read what it rests on → stays `standing`.
//!   3. `falsified_effect_persists`: one of its effects is in `E` again (a
//!      fact of that code on that surface) while the collector, reading the
//!      same surfaces, no longer puts the hypothesis forward — the effect
//!      stands without the mechanism, which is what its falsifier predicts
//!      → `falsified`.
//!   4. `confirmed_effect_removed`: `E` was captured after a mutation, the
//!      hypothesis was opened by an envelope observed no later than that
//!      mutation, it has effects, none is in `E`, and no other hypothesis
//!      standing before `E` shares one of them — the mutation removed the
//!      effect and the one mechanism offered for it → `confirmed`. With a
//!      competing hypothesis over the same effect the intervention cannot
//!      tell them apart: both stay `standing`.
//!   5. Otherwise → stays `standing`.
//!
//! A move out of `standing` into `confirmed` or `falsified` *discriminates*
//! (AC1's "first discriminating observation"); a move out of `confirmed` or
//! `falsified` is a *retraction*.

use std::collections::{BTreeMap, BTreeSet};

use pstack_envelope::{ClaimKind, Completeness, Envelope, SurfaceStatus};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Hypothesis codes and the fact or inference codes that confirm them
/// (pstack's own vocabulary: [`pstack_envelope::ClaimCode`]).
pub const CONFIRMED_BY: [(&str, &str); 1] = [(
    pstack_envelope::ClaimCode::CgroupFrozen.as_str(),
    pstack_envelope::ClaimCode::DStateFromCgroupFreezer.as_str(),
)];

/// Where a hypothesis stands.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum HypothesisState {
    /// Put forward; nothing has killed or confirmed it.
    Standing,
    /// The evidence killed it.
    Falsified,
    /// The evidence confirmed it.
    Confirmed,
}

impl HypothesisState {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            HypothesisState::Standing => "standing",
            HypothesisState::Falsified => "falsified",
            HypothesisState::Confirmed => "confirmed",
        }
    }

    /// From the wire name.
    pub fn parse(s: &str) -> Option<HypothesisState> {
        [
            HypothesisState::Standing,
            HypothesisState::Falsified,
            HypothesisState::Confirmed,
        ]
        .into_iter()
        .find(|h| h.as_str() == s)
    }

    fn judged(self) -> bool {
        self != HypothesisState::Standing
    }
}

/// Which rule moved a hypothesis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum MoveRule {
    /// First asserted.
    Opened,
    /// Asserted again after it was judged.
    Reopened,
    /// A fact or inference with its (or a confirming) code.
    ConfirmedByClaim,
    /// Its effect persists without it.
    FalsifiedEffectPersists,
    /// The mutation removed its effect and it was the only mechanism.
    ConfirmedEffectRemoved,
}

impl MoveRule {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            MoveRule::Opened => "opened",
            MoveRule::Reopened => "reopened",
            MoveRule::ConfirmedByClaim => "confirmed_by_claim",
            MoveRule::FalsifiedEffectPersists => "falsified_effect_persists",
            MoveRule::ConfirmedEffectRemoved => "confirmed_effect_removed",
        }
    }

    /// From the wire name.
    pub fn parse(s: &str) -> Option<MoveRule> {
        [
            MoveRule::Opened,
            MoveRule::Reopened,
            MoveRule::ConfirmedByClaim,
            MoveRule::FalsifiedEffectPersists,
            MoveRule::ConfirmedEffectRemoved,
        ]
        .into_iter()
        .find(|r| r.as_str() == s)
    }
}

/// An observation a hypothesis was put forward to explain: a fact's code
/// on one surface the hypothesis binds.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
pub struct Effect {
    /// The fact's code.
    pub code: String,
    /// The surface both bind.
    pub surface: String,
}

/// One hypothesis of a subject's ledger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Hypothesis {
    /// `h:` + 16 hex digits ([`hypothesis_key`]).
    pub key: String,
    /// The claim code (the mechanism).
    pub code: String,
    /// The statement as last asserted.
    pub statement: String,
    /// The falsifier as last asserted.
    pub falsifier: String,
    /// Surfaces it binds, sorted.
    pub surfaces: Vec<String>,
    /// What it explains, sorted.
    pub effects: Vec<Effect>,
    /// Where it stands.
    pub state: HypothesisState,
    /// Wall time of the envelope that opened (or last reopened) it, ns.
    pub opened_wall_ns: i64,
}

/// One move of one hypothesis by one envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Move {
    /// The hypothesis.
    pub key: String,
    /// Before (`None`: it was not in the ledger).
    pub from: Option<HypothesisState>,
    /// After.
    pub to: HypothesisState,
    /// Why.
    pub rule: MoveRule,
}

impl Move {
    /// [`discriminates`].
    pub fn discriminates(&self) -> bool {
        discriminates(self.from, self.to)
    }

    /// [`retracts`].
    pub fn retracts(&self) -> bool {
        retracts(self.from)
    }
}

/// A move from standing to a judgement: the envelope told hypotheses apart.
pub fn discriminates(from: Option<HypothesisState>, to: HypothesisState) -> bool {
    from == Some(HypothesisState::Standing) && to.judged()
}

/// A move out of a judgement: an earlier conclusion withdrawn.
pub fn retracts(from: Option<HypothesisState>) -> bool {
    from.is_some_and(HypothesisState::judged)
}

/// What one envelope did to a ledger: the rows to store (new or changed)
/// and the moves.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Judgement {
    /// New or changed rows.
    pub rows: Vec<Hypothesis>,
    /// Moves, in key order.
    pub moves: Vec<Move>,
}

/// The key of a hypothesis: `h:` and the first 16 hex digits of
/// SHA-256(code, NUL, each sorted distinct surface id, NUL-separated).
pub fn hypothesis_key(code: &str, surfaces: &[String]) -> String {
    let sorted: BTreeSet<&str> = surfaces.iter().map(String::as_str).collect();
    let mut h = Sha256::new();
    h.update(code.as_bytes());
    for s in sorted {
        h.update([0u8]);
        h.update(s.as_bytes());
    }
    format!("h:{}", &hex::encode(h.finalize())[..16])
}

fn confirms(hypothesis_code: &str, claim_code: &str) -> bool {
    claim_code == hypothesis_code
        || CONFIRMED_BY
            .iter()
            .any(|(h, c)| *h == hypothesis_code && *c == claim_code)
}

/// Judge one envelope `env` (observed at `wall_ns`) of the ledger's
/// subject. `mutation_ns`: when the run mutated the subject, if `env` was
/// captured after that mutation.
pub fn judge(
    ledger: &[Hypothesis],
    env: &Envelope,
    wall_ns: i64,
    mutation_ns: Option<i64>,
) -> Judgement {
    let mut out = Judgement::default();
    if env.completeness == Completeness::IdentityRace {
        return out;
    }
    let by_key: BTreeMap<&str, &Hypothesis> = ledger.iter().map(|h| (h.key.as_str(), h)).collect();
    // Asserted: the first hypothesis claim per key.
    let mut asserted: BTreeMap<String, Hypothesis> = BTreeMap::new();
    for c in env
        .claims
        .iter()
        .filter(|c| c.kind == ClaimKind::Hypothesis)
    {
        let surfaces: Vec<String> = c
            .surfaces
            .iter()
            .cloned()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let key = hypothesis_key(&c.code, &surfaces);
        if asserted.contains_key(&key) {
            continue;
        }
        let effects: Vec<Effect> = env
            .claims
            .iter()
            .filter(|f| f.kind == ClaimKind::Fact)
            .flat_map(|f| {
                f.surfaces
                    .iter()
                    .filter(|s| surfaces.contains(s))
                    .map(|s| Effect {
                        code: f.code.clone(),
                        surface: s.clone(),
                    })
            })
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        asserted.insert(
            key.clone(),
            Hypothesis {
                key,
                code: c.code.clone(),
                statement: c.statement.clone(),
                falsifier: c.falsifier.clone().unwrap_or_default(),
                surfaces,
                effects,
                state: HypothesisState::Standing,
                opened_wall_ns: wall_ns,
            },
        );
    }

    let judging = matches!(
        env.completeness,
        Completeness::Complete | Completeness::Bounded
    );
    let standing: Vec<&Hypothesis> = ledger
        .iter()
        .filter(|h| h.state == HypothesisState::Standing)
        .collect();
    let read_ok: BTreeSet<&str> = env
        .surfaces
        .iter()
        .filter(|s| s.status == SurfaceStatus::Ok && !s.truncated)
        .map(|s| s.id.as_str())
        .collect();
    let mut moved: BTreeMap<String, (Hypothesis, Move)> = BTreeMap::new();
    if judging {
        for h in standing.iter().filter(|h| !asserted.contains_key(&h.key)) {
            let rule = judge_one(h, env, &read_ok, &standing, mutation_ns);
            if let Some(rule) = rule {
                let to = match rule {
                    MoveRule::FalsifiedEffectPersists => HypothesisState::Falsified,
                    _ => HypothesisState::Confirmed,
                };
                let mut row = (*h).clone();
                row.state = to;
                moved.insert(
                    h.key.clone(),
                    (
                        row,
                        Move {
                            key: h.key.clone(),
                            from: Some(HypothesisState::Standing),
                            to,
                            rule,
                        },
                    ),
                );
            }
        }
    }
    for (key, mut new) in asserted {
        match by_key.get(key.as_str()) {
            None => {
                out.moves.push(Move {
                    key: key.clone(),
                    from: None,
                    to: HypothesisState::Standing,
                    rule: MoveRule::Opened,
                });
                out.rows.push(new);
            }
            Some(old) if old.state == HypothesisState::Standing => {
                // Re-asserted: refreshed, not moved; it keeps its opening.
                new.opened_wall_ns = old.opened_wall_ns;
                if new != **old {
                    out.rows.push(new);
                }
            }
            Some(old) => {
                out.moves.push(Move {
                    key: key.clone(),
                    from: Some(old.state),
                    to: HypothesisState::Standing,
                    rule: MoveRule::Reopened,
                });
                out.rows.push(new);
            }
        }
    }
    for (_, (row, m)) in moved {
        out.rows.push(row);
        out.moves.push(m);
    }
    out.moves.sort_by(|a, b| a.key.cmp(&b.key));
    out.rows.sort_by(|a, b| a.key.cmp(&b.key));
    out
}

/// Rules 1–5 for one standing hypothesis `h` not asserted by `env`.
fn judge_one(
    h: &Hypothesis,
    env: &Envelope,
    read_ok: &BTreeSet<&str>,
    standing: &[&Hypothesis],
    mutation_ns: Option<i64>,
) -> Option<MoveRule> {
    let confirmed = env.claims.iter().any(|c| {
        c.kind != ClaimKind::Hypothesis
            && confirms(&h.code, &c.code)
            && c.surfaces.iter().any(|s| h.surfaces.contains(s))
    });
    if confirmed {
        return Some(MoveRule::ConfirmedByClaim);
    }
    if !h.surfaces.iter().all(|s| read_ok.contains(s.as_str())) {
        return None;
    }
    let persists = h.effects.iter().any(|e| {
        env.claims.iter().any(|c| {
            c.kind == ClaimKind::Fact && c.code == e.code && c.surfaces.contains(&e.surface)
        })
    });
    if persists {
        return Some(MoveRule::FalsifiedEffectPersists);
    }
    let after_its_mutation = mutation_ns.is_some_and(|m| h.opened_wall_ns <= m);
    let competing = standing
        .iter()
        .any(|o| o.key != h.key && o.effects.iter().any(|e| h.effects.contains(e)));
    if after_its_mutation && !h.effects.is_empty() && !competing {
        return Some(MoveRule::ConfirmedEffectRemoved);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use pstack_envelope::{Claim, Scope};

    const WALL: i64 = 1_796_000_000_000_000_000;

    /// A complete envelope of one process with `d` threads (tids 11, 12, …)
    /// each in D (a `thread_in_d_state` fact on its stat surface).
    fn env(d_tids: &[u32], completeness: Completeness) -> Envelope {
        let mut c = crate::synthetic::Capture::new("node-a", 10, 1);
        c.blocked = false;
        c.threads = 5;
        let mut e = c.unsealed();
        e.claims.clear();
        for tid in d_tids {
            e.claims.push(Claim {
                id: format!("d{tid}"),
                kind: ClaimKind::Fact,
                code: "thread_in_d_state".into(),
                statement: format!("thread {tid} is in D"),
                surfaces: vec![format!("task/{tid}/stat")],
                scope: Scope::Existential,
                falsifier: None,
            });
        }
        e.completeness = completeness;
        e
    }

    fn hypothesis(code: &str, tid: u32) -> Claim {
        Claim {
            id: format!("{code}-{tid}"),
            kind: ClaimKind::Hypothesis,
            code: code.into(),
            statement: format!("thread {tid}: {code}"),
            surfaces: vec![format!("task/{tid}/stat")],
            scope: Scope::Existential,
            falsifier: Some(format!("thread {tid} stays in D without {code}")),
        }
    }

    fn claim(kind: ClaimKind, code: &str, tid: u32) -> Claim {
        Claim {
            id: format!("{code}-{tid}-c"),
            kind,
            code: code.into(),
            statement: format!("thread {tid}: {code} read"),
            surfaces: vec![format!("task/{tid}/stat")],
            scope: Scope::Existential,
            falsifier: None,
        }
    }

    fn apply(ledger: &mut Vec<Hypothesis>, j: &Judgement) {
        for r in &j.rows {
            match ledger.iter_mut().find(|h| h.key == r.key) {
                Some(h) => *h = r.clone(),
                None => ledger.push(r.clone()),
            }
        }
    }

    /// The ledger after a pre-mutation capture asserting `hyps` on
    /// threads in D.
    fn opened(hyps: &[(&str, u32)]) -> Vec<Hypothesis> {
        let tids: Vec<u32> = hyps.iter().map(|h| h.1).collect();
        let mut e = env(&tids, Completeness::Complete);
        e.claims.extend(hyps.iter().map(|(c, t)| hypothesis(c, *t)));
        let j = judge(&[], &e, WALL, None);
        assert!(j.moves.iter().all(|m| m.rule == MoveRule::Opened));
        let mut ledger = Vec::new();
        apply(&mut ledger, &j);
        ledger
    }

    fn rules(j: &Judgement) -> Vec<(String, &'static str)> {
        j.moves
            .iter()
            .map(|m| (m.key.clone(), m.rule.as_str()))
            .collect()
    }

    fn key(code: &str, tid: u32) -> String {
        hypothesis_key(code, &[format!("task/{tid}/stat")])
    }

    const MUTATED: Option<i64> = Some(WALL + 5);

    /// Each move rule has a fixture that produces exactly it.
    #[test]
    fn every_rule_has_a_fixture_that_produces_exactly_it() {
        type Fixture = Box<dyn Fn() -> Judgement>;
        let cases: Vec<(&str, Fixture)> = vec![
            (
                "opened",
                Box::new(|| {
                    let mut e = env(&[11], Completeness::Partial);
                    e.claims.push(hypothesis("fuse_server_not_answering", 11));
                    judge(&[], &e, WALL, None)
                }),
            ),
            (
                "reopened",
                Box::new(|| {
                    let mut l = opened(&[("fuse_server_not_answering", 11)]);
                    l[0].state = HypothesisState::Falsified;
                    let mut e = env(&[11], Completeness::Complete);
                    e.claims.push(hypothesis("fuse_server_not_answering", 11));
                    judge(&l, &e, WALL + 10, None)
                }),
            ),
            (
                "confirmed_by_claim",
                Box::new(|| {
                    let l = opened(&[("cgroup_frozen", 11)]);
                    let mut e = env(&[11], Completeness::Complete);
                    e.claims.push(claim(
                        ClaimKind::Inference,
                        "d_state_from_cgroup_freezer",
                        11,
                    ));
                    judge(&l, &e, WALL + 10, None)
                }),
            ),
            (
                "falsified_effect_persists",
                Box::new(|| {
                    let l = opened(&[("fuse_server_not_answering", 11)]);
                    judge(&l, &env(&[11], Completeness::Complete), WALL + 10, None)
                }),
            ),
            (
                "confirmed_effect_removed",
                Box::new(|| {
                    let l = opened(&[("fuse_server_not_answering", 11)]);
                    judge(&l, &env(&[], Completeness::Complete), WALL + 10, MUTATED)
                }),
            ),
        ];
        let mut seen = BTreeSet::new();
        for (want, case) in cases {
            let j = case();
            let got: Vec<&str> = j.moves.iter().map(|m| m.rule.as_str()).collect();
            assert_eq!(got, [want], "{want}: {j:?}");
            seen.insert(want);
        }
        for r in [
            MoveRule::Opened,
            MoveRule::Reopened,
            MoveRule::ConfirmedByClaim,
            MoveRule::FalsifiedEffectPersists,
            MoveRule::ConfirmedEffectRemoved,
        ] {
            assert!(seen.contains(r.as_str()), "{} has no fixture", r.as_str());
            assert_eq!(MoveRule::parse(r.as_str()), Some(r));
        }
    }

    #[test]
    fn what_leaves_a_hypothesis_standing() {
        let fuse = "fuse_server_not_answering";
        let l = opened(&[(fuse, 11)]);
        // Re-asserted: no move, even after a mutation.
        let mut e = env(&[11], Completeness::Complete);
        e.claims.push(hypothesis(fuse, 11));
        assert_eq!(judge(&l, &e, WALL + 10, MUTATED).moves, []);
        // A partial envelope asserts but does not judge.
        assert_eq!(
            judge(&l, &env(&[11], Completeness::Partial), WALL + 10, MUTATED).moves,
            []
        );
        // An identity race moves nothing, not even a new hypothesis.
        let mut race = env(&[], Completeness::IdentityRace);
        race.claims.push(hypothesis("cgroup_frozen", 12));
        assert_eq!(judge(&l, &race, WALL + 10, MUTATED), Judgement::default());
        // The surface it rests on was not read ok.
        let mut unread = env(&[], Completeness::Bounded);
        unread
            .surfaces
            .iter_mut()
            .filter(|s| s.id == "task/11/stat")
            .for_each(|s| s.truncated = true);
        assert_eq!(judge(&l, &unread, WALL + 10, MUTATED).moves, []);
        // The effect went away without a mutation: nothing tells why.
        assert_eq!(
            judge(&l, &env(&[], Completeness::Complete), WALL + 10, None).moves,
            []
        );
        // … or the hypothesis was opened after the mutation.
        assert_eq!(
            judge(
                &l,
                &env(&[], Completeness::Complete),
                WALL + 10,
                Some(WALL - 1)
            )
            .moves,
            []
        );
        // Two hypotheses over one effect: the mutation cannot tell them apart.
        let mut both = env(&[11], Completeness::Complete);
        both.claims.push(hypothesis(fuse, 11));
        let mut other = claim(ClaimKind::Hypothesis, "cgroup_frozen", 11);
        other.falsifier = Some("the freezer reads thawed".into());
        both.claims.push(other);
        let two = judge(&[], &both, WALL, None);
        let mut l2 = Vec::new();
        apply(&mut l2, &two);
        assert_eq!(l2.len(), 2);
        assert_eq!(
            judge(&l2, &env(&[], Completeness::Complete), WALL + 10, MUTATED).moves,
            []
        );
    }

    /// One post-mutation envelope falsifies one hypothesis, confirms another
    /// and leaves a third standing.
    #[test]
    fn one_post_mutation_capture_falsifies_confirms_and_leaves_standing() {
        let fuse = "fuse_server_not_answering";
        let frozen = "cgroup_frozen";
        let mut l = opened(&[(fuse, 11), (frozen, 12), (fuse, 13)]);
        let mut post = env(&[11, 12, 13], Completeness::Complete);
        post.claims.push(claim(
            ClaimKind::Inference,
            "d_state_from_cgroup_freezer",
            12,
        ));
        post.claims.push(hypothesis(fuse, 13));
        let j = judge(&l, &post, WALL + 10, MUTATED);
        let mut want = vec![
            (key(fuse, 11), "falsified_effect_persists"),
            (key(frozen, 12), "confirmed_by_claim"),
        ];
        want.sort();
        assert_eq!(rules(&j), want);
        assert!(j.moves.iter().all(Move::discriminates));
        assert!(!j.moves.iter().any(Move::retracts));
        apply(&mut l, &j);
        let state = |k: &str| l.iter().find(|h| h.key == k).unwrap().state;
        assert_eq!(state(&key(fuse, 11)), HypothesisState::Falsified);
        assert_eq!(state(&key(frozen, 12)), HypothesisState::Confirmed);
        assert_eq!(state(&key(fuse, 13)), HypothesisState::Standing);
        // Asserting the falsified one again reopens it: a retraction.
        let mut again = env(&[11], Completeness::Complete);
        again.claims.push(hypothesis(fuse, 11));
        let j = judge(&l, &again, WALL + 20, None);
        let m = j.moves.iter().find(|m| m.key == key(fuse, 11)).unwrap();
        assert!(m.retracts() && !m.discriminates());
    }

    #[test]
    fn keys_ignore_surface_order_and_ids_but_not_code() {
        let a = hypothesis_key("x", &["b".into(), "a".into(), "a".into()]);
        assert_eq!(a, hypothesis_key("x", &["a".into(), "b".into()]));
        assert_ne!(a, hypothesis_key("y", &["a".into(), "b".into()]));
        assert_eq!(a.len(), 18);
        for s in [
            HypothesisState::Standing,
            HypothesisState::Falsified,
            HypothesisState::Confirmed,
        ] {
            assert_eq!(HypothesisState::parse(s.as_str()), Some(s));
        }
    }
}
