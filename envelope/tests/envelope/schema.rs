//! The published JSON Schema agrees with the Rust model: every valid fixture
//! passes it, and structural violations the model rejects, it rejects too.

use pstack_envelope::JSON_SCHEMA;
use serde_json::{Value, json};

use crate::fixtures::{base, complete_base, reseal};

type Mutation = Box<dyn Fn(&mut Value)>;

fn validator() -> jsonschema::Validator {
    let schema: Value = serde_json::from_str(JSON_SCHEMA).unwrap();
    jsonschema::validator_for(&schema).unwrap()
}

#[test]
fn schema_accepts_what_the_model_accepts() {
    let v = validator();
    for env in [
        reseal(base()),
        reseal(complete_base()),
        serde_json::to_value(pstack_envelope::example::example_sealed()).unwrap(),
    ] {
        let errs: Vec<String> = v.iter_errors(&env).map(|e| e.to_string()).collect();
        assert!(errs.is_empty(), "{errs:?}");
        pstack_testkit::verify(&serde_json::to_vec(&env).unwrap()).unwrap();
    }
}

#[test]
fn schema_rejects_what_the_model_rejects_structurally() {
    let v = validator();
    let mutations: Vec<(&str, Mutation)> = vec![
        (
            "unknown top-level field",
            Box::new(|e| e["extra"] = json!(1)),
        ),
        (
            "unknown surface field",
            Box::new(|e| e["surfaces"][0]["extra"] = json!(1)),
        ),
        (
            "unmapped status",
            Box::new(|e| e["surfaces"][0]["status"] = json!("stuck")),
        ),
        (
            "missing identity field",
            Box::new(|e| {
                e["subject"]["identity"]
                    .as_object_mut()
                    .unwrap()
                    .remove("boot_id");
            }),
        ),
        (
            "float fact",
            Box::new(|e| e["surfaces"][0]["facts"]["x"] = json!(1.5)),
        ),
        (
            "wrong schema id",
            Box::new(|e| e["schema"] = json!("pstack.envelope/v0")),
        ),
        (
            "bad kind",
            Box::new(|e| e["subject"]["kind"] = json!("pod")),
        ),
        (
            "negative count",
            Box::new(|e| e["universe"]["observed_count"] = json!(-1)),
        ),
    ];
    for (name, mutate) in mutations {
        let mut env = base();
        mutate(&mut env);
        // Reseal *after* the mutation, with the independent canonicalizer (it also
        // renders the float fixture, which pstack's refuses): the digest is right, so
        // the model must reject the envelope for the structural fault itself. Before,
        // the mutation came after resealing and `verify` failed on the digest whatever
        // the model did.
        env["digest"] = json!(pstack_testkit::jcs_oracle_digest(&env));
        assert!(!v.is_valid(&env), "schema accepted: {name}");
        let rejection = pstack_envelope::verify(&serde_json::to_vec(&env).unwrap())
            .expect_err(&format!("model accepted: {name}"));
        let rules: Vec<&str> = rejection.errors.iter().map(|e| e.rule()).collect();
        assert!(
            !rules.is_empty() && !rules.contains(&"bad_digest"),
            "{name}: the model must reject the fault, not the digest: {rules:?}"
        );
    }
}

/// JSON Schema's `integer` is a value test (4242.0 is an integer there), while the
/// envelope parser refuses every number literal with a fraction, an exponent or a
/// negative zero (RFC 8785 would re-render them). A schema cannot see the literal, so
/// the difference is documented in the schema's description, and this test keeps the
/// documentation and both behaviours in step.
#[test]
fn integer_literals_the_schema_accepts_but_the_parser_refuses_are_documented() {
    let v = validator();
    let schema: Value = serde_json::from_str(JSON_SCHEMA).unwrap();
    let description = schema["description"].as_str().unwrap();
    for literal in ["4242.0", "1e2", "-0"] {
        assert!(
            description.contains(literal),
            "the schema's description must name {literal}: {description}"
        );
        let mut placeholder = reseal(base());
        placeholder["universe"]["observed_count"] = json!(4_242_424);
        let text = serde_json::to_string(&placeholder)
            .unwrap()
            .replacen("4242424", literal, 1);
        let env: Value = serde_json::from_str(&text).unwrap();
        let errs: Vec<String> = v.iter_errors(&env).map(|e| e.to_string()).collect();
        assert!(
            errs.is_empty(),
            "JSON Schema accepts {literal} as an integer (if this changes, update the description): {errs:?}"
        );
        let err = pstack_envelope::parse_strict(text.as_bytes()).unwrap_err();
        assert_eq!(err.rule(), "float", "{literal}: {err}");
    }
}
