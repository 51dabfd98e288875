//! Verify's fast path (one pass over canonical bytes) against the general
//! path (typed parse, strict parse, canonical re-rendering): the same verdict
//! on every input — valid sealed envelopes, their non-canonical renderings,
//! and hostile mutations of both.

use proptest::prelude::*;
use pstack_envelope::{
    Envelope, Rejection, VerifiedSummary, example::example_sealed, verify_canonical, verify_digest,
    verify_digest_fast, verify_general, verify_summary, verify_summary_fast,
};
use serde_json::{Value, json};

use crate::properties::mutation_fuzz::{self, mutation};
use crate::properties::{envelope, scramble};

/// Both paths on `bytes`: `verify` equals the general path, and where the fast
/// path decides it decides the same. Returns whether the fast path decided.
#[track_caller]
pub fn check_same_verdict(bytes: &[u8]) -> bool {
    let general = verify_general(bytes);
    let combined = pstack_envelope::verify(bytes);
    assert_eq!(
        combined,
        general,
        "verify and the general path disagree on {}",
        String::from_utf8_lossy(bytes)
    );
    // The digest-only path (issue 31): the single pass says yes only where
    // the general path does, with its digest; `verify_digest` returns the
    // general path's verdict.
    let general_digest = general.as_ref().map(|e| e.digest.clone());
    assert_eq!(
        verify_digest(bytes).map(|d| d.to_string()),
        general_digest.clone().map_err(Clone::clone),
        "verify_digest and the general path disagree on {}",
        String::from_utf8_lossy(bytes)
    );
    if let Some(d) = verify_digest_fast(bytes) {
        assert_eq!(
            Ok(d.to_string()),
            general_digest.clone(),
            "the digest-only pass and the general path disagree on {}",
            String::from_utf8_lossy(bytes)
        );
    }
    // The summary path (what the store indexes, issue 31 item 5): the same
    // verdict and the same extracted members as the general path's model;
    // its single pass decides exactly where the digest-only pass does.
    let general_summary = general.clone().and_then(VerifiedSummary::of);
    assert_eq!(
        verify_summary(bytes),
        general_summary,
        "verify_summary and the general path disagree on {}",
        String::from_utf8_lossy(bytes)
    );
    let fast_summary = verify_summary_fast(bytes);
    assert_eq!(
        fast_summary.as_ref().map(|s| s.digest),
        verify_digest_fast(bytes),
        "the summary pass and the digest-only pass decide different inputs: {}",
        String::from_utf8_lossy(bytes)
    );
    if let Some(s) = fast_summary {
        assert_eq!(
            Ok(s),
            general_summary,
            "the summary pass and the general path disagree on {}",
            String::from_utf8_lossy(bytes)
        );
    }
    match verify_canonical(bytes) {
        Some(fast) => {
            assert_eq!(
                fast,
                general,
                "fast and general paths disagree on {}",
                String::from_utf8_lossy(bytes)
            );
            true
        }
        None => false,
    }
}

fn rules(r: &Result<Envelope, Rejection>) -> Vec<&'static str> {
    match r {
        Ok(_) => vec![],
        Err(rej) => rej.errors.iter().map(|e| e.rule()).collect(),
    }
}

/// One way to render a sealed envelope other than canonically.
#[derive(Debug, Clone)]
enum Tweak {
    /// The canonical form itself.
    None,
    /// Members of the k-th object (preorder) in reverse order.
    Reverse(usize),
    /// Whitespace before the k-th value.
    Space(usize, &'static str),
    /// The k-th non-empty string's first character written as an escape
    /// RFC 8785 would not use (`\u0061`, `\u000a`, `\/`, a surrogate pair).
    Escape(usize),
    /// The k-th integer spelled another way (`1.0`, `1e0`, `1E+0`, `01`) or
    /// replaced by `-0` (which JSON parsers read as a float).
    Number(usize, u8),
    /// The k-th object's first member written twice.
    Duplicate(usize),
}

fn tweak() -> impl Strategy<Value = Tweak> {
    let idx = any::<usize>();
    prop_oneof![
        Just(Tweak::None),
        idx.prop_map(Tweak::Reverse),
        (
            idx,
            prop_oneof![Just(" "), Just("\n"), Just("\t"), Just("\r\n  ")]
        )
            .prop_map(|(i, s)| Tweak::Space(i, s)),
        idx.prop_map(Tweak::Escape),
        (idx, 0u8..5).prop_map(|(i, n)| Tweak::Number(i, n)),
        idx.prop_map(Tweak::Duplicate),
    ]
}

/// Preorder counters, to resolve a tweak's index against one value.
#[derive(Default)]
struct Counts {
    objects: usize,
    values: usize,
    strings: usize,
    numbers: usize,
}

struct Render<'t> {
    tweak: &'t Tweak,
    /// The tweak's index resolved against the counts (`None`: no target).
    target: Option<usize>,
    seen: Counts,
    out: String,
}

fn count(v: &Value, c: &mut Counts) {
    c.values += 1;
    match v {
        Value::Object(m) => {
            c.objects += 1;
            m.values().for_each(|x| count(x, c));
        }
        Value::Array(a) => a.iter().for_each(|x| count(x, c)),
        Value::String(s) if !s.is_empty() => c.strings += 1,
        Value::Number(_) => c.numbers += 1,
        _ => {}
    }
}

/// Render `v` canonically (serde_json's compact output is RFC 8785 for the
/// envelope's ASCII member names) except for `tweak`.
fn render(v: &Value, tweak: &Tweak) -> String {
    let mut c = Counts::default();
    count(v, &mut c);
    let pick = |i: &usize, n: usize| (n > 0).then(|| i % n);
    let target = match tweak {
        Tweak::None => None,
        Tweak::Reverse(i) | Tweak::Duplicate(i) => pick(i, c.objects),
        // Not before the whole value: surrounding whitespace is not part of
        // the value and stays canonical.
        Tweak::Space(i, _) => pick(i, c.values - 1).map(|t| t + 1),
        Tweak::Escape(i) => pick(i, c.strings),
        Tweak::Number(i, _) => pick(i, c.numbers),
    };
    let mut r = Render {
        tweak,
        target,
        seen: Counts::default(),
        out: String::new(),
    };
    r.value(v);
    r.out
}

impl Render<'_> {
    fn value(&mut self, v: &Value) {
        if let Tweak::Space(_, ws) = self.tweak
            && self.target == Some(self.seen.values)
        {
            self.out.push_str(ws);
        }
        self.seen.values += 1;
        match v {
            Value::Object(m) => {
                let me = self.seen.objects;
                self.seen.objects += 1;
                let mut members: Vec<(&String, &Value)> = m.iter().collect();
                let hit = self.target == Some(me);
                if hit && matches!(self.tweak, Tweak::Reverse(_)) {
                    members.reverse();
                }
                if hit
                    && matches!(self.tweak, Tweak::Duplicate(_))
                    && let Some(first) = members.first().copied()
                {
                    members.push(first);
                }
                self.out.push('{');
                for (i, (k, x)) in members.into_iter().enumerate() {
                    if i > 0 {
                        self.out.push(',');
                    }
                    self.out.push_str(&serde_json::to_string(k).unwrap());
                    self.out.push(':');
                    self.value(x);
                }
                self.out.push('}');
            }
            Value::Array(a) => {
                self.out.push('[');
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        self.out.push(',');
                    }
                    self.value(x);
                }
                self.out.push(']');
            }
            Value::String(s) if !s.is_empty() => {
                let me = self.seen.strings;
                self.seen.strings += 1;
                if matches!(self.tweak, Tweak::Escape(_)) && self.target == Some(me) {
                    let mut chars = s.chars();
                    let first = chars.next().unwrap();
                    let rest: String = chars.collect();
                    let escaped = if first == '/' {
                        "\\/".to_string()
                    } else {
                        first
                            .encode_utf16(&mut [0; 2])
                            .iter()
                            .map(|u| format!("\\u{u:04X}"))
                            .collect()
                    };
                    let tail = serde_json::to_string(&rest).unwrap();
                    self.out.push('"');
                    self.out.push_str(&escaped);
                    self.out.push_str(&tail[1..]);
                } else {
                    self.out.push_str(&serde_json::to_string(s).unwrap());
                }
            }
            Value::Number(n) => {
                let me = self.seen.numbers;
                self.seen.numbers += 1;
                match self.tweak {
                    Tweak::Number(_, how) if self.target == Some(me) => {
                        let text = n.to_string();
                        self.out.push_str(&match how {
                            0 => format!("{text}.0"),
                            1 => format!("{text}e0"),
                            2 => format!("{text}E+0"),
                            3 => "-0".to_string(),
                            _ => format!("0{text}"),
                        });
                    }
                    _ => self.out.push_str(&n.to_string()),
                }
            }
            other => self.out.push_str(&other.to_string()),
        }
    }
}

#[derive(Debug, Clone)]
enum Flip {
    /// Xor one byte anywhere.
    Any(prop::sample::Index, u8),
    /// Replace one byte with another printable ASCII byte (mostly stays
    /// canonical, so the fast path must decide it).
    Printable(prop::sample::Index, u8),
}

fn flip() -> impl Strategy<Value = Flip> {
    prop_oneof![
        (any::<prop::sample::Index>(), 1u8..=255).prop_map(|(i, x)| Flip::Any(i, x)),
        (any::<prop::sample::Index>(), b' '..=b'~').prop_map(|(i, c)| Flip::Printable(i, c)),
    ]
}

fn apply(bytes: &mut [u8], f: &Flip) {
    match f {
        Flip::Any(i, x) => bytes[i.index(bytes.len())] ^= x,
        Flip::Printable(i, c) => bytes[i.index(bytes.len())] = *c,
    }
}

/// A sealed generated envelope, optionally holding a facts value nested
/// `deep` arrays down (the strict limit falls inside the range generated).
fn sealed(e: Envelope, deep: Option<usize>) -> Envelope {
    let mut e = e;
    if let Some(n) = deep {
        let mut v = json!(1);
        for _ in 0..n {
            v = json!([v]);
        }
        e.surfaces[0].facts.insert("deep".into(), v);
        e.digest.clear();
        e = e.seal().unwrap();
    }
    e
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Mutations of valid sealed envelopes: byte flips, reordered members,
    /// whitespace, escaped vs raw characters, number spellings, duplicate
    /// keys, deep nesting. Fast and general paths give the same verdict.
    #[test]
    fn fast_and_general_paths_give_the_same_verdict(
        e in envelope(),
        deep in prop::option::weighted(0.3, 24usize..34),
        tweak in tweak(),
        flips in prop::collection::vec(flip(), 0..3),
    ) {
        let e = sealed(e, deep);
        let v = serde_json::to_value(&e).unwrap();
        let canonical = serde_json::to_vec(&e).unwrap();
        let mut bytes = render(&v, &tweak).into_bytes();
        let rendered_canonically = bytes == canonical;
        for f in &flips {
            apply(&mut bytes, f);
        }
        let decided = check_same_verdict(&bytes);
        if flips.is_empty() {
            let verdict = verify_general(&bytes);
            match &tweak {
                // Valid renderings of a valid envelope verify, whichever path.
                Tweak::None | Tweak::Reverse(_) | Tweak::Space(..) | Tweak::Escape(_) => {
                    let too_deep = deep.is_some_and(|n| n > 28);
                    if too_deep {
                        prop_assert_eq!(rules(&verdict), vec!["too_deep"]);
                    } else {
                        prop_assert_eq!(verdict.as_ref().map(|x| &x.digest), Ok(&e.digest));
                    }
                    // The fast path takes exactly the canonical renderings
                    // (of envelopes within the nesting limit).
                    prop_assert_eq!(decided, rendered_canonically && !too_deep);
                }
                Tweak::Number(..) | Tweak::Duplicate(_) => {
                    if !rendered_canonically {
                        prop_assert!(verdict.is_err());
                        prop_assert!(!decided);
                    }
                }
            }
        }
    }

    /// Flips inside a canonical envelope that keep it canonical are the fast
    /// path's to decide (a bad digest, a broken rule), and it decides them as
    /// the general path does.
    #[test]
    fn canonical_tampering_is_decided_by_the_fast_path(
        e in envelope(),
        at in any::<prop::sample::Index>(),
        c in b'a'..=b'z',
    ) {
        let mut bytes = serde_json::to_vec(&e).unwrap();
        // Change one letter inside a string value to another letter.
        let letters: Vec<usize> = bytes.iter().enumerate()
            .filter(|(_, b)| b.is_ascii_lowercase()).map(|(i, _)| i).collect();
        let i = *at.get(&letters);
        bytes[i] = c;
        check_same_verdict(&bytes);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Issue 31: every mutation the verify property tests make — the tweaks
    /// and flips of `fast_and_general_paths_give_the_same_verdict` and the
    /// flips, truncations, insertions and deletions of the mutation fuzz,
    /// together — through the fast paths (the digest-only single pass, the
    /// model pass) and the general path: the same verdicts. Where nothing was
    /// mutated the digest-only pass must decide (canonical renderings).
    #[test]
    fn fast_and_general_paths_give_the_same_verdict_on_every_mutation(
        e in envelope(),
        deep in prop::option::weighted(0.3, 24usize..34),
        tweak in tweak(),
        flips in prop::collection::vec(flip(), 0..3),
        ms in prop::collection::vec(mutation(), 0..3),
    ) {
        let e = sealed(e, deep);
        let v = serde_json::to_value(&e).unwrap();
        let canonical = serde_json::to_vec(&e).unwrap();
        let mut bytes = render(&v, &tweak).into_bytes();
        let rendered_canonically = bytes == canonical;
        for f in &flips {
            apply(&mut bytes, f);
        }
        for m in &ms {
            if bytes.is_empty() {
                break;
            }
            mutation_fuzz::apply(&mut bytes, m);
        }
        check_same_verdict(&bytes);
        if flips.is_empty() && ms.is_empty() && rendered_canonically {
            let within_depth = deep.is_none_or(|n| n <= 28);
            prop_assert_eq!(
                verify_digest_fast(&bytes).is_some(),
                within_depth,
                "a canonical valid envelope is the single pass's to decide"
            );
        }
    }

    /// The mutation fuzz's own inputs (the example, compact or pretty),
    /// through the digest-only pass and the general path.
    #[test]
    fn the_mutation_fuzz_gets_the_same_verdict_on_fast_and_general_paths(
        ms in prop::collection::vec(mutation(), 1..4),
        compact in any::<bool>(),
    ) {
        let mut bytes = if compact {
            serde_json::to_vec(&example_sealed()).unwrap()
        } else {
            example_sealed().to_json_pretty()
        };
        for m in &ms {
            if bytes.is_empty() {
                break;
            }
            mutation_fuzz::apply(&mut bytes, m);
        }
        check_same_verdict(&bytes);
    }
}

/// Each rule the digest-only pass checks without the model, broken once in
/// canonical bytes that are then resealed: the pass must not say yes, and
/// `verify_digest` names the rule as `verify` does.
#[test]
fn every_rule_broken_in_canonical_bytes_is_left_to_the_full_verify() {
    use pstack_envelope::{ClaimKind, Completeness, Scope, SurfaceStatus, Termination};
    let base = pstack_envelope::example::example_unsealed();
    type Break = fn(&mut Envelope);
    let breaks: Vec<(&str, Break)> = vec![
        ("duplicate surface id", |e| {
            e.surfaces[1].id = e.surfaces[0].id.clone()
        }),
        ("surface digest form", |e| {
            e.surfaces[0].digest = Some("sha256:XY".into())
        }),
        ("error without cause", |e| {
            e.surfaces[2].status = SurfaceStatus::Error;
            e.surfaces[2].cause = None;
        }),
        ("error with a blank cause", |e| {
            e.surfaces[2].status = SurfaceStatus::Error;
            if let Some(c) = &mut e.surfaces[2].cause {
                c.message = " \n\t".into();
            }
        }),
        ("complete with a non-ok surface", |e| {
            e.completeness = Completeness::Complete
        }),
        ("complete with a truncated surface", |e| {
            e.surfaces.truncate(2);
            e.unknowns.clear();
            e.completeness = Completeness::Complete;
            e.surfaces[0].truncated = true;
        }),
        ("complete, universe not exhausted", |e| {
            e.surfaces.truncate(2);
            e.unknowns.clear();
            e.completeness = Completeness::Complete;
            e.universe.termination = Termination::Cap;
        }),
        ("duplicate claim id", |e| {
            e.claims[1].id = e.claims[0].id.clone()
        }),
        ("identity race, a fact", |e| {
            e.completeness = Completeness::IdentityRace
        }),
        ("unbound claim", |e| e.claims[0].surfaces.clear()),
        ("falsifier outside a hypothesis", |e| {
            e.claims[0].falsifier = Some("x".into())
        }),
        ("cites a missing surface", |e| {
            e.claims[0].surfaces = vec!["task/9/none".into()]
        }),
        ("fact bound to a surface not read", |e| {
            e.claims[0].surfaces = vec!["task/4243/stack".into()]
        }),
        ("inference bound to a surface not read", |e| {
            e.claims[0].kind = ClaimKind::Inference;
            e.claims[0].surfaces = vec!["task/4243/stack".into()];
        }),
        ("universal outside complete", |e| {
            e.claims[0].scope = Scope::Universal
        }),
        ("hypothesis without falsifier", |e| {
            e.claims[1].falsifier = None
        }),
        ("hypothesis with a blank falsifier", |e| {
            e.claims[1].falsifier = Some("  ".into())
        }),
        ("duplicate unknown id", |e| {
            let u = e.unknowns[0].clone();
            e.unknowns.push(u);
        }),
        ("unknown without probe", |e| {
            e.unknowns[0].probe = " ".into()
        }),
        ("unknown without owner", |e| {
            e.unknowns[0].owner = String::new()
        }),
        ("unknown without question", |e| {
            e.unknowns[0].question = "\t".into()
        }),
        ("unknown without blocks", |e| {
            e.unknowns[0].blocks = String::new()
        }),
        ("unknown cites a missing surface", |e| {
            e.unknowns[0].surface = Some("task/9/none".into())
        }),
        ("no action", |e| e.next_transition.action = " ".into()),
        ("no receipt", |e| {
            e.next_transition.success_receipt = String::new()
        }),
        ("no abort condition", |e| {
            e.next_transition.abort_conditions = vec![" ".into(), String::new()]
        }),
        ("wall time", |e| {
            e.clock.wall_time = "2026-13-01T00:00:00Z".into()
        }),
        ("monotonic start", |e| {
            e.clock.monotonic_start_ns = "-1".into()
        }),
        ("monotonic end", |e| {
            e.clock.monotonic_end_ns = String::new()
        }),
        ("selector digest", |e| {
            e.universe.selector_digest = "sha256:".into()
        }),
        ("empty identity field", |e| {
            if let pstack_envelope::Subject::Process(p) = &mut e.subject {
                p.cgroup = " ".into();
            }
        }),
        ("cap name", |e| {
            e.bounds.caps.insert("Bad".into(), 1);
        }),
        ("cap name repeating a bound", |e| {
            e.bounds.caps.insert("max_threads".into(), 1);
        }),
        ("trigger kind", |e| {
            e.collector.trigger = Some(pstack_envelope::Trigger {
                condition: [("a".to_string(), "b".to_string())].into_iter().collect(),
                fired_at: "2026-12-01T00:00:00Z".into(),
                kind: "no_such_kind".into(),
                rule: "r".into(),
            })
        }),
        ("trigger rule", |e| {
            e.collector.trigger = Some(pstack_envelope::Trigger {
                condition: Default::default(),
                fired_at: "2026-12-01T00:00:00Z".into(),
                kind: "d_state".into(),
                rule: " ".into(),
            })
        }),
        ("trigger time", |e| {
            e.collector.trigger = Some(pstack_envelope::Trigger {
                condition: Default::default(),
                fired_at: "yesterday".into(),
                kind: "d_state".into(),
                rule: "r".into(),
            })
        }),
    ];
    for (what, break_it) in breaks {
        let mut e = base.clone();
        break_it(&mut e);
        let e = e.seal_unchecked().unwrap();
        let bytes = e.to_canonical_json().unwrap();
        let general = verify_general(&bytes);
        assert!(general.is_err(), "{what}: the rule is not broken");
        assert_eq!(verify_digest_fast(&bytes), None, "{what}");
        check_same_verdict(&bytes);
    }
    // And the control: the same envelope, unbroken, is the pass's.
    let e = base.seal().unwrap();
    let bytes = e.to_canonical_json().unwrap();
    assert_eq!(
        verify_digest_fast(&bytes).map(|d| d.to_string()),
        Some(e.digest.clone())
    );
    assert_eq!(verify_digest(&bytes).unwrap().to_string(), e.digest);
}

#[test]
fn the_bytes_pstack_writes_take_the_fast_path() {
    let e = example_sealed();
    let bytes = serde_json::to_vec(&e).unwrap();
    assert_eq!(verify_canonical(&bytes), Some(Ok(e.clone())));
    // A trailing newline (a file) and leading whitespace are not the value.
    let mut file = b"\n ".to_vec();
    file.extend_from_slice(&bytes);
    file.push(b'\n');
    assert_eq!(verify_canonical(&file), Some(Ok(e)));
}

#[test]
fn a_non_canonical_but_valid_envelope_verifies_through_the_fallback() {
    let e = example_sealed();
    let pretty = e.to_json_pretty();
    assert_eq!(verify_canonical(&pretty), None, "pretty is not canonical");
    assert_eq!(pstack_envelope::verify(&pretty), Ok(e.clone()));

    let reordered = scramble(&serde_json::to_value(&e).unwrap());
    assert_eq!(verify_canonical(reordered.as_bytes()), None);
    assert_eq!(pstack_envelope::verify(reordered.as_bytes()), Ok(e.clone()));

    // Members reordered without any whitespace, and a character escaped.
    let v = serde_json::to_value(&e).unwrap();
    for tweak in [Tweak::Reverse(0), Tweak::Escape(7)] {
        let text = render(&v, &tweak);
        assert_ne!(text.as_bytes(), serde_json::to_vec(&e).unwrap());
        assert_eq!(verify_canonical(text.as_bytes()), None, "{tweak:?}");
        assert_eq!(pstack_envelope::verify(text.as_bytes()), Ok(e.clone()));
    }
}

#[test]
fn what_the_model_would_not_render_back_is_left_to_the_general_path() {
    // `"caps":{}` and an absent `probe` are valid JSON the model does not
    // reproduce; the fast path must not decide them.
    let e = example_sealed();
    let text = String::from_utf8(serde_json::to_vec(&e).unwrap()).unwrap();
    let caps = text.replacen(
        "\"bundle_deadline_ms\":2000,",
        "\"bundle_deadline_ms\":2000,\"caps\":{},",
        1,
    );
    assert_ne!(caps, text);
    assert_eq!(verify_canonical(caps.as_bytes()), None);
    check_same_verdict(caps.as_bytes());
    let probe = text.replacen(
        "\"probe\":\"pstackctl capture --tid 4243 --surface-deadline 2s\",",
        "",
        1,
    );
    assert_ne!(probe, text);
    assert_eq!(verify_canonical(probe.as_bytes()), None);
    check_same_verdict(probe.as_bytes());
    // An explicit null in an optional member.
    let null = text.replacen("\"surface\":\"task/4243/stack\"", "\"surface\":null", 1);
    assert_ne!(null, text);
    assert_eq!(verify_canonical(null.as_bytes()), None);
    check_same_verdict(null.as_bytes());
}

/// Remove whitespace outside strings: the pretty fixtures rendered compact,
/// which for the envelope's ASCII member names is their canonical form (or
/// as close as a hostile fixture allows).
pub fn minify(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let (mut in_string, mut escaped) = (false, false);
    for &b in bytes {
        if in_string {
            out.push(b);
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
        } else if !matches!(b, b' ' | b'\n' | b'\t' | b'\r') {
            if b == b'"' {
                in_string = true;
            }
            out.push(b);
        }
    }
    out
}

#[test]
fn member_names_sort_by_utf16_units_on_both_paths() {
    // U+E000 sorts after U+1F600 in UTF-8 (serde's map order) but before it in
    // UTF-16 (RFC 8785's): serde's compact output is then not canonical and
    // goes to the general path; the canonical rendering takes the fast path.
    let mut e = pstack_envelope::example::example_unsealed();
    for (k, v) in [("\u{e000}", 1), ("\u{1f600}", 2), ("a\n", 3), ("\u{7f}", 4)] {
        e.surfaces[0].facts.insert(k.into(), json!(v));
    }
    let e = e.seal().unwrap();
    let serde_order = serde_json::to_vec(&e).unwrap();
    assert_eq!(verify_canonical(&serde_order), None);
    assert_eq!(pstack_envelope::verify(&serde_order), Ok(e.clone()));
    let canonical = e.to_canonical_json().unwrap();
    assert_ne!(canonical, serde_order);
    assert_eq!(verify_canonical(&canonical), Some(Ok(e.clone())));
    check_same_verdict(&canonical);
    check_same_verdict(&serde_order);
}

/// Past `PIPELINE_FROM` (256 KiB) the fast path hashes on a second thread:
/// a ~1 MiB envelope still verifies with the general path's digest, and a
/// byte changed before the digest member, in the surfaces after it, or
/// at the last byte gets the general path's verdict.
#[test]
fn a_large_envelope_hashed_beside_the_parse_gets_the_same_verdicts() {
    let e = pstack_envelope::example::example_with_threads(800);
    let e = e.seal().unwrap();
    let bytes = serde_json::to_vec(&e).unwrap();
    assert!(bytes.len() > 512 * 1024, "{} bytes", bytes.len());
    assert_eq!(verify_canonical(&bytes), Some(Ok(e.clone())));
    assert!(check_same_verdict(&bytes));

    let text = String::from_utf8(bytes.clone()).unwrap();
    let early = text.find("\"completeness\":\"").unwrap() - 5;
    let late = text.rfind("some_kernel_function_23").unwrap() + 3;
    for at in [early, late] {
        let mut tampered = bytes.clone();
        tampered[at] = if tampered[at] == b'x' { b'y' } else { b'x' };
        let verdict = verify_canonical(&tampered);
        assert!(
            check_same_verdict(&tampered),
            "byte {at}: the fast path decides"
        );
        assert!(
            rules(&verdict.unwrap()).contains(&"bad_digest"),
            "byte {at} changed must break the digest"
        );
    }
    // Cut short: not an envelope; the general path decides.
    assert!(!check_same_verdict(&bytes[..bytes.len() - 1]));
}

/// A large envelope is read by two threads, the second from a surface
/// boundary it finds by searching for what one looks like
/// (`},{"authority":"`). The same text inside a fact (an array of objects
/// with an `authority` member) is not a boundary: the envelope must verify
/// all the same, and a byte changed after it, or a space put in, gets the
/// general path's verdict.
#[test]
fn a_surface_boundary_lookalike_inside_a_fact_is_not_taken_for_one() {
    let mut e = pstack_envelope::example::example_with_threads(800);
    for s in e.surfaces.iter_mut().skip(1) {
        // Last among the facts, so it covers most of each surface's text.
        s.facts.insert(
            "zz_decoy".into(),
            json!(
                (0..40)
                    .map(|k| json!({"authority": format!("decoy-{k}")}))
                    .collect::<Vec<_>>()
            ),
        );
    }
    let e = e.seal().unwrap();
    let bytes = serde_json::to_vec(&e).unwrap();
    let text = String::from_utf8(bytes.clone()).unwrap();
    // Where the second thread's search starts (TAIL_FROM_PERMILLE, 600): the
    // first lookalike after it must be a decoy for this test to test it.
    let from = bytes.len() / 1000 * 600;
    let first = from + text[from..].find("},{\"authority\":\"").unwrap();
    assert!(
        text[first..].starts_with("},{\"authority\":\"decoy-"),
        "the search would start at a real boundary; move the decoys"
    );
    assert_eq!(verify_canonical(&bytes), Some(Ok(e.clone())));
    assert!(check_same_verdict(&bytes));

    // A byte changed in a decoy past the search's start: the digest breaks.
    let mut tampered = bytes.clone();
    let at = first + "},{\"authority\":\"decoy-".len();
    tampered[at] = b'9';
    let verdict = verify_canonical(&tampered);
    assert!(check_same_verdict(&tampered));
    assert!(rules(&verdict.unwrap()).contains(&"bad_digest"));

    // A space after a real boundary far into the tail: not canonical, so the
    // fast path declines and the general path finds the envelope intact.
    let late = text.rfind("},{\"authority\":\"procfs:").unwrap() + 2;
    let mut spaced = bytes[..late].to_vec();
    spaced.push(b' ');
    spaced.extend_from_slice(&bytes[late..]);
    assert_eq!(verify_canonical(&spaced), None);
    assert_eq!(pstack_envelope::verify(&spaced), Ok(e));
}
