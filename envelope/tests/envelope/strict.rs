//! Strict parsing: duplicate keys, unsafe integers, floats, depth, garbage.

use pstack_envelope::{EnvelopeError, MAX_DEPTH, parse_strict, to_canonical};
use pstack_testkit::verify;

#[test]
fn duplicate_keys_are_rejected_with_their_path() {
    let e = parse_strict(br#"{"a":{"b":1,"b":2}}"#).unwrap_err();
    assert_eq!(
        e,
        EnvelopeError::DuplicateKey {
            path: "$.a".into(),
            key: "b".into()
        }
    );
    // serde_json alone would have kept the last value.
    let lenient: serde_json::Value = serde_json::from_str(r#"{"b":1,"b":2}"#).unwrap();
    assert_eq!(lenient["b"], 2);
}

#[test]
fn integers_beyond_2_pow_53_are_rejected() {
    assert!(parse_strict(b"9007199254740991").is_ok());
    assert!(parse_strict(b"-9007199254740991").is_ok());
    for text in [
        "9007199254740992",
        "-9007199254740992",
        "18446744073709551615",
        "123456789012345678901234567890",
    ] {
        assert_eq!(
            parse_strict(text.as_bytes()).unwrap_err().rule(),
            "number_out_of_range",
            "{text}"
        );
    }
}

#[test]
fn floats_are_rejected_in_every_spelling() {
    for text in ["1.0", "0.5", "1e3", "-2E-2", r#"{"x":[0,1.25]}"#] {
        assert_eq!(
            parse_strict(text.as_bytes()).unwrap_err().rule(),
            "float",
            "{text}"
        );
    }
    assert_eq!(
        parse_strict(br#"{"x":[0,1.25]}"#).unwrap_err(),
        EnvelopeError::Float {
            path: "$.x[1]".into(),
            value: "1.25".into()
        }
    );
}

#[test]
fn nesting_is_bounded() {
    let ok = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
    assert!(parse_strict(ok.as_bytes()).is_ok());
    let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
    assert_eq!(
        parse_strict(deep.as_bytes()).unwrap_err().rule(),
        "too_deep"
    );
    // Far beyond serde_json's own recursion limit: still our typed error, no stack overflow.
    let very = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    assert_eq!(
        parse_strict(very.as_bytes()).unwrap_err().rule(),
        "too_deep"
    );
    let objects = "{\"a\":".repeat(50_000);
    assert_eq!(
        parse_strict(objects.as_bytes()).unwrap_err().rule(),
        "too_deep"
    );
}

#[test]
fn malformed_input_gives_typed_errors_never_panics() {
    let cases: &[&[u8]] = &[
        b"",
        b"   ",
        b"{",
        b"}",
        b"nul",
        b"{\"a\":1}{\"b\":2}",
        b"{\"a\" 1}",
        b"\"\\ud800\"",
        b"[1,]",
        b"\xff\xfe{}",
        b"\xc3\x28",
        &[0u8; 64],
    ];
    for c in cases {
        let e = parse_strict(c).unwrap_err();
        assert!(matches!(e.rule(), "json" | "not_utf8"), "{c:?}: {e}");
        assert!(verify(c).is_err());
    }
    // Valid JSON that is not an envelope.
    for c in [&b"[]"[..], b"42", b"\"x\"", b"null", b"{}"] {
        assert!(verify(c).is_err(), "{c:?}");
    }
}

#[test]
fn huge_input_is_handled() {
    let big = format!(
        "{{\"schema\":\"pstack.envelope/v1\",\"pad\":\"{}\"}}",
        "x".repeat(8 << 20)
    );
    let e = verify(big.as_bytes()).unwrap_err();
    assert_eq!(e.errors[0].rule(), "unknown_field");
}

#[test]
fn canonical_form_of_parsed_text_matches_rfc8785_example_shape() {
    let v = parse_strict(br#"{ "b" : [ 1 , { "d":true,"c":null } ] , "a":"\u00e9\n" }"#).unwrap();
    assert_eq!(
        String::from_utf8(to_canonical(&v).unwrap()).unwrap(),
        "{\"a\":\"é\\n\",\"b\":[1,{\"c\":null,\"d\":true}]}"
    );
}
