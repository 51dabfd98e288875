//! The netns-wide surfaces of a transport capture (netstat, links, route,
//! conntrack, CPU) and the [`NetnsView`] the claim rules read.

use super::*;

/// What the node-wide (netns-wide) surfaces showed, for claims.
#[derive(Debug, Default, Clone)]
pub struct NetnsView {
    /// The netns-wide surfaces (shared by every flow's envelope).
    pub surfaces: Vec<Surface>,
    /// snmp/netstat counter deltas over the window, by `Group.Name`.
    pub counter_delta: BTreeMap<String, i128>,
    /// Egress link MTU.
    pub link_mtu: Option<u32>,
    /// Egress link name.
    pub link_name: Option<String>,
    /// veth peer MTU.
    pub peer_mtu: Option<u32>,
    /// veth peer name.
    pub peer_name: Option<String>,
    /// Route's cached PMTU.
    pub route_pmtu: Option<u32>,
    /// Route's MTU.
    pub route_mtu: Option<u32>,
    /// Interfaces whose drops/errors moved, with the sum of the deltas.
    pub link_drops: Vec<(String, i64)>,
    /// Conntrack (count, max, fill ppm, stat deltas).
    pub conntrack: Option<(u64, u64, u64, BTreeMap<String, i128>)>,
    /// CPU load at window end.
    pub load: Option<LoadFacts>,
}

impl Ctx<'_> {
    pub(super) fn netns_view(&self) -> NetnsView {
        let mut v = NetnsView::default();
        let (s, e) = match (&self.raw.start, &self.raw.end) {
            (Ok(s), Ok(e)) => (s, e),
            (Err(f), _) | (_, Err(f)) => {
                // The net helper could not sample one end: every netns-wide
                // surface is missing that end, with the helper's status.
                let u = Unread::of_helper(f);
                for (id, auth) in [
                    (sid::NETSTAT, "procfs:/proc/thread-self/net/{snmp,netstat}"),
                    (sid::ROUTE, "rtnetlink:RTM_GETROUTE"),
                    (sid::LINK, "rtnetlink:RTM_GETLINK"),
                    (
                        sid::CONNTRACK,
                        "procfs:/proc/sys/net/netfilter/nf_conntrack_{count,max} + /proc/thread-self/net/stat/nf_conntrack",
                    ),
                    (
                        sid::HOST_CPU,
                        "procfs:/proc/loadavg + /proc/stat + /proc/pressure/cpu",
                    ),
                ] {
                    v.surfaces.push(failed(
                        id,
                        auth,
                        u.elapsed_us,
                        u.status,
                        u.errno,
                        u.message.clone(),
                    ));
                }
                return v;
            }
        };

        // Counters.
        let auth = "procfs:/proc/thread-self/net/{snmp,netstat}";
        match (&s.counters.value, &e.counters.value) {
            (Ok((a, ra)), Ok((b, rb))) => {
                let (delta, one_sided) = snmp::delta(a, b);
                let mut raw = ra.clone();
                raw.extend_from_slice(rb);
                let mut d = Map::new();
                let mut other = Map::new();
                for (k, x) in &delta {
                    if k.starts_with("Tcp.") || k.starts_with("TcpExt.") {
                        d.insert(k.clone(), num(*x));
                    } else if *x != 0 {
                        other.insert(k.clone(), num(*x));
                    }
                }
                let mut facts = Map::new();
                facts.insert("scope".into(), json!("netns"));
                facts.insert("tcp_delta".into(), Value::Object(d));
                facts.insert("other_nonzero_delta".into(), Value::Object(other));
                facts.insert("one_sided".into(), json!(one_sided));
                facts.insert("counters_read".into(), json!(b.len()));
                v.surfaces.push(surface(
                    sid::NETSTAT,
                    auth,
                    s.counters.elapsed_us + e.counters.elapsed_us,
                    Some((sha256_digest(&raw), raw.len() as u64)),
                    facts,
                ));
                v.counter_delta = delta;
            }
            (Err(err), _) | (_, Err(err)) => {
                let errno = match err {
                    CountersError::Io { errno, .. } => Some(*errno),
                    CountersError::Parse { .. } => None,
                };
                v.surfaces.push(failed(
                    sid::NETSTAT,
                    auth,
                    s.counters.elapsed_us + e.counters.elapsed_us,
                    status_of_errno(errno),
                    errno,
                    err.to_string(),
                ));
            }
        }

        // Route.
        let auth = format!("rtnetlink:RTM_GETROUTE dst {}", self.plan.filter.peer);
        match (&s.route.value, &e.route.value) {
            (Ok(a), Ok(b)) => {
                let f = |r: &RouteFacts| {
                    json!({
                        "oif": r.oif, "gateway": r.gateway.map(|g| g.to_string()),
                        "prefsrc": r.prefsrc.map(|g| g.to_string()), "table": r.table,
                        "mtu": r.mtu, "advmss": r.advmss, "cached_exception": r.cloned,
                        "expires_s": r.expires_s, "pmtu": r.pmtu(),
                    })
                };
                v.route_pmtu = b.value.pmtu().or(a.value.pmtu());
                v.route_mtu = b.value.mtu;
                let mut raw = a.raw.digest.clone();
                raw.push_str(&b.raw.digest);
                v.surfaces.push(surface(
                    sid::ROUTE,
                    auth,
                    s.route.elapsed_us + e.route.elapsed_us,
                    Some((b.raw.digest.clone(), b.raw.bytes)),
                    obj(json!({"start": f(&a.value), "end": f(&b.value), "start_digest": a.raw.digest})),
                ));
            }
            (Err(err), _) | (_, Err(err)) => v.surfaces.push(failed(
                sid::ROUTE,
                auth,
                s.route.elapsed_us + e.route.elapsed_us,
                status_of_errno(err.errno()),
                err.errno(),
                err.to_string(),
            )),
        }

        // Egress link and its veth peer.
        for (id, a, b, is_peer) in [
            (sid::LINK, &s.link, &e.link, false),
            (sid::LINK_PEER, &s.peer_link, &e.peer_link, true),
        ] {
            match (a, b) {
                (Some(a), Some(b)) => match (&a.value, &b.value) {
                    (Ok(x), Ok(y)) => {
                        let auth = format!(
                            "rtnetlink:RTM_GETLINK ifindex {}{}",
                            y.value.index,
                            if is_peer {
                                " (veth peer, IFLA_TARGET_NETNSID)"
                            } else {
                                ""
                            }
                        );
                        let delta = link_stats_delta(&x.value, &y.value);
                        let drops = drops_in(&delta);
                        if drops > 0 {
                            v.link_drops.push((y.value.name.clone(), drops));
                        }
                        if is_peer {
                            v.peer_mtu = y.value.mtu;
                            v.peer_name = Some(y.value.name.clone());
                        } else {
                            v.link_mtu = y.value.mtu;
                            v.link_name = Some(y.value.name.clone());
                        }
                        let mut facts = link_facts(&y.value);
                        facts.insert("mtu_at_start".into(), json!(x.value.mtu));
                        facts.insert("operstate_at_start".into(), json!(x.value.operstate));
                        facts.insert("delta".into(), Value::Object(delta));
                        v.surfaces.push(surface(
                            id,
                            auth,
                            a.elapsed_us + b.elapsed_us,
                            Some((y.raw.digest.clone(), y.raw.bytes)),
                            facts,
                        ));
                    }
                    (Err(err), _) | (_, Err(err)) => v.surfaces.push(failed(
                        id,
                        "rtnetlink:RTM_GETLINK",
                        a.elapsed_us + b.elapsed_us,
                        status_of_errno(err.errno()),
                        err.errno(),
                        err.to_string(),
                    )),
                },
                (None, None) => {}
                _ => v.surfaces.push(failed(
                    id,
                    "rtnetlink:RTM_GETLINK",
                    0,
                    SurfaceStatus::Vanished,
                    None,
                    "the egress link changed during the window (present at one end only)",
                )),
            }
        }

        // Conntrack.
        let auth = "procfs:/proc/sys/net/netfilter/nf_conntrack_{count,max} + /proc/thread-self/net/stat/nf_conntrack";
        let el = s.conntrack.elapsed_us + e.conntrack.elapsed_us;
        match (&s.conntrack.value, &e.conntrack.value) {
            (Ok((a, ra)), Ok((b, rb))) => {
                let mut raw = ra.clone();
                raw.extend_from_slice(rb);
                let mut sd = BTreeMap::new();
                for (k, y) in &b.stats {
                    let x = a.stats.get(k).copied().unwrap_or(0);
                    sd.insert(k.clone(), i128::from(*y) - i128::from(x));
                }
                let facts = obj(json!({
                    "loaded": true,
                    "count": b.count, "max": b.max, "fill_ppm": b.fill_ppm(),
                    "count_at_start": a.count,
                    "stat_delta": sd.iter().map(|(k, x)| (k.clone(), num(*x))).collect::<Map<_, _>>(),
                }));
                v.conntrack = Some((b.count, b.max, b.fill_ppm(), sd));
                v.surfaces.push(surface(
                    sid::CONNTRACK,
                    auth,
                    el,
                    Some((sha256_digest(&raw), raw.len() as u64)),
                    facts,
                ));
            }
            (Err(ConntrackError::NotLoaded(p)), Err(ConntrackError::NotLoaded(_))) => {
                // No conntrack in this kernel: there is no table to fill. An observation, not a gap.
                v.surfaces.push(surface(
                    sid::CONNTRACK,
                    auth,
                    el,
                    Some((sha256_digest(p.as_bytes()), 0)),
                    obj(json!({"loaded": false, "absent": p})),
                ));
            }
            (Err(err), _) | (_, Err(err)) => {
                let errno = match err {
                    ConntrackError::Io { errno, .. } => Some(*errno),
                    _ => None,
                };
                v.surfaces.push(failed(
                    sid::CONNTRACK,
                    auth,
                    el,
                    status_of_errno(errno),
                    errno,
                    err.to_string(),
                ));
            }
        }

        // CPU load: hypothesis-only.
        let auth = "procfs:/proc/loadavg + /proc/stat + /proc/pressure/cpu";
        match &e.load.value {
            Ok((l, raw)) => {
                let mut facts = obj(serde_json::to_value(l).unwrap_or(Value::Null));
                facts.insert("role".into(), json!("hypothesis_only"));
                v.load = Some(l.clone());
                v.surfaces.push(surface(
                    sid::HOST_CPU,
                    auth,
                    e.load.elapsed_us,
                    Some((sha256_digest(raw), raw.len() as u64)),
                    facts,
                ));
            }
            Err(m) => v.surfaces.push(failed(
                sid::HOST_CPU,
                auth,
                e.load.elapsed_us,
                SurfaceStatus::Error,
                None,
                m.clone(),
            )),
        }
        v
    }
}
