//! Property tests: seal/verify round trip, tamper detection anywhere, canonical
//! form independent of key order and whitespace, diff determinism.

use proptest::prelude::*;
use pstack_envelope::{
    Envelope, compute_digest, diff, example::example_sealed, parse_strict, to_canonical,
};
use pstack_testkit::verify;
use serde_json::{Map, Value, json};

pub fn fact_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (-(1i64 << 53) + 1..(1i64 << 53)).prop_map(|n| json!(n)),
        "[ -~é😀\\n\\t\u{1}\u{7f}\u{2028}\"\\\\]{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{1,6}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

pub fn envelope() -> impl Strategy<Value = Envelope> {
    (
        prop::collection::btree_map("[a-z_]{1,8}", fact_value(), 0..6),
        1u32..4_000_000,
        "[a-z0-9-]{1,16}",
    )
        .prop_map(|(facts, pid, host)| {
            let mut e = pstack_envelope::example::example_unsealed();
            if let pstack_envelope::Subject::Process(p) = &mut e.subject {
                p.pid = pid;
                p.host = host;
            }
            e.surfaces[0].facts = facts.into_iter().collect::<Map<_, _>>();
            e.seal().unwrap()
        })
}

/// Every path to a scalar leaf of a JSON value.
fn leaves(v: &Value, path: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match v {
        Value::Object(m) => {
            for (k, c) in m {
                path.push(k.clone());
                leaves(c, path, out);
                path.pop();
            }
        }
        Value::Array(a) => {
            for (i, c) in a.iter().enumerate() {
                path.push(i.to_string());
                leaves(c, path, out);
                path.pop();
            }
        }
        _ => out.push(path.clone()),
    }
}

fn at<'a>(v: &'a mut Value, path: &[String]) -> &'a mut Value {
    path.iter().fold(v, |v, p| match v {
        Value::Array(a) => &mut a[p.parse::<usize>().unwrap()],
        other => &mut other[p.as_str()],
    })
}

/// A different value of the same JSON type (so the change survives parsing).
fn perturb(v: &Value) -> Value {
    match v {
        Value::Null => json!(false),
        Value::Bool(b) => json!(!b),
        Value::Number(n) => json!(
            n.as_i64()
                .map(|n| if n == 0 { 1 } else { n - 1 })
                .unwrap_or(0)
        ),
        Value::String(s) => json!(format!("{s}x")),
        other => other.clone(),
    }
}

/// Re-render JSON with objects' members in reverse order and odd whitespace.
pub fn scramble(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let members: Vec<String> = m
                .iter()
                .rev()
                .map(|(k, c)| {
                    format!(
                        " {} :\n\t{} ",
                        serde_json::to_string(k).unwrap(),
                        scramble(c)
                    )
                })
                .collect();
            format!("{{ {} }}", members.join(" ,\r\n"))
        }
        Value::Array(a) => format!(
            "[ {} ]",
            a.iter().map(scramble).collect::<Vec<_>>().join(" , ")
        ),
        other => other.to_string(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn seal_then_verify_round_trips(e in envelope()) {
        let bytes = e.to_json_pretty();
        let back = verify(&bytes).unwrap();
        prop_assert_eq!(back, e);
    }

    #[test]
    fn any_single_leaf_change_breaks_verification(e in envelope(), pick in any::<prop::sample::Index>()) {
        let mut v = serde_json::to_value(&e).unwrap();
        let mut all = Vec::new();
        leaves(&v, &mut Vec::new(), &mut all);
        all.retain(|p| p.first().map(String::as_str) != Some("digest"));
        let path = pick.get(&all).clone();
        let target = at(&mut v, &path);
        *target = perturb(target);
        let result = verify(&serde_json::to_vec(&v).unwrap());
        prop_assert!(result.is_err(), "change at {:?} went unnoticed", path);
    }

    #[test]
    fn canonical_form_ignores_key_order_and_whitespace(e in envelope()) {
        let v = serde_json::to_value(&e).unwrap();
        let scrambled = scramble(&v);
        let reparsed = parse_strict(scrambled.as_bytes()).unwrap();
        prop_assert_eq!(to_canonical(&reparsed).unwrap(), to_canonical(&v).unwrap());
        prop_assert_eq!(compute_digest(&reparsed).unwrap(), e.digest.clone());
        prop_assert!(verify(scrambled.as_bytes()).is_ok());
    }

    #[test]
    fn fast_seal_path_agrees_with_the_general_canonicalizer(
        e in envelope(),
        key in "[a-zé\u{e000}\u{1f600}]{1,4}",
        other in "[a-zé\u{e000}\u{1f600}]{1,4}",
    ) {
        let mut e = e;
        // Two such names in one object: U+E000 sorts after U+1F600 in UTF-8 but
        // before it in UTF-16, so a byte-order sort fails here against the oracle.
        e.surfaces[0].facts.insert(key, json!(1));
        e.surfaces[0].facts.insert(other, json!(2));
        let general = e.canonical_body().unwrap();
        // The fast path may defer only when a name sorts differently in UTF-16 (a
        // character above U+FFFF); everywhere else it must run and agree.
        let astral = e.surfaces[0].facts.keys().any(|k| k.chars().any(|c| c as u32 > 0xFFFF));
        match e.fast_canonical_body() {
            Some(fast) => prop_assert_eq!(&fast, &general),
            None => prop_assert!(astral, "the fast path declined a BMP-only envelope"),
        }
        let sealed = e.clone().seal_unchecked().unwrap();
        prop_assert_eq!(&sealed.digest, &pstack_envelope::sha256_digest(&general));
        // And the independent canonicalizer renders the same bytes.
        let mut body = serde_json::to_value(&sealed).unwrap();
        body.as_object_mut().unwrap().remove("digest");
        prop_assert_eq!(&general, &pstack_testkit::jcs_oracle(&body));
    }

    /// Round trip from *valid generated* input (no `if let Ok` that random bytes never
    /// reach): a generated fact edit, resealed, rendered pretty or scrambled, verifies
    /// and decodes to the same envelope, with the oracle's digest.
    #[test]
    fn valid_edits_round_trip_in_any_rendering(
        e in envelope(),
        key in "[a-z_]{1,8}",
        value in fact_value(),
        scrambled in any::<bool>(),
    ) {
        let mut e = e;
        e.surfaces[0].facts.insert(key, value);
        let sealed = e.seal().unwrap();
        let bytes = if scrambled {
            scramble(&serde_json::to_value(&sealed).unwrap()).into_bytes()
        } else {
            sealed.to_json_pretty()
        };
        let back = verify(&bytes).unwrap();
        prop_assert_eq!(&back, &sealed);
        prop_assert_eq!(verify(&back.to_json_pretty()).unwrap(), sealed);
    }

    #[test]
    fn diff_of_an_envelope_with_itself_is_empty(e in envelope()) {
        prop_assert!(diff(&e, &e).unwrap().is_empty());
    }

    #[test]
    fn diff_is_deterministic(a in envelope(), facts in prop::collection::btree_map("[a-z_]{1,8}", fact_value(), 0..6)) {
        let mut b = a.clone();
        b.surfaces[0].facts = facts.into_iter().collect();
        let b = b.seal().unwrap();
        let one = serde_json::to_vec(&diff(&a, &b).unwrap()).unwrap();
        let two = serde_json::to_vec(&diff(&a.clone(), &b.clone()).unwrap()).unwrap();
        prop_assert_eq!(one, two);
        prop_assert_eq!(diff(&a, &b).unwrap().render(), diff(&a, &b).unwrap().render());
    }
}

#[test]
fn sealed_example_verifies() {
    verify(&example_sealed().to_json_pretty()).unwrap();
}

/// Hostile byte-level mutations of a valid envelope (the same oracle as the
/// cargo-fuzz target, run on stable in every `cargo test`): never a panic;
/// anything accepted re-renders to an envelope that verifies identically.
pub mod mutation_fuzz {
    use super::*;

    #[derive(Debug, Clone)]
    pub enum Mutation {
        Flip(prop::sample::Index, u8),
        Truncate(prop::sample::Index),
        Insert(prop::sample::Index, Vec<u8>),
        Delete(prop::sample::Index, usize),
    }

    pub fn mutation() -> impl Strategy<Value = Mutation> {
        prop_oneof![
            (any::<prop::sample::Index>(), 1u8..=255).prop_map(|(i, x)| Mutation::Flip(i, x)),
            any::<prop::sample::Index>().prop_map(Mutation::Truncate),
            (
                any::<prop::sample::Index>(),
                prop::collection::vec(
                    prop_oneof![
                        Just(b'{'),
                        Just(b'['),
                        Just(b'"'),
                        Just(b','),
                        Just(b'9'),
                        Just(b'.'),
                        Just(0xff),
                        any::<u8>()
                    ],
                    1..16
                )
            )
                .prop_map(|(i, b)| Mutation::Insert(i, b)),
            (any::<prop::sample::Index>(), 1usize..64).prop_map(|(i, n)| Mutation::Delete(i, n)),
        ]
    }

    pub fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
        match m {
            Mutation::Flip(i, x) => {
                let i = i.index(bytes.len());
                bytes[i] ^= x;
            }
            Mutation::Truncate(i) => bytes.truncate(i.index(bytes.len())),
            Mutation::Insert(i, b) => {
                let i = i.index(bytes.len());
                bytes.splice(i..i, b.iter().copied());
            }
            Mutation::Delete(i, n) => {
                let i = i.index(bytes.len());
                let end = (i + n).min(bytes.len());
                bytes.drain(i..end);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// Hostile bytes: the property is "never a panic". Round trips are proven from
        /// valid generated input in `valid_edits_round_trip_in_any_rendering`.
        #[test]
        fn mutated_envelopes_never_panic(
            ms in prop::collection::vec(mutation(), 1..4),
            compact in any::<bool>(),
        ) {
            // Pretty (the general path) or compact (canonical: verify's fast
            // path); `verify` here also checks both paths agree.
            let mut bytes = if compact {
                serde_json::to_vec(&example_sealed()).unwrap()
            } else {
                example_sealed().to_json_pretty()
            };
            for m in &ms {
                if bytes.is_empty() { break; }
                apply(&mut bytes, m);
            }
            if let Ok(env) = verify(&bytes) {
                let again = verify(&env.to_json_pretty()).unwrap();
                prop_assert_eq!(again, env);
            }
        }
    }
}

#[test]
fn large_envelopes_hash_identically_across_hash_chunks() {
    // Several 64 KiB hash blocks, and the boundary cases.
    for n in [0usize, 1, 300, 2000] {
        let mut e = pstack_envelope::example::example_unsealed();
        for i in 0..n {
            let mut s = e.surfaces[0].clone();
            s.id = format!("task/{i}/stack");
            s.facts.insert(
                "frames".into(),
                json!(vec!["[<0>] do_sys_poll+0x1c0/0x4e0"; 8]),
            );
            e.surfaces.push(s);
        }
        let general = e.canonical_body().unwrap();
        let sealed = e.seal_unchecked().unwrap();
        assert_eq!(
            sealed.digest,
            pstack_envelope::sha256_digest(&general),
            "n = {n}, {} bytes",
            general.len()
        );
        verify(&sealed.to_json_pretty()).unwrap();
    }
}

#[test]
fn explicit_null_in_an_optional_member_is_refused_but_facts_may_hold_null() {
    let mut v = serde_json::to_value(example_sealed()).unwrap();
    v["claims"][0]["falsifier"] = Value::Null;
    let v = crate::fixtures::reseal(v);
    let e = verify(&serde_json::to_vec(&v).unwrap()).unwrap_err();
    assert_eq!(e.errors[0].rule(), "invalid_field", "{e}");

    let mut v = serde_json::to_value(example_sealed()).unwrap();
    v["surfaces"][0]["facts"]["wchan"] = Value::Null;
    let v = crate::fixtures::reseal(v);
    verify(&serde_json::to_vec(&v).unwrap()).unwrap();
}

#[test]
fn in_memory_unsafe_integers_are_refused_at_seal() {
    let mut e = pstack_envelope::example::example_unsealed();
    e.bounds.max_bytes_per_surface = 1 << 60;
    let r = e.seal().unwrap_err();
    assert_eq!(r.errors[0].rule(), "number_out_of_range");
}
