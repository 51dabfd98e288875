//! Decoding of `struct pstack_tcp_flow` (`ebpf/bpf/pstack_events.h`): one
//! flow's in-kernel aggregate, read from the `FLOWS` map at window end or
//! received as a ring record when the flow reached CLOSE.
//!
//! Pure: bytes in, typed values out, by explicit little-endian offsets. A
//! record of the wrong size is a typed error. The size is pinned by a test and
//! by a `_Static_assert` in the header; ring records are told apart from
//! `pstack_tcp_event` (112 bytes) by their size.

use crate::record::{Endpoint, RecordError, TcpState};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Size of `struct pstack_tcp_flow`.
pub const TCP_FLOW_SIZE: usize = 216;
/// Transitions the kernel keeps per flow (`PSTACK_TCP_FLOW_TRANSITIONS`).
pub const FLOW_TRANSITIONS: usize = 8;

/// `flags`: `last_reset_reason` is set.
pub const FLOW_REASON: u8 = 0x01;
/// `flags`: the byte counters were read from a full socket.
pub const FLOW_BYTES: u8 = 0x02;
/// `flags`: ports and addresses are known.
pub const FLOW_TUPLE: u8 = 0x04;
/// `flags`: the tuple fields hold a pair with a port 0 (a listener; a client
/// before its first complete event).
pub const FLOW_PARTIAL: u8 = 0x08;
/// `flags` (map entries only): the flow was already sent at CLOSE; the entry
/// waits to be reused by the next socket at that address.
pub const FLOW_DEAD: u8 = 0x10;
/// `flags` (flow records only): the flow's last transition, ESTABLISHED ->
/// CLOSE, is a rare event this record stands for (no separate record sent).
pub const FLOW_LEFT_EST: u8 = 0x20;

/// One flow's kernel aggregate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpFlowRecord {
    /// First event folded, CLOCK_MONOTONIC ns.
    pub first_ns: u64,
    /// Last event folded.
    pub last_ns: u64,
    /// Socket cookie, when the kernel had generated one.
    pub sock_cookie: Option<u64>,
    /// Netns cookie.
    pub netns_cookie: Option<u64>,
    /// The socket's address (an in-host join key, never emitted).
    pub sk_key: u64,
    /// `tcp_sock.bytes_acked` at CLOSE (a flow still open has none).
    pub bytes_acked: Option<u64>,
    /// `tcp_sock.bytes_received` at CLOSE.
    pub bytes_received: Option<u64>,
    /// Netns inode.
    pub netns_ino: Option<u32>,
    /// Retransmits (all).
    pub retransmits: u64,
    /// Retransmits in `TCP_CA_Loss` (the RTO timer fired).
    pub rtos: u64,
    /// Retransmits in `TCP_CA_Recovery` (fast retransmit).
    pub recovery: u64,
    /// Retransmits in Open/Disorder/CWR (tail loss probes among them).
    pub other_retransmits: u64,
    /// RSTs this host sent on the socket.
    pub resets_sent: u64,
    /// RSTs the socket received.
    pub resets_received: u64,
    /// Last send-reset reason.
    pub last_reset_reason: Option<i32>,
    /// State changes (all).
    pub state_changes: u64,
    /// Local and remote endpoints, when known (both ports set).
    pub tuple: Option<(Endpoint, Endpoint)>,
    /// Endpoints with a port 0, when that is all the flow's events carried.
    pub partial_tuple: Option<(Endpoint, Endpoint)>,
    /// Last state seen.
    pub state: TcpState,
    /// A map entry whose flow was already sent at CLOSE (skip it).
    pub dead: bool,
    /// The record also stands for the flow leaving ESTABLISHED straight to CLOSE.
    pub left_established_at_end: bool,
    /// The first transitions: (ns, from, to).
    pub transitions: Vec<(u64, TcpState, TcpState)>,
}

fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}
fn u64_at(b: &[u8], o: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(a)
}

fn addr(family: u8, raw: &[u8]) -> IpAddr {
    if family == 10 {
        let mut a = [0u8; 16];
        a.copy_from_slice(&raw[..16]);
        IpAddr::V6(Ipv6Addr::from(a))
    } else {
        IpAddr::V4(Ipv4Addr::new(raw[0], raw[1], raw[2], raw[3]))
    }
}

impl TcpFlowRecord {
    /// Decode one `struct pstack_tcp_flow`.
    pub fn parse(b: &[u8]) -> Result<TcpFlowRecord, RecordError> {
        if b.len() != TCP_FLOW_SIZE {
            return Err(RecordError {
                what: "tcp flow",
                got: b.len(),
                want: TCP_FLOW_SIZE,
            });
        }
        let nz = |v: u64| (v != 0).then_some(v);
        let flags = b[97];
        let family = b[96];
        let bytes = flags & FLOW_BYTES != 0;
        let state_changes = u64::from(u32_at(b, 88));
        let kept = usize::try_from(state_changes)
            .unwrap_or(usize::MAX)
            .min(FLOW_TRANSITIONS);
        let transitions = (0..kept)
            .map(|i| {
                (
                    u64_at(b, 136 + 8 * i),
                    TcpState(b[200 + i]),
                    TcpState(b[208 + i]),
                )
            })
            .collect();
        Ok(TcpFlowRecord {
            first_ns: u64_at(b, 0),
            last_ns: u64_at(b, 8),
            sock_cookie: nz(u64_at(b, 16)),
            netns_cookie: nz(u64_at(b, 24)),
            sk_key: u64_at(b, 32),
            bytes_acked: bytes.then(|| u64_at(b, 40)),
            bytes_received: bytes.then(|| u64_at(b, 48)),
            netns_ino: Some(u32_at(b, 56)).filter(|&v| v != 0),
            retransmits: u64::from(u32_at(b, 60)),
            rtos: u64::from(u32_at(b, 64)),
            recovery: u64::from(u32_at(b, 68)),
            other_retransmits: u64::from(u32_at(b, 72)),
            resets_sent: u64::from(u32_at(b, 76)),
            resets_received: u64::from(u32_at(b, 80)),
            last_reset_reason: (flags & FLOW_REASON != 0).then(|| u32_at(b, 84) as i32),
            state_changes,
            tuple: (flags & FLOW_TUPLE != 0).then(|| endpoints(family, b)),
            partial_tuple: (flags & (FLOW_TUPLE | FLOW_PARTIAL) == FLOW_PARTIAL)
                .then(|| endpoints(family, b)),
            state: TcpState(b[98]),
            dead: flags & FLOW_DEAD != 0,
            left_established_at_end: flags & FLOW_LEFT_EST != 0,
            transitions,
        })
    }
}

fn endpoints(family: u8, b: &[u8]) -> (Endpoint, Endpoint) {
    (
        Endpoint {
            addr: addr(family, &b[104..120]),
            port: u16_at(b, 92),
        },
        Endpoint {
            addr: addr(family, &b[120..136]),
            port: u16_at(b, 94),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_is_pinned_and_fields_decode_at_their_offsets() {
        assert!(TcpFlowRecord::parse(&[0u8; 112]).is_err());
        let mut b = vec![0u8; TCP_FLOW_SIZE];
        b[0..8].copy_from_slice(&5u64.to_le_bytes());
        b[16..24].copy_from_slice(&77u64.to_le_bytes());
        b[60..64].copy_from_slice(&3u32.to_le_bytes());
        b[64..68].copy_from_slice(&2u32.to_le_bytes());
        b[88..92].copy_from_slice(&10u32.to_le_bytes());
        b[92..94].copy_from_slice(&5555u16.to_le_bytes());
        b[94..96].copy_from_slice(&80u16.to_le_bytes());
        b[96] = 2;
        b[97] = FLOW_TUPLE;
        b[104..108].copy_from_slice(&[127, 0, 0, 1]);
        b[120..124].copy_from_slice(&[10, 0, 0, 2]);
        b[136..144].copy_from_slice(&9u64.to_le_bytes());
        b[200] = 7;
        b[208] = 2;
        let f = TcpFlowRecord::parse(&b).expect("decodes");
        assert_eq!(f.first_ns, 5);
        assert_eq!(f.sock_cookie, Some(77));
        assert_eq!((f.retransmits, f.rtos), (3, 2));
        assert_eq!(f.state_changes, 10);
        assert_eq!(f.transitions.len(), FLOW_TRANSITIONS, "10 seen, 8 kept");
        assert_eq!(f.transitions[0], (9, TcpState(7), TcpState(2)));
        let (l, r) = f.tuple.expect("tuple");
        assert_eq!(l.to_string(), "127.0.0.1:5555");
        assert_eq!(r.to_string(), "10.0.0.2:80");
        assert_eq!(f.bytes_acked, None);
        assert_eq!(f.last_reset_reason, None);
    }
}
