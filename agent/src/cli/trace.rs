//! `pstackctl trace tcp`: TCP retransmits, resets and state changes, live,
//! from pstack's eBPF programs — the answer to "what is happening to this
//! stream right now". Optionally seals the window into an envelope.
//!
//! Invariants:
//! - The kernel filters by `--port` (either end); `--addr` is matched in user
//!   space. Both are recorded in the surfaces' facts and the universe selector.
//! - Nothing is silent: a lost event (ring buffer full) makes the surfaces
//!   `truncated`, the summary says how many were lost and the envelope is
//!   `bounded`; a session that cannot start exits non-zero with the typed
//!   reason (and `--seal` still writes an envelope whose surfaces carry it).
//! - Attribution is honest: the pid/comm printed with an event is the task on
//!   CPU when it fired (`on cpu`), which in softirq/timer context is not the
//!   socket's owner.
//!
//! Exit codes: 0 window captured; 2 usage or I/O error; 3 `unsupported` (no
//! BTF, tracepoint missing); 4 `permission_denied` (not root, no
//! CAP_BPF+CAP_PERFMON).

use std::io::Write;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use pstack_capture::request::{RequestError, TRACE_WINDOW, TcpTraceRequest};
use pstack_capture::tcp_trace::{self, TracePlan};
use pstack_ebpf::aggregate::TcpSurface;
use pstack_ebpf::{EbpfSession, TcpEvent, TcpEventKind, WindowReport};
use pstack_envelope::{Envelope, SurfaceStatus};

use crate::supervisor::clock::wall_time_now;

/// Exit code: the kernel cannot provide the surface.
pub const EXIT_UNSUPPORTED: i32 = 3;
/// Exit code: this process may not load eBPF.
pub const EXIT_PERMISSION_DENIED: i32 = 4;

/// Arguments of `pstackctl trace`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(Debug, clap::Subcommand)]
enum What {
    /// TCP retransmits, resets (with who sent them) and state changes, live.
    Tcp(TcpArgs),
}

/// Arguments of `pstackctl trace tcp`.
#[derive(Debug, clap::Args)]
pub struct TcpArgs {
    /// How long to watch (e.g. 500ms, 10s, 2m). Ctrl-C ends it early.
    #[arg(long, default_value = "10s", value_parser = parse_window)]
    window: Duration,
    /// Only flows with this port at either end (filtered in the kernel).
    #[arg(long)]
    port: Option<u16>,
    /// Only flows with this address at either end.
    #[arg(long)]
    addr: Option<IpAddr>,
    /// Print one JSON object per event, then the surfaces, instead of text.
    #[arg(long)]
    json: bool,
    /// Seal the window into an envelope written to this path.
    #[arg(long, value_name = "PATH")]
    seal: Option<PathBuf>,
    /// Ring buffer bytes (power of two). Larger absorbs longer bursts.
    #[arg(long, default_value_t = 256 * 1024)]
    ring_bytes: u32,
}

/// Parse a window: `500ms`, `10s`, `2m` (a unit is required; the one parser
/// of `pstack_cli::duration`); 1 ms ..= 1 h.
pub fn parse_window(s: &str) -> Result<Duration, String> {
    let d = pstack_cli::parse_duration(s).map_err(|e| e.to_string())?;
    if d < TRACE_WINDOW.0 || d > TRACE_WINDOW.1 {
        return Err(format!("{} is outside 1ms..=1h", s.trim()));
    }
    Ok(d)
}

impl TcpArgs {
    /// The request these arguments ask for.
    pub fn request(&self) -> TcpTraceRequest {
        TcpTraceRequest {
            window_ms: u64::try_from(self.window.as_millis()).unwrap_or(u64::MAX),
            port: self.port,
            addr: self.addr.map(|a| a.to_string()),
            ring_bytes: Some(self.ring_bytes),
        }
    }

    fn plan(&self) -> Result<TracePlan, RequestError> {
        self.request().plan()
    }
}

/// Parse an off-CPU window of `capture --pid/--tid --window` (the one parser
/// of `pstack_cli::duration`), within `request::PROCESS_WINDOW`.
pub fn parse_offcpu_window(s: &str) -> Result<Duration, String> {
    let d = pstack_cli::parse_duration(s).map_err(|e| e.to_string())?;
    let (lo, hi) = pstack_capture::request::PROCESS_WINDOW;
    if d < lo || d > hi {
        return Err(format!(
            "{} is outside {}..={}",
            s.trim(),
            pstack_cli::duration::format_duration(lo),
            pstack_cli::duration::format_duration(hi)
        ));
    }
    Ok(d)
}

/// Run `pstackctl trace`.
pub fn run(args: Args) -> anyhow::Result<i32> {
    match args.what {
        What::Tcp(a) => run_tcp(a),
    }
}

fn describe(e: &TcpEvent, start_ns: u64) -> String {
    let t = e.ts_ns.saturating_sub(start_ns) as f64 / 1e9;
    // The task on CPU when the event fired: in softirq/timer context it is
    // not the socket's owner, so the label says so.
    let who = if e.pid == 0 {
        "on cpu: softirq, no task".to_string()
    } else {
        format!("on cpu: pid {} {}", e.pid, e.comm)
    };
    match e.kind {
        TcpEventKind::Retransmit => {
            format!(
                "+{t:8.3}s retransmit  {} -> {}  state {}  ({who})",
                e.local, e.remote, e.state
            )
        }
        TcpEventKind::SendReset => format!(
            "+{t:8.3}s reset sent  {} -> {}  this host reset the stream{}{}  ({who})",
            e.local,
            e.remote,
            e.detail
                .map(|r| format!(", reason {}", pstack_ebpf::record::reset_reason_name(r)))
                .unwrap_or_default(),
            if e.has_sock { "" } else { ", no socket" },
        ),
        TcpEventKind::ReceiveReset => format!(
            "+{t:8.3}s reset recv  {} <- {}  the peer reset the stream in state {}  ({who})",
            e.local, e.remote, e.state
        ),
        TcpEventKind::StateChange => format!(
            "+{t:8.3}s state       {} -> {}  {} -> {}",
            e.local,
            e.remote,
            e.state,
            e.new_state.map(|s| s.name()).unwrap_or_default()
        ),
    }
}

fn run_tcp(a: TcpArgs) -> anyhow::Result<i32> {
    let plan = match a.plan() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("pstackctl trace tcp: {e}");
            return Ok(2);
        }
    };
    // Live output: wake the reader every tick even below the wakeup backlog.
    let cfg = plan.ebpf_config(true);
    let wall = wall_time_now();
    let t0 = crate::supervisor::clock::monotonic_ns();
    let mut session = match EbpfSession::start(cfg.clone()) {
        Ok(s) => s,
        Err(e) => {
            let status = e.status();
            eprintln!("pstackctl trace tcp: {status}: {e}");
            match status {
                SurfaceStatus::PermissionDenied => {
                    use crate::supervisor::denial;
                    eprintln!("  {}", denial::explain_bpf(&denial::Caller::current()))
                }
                SurfaceStatus::Unsupported => eprintln!(
                    "  this kernel cannot provide it (needs BTF and the tcp/sock tracepoints)"
                ),
                _ => {}
            }
            if let Some(path) = &a.seal {
                let env = tcp_trace::refused_envelope(&plan, &cfg, wall, t0, &e)?;
                write_envelope(path, &env)?;
            }
            return Ok(match status {
                SurfaceStatus::PermissionDenied => EXIT_PERMISSION_DENIED,
                SurfaceStatus::Unsupported => EXIT_UNSUPPORTED,
                _ => 2,
            });
        }
    };
    let stdout = std::io::stdout();
    if !a.json {
        eprintln!(
            "tracing TCP for {}{}{} (Ctrl-C to stop)",
            pstack_cli::duration::format_duration(a.window),
            a.port.map(|p| format!(", port {p}")).unwrap_or_default(),
            a.addr.map(|x| format!(", addr {x}")).unwrap_or_default()
        );
    }
    let start_ns = crate::supervisor::clock::monotonic_ns();
    let json = a.json;
    let mut write_err: Option<std::io::Error> = None;
    let stdout_gone = std::sync::atomic::AtomicBool::new(false);
    let progress = pstack_cli::progress::Progress::start("watching TCP", a.window);
    let on_event = |e: &TcpEvent| {
        if write_err.is_some() {
            return;
        }
        // The event line must not land after the countdown on a shared terminal.
        let _drawing = progress.clear_line();
        let mut out = stdout.lock();
        let r = if json {
            let meta = pstack_ebpf::WindowMeta {
                start_ns,
                end_ns: start_ns,
                window_ms: 0,
            };
            writeln!(out, "{}", pstack_ebpf::surface::event_json(e, &meta))
        } else {
            writeln!(out, "{}", describe(e, start_ns))
        };
        if let Err(err) = r.and_then(|_| out.flush()) {
            stdout_gone.store(true, std::sync::atomic::Ordering::Relaxed);
            write_err = Some(err);
        }
    };
    // Ctrl-C, or stdout's reader going away, ends the window early.
    let stop = async {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async {
                while !stdout_gone.load(std::sync::atomic::Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            } => {}
        }
    };
    let report = session
        .run_window_blocking_until(a.window, on_event, stop)
        .context("reading the eBPF ring buffer")?;
    progress.finish();
    let surfaces = report.surfaces();
    // A closed stdout ends the printing, not the sealing: the envelope is
    // still written, then the pipe error ends the command (quietly).
    let stdout_result = if write_err.is_some() {
        Ok(())
    } else if json {
        pstack_cli::outln!(
            "{}",
            serde_json::to_string(&surfaces).context("encoding surfaces")?
        )
    } else {
        print_summary(&report)
    };
    if let Some(path) = &a.seal {
        let env = tcp_trace::envelope(
            &plan,
            &cfg,
            wall,
            report.meta.start_ns,
            report.meta.end_ns,
            surfaces,
            Some(&report),
        )?;
        write_envelope(path, &env)?;
        eprintln!(
            "sealed {} ({}) -> {}",
            env.digest,
            env.completeness.as_str(),
            path.display()
        );
    }
    if let Some(e) = write_err {
        return Err(e.into());
    }
    stdout_result?;
    Ok(0)
}

fn print_summary(r: &WindowReport) -> std::io::Result<()> {
    let Some(agg) = &r.tcp else { return Ok(()) };
    let lost: u64 = r.tcp_ctx.lost.iter().sum();
    let seconds = r.meta.end_ns.saturating_sub(r.meta.start_ns) as f64 / 1e9;
    for line in summary_lines(agg, seconds, lost) {
        pstack_cli::outln!("{line}")?;
    }
    Ok(())
}

/// Per-flow lines listed under each total before `... and N more`.
const SUMMARY_FLOWS: usize = 20;

/// The end-of-window summary. Every total is followed by the lines that make
/// it up, each with its own count, and a remainder line for what is not
/// listed (flows past the list, or past the flow cap): the lines of a
/// section always add up to its total.
pub fn summary_lines(agg: &pstack_ebpf::TcpAggregate, seconds: f64, lost: u64) -> Vec<String> {
    let mut out = Vec::new();
    let retransmits = agg.seen(TcpEventKind::Retransmit);
    let sent = agg.seen(TcpEventKind::SendReset);
    let received = agg.seen(TcpEventKind::ReceiveReset);
    out.push(format!(
        "-- {retransmits} retransmits, {sent} resets sent, {received} resets received, {} state changes in {seconds:.1}s{}",
        agg.seen(TcpEventKind::StateChange),
        if lost > 0 {
            format!("; {lost} EVENTS LOST (ring buffer full): counts are a lower bound")
        } else {
            String::new()
        }
    ));
    let rest = |out: &mut Vec<String>, what: &str, flows: usize, events: u64| {
        if events > 0 {
            out.push(format!(
                "   ... {events} more {what} on {}",
                if flows > 0 {
                    format!("{flows} more flow(s) (see --json or --seal)")
                } else {
                    format!("flows past the {}-flow cap", agg.limits().max_flows)
                }
            ));
        }
    };
    let with_retransmits: Vec<_> = agg.flows().iter().filter(|f| f.retransmits > 0).collect();
    let mut listed = 0;
    for f in with_retransmits.iter().take(SUMMARY_FLOWS) {
        listed += f.retransmits;
        out.push(format!(
            "   retransmits {:>5}  {} -> {}",
            f.retransmits, f.local, f.remote
        ));
    }
    rest(
        &mut out,
        "retransmits",
        with_retransmits.len().saturating_sub(SUMMARY_FLOWS),
        retransmits.saturating_sub(listed),
    );
    let with_resets: Vec<_> = agg
        .flows()
        .iter()
        .filter(|f| f.feeds(TcpSurface::Resets))
        .collect();
    let mut listed = 0;
    for f in with_resets.iter().take(SUMMARY_FLOWS) {
        listed += f.resets_sent + f.resets_received;
        let who = match (f.resets_sent > 0, f.resets_received > 0) {
            (true, false) => "this host reset the peer",
            (false, true) => "the peer reset this host",
            _ => "both ends reset",
        };
        out.push(format!(
            "   resets      sent {:>3} received {:>3}  {} <-> {}  ({who})",
            f.resets_sent, f.resets_received, f.local, f.remote
        ));
    }
    rest(
        &mut out,
        "resets",
        with_resets.len().saturating_sub(SUMMARY_FLOWS),
        (sent + received).saturating_sub(listed),
    );
    out
}

fn write_envelope(path: &std::path::Path, env: &Envelope) -> anyhow::Result<()> {
    pstack_capture::envelope_file::write(path, &env.to_json_pretty())
        .with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pstack_ebpf::record::{Comm, Endpoint, TcpState};
    use pstack_envelope::Completeness;

    fn event(kind: TcpEventKind, sk_key: u64, local: u16, remote: u16, pid: u32) -> TcpEvent {
        let ep = |port| Endpoint {
            addr: "127.0.0.1".parse().expect("addr"),
            port,
        };
        let mut comm = [0u8; 16];
        comm[..7].copy_from_slice(b"python3");
        TcpEvent {
            ts_ns: 1_000_000_000,
            kind,
            sock_cookie: Some(sk_key),
            netns_cookie: None,
            netns_ino: Some(1),
            local: ep(local),
            remote: ep(remote),
            family: 2,
            state: TcpState(1),
            new_state: None,
            detail: None,
            layout: 0,
            has_sock: true,
            pid,
            comm: Comm(comm),
            sk_key,
        }
    }

    /// Issue 19: `(on cpu 26260 python3)` did not say 26260 was a pid, and
    /// the summary said "4 resets sent, 4 received" above five lines. Each
    /// section's lines now carry counts that add up to its total, past the
    /// listed flows and the flow cap too.
    #[test]
    fn lines_are_labelled_and_add_up_to_the_totals() {
        let line = describe(&event(TcpEventKind::Retransmit, 1, 5000, 40000, 26260), 0);
        assert!(line.contains("(on cpu: pid 26260 python3)"), "{line}");
        let softirq = describe(&event(TcpEventKind::Retransmit, 1, 5000, 40000, 0), 0);
        assert!(softirq.contains("softirq"), "{softirq}");

        let limits = pstack_ebpf::Limits {
            max_flows: 3,
            ..pstack_ebpf::Limits::default()
        };
        let mut agg = pstack_ebpf::TcpAggregate::new(limits, None);
        // Loopback: each RST is sent by one socket and received by its peer.
        for i in 0..4u16 {
            agg.add(&event(
                TcpEventKind::SendReset,
                10 + u64::from(i),
                6000 + i,
                7000,
                1,
            ));
            agg.add(&event(
                TcpEventKind::ReceiveReset,
                20 + u64::from(i),
                7000,
                6000 + i,
                1,
            ));
        }
        agg.add(&event(TcpEventKind::Retransmit, 10, 6000, 7000, 1));
        let lines = summary_lines(&agg, 1.0, 0);
        assert!(
            lines[0].starts_with("-- 1 retransmits, 4 resets sent, 4 resets received"),
            "{lines:?}"
        );
        let count = |prefix: &str, pick: &dyn Fn(&str) -> u64| -> u64 {
            lines
                .iter()
                .filter(|l| l.trim_start().starts_with(prefix))
                .map(|l| pick(l))
                .sum()
        };
        let num_after = |l: &str, word: &str| -> u64 {
            let mut it = l.split_whitespace();
            while let Some(w) = it.next() {
                if w == word {
                    return it.next().and_then(|n| n.parse().ok()).unwrap_or(0);
                }
            }
            0
        };
        let reset_lines = count("resets", &|l| {
            num_after(l, "sent") + num_after(l, "received")
        });
        let reset_rest = count("... ", &|l| {
            if l.contains("more resets") {
                num_after(l, "...")
            } else {
                0
            }
        });
        assert_eq!(reset_lines + reset_rest, 8, "{lines:#?}");
        assert!(
            reset_rest > 0,
            "the 3-flow cap leaves some unlisted: {lines:#?}"
        );
        let retransmit_lines = count("retransmits", &|l| num_after(l, "retransmits"));
        assert_eq!(retransmit_lines, 1, "{lines:#?}");
    }

    /// Root + kernel: `trace tcp --port P --seal F` over a real loopback linger-0 close
    /// seals a valid envelope whose resets surface names the closing client.
    #[test]
    fn trace_tcp_as_root_seals_a_valid_envelope_naming_the_reset_sender() {
        pstack_testkit::require!(pstack_testkit::is_root(), "needs root to load eBPF");
        pstack_testkit::require!(
            std::path::Path::new("/sys/kernel/btf/vmlinux").exists(),
            "kernel BTF (/sys/kernel/btf/vmlinux) is missing: CONFIG_DEBUG_INFO_BTF=y is required"
        );
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let server = l.local_addr().expect("addr");
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("trace.json");
        // Attaching the programs takes a variable time (hundreds of ms on a loaded
        // machine): a single reset sent at a fixed delay can land before the programs
        // see anything. Reset one fresh connection every 100 ms for the whole window
        // instead, and expect the envelope to name one of those senders.
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop_traffic = stop.clone();
        let traffic = std::thread::spawn(move || {
            let mut clients = Vec::new();
            while !stop_traffic.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(100));
                let c = std::net::TcpStream::connect(server).expect("connect");
                clients.push(c.local_addr().expect("local").to_string());
                let (s, _) = l.accept().expect("accept");
                use std::os::fd::AsFd;
                nix::sys::socket::setsockopt(
                    &c.as_fd(),
                    nix::sys::socket::sockopt::Linger,
                    &libc::linger {
                        l_onoff: 1,
                        l_linger: 0,
                    },
                )
                .expect("linger");
                drop(c);
                drop(s);
            }
            clients
        });
        let code = run_tcp(TcpArgs {
            window: Duration::from_millis(2500),
            port: Some(server.port()),
            addr: None,
            json: true,
            seal: Some(path.clone()),
            ring_bytes: 64 * 1024,
        })
        .expect("trace");
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let clients = traffic.join().expect("traffic");
        assert_eq!(code, 0);
        let bytes = std::fs::read(&path).expect("sealed envelope written");
        let env = pstack_envelope::verify(&bytes).expect("the sealed trace verifies");
        assert_eq!(env.completeness, Completeness::Complete);
        let resets = env
            .surfaces
            .iter()
            .find(|s| s.id == "ebpf:tcp_resets")
            .expect("resets surface");
        let sample = resets.facts["sample"].as_array().expect("sample");
        assert!(
            sample.iter().any(|e| e["direction"] == "sent"
                && e["rst_sender"]
                    .as_str()
                    .is_some_and(|a| clients.iter().any(|c| c == a))),
            "no reset sent by one of {clients:?}: {sample:?}"
        );
        assert!(env.claims.iter().any(|c| c.code == "tcp_reset_sender"
            && clients.iter().any(|a| c.statement.contains(a.as_str()))));
    }

    #[test]
    fn windows_parse_with_units_and_refuse_nonsense() {
        assert_eq!(parse_window("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_window("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_window("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_window("7").is_err(), "a bare number has no unit");
        assert!(parse_window("0s").is_err());
        assert!(parse_window("2h").is_err());
        assert!(parse_window("-1s").is_err());
        assert!(parse_window("99999m").is_err());
        assert!(parse_window("").is_err());
    }
}
