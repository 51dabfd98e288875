//! What Hubble saw of the transfer: a section of [`super::transfer_envelope`].

use std::net::{IpAddr, SocketAddr};

use pstack_envelope::{ClaimCode, ClaimKind, StatusCause, Surface, SurfaceStatus, sha256_digest};
use serde_json::{Map, Value, json};

use super::{Cx, Out};
use crate::longhorn::flows::classify;
use crate::longhorn::hubble::{HUBBLE_DEADLINE, hubble_facts};

/// Hubble: what Cilium did with the packets to the peer, or the unknown that asks.
pub(super) fn hubble_section(cx: Cx, o: &mut Out) {
    let Cx { plan, r, topo, .. } = cx;
    let hubble_probe = format!(
        "hubble observe --ip {} --since 30m -o jsonpb   # all verdicts; run on the other node too",
        plan.filter.peer
    );
    let mut hubble_answered = false;
    if let Some(h) = &r.hubble {
        let auth = format!("exec:{}", h.command);
        match h.result.clone().and_then(|out| {
            hubble_facts(&out)
                .map(|f| (f, out))
                .map_err(|m| crate::longhorn::client::ApiFailure {
                    status: SurfaceStatus::Error,
                    errno: None,
                    message: m,
                })
        }) {
            Ok((mut facts, out)) => {
                // Each connection labelled by its role in the rebuild.
                if let (Some(t), Some(Value::Array(conns))) = (topo, facts.get_mut("connections")) {
                    for c in conns {
                        let end = |ip: &str, port: &str| -> Option<SocketAddr> {
                            let ip: IpAddr = c.get(ip)?.as_str()?.parse().ok()?;
                            let port = u16::try_from(c.get(port)?.as_u64()?).ok()?;
                            Some(SocketAddr::new(ip, port))
                        };
                        if let (Some(x), Some(y)) = (
                            end("source", "source_port"),
                            end("destination", "destination_port"),
                        ) {
                            let role = classify(t, x, y, r.by_ip);
                            c["role"] = json!(role.as_str());
                        }
                    }
                }
                let dropped = facts["dropped_flows"].as_u64().unwrap_or(0);
                let verdicts = facts["verdicts"].to_string();
                let reasons = facts["reasons"].to_string();
                o.surfaces.push(Surface::read(
                    "cilium/hubble",
                    auth,
                    HUBBLE_DEADLINE.as_millis() as u64,
                    h.elapsed_us,
                    Some((sha256_digest(&out), out.len() as u64)),
                    facts,
                ));
                if dropped > 0 {
                    o.claim(ClaimKind::Fact, ClaimCode::HubbleReportsDrops, format!("Hubble reports {dropped} DROPPED flow(s) involving {} over the window ({reasons}); all verdicts: {verdicts}", plan.filter.peer), &["cilium/hubble"], None);
                } else {
                    o.claim(ClaimKind::Fact, ClaimCode::HubbleReportsNoDrops, format!("Hubble reports no DROPPED flow involving {} over the window (verdicts: {verdicts}); this does not clear the network: a packet FORWARDED on this node may still never reach the other one — compare with the other node's capture, and Multus storage-network traffic is invisible to Cilium", plan.filter.peer), &["cilium/hubble"], None);
                }
                hubble_answered = true;
            }
            Err(f) => o.surfaces.push(Surface {
                id: "cilium/hubble".into(),
                authority: auth,
                status: f.status,
                cause: Some(StatusCause {
                    errno: f.errno,
                    message: f.message,
                }),
                deadline_ms: HUBBLE_DEADLINE.as_millis() as u64,
                elapsed_us: h.elapsed_us,
                digest: None,
                bytes: 0,
                truncated: false,
                facts: Map::new(),
            }),
        }
    }
    if !hubble_answered {
        let has = o.surfaces.iter().any(|s| s.id == "cilium/hubble");
        o.unknown(
            format!(
                "what did Cilium do with the packets between this node and {} (every verdict, per connection)?",
                plan.filter.peer
            ),
            "EXCLUDE_POLICY_DROP",
            hubble_probe,
            has.then_some("cilium/hubble"),
        );
    }
}
