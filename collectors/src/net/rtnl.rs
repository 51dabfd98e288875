//! Route and interface surfaces through rtnetlink (`NETLINK_ROUTE`).
//!
//! - [`route_get`] asks the kernel the question `ip route get ADDR` asks
//!   (`RTM_GETROUTE` with `RTA_DST`): egress device, gateway, preferred
//!   source, the route's MTU metric, and whether the answer is a cached
//!   exception (`RTM_F_CLONED` with an expiry) — the kernel's PMTU for that
//!   destination after an ICMP "fragmentation needed".
//! - [`link_get`] reads one interface (`RTM_GETLINK`): name, MTU, operstate,
//!   `IFLA_STATS64`, kind (`veth`, …), and its link partner (`IFLA_LINK`,
//!   `IFLA_LINK_NETNSID`). For a veth whose peer lives in another netns, the
//!   peer is read with `IFLA_TARGET_NETNSID` from the same socket, so no
//!   second `setns` is needed.
//!
//! The decoders ([`parse_route`], [`parse_link`]) are pure.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use super::netlink::{AttrIter, NLM_F_REQUEST, NetlinkError, NetlinkSocket};

const RTM_NEWLINK: u16 = 16;
const RTM_GETLINK: u16 = 18;
const RTM_NEWROUTE: u16 = 24;
const RTM_GETROUTE: u16 = 26;
const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const RTA_PREFSRC: u16 = 7;
const RTA_METRICS: u16 = 8;
const RTA_CACHEINFO: u16 = 12;
const RTA_TABLE: u16 = 15;
const RTAX_MTU: u16 = 2;
const RTAX_ADVMSS: u16 = 8;
const RTM_F_CLONED: u32 = 0x200;
const IFLA_IFNAME: u16 = 3;
const IFLA_MTU: u16 = 4;
const IFLA_LINK: u16 = 5;
const IFLA_OPERSTATE: u16 = 16;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_STATS64: u16 = 23;
const IFLA_LINK_NETNSID: u16 = 37;
const IFLA_TARGET_NETNSID: u16 = 46;

/// The kernel's route for one destination.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteFacts {
    /// Destination asked about.
    pub dst: IpAddr,
    /// Egress interface index.
    pub oif: Option<u32>,
    /// Next-hop gateway, if not on-link.
    pub gateway: Option<IpAddr>,
    /// Preferred source address.
    pub prefsrc: Option<IpAddr>,
    /// Routing table id.
    pub table: Option<u32>,
    /// `RTAX_MTU`: route MTU metric (or cached PMTU when `cloned`).
    pub mtu: Option<u32>,
    /// `RTAX_ADVMSS` metric.
    pub advmss: Option<u32>,
    /// The answer came from a cached exception (e.g. a learned PMTU).
    pub cloned: bool,
    /// Seconds until the cached exception expires (0 = none).
    pub expires_s: i64,
}

impl RouteFacts {
    /// The kernel's PMTU for this destination, when it learned one.
    pub fn pmtu(&self) -> Option<u32> {
        if self.cloned && self.expires_s != 0 {
            self.mtu
        } else {
            None
        }
    }
}

/// rtnl_link_stats64, the fields a transport investigation reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkStats {
    /// Packets received.
    pub rx_packets: u64,
    /// Packets sent.
    pub tx_packets: u64,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Receive errors.
    pub rx_errors: u64,
    /// Transmit errors.
    pub tx_errors: u64,
    /// Received packets dropped.
    pub rx_dropped: u64,
    /// Transmitted packets dropped.
    pub tx_dropped: u64,
    /// Receive overruns.
    pub rx_over_errors: u64,
    /// Missed on receive.
    pub rx_missed_errors: u64,
    /// Carrier errors.
    pub tx_carrier_errors: u64,
}

/// One interface.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkFacts {
    /// ifindex in its netns.
    pub index: i32,
    /// Name.
    pub name: String,
    /// MTU.
    pub mtu: Option<u32>,
    /// RFC 2863 operstate name (`up`, `down`, `lowerlayerdown`, …).
    pub operstate: String,
    /// `IFLA_INFO_KIND` (e.g. `veth`).
    pub kind: Option<String>,
    /// Link partner's ifindex (`IFLA_LINK`).
    pub link: Option<i32>,
    /// The partner's netns id as seen from here, if it is elsewhere.
    pub link_netnsid: Option<i32>,
    /// Counters.
    pub stats: Option<LinkStats>,
}

/// RFC 2863 operstate names, as `ip link` prints them (lowercase).
pub fn operstate_name(v: u8) -> &'static str {
    match v {
        0 => "unknown",
        1 => "notpresent",
        2 => "down",
        3 => "lowerlayerdown",
        4 => "testing",
        5 => "dormant",
        6 => "up",
        _ => "invalid",
    }
}

fn ip_from(v: &[u8]) -> Option<IpAddr> {
    match v.len() {
        4 => Some(IpAddr::from(<[u8; 4]>::try_from(v).ok()?)),
        16 => Some(IpAddr::from(<[u8; 16]>::try_from(v).ok()?)),
        _ => None,
    }
}

/// The `rtmsg` + `RTA_DST` payload of a route lookup.
pub fn route_request(dst: IpAddr) -> Vec<u8> {
    let mut p = vec![0u8; 12];
    let (family, bits, octets): (u8, u8, Vec<u8>) = match dst {
        IpAddr::V4(a) => (libc::AF_INET as u8, 32, a.octets().to_vec()),
        IpAddr::V6(a) => (libc::AF_INET6 as u8, 128, a.octets().to_vec()),
    };
    p[0] = family;
    p[1] = bits;
    super::netlink::push_attr(&mut p, RTA_DST, &octets);
    p
}

/// Decode an `RTM_NEWROUTE` payload.
pub fn parse_route(dst: IpAddr, payload: &[u8]) -> Result<RouteFacts, NetlinkError> {
    if payload.len() < 12 {
        return Err(NetlinkError::Malformed(format!(
            "rtmsg of {} bytes",
            payload.len()
        )));
    }
    let flags = u32::from_ne_bytes(payload[8..12].try_into().unwrap_or_default());
    let mut r = RouteFacts {
        dst,
        oif: None,
        gateway: None,
        prefsrc: None,
        table: Some(u32::from(payload[4])),
        mtu: None,
        advmss: None,
        cloned: flags & RTM_F_CLONED != 0,
        expires_s: 0,
    };
    for a in AttrIter::new(&payload[12..]) {
        let a = a?;
        match a.kind {
            RTA_OIF => r.oif = a.u32(),
            RTA_GATEWAY => r.gateway = ip_from(a.value),
            RTA_PREFSRC => r.prefsrc = ip_from(a.value),
            RTA_TABLE => r.table = a.u32(),
            RTA_METRICS => {
                for m in AttrIter::new(a.value) {
                    let m = m?;
                    match m.kind {
                        RTAX_MTU => r.mtu = m.u32(),
                        RTAX_ADVMSS => r.advmss = m.u32(),
                        _ => {}
                    }
                }
            }
            RTA_CACHEINFO => {
                // struct rta_cacheinfo: clntref, lastuse, expires (s32, jiffies→clock_t), …
                if let Some(b) = a.value.get(8..12) {
                    let ticks = i32::from_ne_bytes(b.try_into().unwrap_or_default());
                    // SAFETY: sysconf has no memory-safety preconditions.
                    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1);
                    r.expires_s = i64::from(ticks) / hz;
                    if ticks != 0 && r.expires_s == 0 {
                        r.expires_s = 1;
                    }
                }
            }
            _ => {}
        }
    }
    Ok(r)
}

/// The `ifinfomsg` payload asking for one link, optionally in another netns.
pub fn link_request(index: i32, target_netnsid: Option<i32>) -> Vec<u8> {
    let mut p = vec![0u8; 16];
    p[4..8].copy_from_slice(&index.to_ne_bytes());
    if let Some(id) = target_netnsid {
        super::netlink::push_attr(&mut p, IFLA_TARGET_NETNSID, &id.to_ne_bytes());
    }
    p
}

/// Decode an `RTM_NEWLINK` payload.
pub fn parse_link(payload: &[u8]) -> Result<LinkFacts, NetlinkError> {
    if payload.len() < 16 {
        return Err(NetlinkError::Malformed(format!(
            "ifinfomsg of {} bytes",
            payload.len()
        )));
    }
    let mut l = LinkFacts {
        index: i32::from_ne_bytes(payload[4..8].try_into().unwrap_or_default()),
        name: String::new(),
        mtu: None,
        operstate: "unknown".into(),
        kind: None,
        link: None,
        link_netnsid: None,
        stats: None,
    };
    for a in AttrIter::new(&payload[16..]) {
        let a = a?;
        match a.kind {
            IFLA_IFNAME => l.name = a.str(),
            IFLA_MTU => l.mtu = a.u32(),
            IFLA_LINK => l.link = a.i32(),
            IFLA_LINK_NETNSID => l.link_netnsid = a.i32(),
            IFLA_OPERSTATE => l.operstate = operstate_name(a.u8().unwrap_or(0)).into(),
            IFLA_LINKINFO => {
                for i in AttrIter::new(a.value) {
                    let i = i?;
                    if i.kind == IFLA_INFO_KIND {
                        l.kind = Some(i.str());
                    }
                }
            }
            IFLA_STATS64 => {
                let v = |i: usize| {
                    a.value
                        .get(i * 8..i * 8 + 8)
                        .and_then(|b| b.try_into().ok())
                        .map(u64::from_ne_bytes)
                        .unwrap_or(0)
                };
                if a.value.len() >= 23 * 8 {
                    l.stats = Some(LinkStats {
                        rx_packets: v(0),
                        tx_packets: v(1),
                        rx_bytes: v(2),
                        tx_bytes: v(3),
                        rx_errors: v(4),
                        tx_errors: v(5),
                        rx_dropped: v(6),
                        tx_dropped: v(7),
                        rx_over_errors: v(11),
                        rx_missed_errors: v(15),
                        tx_carrier_errors: v(17),
                    });
                }
            }
            _ => {}
        }
    }
    Ok(l)
}

/// A decoded answer plus the raw reply's meta.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Answer<T> {
    /// Decoded value.
    pub value: T,
    /// Digest and length of the raw reply.
    pub raw: crate::procfs::RawMeta,
}

fn ask<T>(
    kind: u16,
    payload: &[u8],
    want: u16,
    decode: &dyn Fn(&[u8]) -> Result<T, NetlinkError>,
) -> Result<Answer<T>, NetlinkError> {
    let mut sock = NetlinkSocket::open(libc::NETLINK_ROUTE)?;
    let mut raw = Vec::new();
    let mut out = None;
    sock.transact(
        kind,
        NLM_F_REQUEST,
        payload,
        &mut |b| raw.extend_from_slice(b),
        &mut |m| {
            if m.kind == want && out.is_none() {
                out = Some(decode(m.payload)?);
            }
            Ok(())
        },
    )?;
    let value =
        out.ok_or_else(|| NetlinkError::Malformed("no answer message in the reply".into()))?;
    Ok(Answer {
        value,
        raw: crate::procfs::RawMeta::of(&raw, false),
    })
}

/// `ip route get DST` in the calling thread's netns.
pub fn route_get(dst: IpAddr) -> Result<Answer<RouteFacts>, NetlinkError> {
    ask(RTM_GETROUTE, &route_request(dst), RTM_NEWROUTE, &|p| {
        parse_route(dst, p)
    })
}

/// One interface by index, here or (with `target_netnsid`) in a peer netns.
pub fn link_get(
    index: i32,
    target_netnsid: Option<i32>,
) -> Result<Answer<LinkFacts>, NetlinkError> {
    ask(
        RTM_GETLINK,
        &link_request(index, target_netnsid),
        RTM_NEWLINK,
        &parse_link,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::netlink::push_attr;

    #[test]
    fn route_reply_with_cached_pmtu() {
        let mut p = vec![0u8; 12];
        p[0] = 2;
        p[4] = 254;
        p[8..12].copy_from_slice(&RTM_F_CLONED.to_ne_bytes());
        push_attr(&mut p, RTA_OIF, &7u32.to_ne_bytes());
        push_attr(&mut p, RTA_PREFSRC, &[10, 0, 0, 1]);
        let mut metrics = Vec::new();
        push_attr(&mut metrics, RTAX_MTU, &1280u32.to_ne_bytes());
        push_attr(&mut p, RTA_METRICS, &metrics);
        let mut ci = vec![0u8; 20];
        ci[8..12].copy_from_slice(&(600 * 100i32).to_ne_bytes());
        push_attr(&mut p, RTA_CACHEINFO, &ci);
        let r = parse_route("10.0.0.2".parse().unwrap(), &p).unwrap();
        assert_eq!(r.oif, Some(7));
        assert_eq!(r.prefsrc, Some("10.0.0.1".parse().unwrap()));
        assert_eq!(r.mtu, Some(1280));
        assert!(r.cloned);
        assert!(r.expires_s > 0);
        assert_eq!(r.pmtu(), Some(1280));
    }

    #[test]
    fn route_without_exception_has_no_pmtu() {
        let mut p = vec![0u8; 12];
        let mut metrics = Vec::new();
        push_attr(&mut metrics, RTAX_MTU, &9000u32.to_ne_bytes());
        push_attr(&mut p, RTA_METRICS, &metrics);
        let r = parse_route("10.0.0.2".parse().unwrap(), &p).unwrap();
        assert_eq!(r.mtu, Some(9000));
        assert_eq!(r.pmtu(), None);
    }

    #[test]
    fn link_reply_with_veth_peer_elsewhere() {
        let mut p = vec![0u8; 16];
        p[4..8].copy_from_slice(&3i32.to_ne_bytes());
        push_attr(&mut p, IFLA_IFNAME, b"veth0\0");
        push_attr(&mut p, IFLA_MTU, &1500u32.to_ne_bytes());
        push_attr(&mut p, IFLA_LINK, &9i32.to_ne_bytes());
        push_attr(&mut p, IFLA_LINK_NETNSID, &0i32.to_ne_bytes());
        push_attr(&mut p, IFLA_OPERSTATE, &[6]);
        let mut li = Vec::new();
        push_attr(&mut li, IFLA_INFO_KIND, b"veth\0");
        push_attr(&mut p, IFLA_LINKINFO, &li);
        let mut st = vec![0u8; 24 * 8];
        st[7 * 8..8 * 8].copy_from_slice(&42u64.to_ne_bytes());
        push_attr(&mut p, IFLA_STATS64, &st);
        let l = parse_link(&p).unwrap();
        assert_eq!(l.name, "veth0");
        assert_eq!(l.kind.as_deref(), Some("veth"));
        assert_eq!((l.link, l.link_netnsid), (Some(9), Some(0)));
        assert_eq!(l.operstate, "up");
        assert_eq!(l.stats.unwrap().tx_dropped, 42);
    }

    #[test]
    fn short_headers_are_malformed() {
        assert!(parse_link(&[0; 8]).is_err());
        assert!(parse_route("::1".parse().unwrap(), &[0; 4]).is_err());
    }
}
