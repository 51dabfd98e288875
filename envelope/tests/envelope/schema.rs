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
        pstack_envelope::verify(&serde_json::to_vec(&env).unwrap()).unwrap();
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
        let mut env = reseal(base());
        mutate(&mut env);
        assert!(!v.is_valid(&env), "schema accepted: {name}");
        assert!(
            pstack_envelope::verify(&serde_json::to_vec(&env).unwrap()).is_err(),
            "model accepted: {name}"
        );
    }
}
