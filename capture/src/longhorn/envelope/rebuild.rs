//! The rebuild's Engine Events, the watcher's verdict and the terminal
//! unknown. Sections of [`super::transfer_envelope`].

use std::net::{IpAddr, SocketAddr};

use pstack_envelope::surface_id::storage_transfer::STREAMS;
use pstack_envelope::{
    ClaimCode, ClaimKind, Envelope, StatusCause, Subject, Surface, SurfaceStatus, sha256_digest,
};
use serde_json::{Map, Value, json};

use super::{Cx, Out, endpoints, role_in};
use crate::longhorn::flows::FlowRole;
use crate::longhorn::kube::{EVENTS_DEADLINE, kubectl_events};
use crate::longhorn::model::{RebuildEntry, Volume, parse_error_addrs};

/// The rebuild's Engine Events seen by the watcher (its verdict: [`verdict_section`]).
/// Formats: longhorn-manager v1.9.0 `controller/engine_controller.go`
/// l.1860 (Rebuilding), l.1874 (FailedRebuilding), l.1916 (Rebuilt),
/// l.1793/1827 (snapshot purge), l.855 (Faulted).
pub(super) fn engine_events(cx: Cx, roles: &[(&Envelope, FlowRole)], o: &mut Out) {
    let Cx { r, .. } = cx;
    let streams = &r.streams;
    let role_of = |digest: &str| role_in(roles, digest);
    if !r.signals.is_empty() {
        let mut facts = Map::new();
        facts.insert("events".into(), json!(r.signals));
        facts.insert("source".into(), json!("pstackd's Engine Events watch"));
        o.surfaces.push(Surface {
            id: "kubernetes/events/watch".into(),
            authority: format!(
                "k8s:WATCH /api/v1/namespaces/{}/events?fieldSelector=involvedObject.kind=Engine",
                crate::longhorn::kube::NAMESPACE
            ),
            status: SurfaceStatus::Ok,
            cause: None,
            deadline_ms: crate::longhorn::kube::WATCH_SESSION.as_millis() as u64,
            elapsed_us: 0,
            digest: None,
            bytes: 0,
            truncated: false,
            facts,
        });
    }
    for ev in &r.signals {
        let addrs = parse_error_addrs(&ev.message);
        o.claim(
            ClaimKind::Fact,
            ClaimCode::LonghornEngineEvent,
            format!(
                "Kubernetes Event {} ({}) on {} {} at {}: {:?}",
                ev.reason, ev.event_type, ev.kind, ev.name, ev.last, ev.message
            ),
            &["kubernetes/events/watch"],
            None,
        );
        let failure = matches!(
            ev.reason.as_str(),
            "FailedRebuilding" | "TimeoutSnapshotPurge" | "FailedStartingSnapshotPurge" | "Faulted"
        );
        if !failure {
            continue;
        }
        // The address pairs and endpoints it names, linked to flows.
        let cause = addrs.cause.clone().unwrap_or_else(|| "an error".into());
        let mut named: Vec<(Option<SocketAddr>, SocketAddr)> =
            addrs.pairs.iter().map(|(a, b)| (Some(*a), *b)).collect();
        named.extend(addrs.endpoints.iter().map(|b| (None, *b)));
        for (x, y) in named {
            let hits: Vec<&Envelope> = streams
                .flows
                .iter()
                .filter(|s| {
                    endpoints(s).is_some_and(|(l, rm)| match x {
                        Some(x) => (l == x && rm == y) || (l == y && rm == x),
                        None => rm == y,
                    })
                })
                .collect();
            let what = match x {
                Some(x) => format!("{x}→{y}"),
                None => format!("a connection to {y}"),
            };
            // Flows that lived inside the window between the two sock_diag
            // samples (a dial that timed out on a dropped SYN is one).
            let transient: Vec<&crate::transport::TransientFlow> = streams
                .short_lived
                .iter()
                .flatten()
                .filter(|f| match x {
                    Some(x) => (f.local == x && f.remote == y) || (f.local == y && f.remote == x),
                    None => f.remote == y,
                })
                .collect();
            for f in &transient {
                o.claim(
                    ClaimKind::Fact,
                    ClaimCode::LonghornErrorNamesShortLivedFlow,
                    format!(
                        "the {} Event names {cause} on {what}; this is the short-lived flow {}→{} seen by eBPF inside the window (states {}; {} retransmit(s), {} RST sent, {} RST received{})",
                        ev.reason,
                        f.local,
                        f.remote,
                        if f.transitions.is_empty() { "?".to_string() } else { f.transitions.join(" ") },
                        f.retransmits,
                        f.resets_sent,
                        f.resets_received,
                        if !f.transitions.is_empty() && !f.transitions.iter().any(|t| t.contains(">ESTABLISHED")) {
                            "; it never reached ESTABLISHED"
                        } else {
                            ""
                        }
                    ),
                    &["kubernetes/events/watch", STREAMS],
                    None,
                );
            }
            if hits.is_empty() {
                if x.is_some() && transient.is_empty() {
                    o.claim(
                        ClaimKind::Fact,
                        ClaimCode::LonghornErrorNamesUnlinkedConnection,
                        format!(
                            "the {} Event names {cause} on {what}; no stream linked here has that address pair (it closed before the window, or is captured on the other node)",
                            ev.reason
                        ),
                        &["kubernetes/events/watch", STREAMS],
                        None,
                    );
                }
                continue;
            }
            for s in hits {
                let (flow, state) = match &s.subject {
                    Subject::NetworkStream(n) => (
                        n.flow_id.clone(),
                        s.surfaces
                            .iter()
                            .find(|x| x.id == "tcp/end")
                            .and_then(|x| x.facts.get("state"))
                            .and_then(Value::as_str)
                            .unwrap_or("?")
                            .to_string(),
                    ),
                    _ => (String::new(), String::new()),
                };
                o.claim(
                    ClaimKind::Fact,
                    ClaimCode::LonghornErrorNamesStream,
                    format!(
                        "the {} Event names {cause} on {what}; this is flow {flow} (last state {state}), role {}, stream envelope {}",
                        ev.reason,
                        role_of(&s.digest).map(FlowRole::as_str).unwrap_or("?"),
                        s.digest
                    ),
                    &["kubernetes/events/watch", STREAMS],
                    None,
                );
            }
        }
    }
}

/// The watcher's verdict on the rebuild; whether it closes the terminal question.
pub(super) fn verdict_section(cx: Cx, o: &mut Out) -> bool {
    let Cx { r, topo, .. } = cx;
    let verdict_closes = r
        .verdict
        .as_ref()
        .is_some_and(|v| v.outcome != "unresolved" && !v.outcome.is_empty());
    if let Some(v) = &r.verdict {
        let (code, statement) = if v.outcome.starts_with("failed") {
            (
                ClaimCode::LonghornRebuildFailed,
                format!(
                    "the rebuild failed ({}) at step {}{}: {:?}",
                    v.basis,
                    v.step,
                    if v.before_file_sync {
                        ", before file sync (no rebuildStatus entry was in_progress)"
                    } else {
                        ""
                    },
                    v.error
                ),
            )
        } else if v.outcome == "complete" {
            (
                ClaimCode::LonghornRebuildComplete,
                format!("the rebuild completed ({})", v.basis),
            )
        } else if v.outcome == "removed" {
            (
                ClaimCode::LonghornRebuildRemoved,
                format!(
                    "the rebuild ended without a FailedRebuilding Event because the replica or volume was removed on purpose ({}): not a failure",
                    v.basis
                ),
            )
        } else {
            (
                ClaimCode::LonghornRebuildUnresolved,
                format!("the rebuild's outcome is not known: {}", v.basis),
            )
        };
        let mut on: Vec<&str> = vec!["longhorn/manager/end"];
        if !r.signals.is_empty() {
            on.push("kubernetes/events/watch");
        }
        on.retain(|s| o.ok(s) || o.surfaces.iter().any(|x| x.id == *s));
        o.claim(ClaimKind::Fact, code, statement, &on, None);
        // Per source (v1.11+): the texts that name it — by its replica
        // address `tcp://IP:P` or its sync agent `IP:P+2` (the 4-tuple's
        // server end).
        let names = |text: &str, p: &crate::longhorn::topology::Party| {
            let (Some(ip), Some(b)) = (p.data_ip(), p.block) else {
                return false;
            };
            let ip = match ip {
                IpAddr::V6(_) => format!("[{ip}]"),
                IpAddr::V4(_) => ip.to_string(),
            };
            text.contains(&format!("tcp://{ip}:{} ", b.start))
                || text.contains(&format!("->{ip}:{}:", b.start.saturating_add(2)))
                || text.contains(&format!("->{ip}:{} ", b.start.saturating_add(2)))
        };
        let per_source: Vec<String> = topo
            .map(|t| {
                t.sources()
                    .map(|p| {
                        let resets = v.retry_errors.iter().filter(|e| names(e, p)).count();
                        let failed = !v.error.is_empty() && names(&v.error, p);
                        format!(
                            "{} {}{}",
                            p.name,
                            if failed {
                                "named by the failure"
                            } else {
                                "not named by a failure"
                            },
                            if resets > 0 {
                                format!(", {resets} retried reset(s)")
                            } else {
                                String::new()
                            }
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        if v.retries > 0 {
            o.claim(
                ClaimKind::Fact,
                ClaimCode::LonghornRebuildRetries,
                format!(
                    "the rebuild survived {} reset(s): each was followed by the file's next attempt (the entry stayed in_progress; from v1.11 each file is retried up to 3 times), so none is the rebuild's end, which is judged by its final state ({}); per source: {}; texts: {:?}",
                    v.retries,
                    v.outcome,
                    if per_source.is_empty() { "no source known".to_string() } else { per_source.join("; ") },
                    v.retry_errors
                ),
                &on,
                None,
            );
        } else if per_source.len() > 1 {
            o.claim(
                ClaimKind::Fact,
                ClaimCode::LonghornRebuildSources,
                format!(
                    "the rebuild had {} sources (fromReplicaList): {}",
                    per_source.len(),
                    per_source.join("; ")
                ),
                &on,
                None,
            );
        }
    }
    verdict_closes
}

/// How the rebuild ended, or the unknown that asks: an entry gone from
/// rebuildStatus (the Events read through the Kubernetes API, or the command
/// to read them), else the terminal question while nothing closed it.
/// Gone: `[]` (or no entry for the target) after the target's rebuild was seen.
pub(super) fn terminal_unknown(
    cx: Cx,
    volumes: &[Option<Volume>; 2],
    target_name: &Option<String>,
    seen_start: Option<RebuildEntry>,
    terminal: bool,
    verdict_closes: bool,
    o: &mut Out,
) {
    let Cx { a, r, .. } = cx;
    let replica_probe = |r: &str| {
        format!(
            "kubectl -n longhorn-system get replicas.longhorn.io {r} -o jsonpath='{{.status.conditions[?(@.type==\"RebuildFailed\")]}} {{.spec.failedAt}}'; kubectl -n longhorn-system get events --field-selector involvedObject.kind=Engine,involvedObject.name={e},reason=FailedRebuilding",
            e = a.engine
        )
    };
    let kubectl = format!(
        "kubectl -n longhorn-system get volumes.longhorn.io {v} -o jsonpath='{{.status.state}} {{.status.robustness}}'; kubectl -n longhorn-system get engines.longhorn.io {e} -o jsonpath='{{.status.rebuildStatus}}'; kubectl -n longhorn-system get events --field-selector involvedObject.kind=Engine,involvedObject.name={e},reason=FailedRebuilding",
        v = a.volume,
        e = a.engine
    );
    let gone = seen_start.is_some()
        && volumes[1].as_ref().is_some_and(|v| {
            !v.rebuild
                .iter()
                .any(|e| Some(&e.replica) == target_name.as_ref())
        });
    if gone {
        let t = target_name.clone().unwrap_or_default();
        let failed_at = volumes[1]
            .as_ref()
            .and_then(|v| v.replicas.iter().find(|r| r.name == t))
            .map(|r| (r.mode.clone(), r.failed_at.clone()));
        o.claim(
            ClaimKind::Fact,
            ClaimCode::LonghornRebuildEntryGone,
            format!(
                "the rebuild of replica {t} reported at window start is gone from rebuildStatus at window end{}: the entry exists only while the replica is WO, so this is not an outcome",
                match &failed_at {
                    Some((m, f)) if !f.is_empty() => format!(" (the replica is now mode {m:?}, failedAt {f})"),
                    Some((m, _)) => format!(" (the replica is now mode {m:?}, no failedAt)"),
                    None => " (the replica is no longer listed)".into(),
                }
            ),
            &["longhorn/manager/start", "longhorn/manager/end"],
            None,
        );
        // The Events, read through the Kubernetes API, or the command to read them.
        let mut events_read = false;
        for read in r.events.iter().flatten() {
            let id = format!("kubernetes/events/{}", read.object);
            let auth = format!("k8s:GET {}", read.url);
            match &read.result {
                Ok((events, body)) => {
                    events_read = true;
                    let failed_rebuilding: Vec<_> = events
                        .iter()
                        .filter(|e| e.reason == "FailedRebuilding")
                        .collect();
                    let mut facts = Map::new();
                    facts.insert("read_at".into(), json!(read.at));
                    facts.insert("object".into(), json!(read.object));
                    facts.insert("events".into(), json!(events));
                    o.surfaces.push(Surface::read(
                        id.clone(),
                        auth,
                        EVENTS_DEADLINE.as_millis() as u64,
                        read.elapsed_us,
                        Some((sha256_digest(body), body.len() as u64)),
                        facts,
                    ));
                    for e in &failed_rebuilding {
                        let pairs: Vec<String> = parse_error_addrs(&e.message)
                            .pairs
                            .iter()
                            .map(|(x, y)| format!("{x}→{y}"))
                            .collect();
                        o.claim(
                            ClaimKind::Fact,
                            ClaimCode::LonghornFailedRebuildingEvent,
                            format!(
                                "Kubernetes Event FailedRebuilding ({}) on {} {} at {} (count {}, from {}): {:?}{}",
                                e.event_type,
                                e.kind,
                                e.name,
                                e.last,
                                e.count,
                                e.component,
                                e.message,
                                if pairs.is_empty() {
                                    String::new()
                                } else {
                                    format!("; it names {}", pairs.join(", "))
                                }
                            ),
                            &[id.as_str(), "longhorn/manager/end"],
                            None,
                        );
                    }
                    if failed_rebuilding.is_empty() {
                        o.claim(
                            ClaimKind::Fact,
                            ClaimCode::KubernetesEventsWithoutFailedRebuilding,
                            format!(
                                "the Kubernetes API lists {} Event(s) for {} in {} at {} and none is FailedRebuilding (Events expire, by default after an hour)",
                                events.len(),
                                read.object,
                                crate::longhorn::kube::NAMESPACE,
                                read.at
                            ),
                            &[id.as_str()],
                            None,
                        );
                    }
                }
                Err(f) => o.surfaces.push(Surface {
                    id,
                    authority: auth,
                    status: f.status,
                    cause: Some(StatusCause {
                        errno: f.errno,
                        message: f.message.clone(),
                    }),
                    deadline_ms: EVENTS_DEADLINE.as_millis() as u64,
                    elapsed_us: read.elapsed_us,
                    digest: None,
                    bytes: 0,
                    truncated: false,
                    facts: {
                        let mut m = Map::new();
                        m.insert("read_at".into(), json!(read.at));
                        m.insert("object".into(), json!(read.object));
                        m
                    },
                }),
            }
        }
        let all_events_read = events_read && r.events.iter().flatten().all(|x| x.result.is_ok());
        let probe = if all_events_read {
            replica_probe(&t)
        } else {
            format!(
                "{}; {}; {}; {}",
                replica_probe(&t),
                kubectl_events(&a.volume),
                kubectl_events(&a.engine),
                kubectl_events(&t)
            )
        };
        if !verdict_closes {
            o.unknown(
            format!(
                "did the rebuild of replica {t} complete or fail, and with what error? (its rebuildStatus entry is gone)"
            ),
            "CLASSIFY_TRANSFER_TERMINAL",
            probe,
            Some("longhorn/manager/end"),
        );
        }
    } else if !terminal && !verdict_closes {
        let surface = ["longhorn/manager/end", "longhorn/manager/start"]
            .into_iter()
            .find(|s| o.surfaces.iter().any(|x| x.id == *s));
        o.unknown(
            format!(
                "what rebuild terminal state does Longhorn report for engine {}?",
                a.engine
            ),
            "CLASSIFY_TRANSFER_TERMINAL",
            match &target_name {
                Some(t) => format!("{kubectl}; {}", replica_probe(t)),
                None => kubectl.clone(),
            },
            surface,
        );
    }
}
