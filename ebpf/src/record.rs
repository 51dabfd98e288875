//! Decoding of the records the C programs write (`ebpf/bpf/pstack_events.h`).
//!
//! Pure: bytes in, typed values out. The layout is an ABI shared with the C
//! side and decoded by explicit little-endian offsets (no `transmute`, no
//! alignment assumptions). A record of the wrong size is a typed error, never
//! a guess; the sizes are pinned by tests against the header's comments.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Size of `struct pstack_tcp_event`.
pub const TCP_EVENT_SIZE: usize = 112;
/// Size of `struct pstack_dstate_event`.
pub const DSTATE_EVENT_SIZE: usize = 184;
/// Size of `struct pstack_offcpu_start`.
pub const OFFCPU_START_SIZE: usize = 160;
/// Size of `struct pstack_offcpu_totals`.
pub const OFFCPU_TOTALS_SIZE: usize = 168;
/// Frames kept per D-state stack (`PSTACK_OFFCPU_STACK_DEPTH`).
pub const STACK_DEPTH: usize = 16;
/// Number of off-CPU state classes (`PSTACK_OFF_CLASSES`).
pub const OFF_CLASSES: usize = 6;

/// `layout` bit: `tcp_send_reset` had the 6.10+ sockaddr-image layout.
pub const LAYOUT_SEND_RESET_SOCKADDR: u8 = 0x01;
/// `layout` bit: `tcp_send_reset` had the older `tcp_event_sk_skb` layout.
pub const LAYOUT_SEND_RESET_SK_SKB: u8 = 0x02;
/// `layout` bit: `tcp_retransmit_skb` carried `err`.
pub const LAYOUT_RETRANSMIT_ERR: u8 = 0x04;
/// `layout` bit: `tcp_receive_reset` carried `sock_cookie`.
pub const LAYOUT_RECV_RESET_COOKIE: u8 = 0x08;

/// `flags` bit: the event carried a socket.
pub const TCP_HAS_SOCK: u8 = 0x01;
/// `flags` bit: a retransmit whose socket was in `TCP_CA_Loss` (the RTO timer fired).
pub const TCP_RTO: u8 = 0x02;
/// `flags` bit: `snd_wnd` / `rcv_wnd` were read from a full socket.
pub const TCP_HAS_WND: u8 = 0x04;
/// `flags` bit (aggregated mode): sent for being decisive (a reset, a flow
/// leaving ESTABLISHED, a flow's first retransmit).
pub const TCP_RARE: u8 = 0x08;
/// `flags` bit (aggregated mode): an ordinary event chosen for the uniform sample.
pub const TCP_SAMPLED: u8 = 0x10;
/// `flags` bit (aggregated mode): no kernel flow entry took this event; user
/// space counts it.
pub const TCP_UNAGG: u8 = 0x20;
/// `icsk_ca_state` value `TCP_CA_Loss`.
pub const TCP_CA_LOSS: u8 = 4;

/// A record that does not have the size its kind requires.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} record is {got} bytes, expected {want}")]
pub struct RecordError {
    /// Which record.
    pub what: &'static str,
    /// Bytes received.
    pub got: usize,
    /// Bytes the layout has.
    pub want: usize,
}

fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}
fn i32_at(b: &[u8], o: usize) -> i32 {
    u32_at(b, o) as i32
}
fn u64_at(b: &[u8], o: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(a)
}
fn comm_at(b: &[u8], o: usize) -> String {
    let raw = &b[o..o + 16];
    let end = raw.iter().position(|&c| c == 0).unwrap_or(raw.len());
    String::from_utf8_lossy(&raw[..end])
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}
/// A task comm as the kernel stores it (16 bytes, NUL-padded), kept inline
/// so decoding an event allocates nothing.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Comm(pub [u8; 16]);

impl Comm {
    /// The name, lossily decoded, control characters replaced by `?`.
    pub fn name(&self) -> String {
        let end = self.0.iter().position(|&c| c == 0).unwrap_or(16);
        String::from_utf8_lossy(&self.0[..end])
            .chars()
            .map(|c| if c.is_control() { '?' } else { c })
            .collect()
    }
}

impl fmt::Display for Comm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

impl fmt::Debug for Comm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.name())
    }
}

fn check(what: &'static str, b: &[u8], want: usize) -> Result<(), RecordError> {
    if b.len() < want {
        return Err(RecordError {
            what,
            got: b.len(),
            want,
        });
    }
    Ok(())
}

/// TCP event kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TcpEventKind {
    /// `tcp:tcp_retransmit_skb`.
    Retransmit,
    /// `tcp:tcp_receive_reset`: this socket received a RST from the peer.
    ReceiveReset,
    /// `tcp:tcp_send_reset`: this host sent a RST.
    SendReset,
    /// `sock:inet_sock_set_state` for TCP.
    StateChange,
}

impl TcpEventKind {
    fn from_raw(k: u8) -> Option<TcpEventKind> {
        match k {
            1 => Some(TcpEventKind::Retransmit),
            2 => Some(TcpEventKind::ReceiveReset),
            3 => Some(TcpEventKind::SendReset),
            4 => Some(TcpEventKind::StateChange),
            _ => None,
        }
    }

    /// Counter slot index in the C `COUNTERS` map (`2*kind` seen, `2*kind+1` lost).
    pub fn raw(self) -> u8 {
        match self {
            TcpEventKind::Retransmit => 1,
            TcpEventKind::ReceiveReset => 2,
            TcpEventKind::SendReset => 3,
            TcpEventKind::StateChange => 4,
        }
    }

    /// Every kind.
    pub const ALL: [TcpEventKind; 4] = [
        TcpEventKind::Retransmit,
        TcpEventKind::ReceiveReset,
        TcpEventKind::SendReset,
        TcpEventKind::StateChange,
    ];

    /// `category/name` of the tracepoint.
    pub fn tracepoint(self) -> &'static str {
        match self {
            TcpEventKind::Retransmit => "tcp/tcp_retransmit_skb",
            TcpEventKind::ReceiveReset => "tcp/tcp_receive_reset",
            TcpEventKind::SendReset => "tcp/tcp_send_reset",
            TcpEventKind::StateChange => "sock/inet_sock_set_state",
        }
    }

    /// Short name for output.
    pub fn as_str(self) -> &'static str {
        match self {
            TcpEventKind::Retransmit => "retransmit",
            TcpEventKind::ReceiveReset => "reset_received",
            TcpEventKind::SendReset => "reset_sent",
            TcpEventKind::StateChange => "state",
        }
    }
}

/// A TCP state as the kernel numbers them (`TCP_ESTABLISHED` = 1 ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TcpState(pub u8);

impl TcpState {
    /// The kernel's name without the `TCP_` prefix, or `UNKNOWN(n)`.
    pub fn name(self) -> String {
        let n = match self.0 {
            1 => "ESTABLISHED",
            2 => "SYN_SENT",
            3 => "SYN_RECV",
            4 => "FIN_WAIT1",
            5 => "FIN_WAIT2",
            6 => "TIME_WAIT",
            7 => "CLOSE",
            8 => "CLOSE_WAIT",
            9 => "LAST_ACK",
            10 => "LISTEN",
            11 => "CLOSING",
            12 => "NEW_SYN_RECV",
            0 => "NONE",
            other => return format!("UNKNOWN({other})"),
        };
        n.to_string()
    }
}

impl fmt::Display for TcpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// The kernel's `enum sk_rst_reason` name (6.10+), or `UNKNOWN(n)`.
pub fn reset_reason_name(reason: i32) -> String {
    const NAMES: [&str; 26] = [
        "NOT_SPECIFIED",
        "NO_SOCKET",
        "TCP_INVALID_ACK_SEQUENCE",
        "TCP_RFC7323_PAWS",
        "TCP_TOO_OLD_ACK",
        "TCP_ACK_UNSENT_DATA",
        "TCP_FLAGS",
        "TCP_OLD_ACK",
        "TCP_ABORT_ON_DATA",
        "TCP_TIMEWAIT_SOCKET",
        "INVALID_SYN",
        "TCP_ABORT_ON_CLOSE",
        "TCP_ABORT_ON_LINGER",
        "TCP_ABORT_ON_MEMORY",
        "TCP_STATE",
        "TCP_KEEPALIVE_TIMEOUT",
        "TCP_DISCONNECT_WITH_DATA",
        "MPTCP_RST_EUNSPEC",
        "MPTCP_RST_EMPTCP",
        "MPTCP_RST_ERESOURCE",
        "MPTCP_RST_EPROHIBIT",
        "MPTCP_RST_EWQ2BIG",
        "MPTCP_RST_EBADPERF",
        "MPTCP_RST_EMIDDLEBOX",
        "ERROR",
        "MAX",
    ];
    usize::try_from(reason)
        .ok()
        .and_then(|i| NAMES.get(i))
        .map(|s| s.to_string())
        .unwrap_or_else(|| format!("UNKNOWN({reason})"))
}

/// One endpoint `addr:port`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Endpoint {
    /// Address (unspecified when the family was unknown).
    pub addr: IpAddr,
    /// Port, host order.
    pub port: u16,
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.addr {
            IpAddr::V4(a) => write!(f, "{a}:{}", self.port),
            IpAddr::V6(a) => write!(f, "[{a}]:{}", self.port),
        }
    }
}

fn endpoint(family: u8, raw: &[u8], port: u16) -> Endpoint {
    let addr = if family == 10 {
        let mut a = [0u8; 16];
        a.copy_from_slice(&raw[..16]);
        IpAddr::V6(Ipv6Addr::from(a))
    } else {
        IpAddr::V4(Ipv4Addr::new(raw[0], raw[1], raw[2], raw[3]))
    };
    Endpoint { addr, port }
}

/// One decoded `struct pstack_tcp_event`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpEvent {
    /// CLOCK_MONOTONIC ns.
    pub ts_ns: u64,
    /// What happened.
    pub kind: TcpEventKind,
    /// Socket cookie, when the kernel had generated one.
    pub sock_cookie: Option<u64>,
    /// `net_cookie` of the socket's netns (retransmits and resets only; state
    /// changes carry the netns inode alone, to save a probe read per event).
    pub netns_cookie: Option<u64>,
    /// Inode of the socket's netns.
    pub netns_ino: Option<u32>,
    /// Local endpoint (for resets: the RST's sender when `kind` is `SendReset`,
    /// the RST's receiver when `ReceiveReset`).
    pub local: Endpoint,
    /// Remote endpoint.
    pub remote: Endpoint,
    /// Address family (2 or 10; 0 unknown).
    pub family: u8,
    /// State at the event (old state for a state change).
    pub state: TcpState,
    /// New state (state changes only).
    pub new_state: Option<TcpState>,
    /// Retransmit `err` or send-reset `reason` (kind-specific), when present.
    pub detail: Option<i32>,
    /// `LAYOUT_*` bits: which tracepoint layout the kernel had.
    pub layout: u8,
    /// The event carried a socket.
    pub has_sock: bool,
    /// On-CPU tgid (0 in softirq; not the socket owner there).
    pub pid: u32,
    /// On-CPU comm.
    pub comm: Comm,
    /// Opaque in-host socket key joining one socket's events (0 = none).
    /// It is a kernel address: used for joining only, never emitted.
    pub sk_key: u64,
}

impl TcpEvent {
    /// Decode one ring-buffer record.
    pub fn parse(b: &[u8]) -> Result<TcpEvent, RecordError> {
        check("tcp event", b, TCP_EVENT_SIZE)?;
        let kind = TcpEventKind::from_raw(b[32]).ok_or(RecordError {
            what: "tcp event kind",
            got: usize::from(b[32]),
            want: 4,
        })?;
        let family = b[33];
        let nz64 = |v: u64| (v != 0).then_some(v);
        let layout = b[76];
        let detail_present = match kind {
            TcpEventKind::Retransmit => layout & LAYOUT_RETRANSMIT_ERR != 0,
            TcpEventKind::SendReset => layout & LAYOUT_SEND_RESET_SOCKADDR != 0,
            _ => false,
        };
        Ok(TcpEvent {
            ts_ns: u64_at(b, 0),
            kind,
            sock_cookie: nz64(u64_at(b, 8)),
            netns_cookie: nz64(u64_at(b, 16)),
            netns_ino: Some(u32_at(b, 24)).filter(|&v| v != 0),
            local: endpoint(family, &b[40..56], u16_at(b, 36)),
            remote: endpoint(family, &b[56..72], u16_at(b, 38)),
            family,
            state: TcpState(b[34]),
            new_state: (kind == TcpEventKind::StateChange).then_some(TcpState(b[35])),
            detail: detail_present.then(|| i32_at(b, 72)),
            layout,
            has_sock: b[77] & TCP_HAS_SOCK != 0,
            pid: u32_at(b, 28),
            comm: {
                let mut c = [0u8; 16];
                c.copy_from_slice(&b[80..96]);
                Comm(c)
            },
            sk_key: u64_at(b, 96),
        })
    }
}

/// What a record says about its socket's congestion and window state, beside
/// the [`TcpEvent`] itself (a separate type so that `TcpEvent` stays the same
/// for its existing users).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TcpSockState {
    /// `tcp_sock.snd_wnd`: the send window the peer advertised, bytes
    /// (present when the record had a full socket).
    pub snd_wnd: Option<u32>,
    /// `tcp_sock.rcv_wnd`: the receive window this end advertises, bytes.
    pub rcv_wnd: Option<u32>,
    /// `icsk_ca_state` of a retransmit's socket (`TCP_CA_Open` 0 ... `TCP_CA_Loss` 4).
    pub ca_state: Option<u8>,
    /// A retransmit sent in `TCP_CA_Loss`: the RTO timer fired (or loss
    /// recovery after it), not fast retransmit.
    pub rto: bool,
}

impl TcpSockState {
    /// Decode the socket-state part of one `struct pstack_tcp_event`.
    pub fn parse(b: &[u8]) -> Result<TcpSockState, RecordError> {
        check("tcp event", b, TCP_EVENT_SIZE)?;
        let flags = b[77];
        let wnd = flags & TCP_HAS_WND != 0;
        let retransmit_with_sock = b[32] == 1 && flags & TCP_HAS_SOCK != 0;
        Ok(TcpSockState {
            snd_wnd: wnd.then(|| u32_at(b, 104)),
            rcv_wnd: wnd.then(|| u32_at(b, 108)),
            ca_state: retransmit_with_sock.then_some(b[78]),
            rto: retransmit_with_sock && flags & TCP_RTO != 0,
        })
    }
}

/// One whole TCP record: the event and its socket state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpRecord {
    /// The event.
    pub event: TcpEvent,
    /// Windows and congestion state of its socket.
    pub sock: TcpSockState,
}

impl TcpRecord {
    /// Decode one ring-buffer record.
    pub fn parse(b: &[u8]) -> Result<TcpRecord, RecordError> {
        Ok(TcpRecord {
            event: TcpEvent::parse(b)?,
            sock: TcpSockState::parse(b)?,
        })
    }
}

/// Off-CPU state class (index of the per-class arrays).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OffCpuClass {
    /// Preempted, waiting on a runqueue.
    Runnable,
    /// Interruptible sleep (S).
    Sleeping,
    /// Uninterruptible sleep (D), including frozen.
    Uninterruptible,
    /// Stopped or traced (T/t).
    Stopped,
    /// TASK_IDLE kernel threads (I).
    Idle,
    /// Anything else.
    Other,
}

impl OffCpuClass {
    /// Every class in index order.
    pub const ALL: [OffCpuClass; OFF_CLASSES] = [
        OffCpuClass::Runnable,
        OffCpuClass::Sleeping,
        OffCpuClass::Uninterruptible,
        OffCpuClass::Stopped,
        OffCpuClass::Idle,
        OffCpuClass::Other,
    ];

    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            OffCpuClass::Runnable => "runnable",
            OffCpuClass::Sleeping => "S",
            OffCpuClass::Uninterruptible => "D",
            OffCpuClass::Stopped => "T",
            OffCpuClass::Idle => "I",
            OffCpuClass::Other => "other",
        }
    }

    fn from_raw(v: u32) -> OffCpuClass {
        OffCpuClass::ALL
            .get(v as usize)
            .copied()
            .unwrap_or(OffCpuClass::Other)
    }
}

/// `flags` bit: seeded by user space; the start is when watching began.
pub const OFF_SEEDED: u32 = 0x1;

/// `TASK_FROZEN` in the raw task state (6.1+).
pub const TASK_FROZEN: u32 = 0x8000;

/// One completed D-state episode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DStateEpisode {
    /// Switch-out time, CLOCK_MONOTONIC ns.
    pub start_ns: u64,
    /// Time off CPU, ns.
    pub duration_ns: u64,
    /// Thread id.
    pub tid: u32,
    /// Process id.
    pub tgid: u32,
    /// Thread that woke it, when seen.
    pub waker_tid: Option<u32>,
    /// Raw task state at switch-out.
    pub raw_state: u32,
    /// Kernel stack at switch-out (addresses, innermost first).
    pub stack: Vec<u64>,
    /// Thread comm.
    pub comm: String,
    /// Already off CPU when watching began: `start_ns` is a lower bound.
    pub seeded: bool,
}

impl DStateEpisode {
    /// Decode one ring-buffer record.
    pub fn parse(b: &[u8]) -> Result<DStateEpisode, RecordError> {
        check("d-state event", b, DSTATE_EVENT_SIZE)?;
        let len = (u32_at(b, 32) as usize).min(STACK_DEPTH);
        Ok(DStateEpisode {
            start_ns: u64_at(b, 0),
            duration_ns: u64_at(b, 8),
            tid: u32_at(b, 16),
            tgid: u32_at(b, 20),
            waker_tid: Some(u32_at(b, 24)).filter(|&w| w != 0),
            raw_state: u32_at(b, 28),
            comm: comm_at(b, 40),
            stack: (0..len).map(|i| u64_at(b, 56 + 8 * i)).collect(),
            seeded: u32_at(b, 36) & OFF_SEEDED != 0,
        })
    }

    /// The task was frozen (cgroup freezer), not blocked on I/O or a lock.
    pub fn frozen(&self) -> bool {
        self.raw_state & TASK_FROZEN != 0
    }
}

/// A switch-out still open (a task off CPU right now).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffCpuStart {
    /// Switch-out time, CLOCK_MONOTONIC ns.
    pub ts_ns: u64,
    /// Process id.
    pub tgid: u32,
    /// State class it left the CPU in.
    pub class: OffCpuClass,
    /// Raw task state (D only).
    pub raw_state: u32,
    /// Waker, once woken.
    pub waker_tid: Option<u32>,
    /// Kernel stack (D only).
    pub stack: Vec<u64>,
    /// Seeded by user space (start = when watching began, a lower bound).
    pub seeded: bool,
}

impl OffCpuStart {
    /// Encode a START value for a thread already off CPU in `class` at
    /// `ts_ns` (seeded; the kernel fills waker and closes it at switch-in).
    pub fn seed(ts_ns: u64, tgid: u32, class: OffCpuClass) -> [u8; OFFCPU_START_SIZE] {
        let mut b = [0u8; OFFCPU_START_SIZE];
        b[0..8].copy_from_slice(&ts_ns.to_le_bytes());
        b[8..12].copy_from_slice(&tgid.to_le_bytes());
        b[12..16].copy_from_slice(&(class as u32).to_le_bytes());
        b[28..32].copy_from_slice(&OFF_SEEDED.to_le_bytes());
        b
    }

    /// Decode one `START` map value.
    pub fn parse(b: &[u8]) -> Result<OffCpuStart, RecordError> {
        check("off-cpu start", b, OFFCPU_START_SIZE)?;
        let len = (u32_at(b, 24) as usize).min(STACK_DEPTH);
        Ok(OffCpuStart {
            ts_ns: u64_at(b, 0),
            tgid: u32_at(b, 8),
            class: OffCpuClass::from_raw(u32_at(b, 12)),
            raw_state: u32_at(b, 16),
            waker_tid: Some(u32_at(b, 20)).filter(|&w| w != 0),
            stack: (0..len).map(|i| u64_at(b, 32 + 8 * i)).collect(),
            seeded: u32_at(b, 28) & OFF_SEEDED != 0,
        })
    }
}

/// Per-task off-CPU totals for the intervals that ended in a window.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OffCpuTotals {
    /// ns per class.
    pub ns: [u64; OFF_CLASSES],
    /// Intervals per class.
    pub count: [u64; OFF_CLASSES],
    /// Longest interval per class, ns.
    pub max_ns: [u64; OFF_CLASSES],
    /// Process id.
    pub tgid: u32,
    /// Comm at the first interval.
    pub comm: String,
}

impl OffCpuTotals {
    /// Decode one `TOTALS` map value.
    pub fn parse(b: &[u8]) -> Result<OffCpuTotals, RecordError> {
        check("off-cpu totals", b, OFFCPU_TOTALS_SIZE)?;
        let arr = |base: usize| -> [u64; OFF_CLASSES] {
            let mut a = [0u64; OFF_CLASSES];
            for (i, v) in a.iter_mut().enumerate() {
                *v = u64_at(b, base + 8 * i);
            }
            a
        };
        Ok(OffCpuTotals {
            ns: arr(0),
            count: arr(48),
            max_ns: arr(96),
            tgid: u32_at(b, 144),
            comm: comm_at(b, 152),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp_record(kind: u8, family: u8) -> Vec<u8> {
        let mut b = vec![0u8; TCP_EVENT_SIZE];
        b[0..8].copy_from_slice(&123u64.to_le_bytes());
        b[8..16].copy_from_slice(&77u64.to_le_bytes());
        b[24..28].copy_from_slice(&4026531840u32.to_le_bytes());
        b[28..32].copy_from_slice(&42u32.to_le_bytes());
        b[32] = kind;
        b[33] = family;
        b[34] = 1;
        b[35] = 7;
        b[36..38].copy_from_slice(&5000u16.to_le_bytes());
        b[38..40].copy_from_slice(&40000u16.to_le_bytes());
        b[40..44].copy_from_slice(&[127, 0, 0, 1]);
        b[56..60].copy_from_slice(&[10, 1, 2, 3]);
        b[72..76].copy_from_slice(&12i32.to_le_bytes());
        b[76] = LAYOUT_SEND_RESET_SOCKADDR;
        b[77] = 1;
        b[80..86].copy_from_slice(b"curl\0x");
        b
    }

    #[test]
    fn short_records_are_typed_errors_not_guesses() {
        assert_eq!(
            TcpEvent::parse(&[0u8; 104]).unwrap_err(),
            RecordError {
                what: "tcp event",
                got: 104,
                want: 112
            }
        );
        assert!(DStateEpisode::parse(&[0u8; 10]).is_err());
        assert!(OffCpuStart::parse(&[]).is_err());
        assert!(OffCpuTotals::parse(&[0u8; 167]).is_err());
    }

    #[test]
    fn unknown_kind_is_refused() {
        assert!(TcpEvent::parse(&tcp_record(9, 2)).is_err());
        assert!(TcpEvent::parse(&tcp_record(0, 2)).is_err());
    }

    #[test]
    fn send_reset_record_decodes_every_field() {
        let e = TcpEvent::parse(&tcp_record(3, 2)).unwrap();
        assert_eq!(e.kind, TcpEventKind::SendReset);
        assert_eq!(e.local.to_string(), "127.0.0.1:5000");
        assert_eq!(e.remote.to_string(), "10.1.2.3:40000");
        assert_eq!(e.sock_cookie, Some(77));
        assert_eq!(e.netns_cookie, None);
        assert_eq!(e.netns_ino, Some(4026531840));
        assert_eq!(e.detail, Some(12));
        assert_eq!(reset_reason_name(12), "TCP_ABORT_ON_LINGER");
        assert_eq!(e.new_state, None);
        assert_eq!(e.comm.name(), "curl");
        assert!(e.has_sock);
    }

    #[test]
    fn retransmit_socket_state_decodes_rto_and_windows() {
        let mut b = tcp_record(1, 2);
        b[77] = TCP_HAS_SOCK | TCP_RTO | TCP_HAS_WND;
        b[78] = TCP_CA_LOSS;
        b[104..108].copy_from_slice(&0u32.to_le_bytes());
        b[108..112].copy_from_slice(&65535u32.to_le_bytes());
        let r = TcpRecord::parse(&b).unwrap();
        assert_eq!(r.event.kind, TcpEventKind::Retransmit);
        assert_eq!(
            r.sock,
            TcpSockState {
                snd_wnd: Some(0),
                rcv_wnd: Some(65535),
                ca_state: Some(4),
                rto: true
            }
        );
        // Without HAS_WND the window bytes mean nothing; a state change has no ca_state.
        let mut b = tcp_record(4, 2);
        b[77] = TCP_HAS_SOCK | TCP_RTO;
        b[104..108].copy_from_slice(&9u32.to_le_bytes());
        let s = TcpSockState::parse(&b).unwrap();
        assert_eq!(s, TcpSockState::default());
        assert!(TcpSockState::parse(&b[..111]).is_err());
    }

    #[test]
    fn ipv6_and_state_change_decode() {
        let mut b = tcp_record(4, 10);
        b[40..56].copy_from_slice(&Ipv6Addr::LOCALHOST.octets());
        let e = TcpEvent::parse(&b).unwrap();
        assert_eq!(e.local.to_string(), "[::1]:5000");
        assert_eq!(e.state.name(), "ESTABLISHED");
        assert_eq!(e.new_state.map(|s| s.name()), Some("CLOSE".to_string()));
        assert_eq!(e.detail, None, "state changes carry no detail");
        assert_eq!(TcpState(200).name(), "UNKNOWN(200)");
        assert_eq!(reset_reason_name(-1), "UNKNOWN(-1)");
    }

    #[test]
    fn dstate_episode_caps_stack_length() {
        let mut b = vec![0u8; DSTATE_EVENT_SIZE];
        b[8..16].copy_from_slice(&1_000_000_000u64.to_le_bytes());
        b[28..32].copy_from_slice(&TASK_FROZEN.to_le_bytes());
        b[32..36].copy_from_slice(&999u32.to_le_bytes());
        let e = DStateEpisode::parse(&b).unwrap();
        assert_eq!(e.stack.len(), STACK_DEPTH);
        assert!(e.frozen());
        assert_eq!(e.waker_tid, None);
    }

    #[test]
    fn seeded_start_round_trips() {
        let b = OffCpuStart::seed(77, 9, OffCpuClass::Uninterruptible);
        let s = OffCpuStart::parse(&b).unwrap();
        assert_eq!(
            (s.ts_ns, s.tgid, s.class, s.seeded),
            (77, 9, OffCpuClass::Uninterruptible, true)
        );
        assert!(s.stack.is_empty() && s.waker_tid.is_none());
    }

    #[test]
    fn totals_decode_by_class() {
        let mut b = vec![0u8; OFFCPU_TOTALS_SIZE];
        b[16..24].copy_from_slice(&5u64.to_le_bytes()); // ns[D]
        b[48 + 8..48 + 16].copy_from_slice(&3u64.to_le_bytes()); // count[S]
        b[144..148].copy_from_slice(&99u32.to_le_bytes());
        b[152..155].copy_from_slice(b"abc");
        let t = OffCpuTotals::parse(&b).unwrap();
        assert_eq!(t.ns[2], 5);
        assert_eq!(t.count[1], 3);
        assert_eq!(t.tgid, 99);
        assert_eq!(t.comm, "abc");
    }
}
