//! Table tests of the supervisor and the report (seed 003 rows 3-01 …
//! 3-36, with pstack's own fixtures standing in for the runbook corpus).

use std::collections::BTreeMap;

use pstack_envelope::Completeness;

use super::deviation::*;
use super::graph::*;
use super::report::*;
use super::supervisor::*;

fn step(tools: &[&str], next: &[&str]) -> Step {
    Step {
        tools: tools.iter().map(|s| s.to_string()).collect(),
        next: next.iter().map(|s| s.to_string()).collect(),
        ..Step::default()
    }
}

fn graph(name: &str, entry: &str, steps: Vec<(&str, Step)>, budgets: &[(&str, u32)]) -> StepGraph {
    let g = StepGraph {
        name: format!("pstack-fixtures/{name}"),
        version: "1".into(),
        entry: entry.into(),
        steps: steps.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        budgets: budgets.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
    };
    g.validate().unwrap();
    g
}

fn terminal(t: Terminal) -> Step {
    Step {
        terminal: Some(t),
        ..Step::default()
    }
}

/// A disk-pressure procedure: df, then du, then journalctl.
fn disk() -> StepGraph {
    graph(
        "disk-pressure",
        "s1",
        vec![
            ("s1", step(&["cli:df"], &["s2"])),
            ("s2", step(&["cli:du"], &["s3"])),
            ("s3", step(&["cli:journalctl"], &["done"])),
            ("done", terminal(Terminal::Success)),
        ],
        &[],
    )
}

/// A node-readiness procedure whose first check routes a failure to the
/// author's escalate node.
fn k8s() -> StepGraph {
    let mut s1 = step(&["cli:kubectl"], &["s2"]);
    s1.assert = Some(Assert {
        exit_code: Some(0),
        stdout_equals: Some("False".into()),
    });
    s1.on_fail = Some("s9".into());
    graph(
        "k8s-node",
        "s1",
        vec![
            ("s1", s1),
            ("s2", step(&["cli:kubectl"], &["s3"])),
            ("s3", step(&["cli:systemctl"], &["s4"])),
            ("s4", step(&["cli:journalctl"], &["s5"])),
            ("s5", step(&["cli:kubectl"], &["done"])),
            ("done", terminal(Terminal::Success)),
            ("s9", terminal(Terminal::Escalate)),
        ],
        &[],
    )
}

/// A retry loop with a budget on `s1->s2`.
fn flaky() -> StepGraph {
    graph(
        "flaky-check",
        "s1",
        vec![
            ("s1", step(&["cli:make"], &["s2"])),
            ("s2", step(&["cli:make"], &["s1", "done"])),
            ("done", terminal(Terminal::Success)),
        ],
        &[("s1->s2", 3)],
    )
}

fn begin(g: &StepGraph, escalation: Option<Escalation>, evaluate: bool) -> RunState {
    start_run(
        g,
        StartOptions {
            agent_identity: "agent-7".into(),
            escalation,
            evaluate_postconditions: evaluate,
            subject: None,
        },
    )
    .unwrap()
}

fn permissive() -> Option<Escalation> {
    Some(Escalation::permissive(99))
}

fn classes(s: &RunState) -> Vec<DeviationClass> {
    s.deviations.iter().map(|d| d.class).collect()
}

fn fixture(class: DeviationClass) -> Vec<DeviationClass> {
    use DeviationClass::*;
    match class {
        UndeclaredTool => {
            let st = begin(&disk(), permissive(), false);
            classes(&propose(&disk(), st, "cli:nothing-declares-this").state)
        }
        OutOfScopeTool => {
            let st = begin(&disk(), permissive(), false);
            classes(&propose(&disk(), st, "cli:du").state)
        }
        OutOfOrderStep => {
            let st = begin(&k8s(), permissive(), false);
            classes(&advance(&k8s(), st, "s5", 0).state)
        }
        UncheckedAdvance => {
            let st = begin(&k8s(), permissive(), true);
            classes(&advance(&k8s(), st, "s2", 0).state)
        }
        BudgetExhausted => {
            let g = flaky();
            let mut st = begin(&g, permissive(), false);
            for _ in 0..20 {
                if st.status != RunStatus::Running {
                    break;
                }
                let to = if st.current == "s2" { "s1" } else { "s2" };
                st = advance(&g, st, to, 0).state;
            }
            classes(&st)
        }
        UnroutedFailure => {
            let mut g = disk();
            g.steps.get_mut("s1").unwrap().assert = Some(Assert {
                exit_code: Some(0),
                stdout_equals: None,
            });
            let st = begin(&g, permissive(), false);
            let obs = Observation {
                exit_code: Some(1),
                ..Observation::default()
            };
            classes(&observe(&g, st, obs).state)
        }
        TerminalNotReached => {
            let st = begin(&disk(), permissive(), false);
            classes(&conclude(&disk(), st).state)
        }
    }
}

#[test]
fn every_deviation_class_has_a_fixture_that_produces_exactly_it() {
    // `fixture` is an exhaustive match: a new class without a fixture does
    // not compile; here each produces exactly its own class.
    for class in DeviationClass::ALL {
        assert_eq!(fixture(class), vec![class], "{}", class.as_str());
    }
    let names: Vec<&str> = DeviationClass::ALL.iter().map(|c| c.as_str()).collect();
    assert_eq!(
        names,
        [
            "undeclared-tool",
            "out-of-scope-tool",
            "out-of-order-step",
            "unchecked-advance",
            "budget-exhausted",
            "unrouted-failure",
            "terminal-not-reached"
        ]
    );
}

const SECRETS: [&str; 6] = [
    "cli:psql --password=hunter2",
    "cli:curl https://api.example.com?token=sk-live-4242424242",
    "cli:kubectl --token=eyJhbGciOiJIUzI1NiJ9.secret",
    "cli:aws --secret-access-key wJalrXUtnFEMI/K7MDENG",
    "mcp:Authorization: Bearer abcdef0123456789",
    "Bearer sk-live-1",
];

fn leaks(serialized: &str, attempted: &str) -> bool {
    [
        "hunter2",
        "sk-live",
        "eyJ",
        "wJalr",
        "abcdef0123456789",
        "password=",
    ]
    .iter()
    .any(|s| serialized.contains(s))
        || serialized.contains(attempted)
}

#[test]
fn a_deviation_record_and_the_run_state_carry_no_payload() {
    for tool in SECRETS {
        let st = begin(&disk(), permissive(), false);
        let d = propose(&disk(), st, tool);
        assert_eq!(d.verdict, Verdict::Block);
        let all = serde_json::to_string(&(&d.state, &d.events)).unwrap();
        assert!(!leaks(&all, tool), "{tool} leaked: {all}");
        let want = capability_class_of(Some(tool));
        assert_eq!(d.state.deviations[0].capability_class, want);
    }
    let st = begin(&disk(), permissive(), false);
    let d = propose_command(&disk(), st, "df -h $(cat /etc/shadow) --password=hunter2");
    let all = serde_json::to_string(&d.state).unwrap();
    assert_eq!(d.verdict, Verdict::Block);
    for bad in ["shadow", "hunter2", "df"] {
        assert!(!all.contains(bad), "{bad} in {all}");
    }
    assert_eq!(classes(&d.state), [DeviationClass::UndeclaredTool]);
    assert_eq!(d.state.deviations[0].capability_class, None);
}

#[test]
fn records_are_ordered_by_sequence_without_a_clock() {
    let mut st = begin(&disk(), permissive(), false);
    st = propose(&disk(), st, "cli:a").state;
    st = propose(&disk(), st, "cli:b").state;
    let seq: Vec<u32> = st.deviations.iter().map(|d| d.sequence).collect();
    assert_eq!(seq, [0, 1]);
    let s = serde_json::to_string(&st).unwrap();
    assert!(
        !s.chars()
            .collect::<Vec<_>>()
            .windows(10)
            .any(|w| w.iter().all(char::is_ascii_digit)),
        "{s}"
    );
}

#[test]
fn a_blocked_call_stays_blocked_however_often_it_is_proposed() {
    let mut st = begin(&disk(), permissive(), false);
    for _ in 0..5 {
        let d = propose(&disk(), st, "cli:nothing-declares-this");
        assert_eq!(d.verdict, Verdict::Block);
        st = d.state;
    }
    assert_eq!(st.deviations.len(), 5);
    let d = propose_command(&disk(), st, "rm -rf /var/lib/postgresql");
    assert_eq!(d.verdict, Verdict::Block);
    // The declared tool through the command path is permitted.
    let st = begin(&disk(), None, false);
    assert_eq!(
        propose_command(&disk(), st, "df -h /tmp").verdict,
        Verdict::Permit
    );
}

#[test]
fn escalation_defaults_end_the_run_on_control_flow_and_block_tools() {
    let st = begin(&k8s(), None, false);
    let moved = advance(&k8s(), st, "s5", 0);
    assert_eq!(moved.state.status, RunStatus::Ended);
    let esc = moved
        .events
        .iter()
        .find(|e| e.kind == EventKind::Escalated)
        .expect("an escalated event");
    assert!(esc.message.contains("out-of-order-step"), "{}", esc.message);
    assert_eq!(esc.at.as_deref(), Some("s1"));
    assert!(!esc.message.contains("s5"));

    let st = begin(&disk(), None, false);
    let d = propose(&disk(), st, "cli:du");
    assert_eq!(d.verdict, Verdict::Block);
    assert_eq!(d.state.status, RunStatus::Running);
}

#[test]
fn escalation_overrides_are_the_operators() {
    let st = begin(&k8s(), permissive(), false);
    let d = advance(&k8s(), st, "s5", 0);
    assert_eq!(d.state.status, RunStatus::Running);
    assert_eq!(d.state.current, "s1", "a blocked transition does not move");
    // And the other way: abort on a tool class.
    let mut responses = BTreeMap::new();
    responses.insert(DeviationClass::OutOfScopeTool, Response::Abort);
    let strict = Escalation {
        responses,
        max_total: 5,
    };
    let st = begin(&disk(), Some(strict), false);
    let d = propose(&disk(), st, "cli:du");
    assert_eq!(d.state.status, RunStatus::Ended);
    assert_eq!(d.state.outcome, Some(InternalOutcome::Aborted));
}

#[test]
fn max_total_stops_the_run_once_exceeded() {
    let mut st = begin(&disk(), None, false);
    for i in 0..=DEFAULT_MAX_TOTAL {
        assert_eq!(st.status, RunStatus::Running, "still running before {i}");
        st = propose(&disk(), st, "cli:du").state;
    }
    assert_eq!(st.status, RunStatus::Ended);
    assert_eq!(st.deviations.len(), DEFAULT_MAX_TOTAL as usize + 1);
    assert_eq!(st.outcome, Some(InternalOutcome::DeviationLimit));
    assert!(st.events.iter().any(|e| e.code == "run/deviation-limit"));
}

#[test]
fn an_anticipated_escalation_is_not_a_deviation() {
    let st = begin(&k8s(), None, true);
    let obs = Observation {
        exit_code: Some(0),
        stdout: Some("True".into()),
        capture: None,
    };
    let d = observe(&k8s(), st, obs);
    assert_eq!(d.state.current, "s9");
    assert!(d.state.deviations.is_empty());
    assert_eq!(d.state.status, RunStatus::Ended);
    let c = conclude(&k8s(), d.state);
    assert!(c.state.deviations.is_empty());
    assert!(local_account(&k8s(), &c.state).complete);
    // Stopped elsewhere: terminal-not-reached.
    let st = begin(&k8s(), None, false);
    assert_eq!(
        classes(&conclude(&k8s(), st).state),
        [DeviationClass::TerminalNotReached]
    );
}

#[test]
fn the_local_account_counts_by_class_and_step_with_the_caveat() {
    let mut st = begin(&disk(), permissive(), false);
    st = propose(&disk(), st, "cli:nope").state;
    st = propose(&disk(), st, "cli:nope").state;
    let r = local_account(&disk(), &st);
    assert_eq!(r.deviations.count, 2);
    assert_eq!(r.deviations.by_class[&DeviationClass::UndeclaredTool], 2);
    assert_eq!(r.deviations.by_step["s1"], 2);
    assert!(r.caveats.join(" ").contains("graph may not match reality"));
}

#[test]
fn recording_on_an_ended_run_does_not_resurrect_it() {
    let mut st = begin(&disk(), None, false);
    st.status = RunStatus::Ended;
    let d = record_deviation(st, DeviationClass::OutOfOrderStep);
    assert_eq!(d.state.status, RunStatus::Ended);
    assert_eq!(d.state.deviations.len(), 1);
    // Through every step kind.
    let st = conclude(&disk(), begin(&disk(), None, false)).state;
    assert_eq!(st.status, RunStatus::Ended);
    let st = advance(&disk(), st, "s2", 0).state;
    let st = propose(&disk(), st, "cli:df").state;
    let st = observe(&disk(), st, Observation::default()).state;
    assert_eq!(st.status, RunStatus::Ended);
    assert_eq!(st.current, "s1");
    assert_eq!(st.deviations.len(), 4);
}

// ---- pstack's rule for MUTATE ----

/// A complete capture expiring at `expires_ns`, observed just before it
/// but no later than 100 (the `now` these tests advance at).
fn capture(subject: &str, expires_ns: i64) -> Observation {
    capture_of(
        subject,
        (expires_ns - 1).min(100),
        expires_ns,
        Completeness::Complete,
    )
}

fn capture_of(
    subject: &str,
    wall_ns: i64,
    expires_ns: i64,
    completeness: Completeness,
) -> Observation {
    Observation {
        capture: Some(Capture {
            digest: "ab".repeat(32),
            subject: subject.into(),
            kind: "process".into(),
            completeness: Some(completeness),
            wall_ns,
            expires_ns,
            epoch: 0,
        }),
        ..Observation::default()
    }
}

fn to_choose_falsifier(g: &StepGraph, obs: Option<Observation>) -> RunState {
    let mut st = begin(g, None, true);
    if let Some(o) = obs {
        st = observe(g, st, o).state;
    }
    for to in ["bind-identity", "classify-unknown", "choose-falsifier"] {
        let d = advance(g, st, to, 100);
        assert_eq!(d.verdict, Verdict::Permit, "{to}: {:?}", d.state.deviations);
        st = d.state;
    }
    st
}

#[test]
fn a_mutate_needs_a_fresh_pre_mutation_capture_of_the_same_subject() {
    let g = investigation_loop();
    // No capture at all.
    let st = to_choose_falsifier(&g, None);
    let d = advance(&g, st, "mutate", 100);
    assert_eq!(classes(&d.state), [DeviationClass::OutOfOrderStep]);
    assert_eq!(d.state.status, RunStatus::Ended);
    // A stale one.
    let st = to_choose_falsifier(&g, Some(capture("proc:h/1", 100)));
    let d = advance(&g, st, "mutate", 100);
    assert_eq!(classes(&d.state), [DeviationClass::OutOfOrderStep]);
    // A fresh one: permitted.
    let st = to_choose_falsifier(&g, Some(capture("proc:h/1", 101)));
    let d = advance(&g, st, "mutate", 100);
    assert_eq!(d.verdict, Verdict::Permit);
    assert!(d.state.deviations.is_empty());
    // CAPTURE AGAIN of another subject does not satisfy the DIFF, nor
    // does the pre-mutation capture observed again.
    let st = advance(&g, d.state, "capture-again", 100).state;
    let replay = observe(&g, st.clone(), capture("proc:h/1", 99)).state;
    assert_eq!(
        classes(&advance(&g, replay, "diff", 100).state),
        [DeviationClass::OutOfOrderStep]
    );
    let st = observe(&g, st, capture("proc:h/2", 1000)).state;
    let d = advance(&g, st.clone(), "diff", 100);
    assert_eq!(classes(&d.state), [DeviationClass::OutOfOrderStep]);
    // The same subject does.
    let st = observe(&g, st, capture("proc:h/1", 1000)).state;
    let d = advance(&g, st, "diff", 100);
    assert_eq!(d.verdict, Verdict::Permit, "{:?}", d.state.deviations);
    // A pre-mutation capture from before the first mutation does not
    // satisfy a second one: back to choose-falsifier, then mutate.
    let st = observe(
        &g,
        d.state,
        Observation {
            exit_code: Some(0),
            ..Observation::default()
        },
    )
    .state;
    let st = advance(&g, st, "choose-falsifier", 100).state;
    let d = advance(&g, st, "mutate", 100);
    assert_eq!(
        d.verdict,
        Verdict::Permit,
        "capture-again counts as pre-mutation"
    );
}

/// MUTATE refuses a `partial` or `identity_race` capture with the
/// completeness named, accepts `complete` and `bounded`, and judges
/// freshness at, just below and just above the threshold (process: 120 s).
#[test]
fn a_mutate_needs_a_complete_or_bounded_capture_within_its_freshness() {
    let g = investigation_loop();
    let f = super::freshness::Freshness::default();
    let wall = 1_000_000_000_000i64;
    let fresh = f.of("process");
    let expires = f.expires_ns("process", wall);
    for (completeness, age, permitted, code) in [
        (
            Completeness::IdentityRace,
            1,
            false,
            "run/pre-mutation-incomplete",
        ),
        (
            Completeness::Partial,
            1,
            false,
            "run/pre-mutation-incomplete",
        ),
        (Completeness::Complete, 1, true, ""),
        (Completeness::Bounded, 1, true, ""),
        (Completeness::Complete, fresh - 1, true, ""),
        (
            Completeness::Complete,
            fresh,
            false,
            "run/pre-mutation-stale",
        ),
        (
            Completeness::Complete,
            fresh + 1,
            false,
            "run/pre-mutation-stale",
        ),
        (
            Completeness::Bounded,
            fresh + 1,
            false,
            "run/pre-mutation-stale",
        ),
    ] {
        let st = to_choose_falsifier(
            &g,
            Some(capture_of("proc:h/1", wall, expires, completeness)),
        );
        let d = advance(&g, st, "mutate", wall + age);
        let what = format!("{completeness:?} at age {age}");
        assert_eq!(d.verdict == Verdict::Permit, permitted, "{what}: {d:?}");
        if permitted {
            assert!(
                d.refusal.is_none() && d.state.deviations.is_empty(),
                "{what}"
            );
            continue;
        }
        assert_eq!(
            classes(&d.state),
            [DeviationClass::OutOfOrderStep],
            "{what}"
        );
        let refusal = d.refusal.as_ref().expect("a typed refusal");
        let dev = d
            .events
            .iter()
            .find(|e| e.kind == EventKind::Deviation)
            .unwrap();
        assert_eq!(dev.code, code, "{what}");
        if code == "run/pre-mutation-incomplete" {
            assert_eq!(refusal.code(), "pre_mutation_envelope_incomplete");
            assert_eq!(refusal.completeness(), Some(completeness));
            assert!(
                dev.message.contains(completeness.as_str()),
                "{}",
                dev.message
            );
        } else {
            assert_eq!(refusal.code(), "pre_mutation_envelope_stale");
        }
        // Every code the refusal writes has a row in the report's table.
        assert_eq!(failure_class_for(&dev.code), Ok(None));
    }
    // The latest capture is judged: a fresh complete one followed by an
    // identity race refuses.
    let mut st = begin(&g, None, true);
    for o in [
        capture_of("proc:h/1", wall, expires, Completeness::Complete),
        capture_of(
            "proc:h/1",
            wall + 5,
            expires + 5,
            Completeness::IdentityRace,
        ),
    ] {
        st = observe(&g, st, o).state;
    }
    for to in ["bind-identity", "classify-unknown", "choose-falsifier"] {
        st = advance(&g, st, to, wall + 10).state;
    }
    let d = advance(&g, st, "mutate", wall + 10);
    assert_eq!(
        d.refusal.and_then(|r| r.completeness()),
        Some(Completeness::IdentityRace)
    );
}

#[test]
fn a_failed_diff_ends_failed_with_a_typed_report() {
    let g = investigation_loop();
    let st = to_choose_falsifier(&g, Some(capture("proc:h/1", 1000)));
    let st = advance(&g, st, "mutate", 100).state;
    let st = advance(&g, st, "capture-again", 100).state;
    let st = observe(&g, st, capture("proc:h/1", 1000)).state;
    let st = advance(&g, st, "diff", 100).state;
    let st = observe(
        &g,
        st,
        Observation {
            exit_code: Some(1),
            ..Observation::default()
        },
    )
    .state;
    assert_eq!(st.current, "end:failed");
    assert_eq!(outcome_of(&st), Outcome::Failed);
    let r = build_run_report(&st, &ctx(None)).unwrap();
    assert_eq!(r.failed_step_id.as_deref(), Some("diff"));
    assert_eq!(r.failure_class, Some(FailureClass::ExpectationMismatch));
    validate(&serde_json::to_value(&r).unwrap()).unwrap();
}

// ---- the report ----

fn ctx(failure_class: Option<FailureClass>) -> ReportContext {
    ReportContext {
        runbook: "pstack/investigation-loop".into(),
        version: "1".into(),
        content_hash: format!("sha256:{}", "0".repeat(64)),
        profile: Profile::P0,
        runtime_profile: RuntimeProfile::R1,
        executor_kind: ExecutorKind::Autonomous,
        env_class: EnvClass::Ci,
        reported_at: "2026-12-03".into(),
        elapsed_seconds: Some(75.0),
        failure_class,
        agent_seconds: Some(60.0),
        hypotheses: vec![ReportHypothesis {
            hypothesis: "h:0123456789abcdef".into(),
            state: super::hypotheses::HypothesisState::Falsified,
            moved_by: vec![format!("sha256:{}", "a".repeat(64))],
        }],
    }
}

#[test]
fn the_failure_class_table_is_the_seeds() {
    use FailureClass::*;
    let rows: &[(&str, Option<FailureClass>)] = &[
        ("run/started", None),
        ("run/after-end", None),
        ("run/deviation-limit", None),
        ("run/escalated-terminal-not-reached", None),
        ("run/expectation-failed", Some(ExpectationMismatch)),
        ("run/unrouted-failure", Some(ExpectationMismatch)),
        ("run/undeclared-tool", Some(PermissionDenied)),
        ("run/unanalyzable-command", Some(PermissionDenied)),
        ("runtime/autonomous-unsupervised", Some(PermissionDenied)),
        ("runtime/capability-unavailable", Some(ToolMissing)),
        ("run/no-entry", Some(PreconditionUnmet)),
        ("run/budget-exhausted", Some(Timeout)),
        ("run/wall-clock-exhausted", Some(Timeout)),
        ("run/approval-denied", Some(HumanAbort)),
        ("run/content-hash-mismatch", Some(UpstreamChanged)),
    ];
    for (code, want) in rows {
        assert_eq!(failure_class_for(code).unwrap(), *want, "{code}");
    }
    assert_eq!(
        failure_class_for("run/made-up"),
        Err(ReportError::UnmappedReason("run/made-up".into()))
    );
    // Every code the supervisor can emit is in the table.
    for c in DeviationClass::ALL {
        failure_class_for(&format!("run/{}", c.as_str())).unwrap();
        failure_class_for(&format!("run/escalated-{}", c.as_str())).unwrap();
    }
}

#[test]
fn an_unmapped_code_refuses_to_emit() {
    let mut st = begin(&disk(), None, false);
    st.events.push(Event {
        kind: EventKind::Checked,
        code: "run/made-up".into(),
        at: Some("s1".into()),
        message: String::new(),
    });
    assert!(matches!(
        emit(&st, &ctx(None)),
        Err(ReportError::UnmappedReason(c)) if c == "run/made-up"
    ));
}

#[test]
fn a_failed_run_without_a_cause_needs_the_operators_class() {
    // disk's s3 → done is success; make a graph whose failed terminal is
    // reached by a plain advance.
    let mut g = disk();
    g.steps.insert("fail".into(), terminal(Terminal::Failed));
    g.steps.get_mut("s1").unwrap().next.push("fail".into());
    let st = advance(&g, begin(&g, None, false), "fail", 0).state;
    assert_eq!(outcome_of(&st), Outcome::Failed);
    assert_eq!(
        build_run_report(&st, &ctx(None)),
        Err(ReportError::UnclassifiableFailure(Some("fail".into())))
    );
    let r = emit(&st, &ctx(Some(FailureClass::HumanAbort))).unwrap();
    assert_eq!(r["failure_class"], "human_abort");
    assert_eq!(r["failed_step_id"], "fail");
}

#[test]
fn outcome_of_and_duration_buckets() {
    let mut st = begin(&disk(), None, false);
    assert_eq!(outcome_of(&st), Outcome::Partial);
    st.status = RunStatus::Ended;
    for (o, want) in [
        (InternalOutcome::Success, Outcome::Success),
        (InternalOutcome::Failed, Outcome::Failed),
        (InternalOutcome::TimedOut, Outcome::Failed),
        (InternalOutcome::BudgetExhausted, Outcome::Failed),
        (InternalOutcome::Escalated, Outcome::Aborted),
        (InternalOutcome::Aborted, Outcome::Aborted),
        (InternalOutcome::DeviationLimit, Outcome::Aborted),
    ] {
        st.outcome = Some(o);
        assert_eq!(outcome_of(&st), want, "{o:?}");
    }
    for (s, want) in [
        (Some(0.0), DurationBucket::UnderOneMinute),
        (Some(59.9), DurationBucket::UnderOneMinute),
        (Some(60.0), DurationBucket::OneToFive),
        (Some(299.0), DurationBucket::OneToFive),
        (Some(300.0), DurationBucket::FiveToThirty),
        (Some(1800.0), DurationBucket::OverThirty),
        (Some(f64::NAN), DurationBucket::OverThirty),
        (Some(f64::INFINITY), DurationBucket::OverThirty),
        (None, DurationBucket::OverThirty),
    ] {
        assert_eq!(duration_bucket(s), want, "{s:?}");
    }
}

#[test]
fn emitted_reports_validate_and_hostile_ones_do_not() {
    let st = conclude(&disk(), begin(&disk(), None, false)).state;
    let r = emit(&st, &ctx(None)).unwrap();
    assert_eq!(r["outcome"], "aborted");
    assert_eq!(r["duration_bucket"], "1-5m");
    assert_eq!(r["deviation_count"], 1);
    let mut bad = r.clone();
    bad["message"] = serde_json::json!("hunter2");
    assert!(validate(&bad).is_err(), "no field for a message");
    let mut bad = r.clone();
    bad["reported_at"] = serde_json::json!("2026-12-03T19:00:00Z");
    assert!(validate(&bad).is_err(), "the day, not the moment");
    let mut bad = r.clone();
    bad["outcome"] = serde_json::json!("failed");
    assert!(validate(&bad).is_err(), "failed needs a class");
    // The ledger and the acceptance metrics: keys, states, digests and counts.
    assert_eq!(r["hypotheses"][0]["state"], "falsified");
    assert_eq!(r["acceptance"]["retractions"], 0);
    assert_eq!(r["acceptance"]["transitions"], 0);
    assert!(
        r["acceptance"]
            .get("first_discriminating_observation_bucket")
            .is_none()
    );
    let mut bad = r.clone();
    bad["hypotheses"][0]["statement"] = serde_json::json!("the FUSE server of /home/alice");
    assert!(validate(&bad).is_err(), "no statement leaves the store");
    let mut bad = r.clone();
    bad["hypotheses"][0]["hypothesis"] = serde_json::json!("fuse_server_not_answering");
    assert!(validate(&bad).is_err(), "a key, not a code");
    let mut bad = r;
    bad["acceptance"]["narration"] = serde_json::json!("status: all good");
    assert!(validate(&bad).is_err(), "no narration in the report");
}
