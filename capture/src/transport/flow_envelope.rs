//! The envelope of one flow: its socket, sockopt and eBPF surfaces, the
//! netns-wide ones, the claim rules' verdict and its unknowns.

use super::*;

impl Ctx<'_> {
    #[allow(
        clippy::too_many_arguments,
        reason = "one call site; the readings of one flow, named"
    )]
    pub(super) fn flow_envelope(
        &self,
        cookie: u64,
        start: Option<&TcpSocket>,
        end: Option<&TcpSocket>,
        view: &NetnsView,
        selector: &str,
        expected: u64,
        observed: u64,
        termination: Termination,
    ) -> Result<Envelope, TransportError> {
        let id_sock = start.or(end).expect("a flow is seen at one end at least");
        let mut surfaces = Vec::new();
        let auth = format!(
            "netlink:NETLINK_SOCK_DIAG inet_diag tcp cookie {cookie} netns {}",
            self.net_ns
        );
        for (id, t, sock, absent_status, absent) in [
            (
                sid::TCP_START,
                &self.raw.start,
                start,
                SurfaceStatus::Skipped,
                "the flow did not exist at window start (opened during the window)",
            ),
            (
                sid::TCP_END,
                &self.raw.end,
                end,
                SurfaceStatus::Vanished,
                "the socket was gone at window end (closed and released during the window)",
            ),
        ] {
            match (tcp_of(t), sock) {
                (Ok((d, elapsed_us)), Some(x)) => surfaces.push(surface(
                    id,
                    auth.clone(),
                    elapsed_us,
                    Some((d.raw.digest.clone(), d.raw.bytes)),
                    socket_facts(x),
                )),
                (Ok((_, elapsed_us)), None) => surfaces.push(failed(
                    id,
                    auth.clone(),
                    elapsed_us,
                    absent_status,
                    None,
                    absent,
                )),
                (Err(u), _) => surfaces.push(failed(
                    id,
                    auth.clone(),
                    u.elapsed_us,
                    u.status,
                    u.errno,
                    u.message,
                )),
            }
        }
        let deltas = match (
            start.and_then(|x| x.info.as_ref()),
            end.and_then(|x| x.info.as_ref()),
        ) {
            (Some(a), Some(b)) => Some(tcp_deltas(a, b)),
            _ => None,
        };
        if let (Some(d), Some(sf)) = (&deltas, surfaces.iter_mut().find(|x| x.id == sid::TCP_END))
            && sf.status == SurfaceStatus::Ok
        {
            sf.facts.insert(
                socket_facts::DELTA.into(),
                Value::Object(d.iter().map(|(k, v)| (k.to_string(), num(*v))).collect()),
            );
        }
        if let Some(t) = self.raw.sockopts.get(&cookie) {
            let auth = "procfs:/proc/*/fd (owner) + pidfd_getfd + getsockopt(TCP_USER_TIMEOUT, SO_KEEPALIVE, TCP_KEEP*)";
            match &t.value {
                Ok(o) => {
                    let facts = obj(serde_json::to_value(o).unwrap_or(Value::Null));
                    let raw = serde_json::to_vec(o).unwrap_or_default();
                    surfaces.push(surface(
                        sid::TCP_SOCKOPT,
                        auth,
                        t.elapsed_us,
                        Some((sha256_digest(&raw), raw.len() as u64)),
                        facts,
                    ));
                }
                Err(err) => {
                    let (status, errno) = match err {
                        SockOptError::NoOwner { .. } => (SurfaceStatus::Skipped, None),
                        SockOptError::OwnerGone { .. } => (SurfaceStatus::Vanished, None),
                        SockOptError::PermissionDenied { errno, .. } => {
                            (SurfaceStatus::PermissionDenied, Some(*errno))
                        }
                        SockOptError::Unsupported { errno, .. } => {
                            (SurfaceStatus::Unsupported, Some(*errno))
                        }
                        SockOptError::Os { errno, .. } => (SurfaceStatus::Error, Some(*errno)),
                        SockOptError::Abandoned { .. } => (SurfaceStatus::Timeout, None),
                    };
                    surfaces.push(failed(
                        sid::TCP_SOCKOPT,
                        auth,
                        t.elapsed_us,
                        status,
                        errno,
                        err.to_string(),
                    ));
                }
            }
        }
        surfaces.extend(view.surfaces.iter().cloned());

        // eBPF.
        let ebpf_flow = match &self.raw.ebpf {
            EbpfWindow::NotRequested => None,
            EbpfWindow::Unavailable { status, message } => {
                surfaces.push(failed(
                    sid::EBPF_TCP,
                    "ebpf:tracepoint/tcp/{tcp_retransmit_skb,tcp_receive_reset,tcp_send_reset},sock/inet_sock_set_state",
                    0,
                    *status,
                    None,
                    message.clone(),
                ));
                None
            }
            EbpfWindow::Flows {
                flows,
                digest,
                bytes,
                truncated,
                ..
            } => {
                let f = flows
                    .iter()
                    .find(|f| f.cookie == cookie)
                    .cloned()
                    .unwrap_or(EbpfFlow {
                        cookie,
                        ..EbpfFlow::default()
                    });
                let mut facts = obj(json!({
                        "cookie": cookie.to_string(),
                        "last_reset_reason": f.last_reset_reason,
                        "transitions": f.transitions,
                        "resets": f.resets.iter().map(|(dir, ts, from)| json!({
                            "direction": dir,
                            "monotonic_ns": ts.to_string(),
                            "wall_time": self.wall_at(*ts),
                            "sent_by": from,
                        })).collect::<Vec<_>>(),
                        "first_event_ns": f.first_ns.to_string(),
                        "last_event_ns": f.last_ns.to_string(),
                }));
                // What the store reads, written through its type.
                EbpfTcpCounts {
                    retransmits: Some(f.retransmits),
                    resets_sent: Some(f.resets_sent),
                    resets_received: Some(f.resets_received),
                }
                .write_into(&mut facts);
                let mut sf = surface(
                    sid::EBPF_TCP,
                    "ebpf:tracepoint/tcp/{tcp_retransmit_skb,tcp_receive_reset,tcp_send_reset},sock/inet_sock_set_state",
                    self.plan.window.as_micros() as u64,
                    digest.clone().map(|d| (d, *bytes)),
                    facts,
                );
                if *truncated {
                    sf.status = SurfaceStatus::Truncated;
                    sf.truncated = true;
                }
                surfaces.push(sf);
                Some(f)
            }
        };

        let ok_ids: Vec<String> = surfaces
            .iter()
            .filter(|x| matches!(x.status, SurfaceStatus::Ok | SurfaceStatus::Truncated))
            .map(|x| x.id.clone())
            .collect();
        let wall_at = |ns: u64| self.wall_at(ns);
        let readings = rules::FlowReadings {
            cookie,
            start,
            end,
            deltas: deltas.as_ref(),
            ok: &ok_ids,
            end_dump_read: tcp_of(&self.raw.end).is_ok(),
            ebpf: ebpf_flow.as_ref(),
            ebpf_surface: surfaces.iter().any(|x| x.id == sid::EBPF_TCP),
            view,
            net_ns: self.net_ns,
            window: self.plan.window,
            wall_at: &wall_at,
        };
        let rules::FlowClaims {
            mut claims,
            mut unknowns,
            fault,
        } = rules::flow_claims(&readings);
        let (local, remote) = (id_sock.local, id_sock.remote);
        let has_sockopt = surfaces.iter().any(|x| x.id == sid::TCP_SOCKOPT);
        // CPU load may bind hypotheses only: the builder refuses a fact on it.
        let surface_ids: Vec<String> = surfaces
            .iter()
            .filter(|x| x.id != sid::HOST_CPU)
            .map(|x| x.id.clone())
            .collect();
        let mut builder = EnvelopeBuilder::new(
            Subject::NetworkStream(StreamIdentity {
                src: local.to_string(),
                dst: remote.to_string(),
                protocol: "tcp".into(),
                flow_id: cookie.to_string(),
                net_ns: Some(self.net_ns.to_string()),
            }),
            self.collector(),
            self.clock(),
            Universe {
                selector: selector.into(),
                selector_digest: sha256_digest(selector.as_bytes()),
                expected_count: expected,
                observed_count: observed,
                termination,
            },
            self.bounds(),
        );
        for x in surfaces {
            if x.id == sid::HOST_CPU {
                builder.hypothesis_surface(x)?;
            } else {
                builder.surface(x)?;
            }
        }
        let completeness = builder.completeness();
        if let Some(c) = rules::no_fault_claim(
            &claims,
            fault,
            completeness,
            surface_ids,
            self.plan.window,
            (local, remote),
        ) {
            claims.push(c);
        }
        if matches!(self.raw.ebpf, EbpfWindow::NotRequested)
            && !unknowns.iter().any(|u| u.blocks == "ATTRIBUTE_RESET")
            && fault
        {
            unknowns.push(Unknown {
                id: format!("u{}", unknowns.len() + 1),
                question: "did either endpoint send a RST on this flow during the window?".into(),
                blocks: "ATTRIBUTE_RESET".into(),
                owner: "node operator".into(),
                probe: "re-run without --no-ebpf (root, kernel BTF) so reset events are joined to the flow".into(),
                surface: None,
            });
        }
        if !ok_ids.iter().any(|x| x == sid::TCP_SOCKOPT) {
            let has = has_sockopt;
            unknowns.push(Unknown {
                id: format!("u{}", unknowns.len() + 1),
                question: "what are this socket's TCP_USER_TIMEOUT and keepalive settings (not read from its owner)?".into(),
                blocks: "EXPLAIN_TIMEOUT".into(),
                owner: "node operator".into(),
                probe: format!(
                    "find the owner: ss -tinpe src {local} dst {remote}; then inspect the owning process's setsockopt calls (strace -e setsockopt -p PID) or its configuration"
                ),
                surface: has.then(|| sid::TCP_SOCKOPT.to_string()),
            });
        }

        let next = if claims.iter().any(|c| c.kind == ClaimKind::Hypothesis) {
            NextTransition {
                action: "TEST_FALSIFIER".into(),
                success_receipt: "a second envelope of this flow after the falsifier's probe, with the hypothesis killed or standing".into(),
                abort_conditions: vec!["the flow's cookie changes (a new connection)".into()],
            }
        } else if fault {
            NextTransition {
                action: "CAPTURE_PEER_SIDE".into(),
                success_receipt: format!(
                    "a sealed envelope of the same flow captured on the node owning {remote}"
                ),
                abort_conditions: vec!["the transfer has finished or was cancelled".into()],
            }
        } else {
            NextTransition {
                action: "CAPTURE_DURING_FAILURE".into(),
                success_receipt: "an envelope of this flow whose window covers the failure".into(),
                abort_conditions: vec!["the flow's cookie changes (a new connection)".into()],
            }
        };
        for claim in claims {
            builder.claim(claim)?;
        }
        for u in unknowns {
            builder.unknown(u)?;
        }
        Ok(builder.seal(next)?)
    }
}
