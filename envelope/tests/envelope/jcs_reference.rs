//! RFC 8785 oracles written by others:
//! - the JCS authors' reference test data (tests/jcs-testdata, Apache-2.0, see its NOTICE):
//!   pstack's canonicalizer must produce each expected output byte for byte — except
//!   where the input holds a non-integer number literal, which the envelope forbids and
//!   the canonicalizer must refuse with a typed error instead of rendering;
//! - `serde_json_canonicalizer` (a second, independent implementation) must pass the same
//!   data (so it is a trustworthy oracle) and then agrees with pstack on generated
//!   envelopes (properties.rs) and on every envelope the suite verifies (pstack-testkit).

use std::path::Path;

use pstack_envelope::{EnvelopeError, to_canonical};
use serde_json::Value;

const FILES: [&str; 6] = [
    "arrays",
    "french",
    "structures",
    "unicode",
    "values",
    "weird",
];

/// The reference inputs holding a number literal that is not a plain integer
/// (`56.0`, `1E30`, `4.50`, ...): outside the envelope's integer-only JSON.
const HAS_NON_INTEGER: [&str; 2] = ["structures", "values"];

fn data(dir: &str, name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/jcs-testdata")
        .join(dir)
        .join(format!("{name}.json"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_reference_data_is_all_there() {
    for name in FILES {
        assert!(!data("input", name).is_empty());
        assert!(!data("output", name).is_empty());
    }
}

#[test]
fn pstack_canonicalizer_matches_the_rfc8785_reference_output_byte_for_byte() {
    for name in FILES {
        let input: Value = serde_json::from_slice(&data("input", name)).unwrap();
        let expected = data("output", name);
        let ours = to_canonical(&input);
        if HAS_NON_INTEGER.contains(&name) {
            match ours {
                Err(EnvelopeError::Float { path, value }) => {
                    assert!(path.starts_with('$'), "{name}: {path}: {value}");
                }
                other => panic!("{name}: a non-integer number must be refused, got {other:?}"),
            }
        } else {
            let ours = ours.unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(
                String::from_utf8_lossy(&ours),
                String::from_utf8_lossy(&expected),
                "{name}"
            );
            assert_eq!(ours, expected, "{name}: bytes");
        }
    }
}

#[test]
fn the_second_canonicalizer_matches_the_rfc8785_reference_output() {
    for name in FILES {
        let input: Value = serde_json::from_slice(&data("input", name)).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&pstack_testkit::jcs_oracle(&input)),
            String::from_utf8_lossy(&data("output", name)),
            "serde_json_canonicalizer on {name}"
        );
    }
}

#[test]
fn both_canonicalizers_agree_on_the_integer_only_reference_files() {
    for name in FILES.iter().filter(|n| !HAS_NON_INTEGER.contains(n)) {
        let input: Value = serde_json::from_slice(&data("input", name)).unwrap();
        assert_eq!(
            to_canonical(&input).unwrap(),
            pstack_testkit::jcs_oracle(&input),
            "{name}"
        );
    }
}

/// The integer-only reference files as a surface's facts: seal's typed writer
/// must render them as the reference output byte for byte, and verify's fast
/// path must take the canonical rendering (its member-order check sees the
/// UTF-16 cases of `weird.json`) and agree with the general path.
#[test]
fn the_typed_writer_and_the_fast_verify_match_the_reference_output() {
    for name in FILES.iter().filter(|n| !HAS_NON_INTEGER.contains(n)) {
        let input: Value = serde_json::from_slice(&data("input", name)).unwrap();
        let expected = data("output", name);
        let mut e = pstack_envelope::example::example_unsealed();
        e.surfaces[0].facts = [("jcs".to_string(), input)].into_iter().collect();
        let sealed = e.clone().seal().unwrap();
        let mut facts = b"\"facts\":{\"jcs\":".to_vec();
        facts.extend_from_slice(&expected);
        facts.push(b'}');
        let contains = |hay: &[u8]| hay.windows(facts.len()).any(|w| w == facts.as_slice());

        let body = e
            .fast_canonical_body()
            .expect("the writer takes integer-only JSON");
        assert!(
            contains(&body),
            "{name}: the writer's facts differ from the reference"
        );
        assert_eq!(body, e.canonical_body().unwrap(), "{name}");

        let canonical = sealed.to_canonical_json().unwrap();
        assert!(contains(&canonical), "{name}");
        assert_eq!(
            pstack_envelope::verify_canonical(&canonical),
            Some(Ok(sealed.clone())),
            "{name}: the fast path must take the canonical rendering"
        );
        assert_eq!(
            pstack_envelope::verify_general(&canonical),
            Ok(sealed),
            "{name}"
        );
    }
}
