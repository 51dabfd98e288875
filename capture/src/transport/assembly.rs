//! Assembly of a transport capture: the flows matched at either sample,
//! the envelope of each (or the one `no_matching_flow` envelope), and the
//! clock, bounds and collector they share.

use super::*;

impl Ctx<'_> {
    pub(super) fn build(&self) -> Result<CaptureResult, TransportError> {
        let (s, e) = (tcp_of(&self.raw.start), tcp_of(&self.raw.end));
        let selector = format!("{} netns={}", self.plan.filter.selector(), self.net_ns);
        // Flows: union of matches at start and end, by cookie, in first-seen order.
        let mut order: Vec<u64> = Vec::new();
        let mut at_start: BTreeMap<u64, &TcpSocket> = BTreeMap::new();
        let mut at_end: BTreeMap<u64, &TcpSocket> = BTreeMap::new();
        if let Ok((d, _)) = &s {
            for x in &d.sockets {
                at_start.insert(x.cookie, x);
                order.push(x.cookie);
            }
        }
        if let Ok((d, _)) = &e {
            for x in &d.sockets {
                at_end.insert(x.cookie, x);
                if !at_start.contains_key(&x.cookie) {
                    order.push(x.cookie);
                }
            }
        }
        let tcp_failed = s.is_err() || e.is_err();
        let short_lived = self.short_lived(&order);
        if order.is_empty() {
            return Ok(CaptureResult {
                net_ns: self.net_ns,
                flows: Vec::new(),
                no_match: Some(self.no_match_envelope(&selector, tcp_failed)?),
                short_lived,
            });
        }
        let expected = order.len() as u64;
        let termination = if order.len() > self.plan.max_flows {
            Termination::Cap
        } else {
            Termination::Exhausted
        };
        order.truncate(self.plan.max_flows);
        let view = self.netns_view();
        let mut flows = Vec::new();
        for cookie in &order {
            let env = self.flow_envelope(
                *cookie,
                at_start.get(cookie).copied(),
                at_end.get(cookie).copied(),
                &view,
                &selector,
                expected,
                order.len() as u64,
                termination,
            )?;
            flows.push(env);
        }
        Ok(CaptureResult {
            net_ns: self.net_ns,
            flows,
            no_match: None,
            short_lived,
        })
    }

    /// eBPF's flows that closed inside the window, match the selection,
    /// belong to this netns (by inode; without one, by this end not being
    /// the peer) and are none of the sock_diag sockets `seen`.
    pub(super) fn short_lived(&self, seen: &[u64]) -> Option<Vec<TransientFlow>> {
        let EbpfWindow::Flows { transient, .. } = &self.raw.ebpf else {
            return None;
        };
        Some(
            transient
                .iter()
                .filter(|f| {
                    f.cookie
                        .as_ref()
                        .and_then(|c| c.parse::<u64>().ok())
                        .is_none_or(|c| !seen.contains(&c))
                })
                .filter(|f| match f.netns_ino {
                    Some(ino) => u64::from(ino) == self.net_ns,
                    None => f.local.ip() != self.plan.filter.peer,
                })
                .filter(|f| self.plan.filter.matches_endpoints(f.local, f.remote))
                .cloned()
                .collect(),
        )
    }

    /// Wall time of a CLOCK_MONOTONIC instant inside the capture.
    pub(super) fn wall_at(&self, mono_ns: u64) -> String {
        crate::clock::wall_time_of(mono_ns)
    }

    pub(super) fn clock(&self) -> Clock {
        Clock {
            wall_time: self.raw.wall.clone(),
            monotonic_start_ns: self.raw.mono_start.to_string(),
            monotonic_end_ns: self.raw.mono_end.to_string(),
            bundle_deadline_ms: self.bundle_deadline_ms(),
        }
    }

    pub(super) fn bundle_deadline_ms(&self) -> u64 {
        self.plan.window.as_millis() as u64 + 4 * SURFACE_DEADLINE_MS
    }

    pub(super) fn bounds(&self) -> Bounds {
        Bounds {
            surface_deadline_ms: SURFACE_DEADLINE_MS,
            bundle_deadline_ms: self.bundle_deadline_ms(),
            max_threads: self.plan.max_flows as u64,
            max_bytes_per_surface: 0,
            leak_budget: self.leak_budget,
            caps: caps(self.plan.max_flows),
        }
    }

    pub(super) fn collector(&self) -> Collector {
        Collector {
            name: "pstackctl capture transport".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            source_commit: SOURCE_COMMIT.into(),
            trigger: self.plan.trigger.clone(),
        }
    }

    pub(super) fn no_match_envelope(
        &self,
        selector: &str,
        tcp_failed: bool,
    ) -> Result<Envelope, TransportError> {
        let mut surfaces = Vec::new();
        let mut claims = Vec::new();
        for (id, end) in [
            (sid::TCP_START, &self.raw.start),
            (sid::TCP_END, &self.raw.end),
        ] {
            match tcp_of(end) {
                Ok((d, elapsed_us)) => surfaces.push(surface(
                    id,
                    "netlink:NETLINK_SOCK_DIAG inet_diag tcp (AF_INET, AF_INET6)",
                    elapsed_us,
                    Some((d.raw.digest.clone(), d.raw.bytes)),
                    obj(json!({"matched": 0, "net_ns": self.net_ns.to_string()})),
                )),
                Err(u) => surfaces.push(failed(
                    id,
                    "netlink:NETLINK_SOCK_DIAG",
                    u.elapsed_us,
                    u.status,
                    u.errno,
                    u.message,
                )),
            }
        }
        let completeness = if tcp_failed {
            Completeness::Partial
        } else {
            claims.push(Claim {
                id: "c1".into(),
                kind: ClaimKind::Fact,
                code: ClaimCode::NoMatchingFlow.into(),
                statement: if self.raw.stopped_early {
                    format!(
                        "no TCP socket in netns {} matched `{}` at the first sample nor at the second, taken at once (the window was not waited out)",
                        self.net_ns,
                        self.plan.filter.selector()
                    )
                } else {
                    format!(
                        "no TCP socket in netns {} matched `{}` at window start or end",
                        self.net_ns,
                        self.plan.filter.selector()
                    )
                },
                surfaces: vec![sid::TCP_START.into(), sid::TCP_END.into()],
                scope: Scope::Universal,
                falsifier: None,
            });
            Completeness::Complete
        };
        let env = Envelope {
            schema: SCHEMA_ID.into(),
            completeness,
            subject: Subject::Host(self.host.clone()),
            collector: self.collector(),
            clock: self.clock(),
            universe: Universe {
                selector: selector.into(),
                selector_digest: sha256_digest(selector.as_bytes()),
                expected_count: 0,
                observed_count: 0,
                termination: Termination::Exhausted,
            },
            bounds: self.bounds(),
            surfaces,
            claims,
            unknowns: vec![Unknown {
                id: "u1".into(),
                question:
                    "is the stream in another network namespace (a pod's) or to another address?"
                        .into(),
                blocks: "CAPTURE_STREAM".into(),
                owner: "node operator".into(),
                probe: format!(
                    "ss -tin dst {} ; for p in $(pgrep -f longhorn-instance-manager); do nsenter -t $p -n ss -tin dst {}; done",
                    self.plan.filter.peer, self.plan.filter.peer
                ),
                surface: None,
            }],
            next_transition: NextTransition {
                action: "CAPTURE_IN_STREAM_NETNS".into(),
                success_receipt: "a network_stream envelope for a flow to the peer".into(),
                abort_conditions: vec!["the transfer has ended".into()],
            },
            digest: String::new(),
        };
        Ok(env.seal()?)
    }
}
