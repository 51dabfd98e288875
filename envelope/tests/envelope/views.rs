//! Diff and handoff on concrete before/after captures.

use pstack_envelope::{
    ClaimKind, EnvelopeError, SurfaceStatus, diff, example::example_unsealed, handoff,
};
use serde_json::json;

#[test]
fn diff_reports_status_facts_claims_and_unknowns() {
    let before = example_unsealed().seal().unwrap();
    let mut after = example_unsealed();
    after.surfaces[2].status = SurfaceStatus::Ok;
    after.surfaces[2].cause = None;
    after.surfaces[1].facts.insert("state".into(), json!("S"));
    after.surfaces.push(pstack_envelope::Surface {
        id: "task/4242/io".into(),
        ..after.surfaces[0].clone()
    });
    after.claims.retain(|c| c.kind != ClaimKind::Fact);
    after.unknowns.clear();
    let after = after.seal().unwrap();
    let d = diff(&before, &after).unwrap();
    assert_eq!(d.surfaces_added, vec!["task/4242/io"]);
    assert!(d.surfaces_removed.is_empty());
    assert_eq!(d.status_changed.len(), 1);
    assert_eq!(
        (d.status_changed[0].before, d.status_changed[0].after),
        (SurfaceStatus::Timeout, SurfaceStatus::Ok)
    );
    assert_eq!(d.facts_changed.len(), 1);
    assert_eq!(d.facts_changed[0].fact, "state");
    assert_eq!(d.facts_changed[0].before, Some(json!("D")));
    assert_eq!(d.claims_resolved.len(), 1);
    assert!(d.claims_resolved[0].starts_with("fact:thread_in_d_state"));
    assert_eq!(
        d.unknowns_resolved,
        vec!["what is thread 4243's kernel stack?"]
    );
    assert!(d.render().contains("task/4243/stack: timeout -> ok"));
}

#[test]
fn diff_refuses_different_subjects() {
    let a = example_unsealed().seal().unwrap();
    let mut b = example_unsealed();
    if let pstack_envelope::Subject::Process(p) = &mut b.subject {
        p.start_ticks += 1; // same PID, a different process
    }
    let b = b.seal().unwrap();
    assert!(matches!(
        diff(&a, &b),
        Err(EnvelopeError::SubjectMismatch { .. })
    ));
}

#[test]
fn handoff_names_the_first_missing_edge_with_its_probe() {
    let env = example_unsealed().seal().unwrap();
    let h = handoff(&env);
    let f = h.frontier.as_ref().unwrap();
    assert_eq!(
        (f.edge, f.what.as_str(), f.status),
        ("surface", "task/4243/stack", Some(SurfaceStatus::Timeout))
    );
    assert_eq!(
        f.probe.as_deref(),
        Some("pstackctl capture --tid 4243 --surface-deadline 2s")
    );
    assert_eq!(h.hypotheses.len(), 1);
    assert_eq!(h.next_transition.action, "CAPTURE_AGAIN");
    assert_eq!(h.digest, env.digest);
    let text = h.render();
    assert!(text.lines().count() < 20, "{text}");
    for needle in [
        "partial",
        "task/4243/stack (timeout)",
        "falsifier:",
        "CAPTURE_AGAIN",
        &env.digest,
    ] {
        assert!(text.contains(needle), "{needle} missing from\n{text}");
    }
    assert!(serde_json::to_vec(&h).unwrap().len() < 2048);
}
