//! The plan of a transport capture: the flow selection as asked, its
//! endpoint and port grammar, and the validated [`Plan`] the engine runs.

use super::*;

/// Which flows to capture and how long to watch them; the transport fields
/// shared by the `transport` and `longhorn` requests (see
/// `TransportRequest` and `LonghornRequest` of `pstackd_api`), before validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowSelection {
    /// Remote endpoint: ADDR or ADDR:PORT (IPv6 with a port in brackets: [fd00::2]:10001).
    pub peer: String,
    /// Local endpoint: ADDR or ADDR:PORT.
    pub local: Option<String>,
    /// Read the network namespace of this process.
    pub netns_pid: Option<u32>,
    /// Read this named network namespace (/run/netns/NAME).
    pub netns: Option<String>,
    /// Sampling window, ms.
    pub window_ms: u64,
    /// With no port pinned, match flows whose local or remote port is in this
    /// range `LO-HI` (Longhorn's instance-manager data ports when absent).
    pub ports: Option<String>,
    /// Most flows enveloped; more matching flows make every envelope `bounded`.
    pub max_flows: usize,
    /// Watch the whole window even when no flow matches at the first sample.
    pub wait: bool,
}

macro_rules! flow_selection_of {
    ($request:ty) => {
        impl From<&$request> for FlowSelection {
            fn from(r: &$request) -> FlowSelection {
                FlowSelection {
                    peer: r.peer.clone(),
                    local: r.local.clone(),
                    netns_pid: r.netns_pid,
                    netns: r.netns.clone(),
                    window_ms: r.window_ms,
                    ports: r.ports.clone(),
                    max_flows: r.max_flows,
                    wait: r.wait,
                }
            }
        }
    };
}
// The transport and Longhorn requests select flows with the same members.
flow_selection_of!(pstackd_api::request::TransportRequest);
flow_selection_of!(pstackd_api::request::LonghornRequest);

/// `ADDR` or `ADDR:PORT` (`[v6]:PORT`); a port must be 1–65535.
pub fn parse_endpoint(param: &'static str, s: &str) -> Result<(IpAddr, Option<u16>), RequestError> {
    let s = s.trim();
    if let Ok(a) = s.parse::<IpAddr>() {
        return Ok((a, None));
    }
    if let Ok(sa) = s.parse::<SocketAddr>() {
        if sa.port() == 0 {
            return Err(invalid(param, "port 0 is not a port (use 1–65535)"));
        }
        return Ok((sa.ip(), Some(sa.port())));
    }
    // Say why: an address with an out-of-range port, or not an address at all.
    if let Some((host, port)) = s.rsplit_once(':') {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.parse::<IpAddr>().is_ok() {
            return Err(invalid(param, format!("port {port:?} is outside 1–65535")));
        }
    }
    Err(invalid(
        param,
        format!("{s:?} is not ADDR, ADDR:PORT or [IPv6]:PORT"),
    ))
}

/// `LO-HI` with 1 ≤ LO ≤ HI ≤ 65535.
pub fn parse_port_range(s: &str) -> Result<PortRange, RequestError> {
    let (lo, hi) = s
        .split_once('-')
        .ok_or_else(|| invalid("ports", format!("{s:?} is not LO-HI")))?;
    let p = |v: &str| -> Result<u16, RequestError> {
        match v.trim().parse::<u32>() {
            Ok(n) if (1..=65535).contains(&n) => Ok(n as u16),
            _ => Err(invalid("ports", format!("{v:?} is outside 1–65535"))),
        }
    };
    let (lo, hi) = (p(lo)?, p(hi)?);
    if lo > hi {
        return Err(invalid("ports", format!("{lo} > {hi}")));
    }
    Ok(PortRange { lo, hi })
}

/// What one capture covers: a validated transport request.
///
/// Outside this crate a plan comes only from [`Plan::from_selection`] (which
/// `crate::request` calls for a wire request): the fields are
/// crate-private, so the engine never receives an unchecked peer, port
/// range, netns or window.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Which flows.
    pub(crate) filter: FlowFilter,
    /// Which network namespace.
    pub(crate) target: NetnsTarget,
    /// Sampling window.
    pub(crate) window: Duration,
    /// Most flows enveloped.
    pub(crate) max_flows: usize,
    /// Whether to run the eBPF TCP window.
    pub(crate) ebpf: bool,
    /// Watch the whole window even when nothing matches at the first sample.
    pub(crate) wait: bool,
    /// The watch rule that started this capture (none for an operator's).
    pub(crate) trigger: Option<pstack_envelope::Trigger>,
}

impl Plan {
    /// The sampling window.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Most flows enveloped.
    pub fn max_flows(&self) -> usize {
        self.max_flows
    }

    /// The same plan, started by a watch rule: the trigger is recorded in
    /// every envelope and changes nothing that was validated.
    pub fn with_trigger(mut self, trigger: pstack_envelope::Trigger) -> Self {
        self.trigger = Some(trigger);
        self
    }

    /// What is being captured, for how long, where (the operator's line).
    pub fn describe(&self, what: &str) -> String {
        format!(
            "capturing {what}{} for {} in netns {} ...",
            self.filter.selector(),
            pstack_units::format_duration(self.window),
            self.target.path()
        )
    }

    /// Validate a flow selection into a plan.
    pub fn from_selection(a: &FlowSelection, ebpf: bool) -> Result<Plan, RequestError> {
        let (peer, peer_port) = parse_endpoint("peer", &a.peer)?;
        let (local, local_port) = match &a.local {
            Some(l) => {
                let (ip, port) = parse_endpoint("local", l)?;
                (Some(ip), port)
            }
            None => (None, None),
        };
        if let Some(l) = local
            && l.is_ipv4() != sockdiag::normalize(peer).is_ipv4()
        {
            return Err(invalid("local", "address family differs from --peer"));
        }
        if a.max_flows == 0 || a.max_flows > MAX_FLOWS {
            return Err(invalid("max_flows", format!("must be 1–{MAX_FLOWS}")));
        }
        let target = match (&a.netns_pid, &a.netns) {
            (Some(pid), None) => NetnsTarget::Pid(*pid),
            (None, Some(n)) => NetnsTarget::Named(n.clone()),
            (None, None) => NetnsTarget::Current,
            (Some(_), Some(_)) => {
                return Err(invalid("netns", "give --netns-pid or --netns, not both"));
            }
        };
        Ok(Plan {
            filter: FlowFilter {
                peer,
                peer_port,
                local,
                local_port,
                either_port_in: Some(match &a.ports {
                    Some(p) => parse_port_range(p)?,
                    None => LONGHORN_PORTS,
                }),
            },
            target,
            window: validation::window(a.window_ms, TRANSPORT_WINDOW)?,
            max_flows: a.max_flows,
            ebpf,
            wait: a.wait,
            trigger: None,
        })
    }
}
