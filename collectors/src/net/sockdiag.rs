//! TCP sockets through `NETLINK_SOCK_DIAG` (`inet_diag`), the source `ss` uses.
//!
//! One dump per address family (IPv4, then IPv6) of every TCP socket in the
//! calling thread's network namespace, with `tcp_info` (length-aware, see
//! [`super::tcpinfo`]), `sk_meminfo`, the congestion algorithm, the pending
//! timer and the socket cookie. Filtering by address/port is done here, in
//! userspace, with [`FlowFilter`]; the kernel dump is never narrowed, so the
//! raw bytes digested are the whole namespace's answer.
//!
//! Invariants:
//! - [`parse_dump`] is pure: captured reply bytes in, typed sockets out.
//! - IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`) are reported as IPv4, so a
//!   dual-stack listener's flows match an IPv4 peer.
//! - The socket cookie is the flow id: stable for the socket's life, never
//!   reused within a boot.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use serde::{Deserialize, Serialize};

use super::netlink::{AttrIter, NLM_F_DUMP, NLM_F_REQUEST, NetlinkError, NetlinkSocket, NlMsgIter};
use super::tcpinfo::TcpInfo;

/// `SOCK_DIAG_BY_FAMILY`.
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const INET_DIAG_MEMINFO: u16 = 1;
const INET_DIAG_INFO: u16 = 2;
const INET_DIAG_CONG: u16 = 4;
const INET_DIAG_SKMEMINFO: u16 = 7;
const INET_DIAG_SHUTDOWN: u16 = 8;
/// Size of `struct inet_diag_msg`.
const INET_DIAG_MSG_LEN: usize = 72;

/// TCP state names, indexed by the kernel's state number.
pub const TCP_STATES: [&str; 13] = [
    "UNKNOWN",
    "ESTABLISHED",
    "SYN_SENT",
    "SYN_RECV",
    "FIN_WAIT1",
    "FIN_WAIT2",
    "TIME_WAIT",
    "CLOSE",
    "CLOSE_WAIT",
    "LAST_ACK",
    "LISTEN",
    "CLOSING",
    "NEW_SYN_RECV",
];

/// Name of a TCP state number.
pub fn state_name(state: u8) -> &'static str {
    TCP_STATES.get(state as usize).copied().unwrap_or("UNKNOWN")
}

/// The timer pending on a socket (`idiag_timer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SocketTimer {
    /// No timer pending.
    None,
    /// Retransmit (also loss probe / reorder) timer.
    Retransmit,
    /// Keepalive timer.
    Keepalive,
    /// TIME_WAIT timer.
    TimeWait,
    /// Zero-window probe timer: the peer advertised a zero window.
    ZeroWindowProbe,
    /// A value this parser does not know.
    Other(u8),
}

impl SocketTimer {
    fn from_raw(v: u8) -> SocketTimer {
        match v {
            0 => SocketTimer::None,
            1 => SocketTimer::Retransmit,
            2 => SocketTimer::Keepalive,
            3 => SocketTimer::TimeWait,
            4 => SocketTimer::ZeroWindowProbe,
            o => SocketTimer::Other(o),
        }
    }

    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            SocketTimer::None => "none",
            SocketTimer::Retransmit => "retransmit",
            SocketTimer::Keepalive => "keepalive",
            SocketTimer::TimeWait => "time_wait",
            SocketTimer::ZeroWindowProbe => "zero_window_probe",
            SocketTimer::Other(_) => "other",
        }
    }
}

/// `SK_MEMINFO_*`: socket memory as the kernel accounts it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SkMemInfo {
    /// Receive queue memory allocated.
    pub rmem_alloc: u32,
    /// SO_RCVBUF.
    pub rcvbuf: u32,
    /// Send memory allocated.
    pub wmem_alloc: u32,
    /// SO_SNDBUF.
    pub sndbuf: u32,
    /// Forward-allocated memory.
    pub fwd_alloc: u32,
    /// Queued send memory.
    pub wmem_queued: u32,
    /// Option memory.
    pub optmem: u32,
    /// Backlog length.
    pub backlog: u32,
    /// Packets dropped on this socket (e.g. rcvbuf full).
    pub drops: u32,
}

/// One TCP socket from the dump.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TcpSocket {
    /// Local endpoint.
    pub local: SocketAddr,
    /// Remote endpoint.
    pub remote: SocketAddr,
    /// State number (see [`state_name`]).
    pub state: u8,
    /// Socket cookie: the flow id.
    pub cookie: u64,
    /// Socket inode (0 for TIME_WAIT / request socks).
    pub inode: u32,
    /// Owner uid.
    pub uid: u32,
    /// Bound interface index (0 = any).
    pub bound_if: u32,
    /// Pending timer.
    pub timer: SocketTimer,
    /// Timer expiry, ms from now.
    pub timer_expires_ms: u32,
    /// Retransmits (retransmit timer) or unanswered probes (probe/keepalive timers).
    pub timer_retrans: u8,
    /// Receive queue: bytes not read by the application.
    pub rqueue: u32,
    /// Send queue: bytes not acknowledged.
    pub wqueue: u32,
    /// Parsed `tcp_info`, when the kernel included it.
    pub info: Option<TcpInfo>,
    /// Socket memory, when included.
    pub mem: Option<SkMemInfo>,
    /// Congestion control algorithm.
    pub congestion: Option<String>,
    /// Shutdown bits (1 = read side, 2 = write side).
    pub shutdown: Option<u8>,
}

/// Port selection for one side of a flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortRange {
    /// Lowest port, inclusive.
    pub lo: u16,
    /// Highest port, inclusive.
    pub hi: u16,
}

impl PortRange {
    /// Exactly one port.
    pub fn one(p: u16) -> PortRange {
        PortRange { lo: p, hi: p }
    }
    /// Whether `p` is in range.
    pub fn contains(self, p: u16) -> bool {
        self.lo <= p && p <= self.hi
    }
}

/// Which sockets a capture means. Listeners never match (they have no peer).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlowFilter {
    /// Remote address (required).
    pub peer: IpAddr,
    /// Remote port, if pinned.
    pub peer_port: Option<u16>,
    /// Local address, if pinned.
    pub local: Option<IpAddr>,
    /// Local port, if pinned.
    pub local_port: Option<u16>,
    /// When no port is pinned: a flow matches if either end's port is in this
    /// range (the data port is the peer's on the sending node and the local
    /// one on the replica's node).
    pub either_port_in: Option<PortRange>,
}

impl FlowFilter {
    /// Whether `s` is one of the flows meant.
    pub fn matches(&self, s: &TcpSocket) -> bool {
        if s.state == 10 {
            return false;
        }
        self.matches_endpoints(s.local, s.remote)
    }

    /// Whether a flow between `local` and `remote` (seen by this host's end)
    /// is one of the flows meant, whatever its state.
    pub fn matches_endpoints(&self, local: SocketAddr, remote: SocketAddr) -> bool {
        if normalize(remote.ip()) != normalize(self.peer) {
            return false;
        }
        if self.peer_port.is_some_and(|p| p != remote.port()) {
            return false;
        }
        if self
            .local
            .is_some_and(|a| normalize(a) != normalize(local.ip()))
        {
            return false;
        }
        if self.local_port.is_some_and(|p| p != local.port()) {
            return false;
        }
        if self.peer_port.is_none()
            && self.local_port.is_none()
            && let Some(r) = self.either_port_in
        {
            return r.contains(remote.port()) || r.contains(local.port());
        }
        true
    }

    /// The selector text recorded in an envelope's universe.
    pub fn selector(&self) -> String {
        let port = |p: Option<u16>| p.map(|p| p.to_string()).unwrap_or_else(|| "*".into());
        let mut s = format!(
            "tcp peer={} peer_port={} local={} local_port={}",
            self.peer,
            port(self.peer_port),
            self.local
                .map(|a| a.to_string())
                .unwrap_or_else(|| "*".into()),
            port(self.local_port)
        );
        if let Some(r) = self.either_port_in
            && self.peer_port.is_none()
            && self.local_port.is_none()
        {
            s.push_str(&format!(" either_port_in={}-{}", r.lo, r.hi));
        }
        s
    }
}

/// IPv4-mapped IPv6 to IPv4; everything else unchanged.
pub fn normalize(a: IpAddr) -> IpAddr {
    match a {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

/// The `inet_diag_req_v2` payload asking for every TCP socket of `family`
/// with tcp_info, meminfo, skmeminfo and congestion algorithm.
pub fn dump_request(family: u8) -> Vec<u8> {
    let mut p = vec![0u8; 56];
    p[0] = family;
    p[1] = libc::IPPROTO_TCP as u8;
    p[2] = (1 << (INET_DIAG_MEMINFO - 1))
        | (1 << (INET_DIAG_INFO - 1))
        | (1 << (INET_DIAG_CONG - 1))
        | (1 << (INET_DIAG_SKMEMINFO - 1));
    p[4..8].copy_from_slice(&u32::MAX.to_ne_bytes()); // all states
    p
}

fn addr(family: u8, raw: &[u8]) -> Result<IpAddr, NetlinkError> {
    match family as i32 {
        libc::AF_INET => {
            let b: [u8; 4] = raw[0..4].try_into().unwrap_or_default();
            Ok(IpAddr::V4(Ipv4Addr::from(b)))
        }
        libc::AF_INET6 => {
            let b: [u8; 16] = raw[0..16].try_into().unwrap_or_default();
            Ok(normalize(IpAddr::V6(Ipv6Addr::from(b))))
        }
        f => Err(NetlinkError::Malformed(format!(
            "inet_diag_msg family {f} is neither AF_INET nor AF_INET6"
        ))),
    }
}

/// Parse one `inet_diag_msg` (plus attributes).
pub fn parse_socket(payload: &[u8]) -> Result<TcpSocket, NetlinkError> {
    if payload.len() < INET_DIAG_MSG_LEN {
        return Err(NetlinkError::Malformed(format!(
            "inet_diag_msg of {} bytes, need {INET_DIAG_MSG_LEN}",
            payload.len()
        )));
    }
    let p = payload;
    let u32n = |off: usize| u32::from_ne_bytes(p[off..off + 4].try_into().unwrap_or_default());
    let family = p[0];
    let sport = u16::from_be_bytes([p[4], p[5]]);
    let dport = u16::from_be_bytes([p[6], p[7]]);
    let src = addr(family, &p[8..24])?;
    let dst = addr(family, &p[24..40])?;
    let cookie = u64::from(u32n(44)) | (u64::from(u32n(48)) << 32);
    let mut s = TcpSocket {
        local: SocketAddr::new(src, sport),
        remote: SocketAddr::new(dst, dport),
        state: p[1],
        cookie,
        inode: u32n(68),
        uid: u32n(64),
        bound_if: u32n(40),
        timer: SocketTimer::from_raw(p[2]),
        timer_expires_ms: u32n(52),
        timer_retrans: p[3],
        rqueue: u32n(56),
        wqueue: u32n(60),
        info: None,
        mem: None,
        congestion: None,
        shutdown: None,
    };
    for attr in AttrIter::new(&p[INET_DIAG_MSG_LEN..]) {
        let attr = attr?;
        match attr.kind {
            INET_DIAG_INFO => {
                // A short struct (very old kernel, or a request socket) is left out, as ss does.
                s.info = TcpInfo::parse(attr.value).ok();
            }
            INET_DIAG_SKMEMINFO => {
                let v = |i: usize| {
                    attr.value
                        .get(i * 4..i * 4 + 4)
                        .and_then(|b| b.try_into().ok())
                        .map(u32::from_ne_bytes)
                        .unwrap_or(0)
                };
                if attr.value.len() >= 32 {
                    s.mem = Some(SkMemInfo {
                        rmem_alloc: v(0),
                        rcvbuf: v(1),
                        wmem_alloc: v(2),
                        sndbuf: v(3),
                        fwd_alloc: v(4),
                        wmem_queued: v(5),
                        optmem: v(6),
                        backlog: v(7),
                        drops: v(8),
                    });
                }
            }
            INET_DIAG_CONG => s.congestion = Some(attr.str()),
            INET_DIAG_SHUTDOWN => s.shutdown = attr.u8(),
            _ => {}
        }
    }
    Ok(s)
}

/// Parse a captured dump reply (one or more `recv` buffers concatenated on
/// message boundaries). Stops at `NLMSG_DONE`.
pub fn parse_dump(bytes: &[u8]) -> Result<Vec<TcpSocket>, NetlinkError> {
    let mut out = Vec::new();
    for msg in NlMsgIter::new(bytes) {
        let msg = msg?;
        match msg.kind {
            SOCK_DIAG_BY_FAMILY => out.push(parse_socket(msg.payload)?),
            super::netlink::NLMSG_DONE => break,
            super::netlink::NLMSG_ERROR => {
                let errno = super::netlink::error_code(msg.payload)?;
                if errno != 0 {
                    return Err(NetlinkError::Kernel {
                        errno,
                        message: std::io::Error::from_raw_os_error(errno).to_string(),
                    });
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

/// A dump: every TCP socket (both families) plus the raw reply bytes' digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TcpDump {
    /// Every socket, both families.
    pub sockets: Vec<TcpSocket>,
    /// Digest, byte count of the raw replies.
    pub raw: crate::procfs::RawMeta,
}

/// Dump every TCP socket of the calling thread's netns. `keep` decides which
/// parsed sockets are retained (all bytes are digested either way).
pub fn dump_tcp(keep: &dyn Fn(&TcpSocket) -> bool) -> Result<TcpDump, NetlinkError> {
    let mut sockets = Vec::new();
    let raw = dump_tcp_each(&mut |s| {
        if keep(&s) {
            sockets.push(s);
        }
    })?;
    Ok(TcpDump { sockets, raw })
}

/// [`dump_tcp`] without the list: every parsed socket is handed to `each` as
/// its reply arrives, and only the raw bytes' digest is returned. The same
/// requests, parser and digest; what differs is that nothing is kept, so a
/// caller that prints as it reads (`pstackctl sockets`) holds one socket at
/// a time instead of 10,000 (whose growing list, faulted in page by page,
/// cost a fresh process more than the read itself).
pub fn dump_tcp_each(
    each: &mut dyn FnMut(TcpSocket),
) -> Result<crate::procfs::RawMeta, NetlinkError> {
    use sha2::Digest;
    let mut sock = NetlinkSocket::open(libc::NETLINK_SOCK_DIAG)?;
    let mut hasher = sha2::Sha256::new();
    let mut total = 0u64;
    for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
        let req = dump_request(family);
        let mut err = None;
        sock.transact(
            SOCK_DIAG_BY_FAMILY,
            NLM_F_REQUEST | NLM_F_DUMP,
            &req,
            &mut |raw| {
                hasher.update(raw);
                total += raw.len() as u64;
            },
            &mut |msg| {
                if msg.kind == SOCK_DIAG_BY_FAMILY {
                    match parse_socket(msg.payload) {
                        Ok(s) => each(s),
                        Err(e) => err = Some(e),
                    }
                }
                Ok(())
            },
        )
        .or_else(|e| match (family as i32, e.errno()) {
            // No IPv6 in this kernel/netns: there are no IPv6 sockets to list.
            (libc::AF_INET6, Some(libc::ENOENT)) | (libc::AF_INET6, Some(libc::EAFNOSUPPORT)) => {
                Ok(())
            }
            _ => Err(e),
        })?;
        if let Some(e) = err {
            return Err(e);
        }
    }
    Ok(crate::procfs::RawMeta {
        digest: format!("sha256:{}", hex::encode(hasher.finalize())),
        bytes: total,
        truncated: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::netlink::{push_attr, request};

    /// Build a reply message the way the kernel lays it out.
    #[allow(
        clippy::too_many_arguments,
        reason = "mirrors the fields of inet_diag_msg"
    )]
    pub(crate) fn diag_msg(
        family: u8,
        state: u8,
        timer: u8,
        src: IpAddr,
        sport: u16,
        dst: IpAddr,
        dport: u16,
        cookie: u64,
        info_len: Option<usize>,
    ) -> Vec<u8> {
        let mut p = vec![0u8; 72];
        p[0] = family;
        p[1] = state;
        p[2] = timer;
        p[3] = 3;
        p[4..6].copy_from_slice(&sport.to_be_bytes());
        p[6..8].copy_from_slice(&dport.to_be_bytes());
        let put = |p: &mut Vec<u8>, off: usize, a: IpAddr| match a {
            IpAddr::V4(v) => p[off..off + 4].copy_from_slice(&v.octets()),
            IpAddr::V6(v) => p[off..off + 16].copy_from_slice(&v.octets()),
        };
        put(&mut p, 8, src);
        put(&mut p, 24, dst);
        p[44..48].copy_from_slice(&(cookie as u32).to_ne_bytes());
        p[48..52].copy_from_slice(&((cookie >> 32) as u32).to_ne_bytes());
        p[52..56].copy_from_slice(&200u32.to_ne_bytes());
        p[68..72].copy_from_slice(&4242u32.to_ne_bytes());
        if let Some(n) = info_len {
            let mut info = vec![0u8; n];
            info[0] = state;
            push_attr(&mut p, INET_DIAG_INFO, &info);
        }
        let mem: Vec<u8> = (1..=9u32).flat_map(|v| v.to_ne_bytes()).collect();
        push_attr(&mut p, INET_DIAG_SKMEMINFO, &mem);
        push_attr(&mut p, INET_DIAG_CONG, b"cubic\0");
        request(SOCK_DIAG_BY_FAMILY, 2, 1, &p)
    }

    fn v4(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn parses_ipv4_socket_with_cookie_above_2_pow_53() {
        let cookie = (1u64 << 60) + 7;
        let m = diag_msg(
            2,
            1,
            1,
            v4("10.0.0.1"),
            40000,
            v4("10.0.0.2"),
            10001,
            cookie,
            Some(248),
        );
        let s = parse_dump(&m).unwrap().remove(0);
        assert_eq!(s.cookie, cookie);
        assert_eq!(s.local.to_string(), "10.0.0.1:40000");
        assert_eq!(s.remote.to_string(), "10.0.0.2:10001");
        assert_eq!(s.timer, SocketTimer::Retransmit);
        assert_eq!(s.info.as_ref().unwrap().len, 248);
        assert_eq!(s.mem.unwrap().drops, 9);
        assert_eq!(s.congestion.as_deref(), Some("cubic"));
    }

    #[test]
    fn short_tcp_info_is_left_out_like_ss() {
        let m = diag_msg(2, 1, 0, v4("1.1.1.1"), 1, v4("2.2.2.2"), 2, 1, Some(60));
        let s = parse_dump(&m).unwrap().remove(0);
        assert!(s.info.is_none());
        assert!(s.mem.is_some());
    }

    #[test]
    fn mapped_ipv6_is_reported_as_ipv4_and_matches_v4_peer() {
        let m = diag_msg(
            10,
            1,
            4,
            "::ffff:10.0.0.2".parse().unwrap(),
            10001,
            "::ffff:10.0.0.1".parse().unwrap(),
            40000,
            9,
            Some(232),
        );
        let s = parse_dump(&m).unwrap().remove(0);
        assert_eq!(s.remote.ip(), v4("10.0.0.1"));
        assert_eq!(s.timer, SocketTimer::ZeroWindowProbe);
        let f = FlowFilter {
            peer: v4("10.0.0.1"),
            peer_port: None,
            local: None,
            local_port: None,
            either_port_in: Some(PortRange {
                lo: 10000,
                hi: 30000,
            }),
        };
        assert!(f.matches(&s), "local port 10001 is in the Longhorn range");
    }

    #[test]
    fn filter_rejects_listener_wrong_peer_and_out_of_range_ports() {
        let mk = |state, dport, sport| {
            parse_dump(&diag_msg(
                2,
                state,
                0,
                v4("10.0.0.1"),
                sport,
                v4("10.0.0.2"),
                dport,
                1,
                None,
            ))
            .unwrap()
            .remove(0)
        };
        let f = FlowFilter {
            peer: v4("10.0.0.2"),
            peer_port: None,
            local: None,
            local_port: None,
            either_port_in: Some(PortRange {
                lo: 10000,
                hi: 30000,
            }),
        };
        assert!(f.matches(&mk(1, 10001, 40000)));
        assert!(!f.matches(&mk(10, 10001, 40000)), "listener");
        assert!(!f.matches(&mk(1, 80, 40000)), "both ports outside range");
        let other = FlowFilter {
            peer: v4("10.0.0.3"),
            ..f.clone()
        };
        assert!(!other.matches(&mk(1, 10001, 40000)));
        let pinned = FlowFilter {
            peer_port: Some(80),
            ..f
        };
        assert!(
            pinned.matches(&mk(1, 80, 40000)),
            "a pinned port overrides the range"
        );
    }

    #[test]
    fn kernel_error_in_dump_is_typed() {
        let m = request(2, 0, 1, &(-13i32).to_ne_bytes());
        assert!(matches!(
            parse_dump(&m),
            Err(NetlinkError::Kernel { errno: 13, .. })
        ));
    }

    #[test]
    fn truncated_diag_msg_is_malformed() {
        let m = request(SOCK_DIAG_BY_FAMILY, 2, 1, &[2u8; 40]);
        assert!(matches!(parse_dump(&m), Err(NetlinkError::Malformed(_))));
    }
}

#[cfg(test)]
mod proptests {
    use super::*;
    use crate::net::netlink::{push_attr, request};
    use proptest::prelude::*;

    proptest! {
        /// Arbitrary bytes never panic the decoders (they are a typed error or a value).
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let _ = parse_dump(&bytes);
            let _ = parse_socket(&bytes);
            let _ = crate::net::tcpinfo::TcpInfo::parse(&bytes);
            let _ = crate::net::rtnl::parse_link(&bytes);
            let _ = crate::net::rtnl::parse_route("10.0.0.1".parse().unwrap(), &bytes);
        }

        /// Encode the fields the kernel would send, decode, and get them back.
        #[test]
        fn diag_msg_round_trips(
            v6 in any::<bool>(),
            src in any::<[u8; 16]>(),
            dst in any::<[u8; 16]>(),
            sport in any::<u16>(),
            dport in any::<u16>(),
            state in 1u8..12,
            timer in 0u8..5,
            cookie in any::<u64>(),
            inode in any::<u32>(),
            info_len in prop_oneof![Just(None), (104usize..320).prop_map(Some)],
            retrans in any::<u32>(),
        ) {
            let mut p = vec![0u8; 72];
            p[0] = if v6 { libc::AF_INET6 as u8 } else { libc::AF_INET as u8 };
            p[1] = state;
            p[2] = timer;
            p[4..6].copy_from_slice(&sport.to_be_bytes());
            p[6..8].copy_from_slice(&dport.to_be_bytes());
            p[8..24].copy_from_slice(&src);
            p[24..40].copy_from_slice(&dst);
            p[44..48].copy_from_slice(&(cookie as u32).to_ne_bytes());
            p[48..52].copy_from_slice(&((cookie >> 32) as u32).to_ne_bytes());
            p[68..72].copy_from_slice(&inode.to_ne_bytes());
            if let Some(n) = info_len {
                let mut info = vec![0u8; n];
                info[100..104].copy_from_slice(&retrans.to_ne_bytes());
                push_attr(&mut p, INET_DIAG_INFO, &info);
            }
            let s = parse_dump(&request(SOCK_DIAG_BY_FAMILY, 2, 1, &p)).unwrap().remove(0);
            prop_assert_eq!(s.cookie, cookie);
            prop_assert_eq!(s.inode, inode);
            prop_assert_eq!(s.state, state);
            prop_assert_eq!((s.local.port(), s.remote.port()), (sport, dport));
            let want_src = if v6 {
                normalize(IpAddr::V6(Ipv6Addr::from(src)))
            } else {
                IpAddr::V4(Ipv4Addr::new(src[0], src[1], src[2], src[3]))
            };
            prop_assert_eq!(s.local.ip(), want_src);
            prop_assert_eq!(s.info.as_ref().map(|i| i.total_retrans), info_len.map(|_| retrans));
            prop_assert_eq!(s.info.as_ref().map(|i| i.len), info_len);
        }
    }
}
