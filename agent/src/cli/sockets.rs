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

use pstack_collectors::net::netns::{NetnsTarget, run_in};
use pstack_collectors::net::sockdiag::{TcpSocket, dump_tcp, state_name};

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
    /// Remote address.
    pub ip: IpAddr,
    /// Remote port, when pinned.
    pub port: Option<u16>,
}

/// Parse `ADDR` or `ADDR:PORT` (`[V6]:PORT`).
pub fn parse_peer(s: &str) -> Result<Peer, String> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(Peer {
            ip: a.ip(),
            port: Some(a.port()),
        });
    }
    s.trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
        .map(|ip| Peer { ip, port: None })
        .map_err(|_| format!("{s:?} is not ADDR or ADDR:PORT (IPv6 with a port: [fd00::2]:10001)"))
}

impl Args {
    /// Whether the parsed socket `s` is one the operator asked for.
    pub fn keeps(&self, s: &TcpSocket) -> bool {
        if s.state == LISTEN && !self.all {
            return false;
        }
        if let Some(p) = self.peer {
            if s.remote.ip() != p.ip || p.port.is_some_and(|port| port != s.remote.port()) {
                return false;
            }
        }
        if let Some(port) = self.port {
            if s.local.port() != port && s.remote.port() != port {
                return false;
            }
        }
        true
    }

    fn target(&self) -> NetnsTarget {
        match (&self.netns, self.netns_pid) {
            (Some(name), _) => NetnsTarget::Named(name.clone()),
            (None, Some(pid)) => NetnsTarget::Pid(pid),
            (None, None) => NetnsTarget::Current,
        }
    }
}

/// Run `pstackctl sockets`.
pub fn run(args: Args) -> anyhow::Result<i32> {
    let keep = args.clone();
    let dump = match run_in(&args.target(), move || dump_tcp(&|s| keep.keeps(s))) {
        Ok((Ok(dump), _ino)) => dump,
        Ok((Err(e), _)) => {
            eprintln!("pstackctl sockets: sock_diag dump: {e}");
            return Ok(2);
        }
        Err(e) => {
            eprintln!("pstackctl sockets: {e}");
            return Ok(2);
        }
    };
    let stdout = io::stdout();
    let mut out = BufWriter::with_capacity(1 << 16, stdout.lock());
    if args.json {
        for s in &dump.sockets {
            serde_json::to_writer(&mut out, s)?;
            out.write_all(b"\n")?;
        }
    } else {
        write_table(&mut out, &dump.sockets)?;
    }
    out.flush()?;
    Ok(0)
}

/// The header line of the table.
pub const HEADER: &str = "State        Recv-Q  Send-Q  Local                         Peer                          rtt/var(ms)      cwnd   mss  retrans  lost  unacked       acked    received  timer";

/// Write the table: a header, then one line a socket.
pub fn write_table(out: &mut dyn Write, sockets: &[TcpSocket]) -> io::Result<()> {
    writeln!(out, "{HEADER}")?;
    let mut line = String::with_capacity(256);
    for s in sockets {
        line.clear();
        row(&mut line, s);
        line.push('\n');
        out.write_all(line.as_bytes())?;
    }
    Ok(())
}

/// One socket's line (no newline).
pub fn row(line: &mut String, s: &TcpSocket) {
    use std::fmt::Write as _;
    // Formatting into a String cannot fail.
    let _ = write!(
        line,
        "{:<12} {:>6}  {:>6}  {:<29} {:<29} ",
        state_name(s.state),
        s.rqueue,
        s.wqueue,
        s.local,
        s.remote
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
            let _ = write!(
                line,
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
            let _ = write!(
                line,
                "{:<15} {:>6} {:>5} {:>8} {:>5} {:>8} {:>11} {:>11}",
                "-", "-", "-", "-", "-", "-", "-", "-"
            );
        }
    }
    let _ = write!(line, "  {}", timer_name(s));
}

fn opt(v: Option<u64>) -> String {
    v.map_or_else(|| "-".to_string(), |v| v.to_string())
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
            ("host.example", None),
            ("", None),
        ];
        for (input, want) in cases {
            assert_eq!(parse_peer(input).ok(), *want, "{input:?}");
        }
    }
}
