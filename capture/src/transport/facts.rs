//! Fact shaping of a transport capture: typed readings to the JSON facts of
//! surfaces (numbers beyond 2^53 as strings), deltas, and the surface
//! constructors.

use super::*;

/// A JSON number when exact, otherwise a decimal string.
pub fn num(v: i128) -> Value {
    if (-MAX_SAFE..=MAX_SAFE).contains(&v) {
        json!(v as i64)
    } else {
        json!(v.to_string())
    }
}

pub(super) fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// tcp_info fields that are u64 in the uapi: always decimal strings.
pub(super) const TCP_INFO_U64: [&str; 9] = [
    "pacing_rate",
    "bytes_acked",
    "bytes_received",
    "delivery_rate",
    "busy_time_us",
    "rwnd_limited_us",
    "sndbuf_limited_us",
    "bytes_sent",
    "bytes_retrans",
];

pub(super) fn tcp_info_facts(i: &TcpInfo) -> Value {
    let mut m = obj(serde_json::to_value(i).unwrap_or(Value::Null));
    m.retain(|_, v| !v.is_null());
    for k in TCP_INFO_U64 {
        if let Some(v) = m.get_mut(k)
            && let Some(n) = v.as_u64()
        {
            *v = json!(n.to_string());
        }
    }
    m.insert("state_name".into(), json!(sockdiag::state_name(i.state)));
    Value::Object(m)
}

pub(super) fn socket_facts(s: &TcpSocket) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("state".into(), json!(sockdiag::state_name(s.state)));
    m.insert(socket_facts::TIMER.into(), json!(s.timer.as_str()));
    m.insert("timer_expires_ms".into(), json!(s.timer_expires_ms));
    m.insert("timer_retrans".into(), json!(s.timer_retrans));
    m.insert(socket_facts::RQUEUE.into(), json!(s.rqueue));
    m.insert(socket_facts::WQUEUE.into(), json!(s.wqueue));
    m.insert("uid".into(), json!(s.uid));
    m.insert("inode".into(), json!(s.inode.to_string()));
    if let Some(c) = &s.congestion {
        m.insert("congestion".into(), json!(c));
    }
    if let Some(sh) = s.shutdown {
        m.insert("shutdown".into(), json!(sh));
    }
    if let Some(mem) = s.mem {
        m.insert(
            "skmem".into(),
            serde_json::to_value(mem).unwrap_or(Value::Null),
        );
    }
    match &s.info {
        Some(i) => {
            m.insert(socket_facts::TCP_INFO.into(), tcp_info_facts(i));
        }
        None => {
            m.insert(socket_facts::TCP_INFO.into(), Value::Null);
        }
    }
    m
}

/// Per-flow deltas end − start of the cumulative tcp_info counters.
pub(super) fn tcp_deltas(a: &TcpInfo, b: &TcpInfo) -> BTreeMap<&'static str, i128> {
    let mut d = BTreeMap::new();
    let mut put = |k: &'static str, x: Option<i128>, y: Option<i128>| {
        if let (Some(x), Some(y)) = (x, y) {
            d.insert(k, y - x);
        }
    };
    put(
        "total_retrans",
        Some(a.total_retrans.into()),
        Some(b.total_retrans.into()),
    );
    // Optional counters: only when both samples carry them (older kernels
    // send a shorter tcp_info).
    macro_rules! optional {
        ($($field:ident),+) => {
            $(put(
                stringify!($field),
                a.$field.map(i128::from),
                b.$field.map(i128::from),
            );)+
        };
    }
    optional!(
        total_rto,
        total_rto_recoveries,
        bytes_acked,
        bytes_received,
        bytes_retrans,
        segs_out,
        segs_in,
        data_segs_out,
        dsack_dups,
        rcv_ooopack
    );
    d
}

/// (payload MSS, on-wire size) of a full-size segment: the socket's PMTU when
/// it has one (options included), else MSS plus the bare IP and TCP headers.
pub(super) fn full_size(sock: Option<&TcpSocket>, remote: SocketAddr) -> (u32, u32) {
    let info = sock.and_then(|x| x.info.as_ref());
    let mss = info.map(|i| i.snd_mss).unwrap_or(0);
    let hdr = if remote.is_ipv4() { 40 } else { 60 };
    let wire = info
        .map(|i| i.pmtu)
        .filter(|p| *p > 0 && *p < 65536)
        .unwrap_or(mss + hdr);
    (mss, wire)
}

/// Counters a local abort (a RST this host sends for its own flow) increments.
pub const LOCAL_ABORT_COUNTERS: [&str; 5] = [
    "TcpExt.TCPAbortOnData",
    "TcpExt.TCPAbortOnClose",
    "TcpExt.TCPAbortOnMemory",
    "TcpExt.TCPAbortOnLinger",
    "TcpExt.TCPAbortFailed",
];

/// Counters whose movement is a transport fault signature (netns-wide).
pub const FAULT_COUNTERS: [&str; 14] = [
    "Tcp.OutRsts",
    "Tcp.EstabResets",
    "Tcp.RetransSegs",
    "TcpExt.TCPTimeouts",
    "TcpExt.TCPAbortOnData",
    "TcpExt.TCPAbortOnTimeout",
    "TcpExt.TCPAbortOnClose",
    "TcpExt.TCPAbortOnMemory",
    "TcpExt.TCPAbortOnLinger",
    "TcpExt.TCPZeroWindowDrop",
    "TcpExt.TCPToZeroWindowAdv",
    "TcpExt.TCPWantZeroWindowAdv",
    "TcpExt.ListenDrops",
    "TcpExt.ListenOverflows",
];

pub(super) fn surface(
    id: impl Into<String>,
    authority: impl Into<String>,
    elapsed_us: u64,
    raw: Option<(String, u64)>,
    facts: Map<String, Value>,
) -> Surface {
    Surface::read(id, authority, SURFACE_DEADLINE_MS, elapsed_us, raw, facts)
}

pub(super) fn failed(
    id: impl Into<String>,
    authority: impl Into<String>,
    elapsed_us: u64,
    status: SurfaceStatus,
    errno: Option<i32>,
    message: impl Into<String>,
) -> Surface {
    let cause = StatusCause {
        errno,
        message: message.into(),
    };
    Surface::unread(
        id,
        authority,
        SURFACE_DEADLINE_MS,
        elapsed_us,
        status,
        cause,
    )
}

pub(super) fn status_of_errno(errno: Option<i32>) -> SurfaceStatus {
    match errno {
        Some(libc::EPERM) | Some(libc::EACCES) => SurfaceStatus::PermissionDenied,
        Some(libc::ENOENT) | Some(libc::EOPNOTSUPP) | Some(libc::EAFNOSUPPORT) => {
            SurfaceStatus::Unsupported
        }
        _ => SurfaceStatus::Error,
    }
}

pub(super) fn link_stats_delta(a: &LinkFacts, b: &LinkFacts) -> Map<String, Value> {
    let mut m = Map::new();
    if let (Some(x), Some(y)) = (a.stats, b.stats) {
        let pairs: [(&str, u64, u64); 11] = [
            ("rx_packets", x.rx_packets, y.rx_packets),
            ("tx_packets", x.tx_packets, y.tx_packets),
            ("rx_bytes", x.rx_bytes, y.rx_bytes),
            ("tx_bytes", x.tx_bytes, y.tx_bytes),
            ("rx_errors", x.rx_errors, y.rx_errors),
            ("tx_errors", x.tx_errors, y.tx_errors),
            ("rx_dropped", x.rx_dropped, y.rx_dropped),
            ("tx_dropped", x.tx_dropped, y.tx_dropped),
            ("rx_over_errors", x.rx_over_errors, y.rx_over_errors),
            ("rx_missed_errors", x.rx_missed_errors, y.rx_missed_errors),
            (
                "tx_carrier_errors",
                x.tx_carrier_errors,
                y.tx_carrier_errors,
            ),
        ];
        for (k, a, b) in pairs {
            m.insert(k.into(), num(i128::from(b) - i128::from(a)));
        }
    }
    m
}

pub(super) fn link_facts(l: &LinkFacts) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("ifindex".into(), json!(l.index));
    m.insert("name".into(), json!(l.name));
    m.insert("mtu".into(), json!(l.mtu));
    m.insert("operstate".into(), json!(l.operstate));
    m.insert("kind".into(), json!(l.kind));
    if let Some(s) = l.stats {
        m.insert(
            "totals".into(),
            json!({
                "rx_dropped": s.rx_dropped.to_string(),
                "tx_dropped": s.tx_dropped.to_string(),
                "rx_errors": s.rx_errors.to_string(),
                "tx_errors": s.tx_errors.to_string(),
            }),
        );
    }
    m
}

pub(super) fn drops_in(delta: &Map<String, Value>) -> i64 {
    [
        "rx_errors",
        "tx_errors",
        "rx_dropped",
        "tx_dropped",
        "rx_over_errors",
        "rx_missed_errors",
    ]
    .iter()
    .filter_map(|k| delta.get(*k).and_then(Value::as_i64))
    .sum()
}

/// The caps a transport capture enforces beyond the five named bounds: the
/// flow cap (also carried as `max_threads`), the owner scan's descriptor
/// cap, and the net helper's answer frame cap (a larger sample is refused,
/// never cut).
pub(super) fn caps(max_flows: usize) -> std::collections::BTreeMap<String, u64> {
    [
        ("max_flows", max_flows as u64),
        ("max_owner_scan_fds", MAX_OWNER_SCAN_FDS as u64),
        (
            "max_net_frame_bytes",
            u64::from(pstack_helper::protocol::NET_MAX_FRAME),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pstack_collectors::net::sockdiag::SocketTimer;
    use pstack_envelope::facts::{Facts as _, SocketFacts, TcpDelta, TcpInfoView};

    /// A `tcp_info` carrying every field this build parses (a long struct
    /// of ones: every optional field present).
    fn full_info() -> TcpInfo {
        TcpInfo::parse(&[1u8; 512]).unwrap()
    }

    fn socket(info: TcpInfo) -> TcpSocket {
        TcpSocket {
            local: "10.77.0.1:40000".parse().unwrap(),
            remote: "10.77.0.2:10001".parse().unwrap(),
            state: 1,
            cookie: 7,
            inode: 1234,
            uid: 0,
            bound_if: 0,
            timer: SocketTimer::Retransmit,
            timer_expires_ms: 200,
            timer_retrans: 0,
            rqueue: 0,
            wqueue: 12,
            info: Some(info),
            mem: None,
            congestion: None,
            shutdown: None,
        }
    }

    /// The store reads a socket surface through `SocketFacts`; what this
    /// engine writes must carry every member it names, in a form it reads
    /// (renaming a kernel field in the collector, or a member in the view,
    /// fails here rather than emptying the store's transfer view).
    #[test]
    fn the_store_finds_every_socket_fact_it_reads() {
        let info = full_info();
        let written = tcp_info_facts(&info);
        for k in TcpInfoView::FIELDS {
            assert!(
                written.get(*k).is_some_and(|v| !v.is_null()),
                "the engine's tcp_info lacks {k}, which the store reads"
            );
        }
        let deltas = tcp_deltas(&info, &info);
        for k in TcpDelta::FIELDS {
            assert!(
                deltas.contains_key(*k),
                "the engine's deltas lack {k}, which the store reads"
            );
        }
        let read = SocketFacts::read(&socket_facts(&socket(info)));
        let tcp = read
            .tcp_info
            .clone()
            .expect("tcp_info reads as the store's view");
        assert_eq!(tcp.present().len(), TcpInfoView::FIELDS.len(), "{tcp:?}");
        assert!(
            read.rqueue.is_some() && read.wqueue.is_some() && read.timer.is_some(),
            "{read:?}"
        );
    }
}
