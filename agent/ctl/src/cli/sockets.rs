//! `pstackctl sockets`: every TCP socket of a network namespace with its
//! `tcp_info`, as a table an operator reads (one line a socket, like
//! `ss -tin`), or as JSON lines with `--json`.
//!
//! It is the transport engine's own reader (`pstack_collectors::net::sockdiag::dump_tcp`,
//! unchanged) run once, in this process, with no window and no envelope: the
//! quick look before a `capture transport`. Nothing is sealed, spooled or
//! shipped. The kernel's dump is never narrowed; `--peer`/`--port`/`--all`
//! filter the parsed sockets here, as the engine's `FlowFilter` does.
//!
//! Why a table by default: at 10,000 sockets the JSON lines are ~13 MB
//! (every `tcp_info` field, named), three times what `ss -tin` prints, and
//! writing them cost more than the read (BENCHMARKS.md, issue 31 item 3).

use std::io::{self, BufWriter, Write};
use std::net::{IpAddr, SocketAddr};

use pstack_capture::transport::parse_endpoint;

use pstack_collectors::net::netns::{NetnsTarget, run_in};
use pstack_collectors::net::sockdiag::{TcpSocket, dump_tcp_each, normalize, state_name};

/// TCP state number of a listening socket.
const LISTEN: u8 = 10;

/// `pstackctl sockets --help`: what the command is, its columns, examples.
pub const LONG_ABOUT: &str = "\
List TCP sockets with their tcp_info, like `ss -tin`: the transport engine's reader run once \
here, with no window and nothing sealed (use `capture transport` for evidence).

Columns: State, Recv-Q and Send-Q (bytes), Local and Peer, then from tcp_info: rtt/rttvar (ms), \
cwnd (segments), mss, retrans (total retransmitted segments), lost, unacked, \
acked/received (bytes), and the pending timer. A value the kernel did not send is `-`.

Examples:
  pstackctl sockets                              connected sockets of this namespace
  pstackctl sockets --peer 10.0.0.7:10001        one peer (ADDR or ADDR:PORT)
  pstackctl sockets --netns-pid 4242 --port 10001   inside Longhorn's instance-manager
  pstackctl sockets --json | jq .info.rtt_us     every field, one JSON object a line";

/// Arguments of `pstackctl sockets`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Only sockets whose remote end is ADDR or ADDR:PORT (IPv6 with a port in brackets).
    #[arg(long, value_name = "ADDR[:PORT]", value_parser = parse_peer)]
    pub peer: Option<Peer>,
    /// Only sockets with this local or remote port.
    #[arg(long, value_name = "PORT")]
    pub port: Option<u16>,
    /// Also list listening sockets (by default, like `ss -t`, only the others).
    #[arg(long)]
    pub all: bool,
    /// Read the network namespace of this process (needs CAP_SYS_ADMIN).
    #[arg(long, value_name = "PID", conflicts_with = "netns")]
    pub netns_pid: Option<u32>,
    /// Read this named network namespace (/run/netns/NAME; needs CAP_SYS_ADMIN).
    #[arg(long, value_name = "NAME")]
    pub netns: Option<String>,
    /// One JSON object a socket (every parsed field) instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// `--peer`: an address, with a port when one is pinned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    /// Remote address (IPv4-mapped IPv6 read as IPv4, as the reader reports it).
    pub ip: IpAddr,
    /// Remote port, when pinned.
    pub port: Option<u16>,
}

/// Parse `ADDR` or `ADDR:PORT` (`[V6]:PORT`) with the transport engine's
/// endpoint grammar, so `--peer` means the same here as in `capture transport`.
pub fn parse_peer(s: &str) -> Result<Peer, String> {
    let (ip, port) = parse_endpoint("peer", s).map_err(|e| e.to_string())?;
    Ok(Peer {
        ip: normalize(ip),
        port,
    })
}

impl Args {
    /// Whether the parsed socket `s` is one the operator asked for.
    pub fn keeps(&self, s: &TcpSocket) -> bool {
        if s.state == LISTEN && !self.all {
            return false;
        }
        let peer_ok = self.peer.is_none_or(|p| {
            s.remote.ip() == p.ip && p.port.is_none_or(|port| port == s.remote.port())
        });
        let port_ok = self
            .port
            .is_none_or(|port| s.local.port() == port || s.remote.port() == port);
        peer_ok && port_ok
    }

    fn target(&self) -> NetnsTarget {
        match (&self.netns, self.netns_pid) {
            (Some(name), _) => NetnsTarget::Named(name.clone()),
            (None, Some(pid)) => NetnsTarget::Pid(pid),
            (None, None) => NetnsTarget::Current,
        }
    }
}

/// Sockets handed from the reader to the writer at a time.
const BATCH: usize = 256;

/// Run `pstackctl sockets`.
///
/// Two threads: the reader enters the namespace, dumps and parses, and hands
/// batches of kept sockets over a bounded channel; this thread formats and
/// writes them. The kernel's dump (most of the time) and the formatting
/// overlap on two cores, and nothing is collected first.
pub fn run(args: Args) -> anyhow::Result<i32> {
    let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<TcpSocket>>(8);
    let keep = args.clone();
    let target = args.target();
    let reader = std::thread::Builder::new()
        .name("pstack-sockets".into())
        .spawn(move || {
            run_in(&target, move || {
                let mut batch = Vec::with_capacity(BATCH);
                let mut writer_gone = false;
                let raw = dump_tcp_each(&mut |s| {
                    if writer_gone || !keep.keeps(&s) {
                        return;
                    }
                    batch.push(s);
                    if batch.len() == BATCH {
                        let full = std::mem::replace(&mut batch, Vec::with_capacity(BATCH));
                        writer_gone = tx.send(full).is_err();
                    }
                });
                if !batch.is_empty() && !writer_gone {
                    let _ = tx.send(batch);
                }
                raw.map(|_| ())
            })
        })?;
    let written = write_rows(&rx, args.json);
    // Unblock the reader if the writer stopped early (a closed pipe).
    drop(rx);
    let read = reader
        .join()
        .map_err(|_| anyhow::anyhow!("the socket reader thread panicked"))?;
    match (read, written) {
        (Err(e), _) => {
            eprintln!("pstackctl sockets: {e}");
            Ok(2)
        }
        (Ok((Err(e), _)), _) => {
            eprintln!("pstackctl sockets: sock_diag dump: {e}");
            Ok(2)
        }
        // A closed pipe (`| head`) is the reader's choice, not an error.
        (Ok((Ok(()), _)), Err(e)) if e.kind() == io::ErrorKind::BrokenPipe => Ok(0),
        (Ok((Ok(()), _)), Err(e)) => Err(e.into()),
        (Ok((Ok(()), _ino)), Ok(())) => Ok(0),
    }
}

/// Write every batch the reader sends: the table (header first) or JSON lines.
fn write_rows(rx: &std::sync::mpsc::Receiver<Vec<TcpSocket>>, json: bool) -> io::Result<()> {
    let stdout = io::stdout();
    let mut out = BufWriter::with_capacity(1 << 16, stdout.lock());
    let mut line = String::with_capacity(256);
    if !json {
        out.write_all(HEADER.as_bytes())?;
        out.write_all(b"\n")?;
    }
    for batch in rx {
        for s in &batch {
            line.clear();
            if json {
                line.push_str(&serde_json::to_string(s).map_err(io::Error::other)?);
            } else {
                row(&mut line, s);
            }
            line.push('\n');
            out.write_all(line.as_bytes())?;
        }
    }
    out.flush()
}

/// The header line of the table.
pub const HEADER: &str = "State        Recv-Q  Send-Q  Local                         Peer                          rtt/var(ms)      cwnd   mss  retrans  lost  unacked       acked    received  timer";

/// One socket's line (no newline). Cells are padded by hand with `itoa`
/// rather than `format!`: at 10,000 sockets the formatting machinery was a
/// fifth of the command's time (BENCHMARKS.md, issue 31 item 3); a test
/// holds it to the `format!` layout byte for byte.
pub fn row(line: &mut String, s: &TcpSocket) {
    left(line, state_name(s.state), 12);
    line.push(' ');
    right_num(line, u64::from(s.rqueue), 6);
    line.push_str("  ");
    right_num(line, u64::from(s.wqueue), 6);
    line.push_str("  ");
    addr(line, s.local, 29);
    line.push(' ');
    addr(line, s.remote, 29);
    line.push(' ');
    match &s.info {
        Some(i) => {
            let start = line.len();
            millis(line, i.rtt_us);
            line.push('/');
            millis(line, i.rttvar_us);
            pad(line, 15usize.saturating_sub(line.len() - start));
            for (v, w) in [
                (i.snd_cwnd, 6),
                (i.snd_mss, 5),
                (i.total_retrans, 8),
                (i.lost, 5),
                (i.unacked, 8),
            ] {
                line.push(' ');
                right_num(line, u64::from(v), w);
            }
            for v in [i.bytes_acked, i.bytes_received] {
                line.push(' ');
                match v {
                    Some(v) => right_num(line, v, 11),
                    None => right(line, "-", 11),
                }
            }
        }
        None => {
            left(line, "-", 15);
            for w in [6, 5, 8, 5, 8, 11, 11] {
                line.push(' ');
                right(line, "-", w);
            }
        }
    }
    line.push_str("  ");
    line.push_str(timer_name(s));
}

/// A number right-aligned in `width`.
fn right_num(line: &mut String, v: u64, width: usize) {
    right(line, itoa::Buffer::new().format(v), width);
}

fn pad(line: &mut String, n: usize) {
    line.extend(std::iter::repeat_n(' ', n));
}

fn left(line: &mut String, cell: &str, width: usize) {
    line.push_str(cell);
    pad(line, width.saturating_sub(cell.chars().count()));
}

fn right(line: &mut String, cell: &str, width: usize) {
    pad(line, width.saturating_sub(cell.chars().count()));
    line.push_str(cell);
}

/// `ms.mmm` of a microsecond count.
fn millis(line: &mut String, us: u32) {
    let mut b = itoa::Buffer::new();
    line.push_str(b.format(us / 1000));
    line.push('.');
    let frac = us % 1000;
    if frac < 100 {
        line.push('0');
    }
    if frac < 10 {
        line.push('0');
    }
    line.push_str(b.format(frac));
}

/// An endpoint left-aligned in `width`: IPv4 by hand, IPv6 by `Display`.
fn addr(line: &mut String, a: SocketAddr, width: usize) {
    let start = line.len();
    match a {
        SocketAddr::V4(v4) => {
            let mut b = itoa::Buffer::new();
            for (n, octet) in v4.ip().octets().into_iter().enumerate() {
                if n > 0 {
                    line.push('.');
                }
                line.push_str(b.format(octet));
            }
            line.push(':');
            line.push_str(b.format(v4.port()));
        }
        SocketAddr::V6(_) => {
            use std::fmt::Write as _;
            // Formatting into a String cannot fail.
            let _ = write!(line, "{a}");
        }
    }
    pad(line, width.saturating_sub(line.len() - start));
}

fn timer_name(s: &TcpSocket) -> &'static str {
    use pstack_collectors::net::sockdiag::SocketTimer;
    match s.timer {
        SocketTimer::None => "-",
        SocketTimer::Retransmit => "retransmit",
        SocketTimer::Keepalive => "keepalive",
        SocketTimer::TimeWait => "time_wait",
        SocketTimer::ZeroWindowProbe => "zero_window_probe",
        SocketTimer::Other(_) => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pstack_collectors::net::sockdiag::SocketTimer;
    use pstack_collectors::net::tcpinfo::TcpInfo;

    /// The layout written with `format!`: what `row` must print byte for byte.
    fn reference(s: &TcpSocket) -> String {
        let opt = |v: Option<u64>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
        let mut line = format!(
            "{:<12} {:>6}  {:>6}  {:<29} {:<29} ",
            state_name(s.state),
            s.rqueue,
            s.wqueue,
            s.local.to_string(),
            s.remote.to_string()
        );
        match &s.info {
            Some(i) => {
                let rtt = format!(
                    "{}.{:03}/{}.{:03}",
                    i.rtt_us / 1000,
                    i.rtt_us % 1000,
                    i.rttvar_us / 1000,
                    i.rttvar_us % 1000
                );
                line += &format!(
                    "{rtt:<15} {:>6} {:>5} {:>8} {:>5} {:>8} {:>11} {:>11}",
                    i.snd_cwnd,
                    i.snd_mss,
                    i.total_retrans,
                    i.lost,
                    i.unacked,
                    opt(i.bytes_acked),
                    opt(i.bytes_received)
                );
            }
            None => {
                line += &format!(
                    "{:<15} {:>6} {:>5} {:>8} {:>5} {:>8} {:>11} {:>11}",
                    "-", "-", "-", "-", "-", "-", "-", "-"
                );
            }
        }
        line + "  " + timer_name(s)
    }

    #[test]
    fn rows_are_the_format_layout_byte_for_byte() {
        let info = |rtt_us: u32, rttvar_us: u32, big: bool| TcpInfo {
            rtt_us,
            rttvar_us,
            snd_cwnd: if big { 4_000_000_000 } else { 10 },
            snd_mss: 65_483,
            total_retrans: if big { 123_456_789 } else { 0 },
            lost: 3,
            unacked: 7,
            bytes_acked: big.then_some(u64::MAX),
            bytes_received: Some(0),
            ..TcpInfo::default()
        };
        let sock = |local: &str, remote: &str, state: u8, info: Option<TcpInfo>, timer| TcpSocket {
            local: local.parse().unwrap(),
            remote: remote.parse().unwrap(),
            state,
            cookie: 1,
            inode: 2,
            uid: 0,
            bound_if: 0,
            timer,
            timer_expires_ms: 0,
            timer_retrans: 0,
            rqueue: 0,
            wqueue: u32::MAX,
            info,
            mem: None,
            congestion: None,
            shutdown: None,
        };
        let cases = [
            sock(
                "127.0.0.1:10001",
                "127.0.0.1:54321",
                1,
                Some(info(0, 0, false)),
                SocketTimer::None,
            ),
            sock(
                "10.200.30.4:65535",
                "255.255.255.255:1",
                1,
                Some(info(1_234_567, 9, true)),
                SocketTimer::Retransmit,
            ),
            sock("0.0.0.0:22", "0.0.0.0:0", 10, None, SocketTimer::Other(9)),
            sock(
                "[fd00::2]:10001",
                "[fe80::1:2:3:4]:443",
                8,
                Some(info(1_000, 999, false)),
                SocketTimer::ZeroWindowProbe,
            ),
            sock(
                "[2001:db8:aaaa:bbbb:cccc:dddd:eeee:ffff]:65535",
                "[::1]:1",
                6,
                Some(info(u32::MAX, 100, true)),
                SocketTimer::TimeWait,
            ),
        ];
        for s in &cases {
            let mut line = String::new();
            row(&mut line, s);
            assert_eq!(line, reference(s), "{s:?}");
        }
    }

    #[test]
    fn peer_parses_address_with_and_without_port() {
        let cases: &[(&str, Option<Peer>)] = &[
            (
                "10.0.0.7",
                Some(Peer {
                    ip: "10.0.0.7".parse().unwrap(),
                    port: None,
                }),
            ),
            (
                "10.0.0.7:10001",
                Some(Peer {
                    ip: "10.0.0.7".parse().unwrap(),
                    port: Some(10001),
                }),
            ),
            (
                "[fd00::2]:10001",
                Some(Peer {
                    ip: "fd00::2".parse().unwrap(),
                    port: Some(10001),
                }),
            ),
            (
                "fd00::2",
                Some(Peer {
                    ip: "fd00::2".parse().unwrap(),
                    port: None,
                }),
            ),
            ("10.0.0.7:99999", None),
            ("10.0.0.7:0", None),
            (
                "::ffff:10.0.0.7",
                Some(Peer {
                    ip: "10.0.0.7".parse().unwrap(),
                    port: None,
                }),
            ),
            ("host.example", None),
            ("", None),
        ];
        for (input, want) in cases {
            assert_eq!(parse_peer(input).ok(), *want, "{input:?}");
        }
    }
}
