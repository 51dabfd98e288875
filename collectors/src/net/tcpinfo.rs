//! `struct tcp_info`, parsed length-aware.
//!
//! The kernel copies `min(sizeof(struct tcp_info), attribute length)` and the
//! struct has only grown: 104 bytes (2.6), then `pacing_rate` … up to 248 bytes
//! (`total_rto*`, 6.7). Like `ss`, we take the attribute as given and read a
//! field only when the bytes cover it; a field beyond the end is `None`,
//! never zero. A shorter-than-base struct (< 104 bytes) is refused.
//!
//! Counters that are `__u64` in the uapi are `u64` here; callers must not emit
//! them as JSON numbers without checking they fit 2^53.

use serde::{Deserialize, Serialize};

/// Smallest `tcp_info` we accept: through `tcpi_total_retrans` (Linux 2.6).
pub const TCP_INFO_BASE_LEN: usize = 104;

/// Parsed `tcp_info`; `None` for fields the kernel's struct did not include.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TcpInfo {
    /// Length of the struct the kernel returned.
    pub len: usize,
    /// TCP state number (`TCP_ESTABLISHED` = 1, …).
    pub state: u8,
    /// Congestion-avoidance state (0 Open, 1 Disorder, 2 CWR, 3 Recovery, 4 Loss).
    pub ca_state: u8,
    /// Consecutive RTO retransmits of the head segment now.
    pub retransmits: u8,
    /// Zero-window / keepalive probes sent without answer.
    pub probes: u8,
    /// RTO exponential backoff.
    pub backoff: u8,
    /// Negotiated options bitmask (TCPI_OPT_*).
    pub options: u8,
    /// Send window scale.
    pub snd_wscale: u8,
    /// Receive window scale.
    pub rcv_wscale: u8,
    /// Retransmission timeout, µs.
    pub rto_us: u32,
    /// Delayed-ACK timeout, µs.
    pub ato_us: u32,
    /// Sender MSS.
    pub snd_mss: u32,
    /// Receiver MSS estimate.
    pub rcv_mss: u32,
    /// Segments sent but not acknowledged.
    pub unacked: u32,
    /// SACKed segments.
    pub sacked: u32,
    /// Segments believed lost.
    pub lost: u32,
    /// Segments retransmitted and not yet acknowledged.
    pub retrans: u32,
    /// ms since the last data sent.
    pub last_data_sent_ms: u32,
    /// ms since the last ACK sent (unused by Linux, always 0).
    pub last_ack_sent_ms: u32,
    /// ms since the last data received.
    pub last_data_recv_ms: u32,
    /// ms since the last ACK received.
    pub last_ack_recv_ms: u32,
    /// Path MTU the socket uses.
    pub pmtu: u32,
    /// Receive slow-start threshold.
    pub rcv_ssthresh: u32,
    /// Smoothed RTT, µs.
    pub rtt_us: u32,
    /// RTT variance, µs.
    pub rttvar_us: u32,
    /// Send slow-start threshold.
    pub snd_ssthresh: u32,
    /// Congestion window, segments.
    pub snd_cwnd: u32,
    /// Advertised MSS.
    pub advmss: u32,
    /// Reordering metric.
    pub reordering: u32,
    /// Receiver-side RTT estimate, µs.
    pub rcv_rtt_us: u32,
    /// Receive space.
    pub rcv_space: u32,
    /// Segments retransmitted over the socket's life.
    pub total_retrans: u32,
    /// Pacing rate, bytes/s.
    pub pacing_rate: Option<u64>,
    /// Bytes acknowledged by the peer (RFC 4898 HCThruOctetsAcked).
    pub bytes_acked: Option<u64>,
    /// Bytes received (RFC 4898 HCThruOctetsReceived).
    pub bytes_received: Option<u64>,
    /// Segments sent.
    pub segs_out: Option<u32>,
    /// Segments received.
    pub segs_in: Option<u32>,
    /// Bytes written by the application not yet sent.
    pub notsent_bytes: Option<u32>,
    /// Minimum RTT seen, µs.
    pub min_rtt_us: Option<u32>,
    /// Data segments received.
    pub data_segs_in: Option<u32>,
    /// Data segments sent.
    pub data_segs_out: Option<u32>,
    /// Delivery rate, bytes/s.
    pub delivery_rate: Option<u64>,
    /// µs busy sending.
    pub busy_time_us: Option<u64>,
    /// µs limited by the receive window.
    pub rwnd_limited_us: Option<u64>,
    /// µs limited by the send buffer.
    pub sndbuf_limited_us: Option<u64>,
    /// Segments delivered.
    pub delivered: Option<u32>,
    /// Segments delivered with CE.
    pub delivered_ce: Option<u32>,
    /// Bytes sent (including retransmits).
    pub bytes_sent: Option<u64>,
    /// Bytes retransmitted.
    pub bytes_retrans: Option<u64>,
    /// DSACKs received.
    pub dsack_dups: Option<u32>,
    /// Reordering events seen.
    pub reord_seen: Option<u32>,
    /// Out-of-order packets received.
    pub rcv_ooopack: Option<u32>,
    /// Peer's advertised receive window, bytes.
    pub snd_wnd: Option<u32>,
    /// Local advertised receive window, bytes.
    pub rcv_wnd: Option<u32>,
    /// Times the flow label was rehashed (after timeouts).
    pub rehash: Option<u32>,
    /// RTO timeouts over the socket's life (6.7+).
    pub total_rto: Option<u16>,
    /// RTO-triggered recoveries (6.7+).
    pub total_rto_recoveries: Option<u16>,
    /// ms spent in RTO recovery (6.7+).
    pub total_rto_time_ms: Option<u32>,
}

/// Why a `tcp_info` could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tcp_info of {len} bytes is shorter than the {TCP_INFO_BASE_LEN}-byte base struct")]
pub struct ShortTcpInfo {
    /// Bytes given.
    pub len: usize,
}

fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    b.get(off..off + 4)?.try_into().ok().map(u32::from_ne_bytes)
}
fn u16_at(b: &[u8], off: usize) -> Option<u16> {
    b.get(off..off + 2)?.try_into().ok().map(u16::from_ne_bytes)
}
fn u64_at(b: &[u8], off: usize) -> Option<u64> {
    b.get(off..off + 8)?.try_into().ok().map(u64::from_ne_bytes)
}

impl TcpInfo {
    /// Parse the bytes of an `INET_DIAG_INFO` attribute (or `getsockopt(TCP_INFO)`).
    pub fn parse(b: &[u8]) -> Result<TcpInfo, ShortTcpInfo> {
        if b.len() < TCP_INFO_BASE_LEN {
            return Err(ShortTcpInfo { len: b.len() });
        }
        let w = |off| u32_at(b, off).unwrap_or(0);
        Ok(TcpInfo {
            len: b.len(),
            state: b[0],
            ca_state: b[1],
            retransmits: b[2],
            probes: b[3],
            backoff: b[4],
            options: b[5],
            snd_wscale: b[6] & 0x0f,
            rcv_wscale: b[6] >> 4,
            rto_us: w(8),
            ato_us: w(12),
            snd_mss: w(16),
            rcv_mss: w(20),
            unacked: w(24),
            sacked: w(28),
            lost: w(32),
            retrans: w(36),
            last_data_sent_ms: w(44),
            last_ack_sent_ms: w(48),
            last_data_recv_ms: w(52),
            last_ack_recv_ms: w(56),
            pmtu: w(60),
            rcv_ssthresh: w(64),
            rtt_us: w(68),
            rttvar_us: w(72),
            snd_ssthresh: w(76),
            snd_cwnd: w(80),
            advmss: w(84),
            reordering: w(88),
            rcv_rtt_us: w(92),
            rcv_space: w(96),
            total_retrans: w(100),
            pacing_rate: u64_at(b, 104),
            bytes_acked: u64_at(b, 120),
            bytes_received: u64_at(b, 128),
            segs_out: u32_at(b, 136),
            segs_in: u32_at(b, 140),
            notsent_bytes: u32_at(b, 144),
            min_rtt_us: u32_at(b, 148),
            data_segs_in: u32_at(b, 152),
            data_segs_out: u32_at(b, 156),
            delivery_rate: u64_at(b, 160),
            busy_time_us: u64_at(b, 168),
            rwnd_limited_us: u64_at(b, 176),
            sndbuf_limited_us: u64_at(b, 184),
            delivered: u32_at(b, 192),
            delivered_ce: u32_at(b, 196),
            bytes_sent: u64_at(b, 200),
            bytes_retrans: u64_at(b, 208),
            dsack_dups: u32_at(b, 216),
            reord_seen: u32_at(b, 220),
            rcv_ooopack: u32_at(b, 224),
            snd_wnd: u32_at(b, 228),
            rcv_wnd: u32_at(b, 232),
            rehash: u32_at(b, 236),
            total_rto: u16_at(b, 240),
            total_rto_recoveries: u16_at(b, 242),
            total_rto_time_ms: u32_at(b, 244),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        b[0] = 1; // ESTABLISHED
        b[3] = 2; // probes
        b[6] = 0x97; // rcv_wscale 9, snd_wscale 7
        b[16..20].copy_from_slice(&1448u32.to_ne_bytes());
        b[100..104].copy_from_slice(&17u32.to_ne_bytes());
        if len >= 128 {
            b[120..128].copy_from_slice(&(1u64 << 60).to_ne_bytes());
        }
        if len >= 232 {
            b[228..232].copy_from_slice(&0u32.to_ne_bytes());
        }
        if len >= 248 {
            b[240..242].copy_from_slice(&5u16.to_ne_bytes());
        }
        b
    }

    #[test]
    fn short_struct_below_base_is_refused() {
        assert_eq!(TcpInfo::parse(&[0; 103]), Err(ShortTcpInfo { len: 103 }));
    }

    #[test]
    fn base_struct_leaves_newer_fields_none() {
        let t = TcpInfo::parse(&image(104)).unwrap();
        assert_eq!(t.total_retrans, 17);
        assert_eq!(t.snd_mss, 1448);
        assert_eq!((t.snd_wscale, t.rcv_wscale), (7, 9));
        assert_eq!(t.pacing_rate, None);
        assert_eq!(t.bytes_acked, None);
        assert_eq!(t.snd_wnd, None);
        assert_eq!(t.total_rto, None);
    }

    #[test]
    fn field_cut_in_the_middle_is_none() {
        // 124 bytes: bytes_acked (120..128) is cut, pacing_rate is whole.
        let t = TcpInfo::parse(&image(124)).unwrap();
        assert!(t.pacing_rate.is_some());
        assert_eq!(t.bytes_acked, None);
    }

    #[test]
    fn full_6_7_struct_reads_every_field() {
        let t = TcpInfo::parse(&image(248)).unwrap();
        assert_eq!(t.bytes_acked, Some(1 << 60));
        assert_eq!(t.snd_wnd, Some(0));
        assert_eq!(t.total_rto, Some(5));
        assert_eq!(t.probes, 2);
    }

    #[test]
    fn longer_future_struct_is_accepted() {
        let t = TcpInfo::parse(&image(300)).unwrap();
        assert_eq!(t.len, 300);
        assert_eq!(t.total_rto, Some(5));
    }
}
