//! Seed 001's adversarial acceptance test: a newcomer given only a compact
//! handoff (from `GET /internal/bundles`) and the store's base URL and key
//! identifies the first missing transition and takes the next legal action,
//! for a D-state process, a reset rebuild stream and an incident whose
//! blast radius says `insufficient_sample`. The newcomer ([`agent`]) is
//! plain HTTP + JSON: it imports none of the store's types. The test side
//! only builds the world (envelopes, incidents, findings, changes) and
//! checks what the newcomer chose against what the handoff demanded.

use pstack_envelope::{
    Claim, ClaimKind, NextTransition, Scope, StreamIdentity, Subject, Surface, SurfaceStatus,
    Termination, Unknown, sha256_digest,
};
use pstack_store_core::synthetic::Capture;
use reqwest::StatusCode;
use serde_json::{Value, json};

use super::post;
use crate::on_both_backends;
use crate::support::{Db, Harness};

/// The scripted newcomer. It knows the store's base URL and key, the
/// handoff or bundle it was given, and seed 001's published agent loop;
/// nothing else.
pub(crate) mod agent {
    use serde_json::{Value, json};

    /// What the newcomer decided, before acting.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Decision {
        /// The first missing transition, in the handoff's words.
        pub first_missing: String,
        /// The next legal action it will take (the handoff's, or derived).
        pub action: String,
        /// The loop step that action is taken in.
        pub step: String,
        /// What it proposes there: a command line or a tool.
        pub proposal: Proposal,
        /// The envelope it acts on, if any.
        pub evidence: Option<String>,
    }

    /// A proposal to the supervisor.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Proposal {
        /// `proposeCommand`.
        Command(String),
        /// `propose`.
        Tool(String),
    }

    /// Why the newcomer will not act.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Refusal {
        /// A field it needs is absent or of the wrong type.
        Missing(&'static str),
        /// The handoff names an action the loop has no step for.
        UnknownAction(String),
        /// The handoff is past its expiry.
        Expired,
        /// The store disagreed (status, body).
        Store(u16, String),
    }

    fn text<'a>(v: &'a Value, field: &'static str) -> Result<&'a str, Refusal> {
        v[field]
            .as_str()
            .filter(|s| !s.trim().is_empty())
            .ok_or(Refusal::Missing(field))
    }

    /// Decide from one handoff: the first missing transition is its
    /// `firstMissingTransition`; the action is its `nextLegalAction`.
    /// Capture actions are taken in the loop's CAPTURE step by proposing
    /// the frontier's probe (a `pstackctl` command line); a falsifier test
    /// in CHOOSE FALSIFIER; a receipt in ISSUE RECEIPT.
    pub fn decide_from_handoff(h: &Value) -> Result<Decision, Refusal> {
        let digest = text(h, "digest")?;
        text(h, "uri")?;
        text(h, "expiresAt")?;
        if h["expired"].as_bool().ok_or(Refusal::Missing("expired"))? {
            return Err(Refusal::Expired);
        }
        let next = &h["nextLegalAction"];
        let action = text(next, "action").map_err(|_| Refusal::Missing("nextLegalAction"))?;
        if !action.bytes().all(|b| b.is_ascii_uppercase() || b == b'_') {
            return Err(Refusal::UnknownAction(action.into()));
        }
        let frontier = &h["firstMissingTransition"];
        let first_missing = match (frontier["edge"].as_str(), frontier["what"].as_str()) {
            (Some(e), Some(w)) => format!("{e}:{w}"),
            _ if frontier.is_null() => "none".to_string(),
            _ => return Err(Refusal::Missing("firstMissingTransition")),
        };
        let probe = frontier["probe"].as_str();
        let (step, proposal) = if action.starts_with("CAPTURE") {
            let command = probe
                .filter(|p| p.starts_with("pstackctl "))
                .ok_or(Refusal::Missing("firstMissingTransition.probe"))?;
            ("capture", Proposal::Command(command.into()))
        } else if action == "TEST_FALSIFIER" {
            (
                "choose-falsifier",
                Proposal::Tool("pstack:search_similar_findings".into()),
            )
        } else if action == "ISSUE_RECEIPT" {
            (
                "issue-receipt",
                Proposal::Tool("pstack:record_investigation_finding".into()),
            )
        } else {
            return Err(Refusal::UnknownAction(action.into()));
        };
        Ok(Decision {
            first_missing,
            action: action.into(),
            step: step.into(),
            proposal,
            evidence: Some(digest.into()),
        })
    }

    /// Decide from an incident's bundle. A candidate change whose blast
    /// radius says `insufficient_sample` is the first missing transition
    /// (the change → regression edge is unproven), and no remediation is
    /// legal on it: the next action is to ask for the blast radius again
    /// in CHOOSE FALSIFIER. Otherwise the first handoff decides.
    pub fn decide_from_bundle(b: &Value) -> Result<Decision, Refusal> {
        let changes = b["bundle"]["autosre"]["candidateChanges"]
            .as_array()
            .ok_or(Refusal::Missing("candidateChanges"))?;
        for c in changes {
            let id = text(&c["change"], "id").map_err(|_| Refusal::Missing("change.id"))?;
            let verdict = c["blastRadius"]["verdict"]
                .as_str()
                .ok_or(Refusal::Missing("blastRadius.verdict"))?;
            if verdict == "insufficient_sample" {
                return Ok(Decision {
                    first_missing: format!("blast_radius:{id}:insufficient_sample"),
                    action: "GATHER_SAMPLE".into(),
                    step: "choose-falsifier".into(),
                    proposal: Proposal::Tool("pstack:get_change_blast_radius".into()),
                    evidence: None,
                });
            }
        }
        let handoffs = b["handoffs"]
            .as_array()
            .ok_or(Refusal::Missing("handoffs"))?;
        decide_from_handoff(handoffs.first().ok_or(Refusal::Missing("handoffs"))?)
    }

    /// What acting left behind in the store.
    #[derive(Debug)]
    pub struct Acted {
        /// The run it started.
        pub run: String,
        /// The run after its last step.
        pub state: Value,
        /// The supervisor's verdict on the proposal.
        pub verdict: String,
    }

    struct Store<'a> {
        http: reqwest::Client,
        base: &'a str,
        key: &'a str,
    }

    impl Store<'_> {
        async fn send(&self, req: reqwest::RequestBuilder) -> Result<Value, Refusal> {
            let resp = req
                .bearer_auth(self.key)
                .send()
                .await
                .map_err(|e| Refusal::Store(0, e.to_string()))?;
            let status = resp.status().as_u16();
            let body: Value = resp.json().await.unwrap_or(Value::Null);
            if !(200..300).contains(&status) {
                return Err(Refusal::Store(status, body.to_string()));
            }
            Ok(body)
        }
        async fn get(&self, path: &str) -> Result<Value, Refusal> {
            self.send(self.http.get(format!("{}{path}", self.base)))
                .await
        }
        async fn post(&self, path: &str, body: Value) -> Result<Value, Refusal> {
            self.send(self.http.post(format!("{}{path}", self.base)).json(&body))
                .await
        }
    }

    /// Take the decided action: read the evidence at the handoff's
    /// canonical URI, start a supervised run, bind the evidence in
    /// CAPTURE, walk the run's `legalNext` to the decided step (citing the
    /// handoff, so an expired one is refused), and propose there.
    pub async fn act(
        base: &str,
        key: &str,
        handoff: Option<&Value>,
        d: &Decision,
    ) -> Result<Acted, Refusal> {
        let store = Store {
            http: reqwest::Client::new(),
            base,
            key,
        };
        if let (Some(h), Some(digest)) = (handoff, &d.evidence) {
            let env = store.get(h["uri"].as_str().unwrap_or_default()).await?;
            if env["digest"].as_str() != Some(digest) {
                return Err(Refusal::Store(200, "the URI names other evidence".into()));
            }
        }
        let started = store
            .post("/internal/runs", json!({"agentIdentity": "newcomer"}))
            .await?;
        let run = text(&started["run"], "id")?.to_string();
        let steps = format!("/internal/runs/{run}/steps");
        let mut state = started["run"].clone();
        if let Some(digest) = &d.evidence {
            state = store
                .post(&steps, json!({"kind": "observe", "envelope": digest}))
                .await?["run"]
                .clone();
        }
        let mut hops = 0;
        while state["current"].as_str() != Some(d.step.as_str()) {
            let legal = state["legalNext"]
                .as_array()
                .ok_or(Refusal::Missing("legalNext"))?;
            let to = legal
                .iter()
                .filter_map(Value::as_str)
                .find(|s| *s == d.step)
                .or_else(|| {
                    legal
                        .iter()
                        .filter_map(Value::as_str)
                        .find(|s| !s.starts_with("end:"))
                })
                .ok_or(Refusal::UnknownAction(d.step.clone()))?
                .to_string();
            let mut body = json!({"kind": "advance", "step": to});
            if let Some(digest) = &d.evidence {
                body["handoff"] = json!(digest);
            }
            state = store.post(&steps, body).await?["run"].clone();
            hops += 1;
            if hops > 16 || state["status"] != "running" {
                return Err(Refusal::Store(200, state.to_string()));
            }
        }
        let body = match &d.proposal {
            Proposal::Command(c) => json!({"kind": "proposeCommand", "command": c}),
            Proposal::Tool(t) => json!({"kind": "propose", "tool": t}),
        };
        let r = store.post(&steps, body).await?;
        Ok(Acted {
            run,
            state: r["run"].clone(),
            verdict: r["verdict"].as_str().unwrap_or_default().to_string(),
        })
    }
}

on_both_backends!(a_newcomer_with_only_a_handoff_takes_the_next_legal_action);

/// Seconds since the synthetic base for a capture `ago_s` seconds before now.
fn seq(h: &Harness, ago_s: i64) -> u64 {
    u64::try_from(h.clock.now_ns() / 1_000_000_000 - ago_s - 1_796_000_000).expect("after base")
}

/// A D-state process: one thread in D, its stack read timed out.
async fn d_state_process(h: &Harness) -> String {
    let (d, b) = Capture::new("node-a", 4242, seq(h, 5)).bytes().unwrap();
    let (st, r) = h.post_batch(&[b]).await;
    assert!(st.is_success() && r.rejected == 0);
    d
}

/// A Longhorn replica rebuild stream the peer reset (eBPF saw the RST),
/// with the peer side not yet captured.
async fn reset_rebuild_stream(h: &Harness) -> String {
    let mut env = Capture::new("node-a", 4242, seq(h, 5)).unsealed();
    env.subject = Subject::NetworkStream(StreamIdentity {
        src: "10.0.0.8:41234".into(),
        dst: "10.0.0.9:10001".into(),
        protocol: "tcp".into(),
        flow_id: "81234".into(),
        net_ns: Some("4026532301".into()),
    });
    env.universe.selector = "tcp flows 10.0.0.8 -> 10.0.0.9:10001".into();
    env.universe.selector_digest = sha256_digest(env.universe.selector.as_bytes());
    env.universe.expected_count = 1;
    env.universe.observed_count = 1;
    env.universe.termination = Termination::Exhausted;
    let surface = |id: &str, facts: Value| {
        let Value::Object(facts) = facts else {
            unreachable!("object")
        };
        Surface {
            id: id.into(),
            authority: format!("pstack:{id}"),
            status: SurfaceStatus::Ok,
            cause: None,
            deadline_ms: 250,
            elapsed_us: 90,
            digest: Some(sha256_digest(id.as_bytes())),
            bytes: 128,
            truncated: false,
            facts,
        }
    };
    env.surfaces = vec![
        surface("tcp/start", json!({"state": "ESTABLISHED"})),
        surface("tcp/end", json!({"state": "CLOSE"})),
        surface("ebpf/tcp", json!({"resets_received": 1, "resets_sent": 0})),
    ];
    let fact = |id: &str, code: &str, statement: &str, surfaces: &[&str]| Claim {
        id: id.into(),
        kind: ClaimKind::Fact,
        code: code.into(),
        statement: statement.into(),
        surfaces: surfaces.iter().map(|s| s.to_string()).collect(),
        scope: Scope::Existential,
        falsifier: None,
    };
    env.claims = vec![
        fact(
            "c1",
            "flow_left_established",
            "flow 10.0.0.8:41234 -> 10.0.0.9:10001 was ESTABLISHED at window start and is in CLOSE at window end",
            &["tcp/start", "tcp/end"],
        ),
        fact(
            "c2",
            "rst_received_from_peer",
            "RST received from 10.0.0.9:10001 (the remote endpoint sent it) on flow cookie 81234",
            &["ebpf/tcp"],
        ),
    ];
    env.unknowns = vec![Unknown {
        id: "u1".into(),
        question: "why did the replica on 10.0.0.9 reset the rebuild stream?".into(),
        blocks: "CAPTURE_PEER_SIDE".into(),
        owner: "operator of node-b".into(),
        probe:
            "pstackctl capture transport --peer 10.0.0.8:41234 --local 10.0.0.9:10001 --window 60s"
                .into(),
        surface: None,
    }];
    env.next_transition = NextTransition {
        action: "CAPTURE_PEER_SIDE".into(),
        success_receipt:
            "a sealed envelope of the same flow captured on the node owning 10.0.0.9:10001".into(),
        abort_conditions: vec!["the transfer has finished or was cancelled".into()],
    };
    env.completeness = pstack_envelope::Completeness::Complete;
    let env = env.seal().expect("a valid stream envelope");
    let (st, r) = h.post_batch(&[serde_json::to_vec(&env).unwrap()]).await;
    assert!(st.is_success() && r.rejected == 0, "{:?}", r.results);
    env.digest
}

/// An incident whose finding cites `cited` and names `change`; its id.
async fn incident(h: &Harness, key: &str, cited: &[String], change: Option<&str>) -> String {
    let (st, r) = post(
        h,
        "/internal/incidents",
        &json!({"project": "p", "environment": "prod", "dedupKey": key,
            "title": "checkout slow", "faultLocusEntityId": "checkout-api"}),
    )
    .await;
    assert!(st.is_success(), "{r}");
    let id = r["incident"]["id"].as_str().unwrap().to_string();
    let mut f = json!({"environment": "prod", "incidentId": id,
        "faultLocusEntityId": "checkout-api",
        "causalChain": [{"subject": "checkout-api", "relation": "originated_fault_in_span", "object": "checkout-api"}],
        "citedEvidenceIds": cited, "idempotencyKey": format!("newcomer-{key}")});
    if let Some(c) = change {
        f["contributingChangeId"] = json!(c);
    }
    let (st, r) = post(h, "/internal/findings", &f).await;
    assert_eq!(st, StatusCode::CREATED, "{r}");
    id
}

async fn bundle(h: &Harness, incident: &str) -> Value {
    let (st, b) = h
        .get(&format!(
            "/internal/bundles?intent=triage_incident&incident={incident}&budgetTokens=100000"
        ))
        .await;
    assert_eq!(st, StatusCode::OK, "{b}");
    b
}

fn base(h: &Harness) -> String {
    h.url("").trim_end_matches('/').to_string()
}

/// The newcomer acts on `handoff`; its choice must be the handoff's, and
/// the store must accept it.
async fn newcomer_on_handoff(h: &Harness, handoff: &Value, want_missing: &str, want_action: &str) {
    use agent::{Proposal, decide_from_handoff};
    let d = decide_from_handoff(handoff).expect("the newcomer can act on the handoff alone");
    assert_eq!(d.first_missing, want_missing, "{handoff}");
    assert_eq!(d.action, want_action);
    assert_eq!(
        d.action, handoff["nextLegalAction"]["action"],
        "it takes the handoff's next legal action"
    );
    assert_eq!(
        d.proposal,
        Proposal::Command(
            handoff["firstMissingTransition"]["probe"]
                .as_str()
                .unwrap()
                .into()
        ),
        "and closes the first missing transition with its probe"
    );
    let acted = agent::act(&base(h), &h.key, Some(handoff), &d)
        .await
        .expect("the store accepts the newcomer's action");
    assert_eq!(acted.verdict, "permit", "{}", acted.state);
    assert_eq!(acted.state["status"], "running");
    assert_eq!(acted.state["current"], "capture");
    assert_eq!(acted.state["deviations"], json!([]));
    assert_eq!(
        acted.state["captures"][0]["digest"], handoff["digest"],
        "the run is bound to the handoff's evidence"
    );
    // The same answer when read back.
    let (_, got) = h.get(&format!("/internal/runs/{}", acted.run)).await;
    assert_eq!(got["run"]["subject"], acted.state["subject"]);
}

async fn a_newcomer_with_only_a_handoff_takes_the_next_legal_action(db: Db) {
    use agent::{Proposal, Refusal, decide_from_bundle, decide_from_handoff};
    let Some(h) = Harness::start(db).await else {
        return;
    };
    // 1. A D-state process.
    let d = d_state_process(&h).await;
    let inc = incident(&h, "dstate", std::slice::from_ref(&d), None).await;
    let b = bundle(&h, &inc).await;
    let dstate = b["handoffs"][0].clone();
    assert_eq!(dstate["digest"], d);
    newcomer_on_handoff(&h, &dstate, "surface:task/4243/stack", "CAPTURE_AGAIN").await;

    // 2. A reset rebuild stream.
    let s = reset_rebuild_stream(&h).await;
    let inc = incident(&h, "rst", std::slice::from_ref(&s), None).await;
    let stream = bundle(&h, &inc).await["handoffs"][0].clone();
    assert_eq!(stream["subjectKind"], "network_stream", "{stream}");
    newcomer_on_handoff(
        &h,
        &stream,
        "unknown:why did the replica on 10.0.0.9 reset the rebuild stream?",
        "CAPTURE_PEER_SIDE",
    )
    .await;

    // 3. An incident whose candidate change has no traffic to judge by.
    let (st, c) = post(
        &h,
        "/v1/changes",
        &json!({"environment": "prod", "kind": "deploy", "service": "checkout-api",
            "version": "2.4.1", "previousVersion": "2.4.0", "summary": "strict decimal rounding"}),
    )
    .await;
    assert!(st.is_success(), "{c}");
    let change = c["id"].as_str().unwrap().to_string();
    let inc = incident(&h, "sample", &[], Some(&change)).await;
    let b = bundle(&h, &inc).await;
    let radius = &b["bundle"]["autosre"]["candidateChanges"][0];
    assert_eq!(radius["change"]["id"], change.as_str());
    assert_eq!(radius["blastRadius"]["verdict"], "insufficient_sample");
    let dec = decide_from_bundle(&b).expect("the newcomer can act on the bundle alone");
    assert_eq!(
        dec.first_missing,
        format!("blast_radius:{change}:insufficient_sample")
    );
    assert_eq!(
        (dec.step.as_str(), &dec.proposal),
        (
            "choose-falsifier",
            &Proposal::Tool("pstack:get_change_blast_radius".into())
        ),
        "no remediation on an unjudged change: it asks for the sample again"
    );
    let acted = agent::act(&base(&h), &h.key, None, &dec).await.unwrap();
    assert_eq!(acted.verdict, "permit", "{}", acted.state);
    assert_eq!(acted.state["current"], "choose-falsifier");
    assert_eq!(acted.state["deviations"], json!([]));

    // Hostile: a handoff that omits or garbles its next action, or has
    // expired, is refused rather than guessed at; so is a bundle whose
    // blast radius lost its verdict.
    let mut no_next = dstate.clone();
    no_next.as_object_mut().unwrap().remove("nextLegalAction");
    assert_eq!(
        decide_from_handoff(&no_next),
        Err(Refusal::Missing("nextLegalAction"))
    );
    let mut garbled = dstate.clone();
    garbled["nextLegalAction"]["action"] = json!("REBOOT_THE_HOST");
    assert_eq!(
        decide_from_handoff(&garbled),
        Err(Refusal::UnknownAction("REBOOT_THE_HOST".into()))
    );
    let mut no_frontier = stream.clone();
    no_frontier["firstMissingTransition"] = json!({"edge": 7});
    assert_eq!(
        decide_from_handoff(&no_frontier),
        Err(Refusal::Missing("firstMissingTransition"))
    );
    let mut stale = dstate.clone();
    stale["expired"] = json!(true);
    assert_eq!(decide_from_handoff(&stale), Err(Refusal::Expired));
    let mut lost = b.clone();
    lost["bundle"]["autosre"]["candidateChanges"][0]["blastRadius"] = Value::Null;
    assert_eq!(
        decide_from_bundle(&lost),
        Err(Refusal::Missing("blastRadius.verdict"))
    );
    // And the store itself refuses to move on a handoff past its expiry
    // (process freshness 120 s): the newcomer cannot act on stale evidence.
    h.clock.advance(std::time::Duration::from_secs(121));
    let dec = decide_from_handoff(&stream).unwrap();
    let mut later = dec.clone();
    later.step = "bind-identity".into();
    later.proposal = Proposal::Tool("pstack:get_envelope_handoff".into());
    match agent::act(&base(&h), &h.key, Some(&stream), &later).await {
        Err(Refusal::Store(410, body)) => assert!(body.contains("handoff_expired"), "{body}"),
        other => panic!("an expired handoff moved a run: {other:?}"),
    }
    h.finish().await;
}
