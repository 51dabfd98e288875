//! Every validator rule has a fixture that triggers exactly it and no other;
//! the table itself is checked to leave no rule without a fixture.

use std::collections::BTreeSet;

use pstack_envelope::EnvelopeError;
use pstack_testkit::verify;
use serde_json::{Value, json};

use crate::fixtures::{base, complete_base, sealed_bytes};

type Fixture = (&'static str, fn() -> Vec<u8>);

fn with(mut f: impl FnMut(&mut Value)) -> Value {
    let mut v = base();
    f(&mut v);
    v
}

fn raw(v: Value) -> Vec<u8> {
    serde_json::to_vec(&v).unwrap()
}

const FIXTURES: &[Fixture] = &[
    ("not_utf8", || {
        let mut b = sealed_bytes(base());
        let at = b.windows(6).position(|w| w == b"node-a").unwrap();
        b[at] = 0xff;
        b
    }),
    ("json", || {
        let b = sealed_bytes(base());
        b[..b.len() / 2].to_vec()
    }),
    ("duplicate_key", || {
        let text = String::from_utf8(sealed_bytes(base())).unwrap();
        let dup = text.replacen("\"pid\": 4242,", "\"pid\": 4242,\n \"pid\": 4343,", 1);
        assert_ne!(dup, text);
        dup.into_bytes()
    }),
    ("float", || {
        raw(with(|v| v["surfaces"][0]["facts"]["load"] = json!(0.75)))
    }),
    ("number_out_of_range", || {
        raw(with(|v| {
            v["surfaces"][0]["facts"]["cookie"] = json!(9007199254740993_u64)
        }))
    }),
    ("too_deep", || {
        let mut deep = json!(1);
        for _ in 0..40 {
            deep = json!([deep]);
        }
        raw(with(|v| v["surfaces"][0]["facts"]["deep"] = deep.clone()))
    }),
    ("wrong_schema", || {
        sealed_bytes(with(|v| v["schema"] = json!("pstack.envelope/v2")))
    }),
    ("unknown_field", || {
        sealed_bytes(with(|v| v["surfaces"][1]["colour"] = json!("red")))
    }),
    ("missing_field", || {
        sealed_bytes(with(|v| {
            v["clock"].as_object_mut().unwrap().remove("wall_time");
        }))
    }),
    ("missing_identity_field", || {
        sealed_bytes(with(|v| {
            v["subject"]["identity"]
                .as_object_mut()
                .unwrap()
                .remove("boot_id");
        }))
    }),
    ("unmapped_status", || {
        sealed_bytes(with(|v| v["surfaces"][2]["status"] = json!("stuck")))
    }),
    ("invalid_field", || {
        sealed_bytes(with(|v| {
            v["clock"]["wall_time"] = json!("yesterday at noon")
        }))
    }),
    ("duplicate_id", || {
        sealed_bytes(with(|v| v["claims"][1]["id"] = json!("c1")))
    }),
    ("bad_digest", || {
        let mut v = crate::fixtures::reseal(base());
        v["surfaces"][1]["facts"]["wchan"] = json!("do_nanosleep");
        raw(v)
    }),
    ("complete_with_non_ok_surface", || {
        sealed_bytes(with(|v| {
            v["completeness"] = json!("complete");
            v["unknowns"] = json!([]);
        }))
    }),
    ("complete_with_truncated_surface", || {
        let mut v = complete_base();
        v["surfaces"][0]["truncated"] = json!(true);
        sealed_bytes(v)
    }),
    ("complete_with_non_exhausted_universe", || {
        let mut v = complete_base();
        v["universe"]["termination"] = json!("cap");
        sealed_bytes(v)
    }),
    ("fact_unbound", || {
        sealed_bytes(with(|v| v["claims"][0]["surfaces"] = json!([])))
    }),
    ("fact_bound_to_non_ok_surface", || {
        sealed_bytes(with(|v| {
            v["claims"][0]["surfaces"] = json!(["task/4243/stack"])
        }))
    }),
    ("claim_cites_missing_surface", || {
        sealed_bytes(with(|v| {
            v["claims"][1]["surfaces"] = json!(["task/9999/stat"])
        }))
    }),
    ("universal_claim_outside_complete", || {
        sealed_bytes(with(|v| v["claims"][1]["scope"] = json!("universal")))
    }),
    ("hypothesis_without_falsifier", || {
        sealed_bytes(with(|v| {
            v["claims"][1].as_object_mut().unwrap().remove("falsifier");
        }))
    }),
    ("unknown_without_probe", || {
        sealed_bytes(with(|v| v["unknowns"][0]["probe"] = json!("  ")))
    }),
    ("unknown_incomplete", || {
        sealed_bytes(with(|v| v["unknowns"][0]["owner"] = json!("")))
    }),
    ("unknown_cites_missing_surface", || {
        sealed_bytes(with(|v| {
            v["unknowns"][0]["surface"] = json!("task/9999/stack")
        }))
    }),
    ("claim_unbound", || {
        sealed_bytes(with(|v| v["claims"][1]["surfaces"] = json!([])))
    }),
    ("falsifier_outside_hypothesis", || {
        sealed_bytes(with(|v| {
            v["claims"][0]["falsifier"] = json!("the thread leaves D")
        }))
    }),
    ("inference_bound_to_unread_surface", || {
        sealed_bytes(with(|v| {
            v["claims"][0]["kind"] = json!("inference");
            v["claims"][0]["surfaces"] = json!(["task/4243/stack"]);
        }))
    }),
    ("next_without_receipt", || {
        sealed_bytes(with(|v| {
            v["next_transition"]["success_receipt"] = json!(" ")
        }))
    }),
    ("next_without_abort", || {
        sealed_bytes(with(|v| {
            v["next_transition"]["abort_conditions"] = json!([""])
        }))
    }),
    ("attribution_in_identity_race", || {
        sealed_bytes(with(|v| v["completeness"] = json!("identity_race")))
    }),
    ("error_without_cause", || {
        sealed_bytes(with(|v| {
            v["surfaces"][2]["status"] = json!("error");
            v["surfaces"][2].as_object_mut().unwrap().remove("cause");
        }))
    }),
];

#[test]
fn every_rule_has_a_fixture_and_no_fixture_is_spare() {
    let table: BTreeSet<&str> = FIXTURES.iter().map(|(r, _)| *r).collect();
    let rules: BTreeSet<&str> = EnvelopeError::VALIDATION_RULES.iter().copied().collect();
    assert_eq!(table.len(), FIXTURES.len(), "a rule has two fixtures");
    assert_eq!(
        table, rules,
        "rules without fixture / fixtures without rule"
    );
}

#[test]
fn each_fixture_triggers_exactly_its_rule() {
    for (rule, make) in FIXTURES {
        let bytes = make();
        let rejection = verify(&bytes).expect_err(rule);
        let fired: Vec<&str> = rejection.errors.iter().map(EnvelopeError::rule).collect();
        assert_eq!(fired, vec![*rule], "fixture {rule}: {rejection}");
    }
}

#[test]
fn the_unmutated_bases_are_valid() {
    verify(&sealed_bytes(base())).unwrap();
    verify(&sealed_bytes(complete_base())).unwrap();
}

#[test]
fn errors_name_where_they_broke() {
    let bytes = FIXTURES.iter().find(|(r, _)| *r == "float").unwrap().1();
    let e = &verify(&bytes).unwrap_err().errors[0];
    assert_eq!(
        e,
        &EnvelopeError::Float {
            path: "$.surfaces[0].facts.load".into(),
            value: "0.75".into()
        }
    );
    let bytes = FIXTURES
        .iter()
        .find(|(r, _)| *r == "unknown_field")
        .unwrap()
        .1();
    assert_eq!(
        verify(&bytes).unwrap_err().errors[0],
        EnvelopeError::UnknownField {
            path: "$.surfaces[1]".into(),
            field: "colour".into()
        }
    );
    let bytes = FIXTURES
        .iter()
        .find(|(r, _)| *r == "missing_identity_field")
        .unwrap()
        .1();
    assert_eq!(
        verify(&bytes).unwrap_err().errors[0],
        EnvelopeError::MissingIdentityField {
            kind: "process".into(),
            field: "boot_id".into()
        }
    );
}

#[test]
fn unknown_fields_are_rejected_at_every_level() {
    let paths: &[&[&str]] = &[
        &[],
        &["subject"],
        &["subject", "identity"],
        &["collector"],
        &["clock"],
        &["universe"],
        &["bounds"],
        &["next_transition"],
    ];
    for path in paths {
        let mut v = base();
        let mut target = &mut v;
        for p in *path {
            target = &mut target[*p];
        }
        target["surprise"] = json!(true);
        let err = &verify(&sealed_bytes(v)).unwrap_err().errors[0];
        assert_eq!(err.rule(), "unknown_field", "at {path:?}: {err}");
    }
    for (array, idx) in [("surfaces", 0), ("claims", 0), ("unknowns", 0)] {
        let mut v = base();
        v[array][idx]["surprise"] = json!(true);
        assert_eq!(
            verify(&sealed_bytes(v)).unwrap_err().errors[0].rule(),
            "unknown_field",
            "{array}"
        );
    }
    let mut v = base();
    v["surfaces"][2]["cause"]["surprise"] = json!(1);
    assert_eq!(
        verify(&sealed_bytes(v)).unwrap_err().errors[0].rule(),
        "unknown_field"
    );
}

#[test]
fn every_subject_kind_requires_its_identity_fields() {
    let cases = [
        (
            "process",
            json!({"host":"h","boot_id":"b","pid":1,"start_ticks":2,"uid":0,"pid_ns":"3","cgroup":"0::/"}),
            vec![
                "host",
                "boot_id",
                "pid",
                "start_ticks",
                "uid",
                "pid_ns",
                "cgroup",
            ],
        ),
        (
            "thread",
            json!({"process":{"host":"h","boot_id":"b","pid":1,"start_ticks":2,"uid":0,"pid_ns":"3","cgroup":"0::/"},"tid":5}),
            vec!["process", "tid"],
        ),
        (
            "network_stream",
            json!({"src":"10.0.0.1:5","dst":"10.0.0.2:6","protocol":"tcp","flow_id":"77"}),
            vec!["src", "dst", "protocol", "flow_id"],
        ),
        (
            "storage_transfer",
            json!({"volume":"v","engine":"e","source_node":"a","target_node":"b","transfer_id":"t"}),
            vec![
                "volume",
                "engine",
                "source_node",
                "target_node",
                "transfer_id",
            ],
        ),
        (
            "host",
            json!({"host":"h","boot_id":"b"}),
            vec!["host", "boot_id"],
        ),
    ];
    for (kind, identity, fields) in cases {
        let mut v = base();
        v["subject"] = json!({"kind": kind, "identity": identity.clone()});
        verify(&sealed_bytes(v.clone()))
            .unwrap_or_else(|e| panic!("{kind} complete identity: {e}"));
        for field in fields {
            let mut w = v.clone();
            w["subject"]["identity"]
                .as_object_mut()
                .unwrap()
                .remove(field);
            let err = &verify(&sealed_bytes(w)).unwrap_err().errors[0];
            assert_eq!(
                err,
                &EnvelopeError::MissingIdentityField {
                    kind: kind.into(),
                    field: field.into()
                },
                "{kind}.{field}"
            );
        }
        // Present but empty is as missing as absent.
        if let Some(first) = identity
            .as_object()
            .unwrap()
            .iter()
            .find(|(_, v)| v.is_string())
        {
            let mut w = v.clone();
            w["subject"]["identity"][first.0] = json!("");
            assert_eq!(
                verify(&sealed_bytes(w)).unwrap_err().errors[0].rule(),
                "missing_identity_field"
            );
        }
    }
}

#[test]
fn every_status_in_the_vocabulary_maps_and_nothing_else_does() {
    use pstack_envelope::SurfaceStatus;
    for s in SurfaceStatus::ALL {
        assert_eq!(SurfaceStatus::parse(s.as_str()), Some(s));
        let mut v = base();
        v["surfaces"][2]["status"] = json!(s.as_str());
        let result = verify(&sealed_bytes(v));
        if let Err(e) = result {
            assert!(
                e.errors.iter().all(|e| e.rule() != "unmapped_status"),
                "{s}: {e}"
            );
        }
    }
    for bad in ["OK", "timed_out", "", "ok "] {
        assert_eq!(SurfaceStatus::parse(bad), None);
    }
}

#[test]
fn seal_refuses_an_invalid_envelope() {
    let mut e = pstack_envelope::example::example_unsealed();
    e.claims[1].falsifier = None;
    let rejection = e.seal().unwrap_err();
    assert_eq!(rejection.errors[0].rule(), "hypothesis_without_falsifier");
}

#[test]
fn a_watch_trigger_is_sealed_and_checked() {
    let trigger = json!({
        "rule": "stuck-io",
        "kind": "d_state",
        "fired_at": "2026-12-04T10:00:00.000Z",
        "condition": {"d_state_ms": "12000", "tid": "4242"}
    });
    let ok = verify(&sealed_bytes(with(|v| {
        v["collector"]["trigger"] = trigger.clone()
    })))
    .expect("a well-formed trigger verifies");
    let t = ok.collector.trigger.as_ref().expect("trigger kept");
    assert_eq!((t.rule.as_str(), t.kind.as_str()), ("stuck-io", "d_state"));
    assert_eq!(t.condition["d_state_ms"], "12000");

    for (member, bad) in [
        ("kind", json!("cpu_hot")),
        ("rule", json!(" ")),
        ("fired_at", json!("yesterday")),
    ] {
        let mut t = trigger.clone();
        t[member] = bad;
        let err = verify(&sealed_bytes(with(|v| {
            v["collector"]["trigger"] = t.clone()
        })))
        .unwrap_err();
        assert!(
            err.errors.iter().any(|e| e
                .to_string()
                .contains(&format!("collector.trigger.{member}"))),
            "{member}: {err:?}"
        );
    }
    let mut t = trigger.clone();
    t["surprise"] = json!(1);
    let err = verify(&sealed_bytes(with(|v| {
        v["collector"]["trigger"] = t.clone()
    })))
    .unwrap_err();
    assert_eq!(err.errors[0].rule(), "unknown_field");
}

/// The fixtures that fail before there is a typed envelope to judge: the fast
/// path leaves all of these to the general path, which names them.
const STRUCTURAL: &[&str] = &[
    "not_utf8",
    "json",
    "duplicate_key",
    "float",
    "number_out_of_range",
    "too_deep",
    "wrong_schema",
    "unknown_field",
    "missing_field",
    "missing_identity_field",
    "unmapped_status",
];

#[test]
fn every_hostile_fixture_gets_the_same_verdict_from_both_paths() {
    use crate::fast_path::{check_same_verdict, minify};
    for (rule, make) in FIXTURES {
        let bytes = make();
        check_same_verdict(&bytes);
        // Rendered compact, as pstack writes: canonical where the fixture
        // allows, so the fast path decides every rule it can see.
        let compact = minify(&bytes);
        let decided = check_same_verdict(&compact);
        assert_eq!(decided, !STRUCTURAL.contains(rule), "fixture {rule}");
        let rejection = pstack_envelope::verify(&compact).expect_err(rule);
        let fired: Vec<&str> = rejection.errors.iter().map(EnvelopeError::rule).collect();
        assert_eq!(fired, vec![*rule], "compact fixture {rule}: {rejection}");
    }
}
