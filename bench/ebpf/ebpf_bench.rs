//! pstack-ebpf benchmarks, side by side in one run (root; needs bpftrace, bpftool, ip, nft).
//!
//! `cargo run --release -p pstack-ebpf --example ebpf_bench -- run`
//!
//! 1. Per-event CPU: pstack's TCP programs and a bpftrace script counting the
//!    same four tracepoints (`@[probe] = count()`) are attached at the same time
//!    while a flood runs in a private network namespace: short connections
//!    (state changes, resets) plus a stream through an nftables input-hook drop
//!    rule (retransmits). Kernel time per program comes from
//!    `kernel.bpf_stats_enabled` (`bpftool prog show`: run_time_ns / run_cnt);
//!    user-space time is each consumer process's utime+stime. Per event =
//!    (kernel + user) / events seen.
//! 2. Throughput: `blast` (a loopback iperf-like: one TCP stream, 128 KiB
//!    writes, for N s) alternately without pstack and with pstack attached
//!    (TCP programs; TCP + off-CPU watching the blaster), medians of 5 runs.
//!
//! 3. `cost [ROUNDS]`: pstack's TCP settings one after the other on the same
//!    flood (no bpftrace): count-only, a recording window (aggregated, and
//!    per-event), the flight recorder watching every port; kernel and
//!    consumer ns per event and each program's ns/run, ROUNDS times over.
//!
//! 4. `peers`: every mode of pstack's TCP programs and the tools a user would
//!    otherwise run, all attached at once to one flood: pstack aggregated
//!    (the recording mode), per-event (debug) and count-only; bpftrace
//!    counting, bpftrace's own `tcpretrans.bt` and `tcplife.bt` and a short
//!    tcpstates-like script (each prints every event); bcc's `tcpstates` and
//!    `tcplife` (libbpf-tools, CO-RE) and bcc's Python `tcpretrans-bpfcc`
//!    (reported as unavailable when it cannot compile on this kernel). Each
//!    tool's programs are told apart by the BPF program ids that appeared
//!    when it attached; kernel ns/event = their run_time_ns / run_cnt, consumer
//!    ns/event = the tool's process CPU over the flood / its run_cnt. Printing
//!    tools write to /dev/null.
//!
//! `PSTACK_BENCH_RING_MIB=N` gives the recording-window consumers an N MiB
//! ring (default 256 KiB, which a 10,000-connection flood overruns on a
//! loaded 2-vCPU machine: lost records are cheap, so compare at lost = 0).
//!
//! Subcommands used internally: `consumer SECS [offcpu-pid]`, `flight SECS`, `blast SECS`, `flood CONNS`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use pstack_ebpf::{EbpfConfig, EbpfSession, TcpEventKind};

/// On-CPU ns of every thread of `pid` (schedstat: ns-precise, unlike utime/stime ticks).
fn cpu_ns(pid: u32) -> u64 {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    dir.filter_map(Result::ok)
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| {
            s.split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
        })
        .sum()
}

/// Start a session and tell the parent (`wait_line(.., "READY")`) it is attached.
fn start_ready(cfg: EbpfConfig) -> EbpfSession {
    let s = EbpfSession::start(cfg).expect("start pstack session");
    println!("READY");
    std::io::stdout().flush().ok();
    s
}

/// A session's window of `secs`, then its kernel counts and this process's CPU.
/// `PSTACK_BENCH_RING_MIB` sets the ring size (a ring too small for the flood
/// loses records, and a lost record costs the kernel almost nothing: compare
/// modes at equal completeness).
fn window_result(mut cfg: EbpfConfig, secs: u64) -> (pstack_ebpf::WindowReport, u64) {
    if let Some(mib) = std::env::var("PSTACK_BENCH_RING_MIB")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
    {
        cfg.ring_bytes = mib << 20;
    }
    let mut s = start_ready(cfg);
    let r = s
        .run_window_blocking(Duration::from_secs(secs), |_| {})
        .expect("window");
    (r, cpu_ns(std::process::id()))
}

/// pstackd's setting: the TCP programs count in the kernel and write no
/// record; like pstackd, the consumer only reads the counters once a second.
fn consumer_count(secs: u64) {
    let mut cfg = EbpfConfig::tcp();
    cfg.tcp_count_only = true;
    let s = start_ready(cfg);
    let mut st = s.status().expect("status");
    for _ in 0..secs {
        std::thread::sleep(Duration::from_secs(1));
        st = s.status().expect("status");
    }
    let events: u64 = st.tcp_events.values().sum();
    let lost: u64 = st.tcp_lost.values().sum();
    let cpu = cpu_ns(std::process::id());
    println!("RESULT events={events} lost={lost} cpu_ns={cpu}");
}

/// A recording session filtered (in the kernel) to port 1, which no flood
/// connection uses: every event is dropped at the port check.
fn consumer_filtered(secs: u64) {
    let mut cfg = EbpfConfig::tcp();
    cfg.port = Some(1);
    let (r, cpu) = window_result(cfg, secs);
    let k = r.tcp_kernel.expect("kernel counts");
    println!(
        "RESULT matched={} lost={} cpu_ns={cpu}",
        k.seen.iter().sum::<u64>(),
        k.lost.iter().sum::<u64>()
    );
}

fn consumer(secs: u64, offcpu_pid: Option<u32>) {
    consumer_mode(secs, offcpu_pid, false)
}

fn consumer_mode(secs: u64, offcpu_pid: Option<u32>, per_event: bool) {
    let mut cfg = EbpfConfig::tcp();
    cfg.tcp_per_event = per_event;
    if let Some(p) = offcpu_pid {
        cfg.offcpu = true;
        cfg.watch_pids = vec![p];
    }
    let (r, cpu) = window_result(cfg, secs);
    let agg = r.tcp.expect("tcp");
    let events: u64 = TcpEventKind::ALL.iter().map(|k| agg.seen(*k)).sum();
    let lost: u64 = r.tcp_ctx.lost.iter().sum();
    println!("RESULT events={events} lost={lost} cpu_ns={cpu}");
}

/// The flight recorder watching every port (so every flood event is
/// recorded and folded), polled every 100 ms as pstackd would.
fn consumer_flight(secs: u64) {
    let mut rec = pstack_ebpf::FlightRecorder::start(pstack_ebpf::FlightConfig {
        ports: (1, 65535),
        ..pstack_ebpf::FlightConfig::default()
    })
    .expect("start flight recorder");
    println!("READY");
    std::io::stdout().flush().ok();
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(secs) {
        let _ = rec.poll();
        std::thread::sleep(Duration::from_millis(100));
    }
    let st = rec.stats();
    println!(
        "RESULT events={} lost={} folded={} flows={} cpu_ns={}",
        st.kernel_events,
        st.events_lost,
        st.events_folded,
        st.flows,
        cpu_ns(std::process::id())
    );
}

/// Cost per event of pstack's TCP settings, one after the other on the same
/// flood (no bpftrace, no other tool attached: no program warms the socket's
/// cache lines for another): count-only, recording windows (aggregated, the
/// captures' mode, and per-event), flight recorder; `rounds` times over,
/// alternating, with each program's ns/run.
fn cost(rounds: usize) {
    let exe = std::env::current_exe().expect("exe");
    sh("sysctl", &["-q", "-w", "kernel.bpf_stats_enabled=1"], None);
    let settings = [
        (
            "count-only (pstackd counters)",
            &["consumer", "60", "count"][..],
        ),
        ("recording window (capture)", &["consumer", "60"][..]),
        (
            "recording window, per-event",
            &["consumer", "60", "per-event"][..],
        ),
        ("flight recorder, all ports", &["flight", "60"][..]),
    ];
    for (round, (label, args)) in (0..rounds).flat_map(|r| settings.iter().map(move |s| (r, *s))) {
        let conns = 10_000usize;
        let writes = 10_000usize;
        let ns = Netns(format!("pstk-bench-{}", std::process::id()));
        sh("ip", &["netns", "add", &ns.0], None);
        sh("ip", &["-n", &ns.0, "link", "set", "lo", "up"], None);
        let lossy_port = 47_999u16;
        let rules = format!(
            "table inet pstack_bench {{\n chain input {{\n  type filter hook input priority 0;\n  tcp dport {lossy_port} tcp flags & syn == 0 numgen random mod 100 < 10 drop\n }}\n}}\n"
        );
        sh(
            "ip",
            &["netns", "exec", &ns.0, "nft", "-f", "-"],
            Some(&rules),
        );
        let mut ps = Kill(
            Command::new(&exe)
                .args(args)
                .stdout(Stdio::piped())
                .spawn()
                .expect("consumer"),
        );
        let _out = wait_line(&mut ps.0, "READY");
        let pid = ps.0.id();
        let cpu0 = cpu_ns(pid);
        let k0 = prog_stats(&["pstack_tcp_", "pstack_inet_"]);
        let p0 = per_prog();
        let t = Instant::now();
        let ns_file = std::fs::File::open(format!("/run/netns/{}", ns.0)).expect("netns");
        std::thread::spawn(move || {
            nix::sched::setns(ns_file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
                .expect("setns");
            let l = std::thread::spawn(move || lossy_stream(lossy_port, writes));
            flood(conns);
            l.join().expect("lossy");
        })
        .join()
        .expect("flood");
        let secs = t.elapsed().as_secs_f64();
        std::thread::sleep(Duration::from_millis(500));
        let k1 = prog_stats(&["pstack_tcp_", "pstack_inet_"]);
        let p1 = per_prog();
        let cpu1 = cpu_ns(pid);
        drop(ps);
        drop(ns);
        let n = (k1.1 - k0.1) as f64;
        let kern = (k1.0 - k0.0) as f64 / n;
        let user = (cpu1 - cpu0) as f64 / n;
        println!(
            "[{round}] {label:<32} {n:>8.0} events in {secs:>5.1}s  kernel {kern:>6.1} ns/event  consumer {user:>6.1} ns/event  total {:>6.1} ns/event",
            kern + user
        );
        for (name, (t1, c1)) in &p1 {
            let (t0, c0) = p0.get(name).copied().unwrap_or((0, 0));
            if c1 > &c0 && name.starts_with("pstack_") {
                println!(
                    "      {name} {} runs {:.1} ns/run",
                    c1 - c0,
                    (t1 - t0) as f64 / (c1 - c0) as f64
                );
            }
        }
    }
}

fn rusage_ns() -> u64 {
    let mut ru: libc::rusage = unsafe_zeroed_rusage();
    // SAFETY: `ru` is a valid, writable rusage; RUSAGE_SELF always exists.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn unsafe_zeroed_rusage() -> libc::rusage {
    // SAFETY: rusage is plain old data; all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

/// Returns (Gbit/s, CPU ns of this process per MiB moved).
fn blast(secs: u64) -> (f64, f64) {
    let cpu0 = rusage_ns();
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let a = l.local_addr().expect("addr");
    let server = std::thread::spawn(move || {
        let (mut s, _) = l.accept().expect("accept");
        let mut buf = vec![0u8; 256 * 1024];
        let mut n = 0u64;
        loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(k) => n += k as u64,
            }
        }
        n
    });
    let mut c = TcpStream::connect(a).expect("connect");
    let buf = vec![1u8; 128 * 1024];
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(secs) {
        c.write_all(&buf).expect("write");
    }
    drop(c);
    let n = server.join().expect("server");
    let cpu = rusage_ns() - cpu0;
    (
        n as f64 * 8.0 / t.elapsed().as_secs_f64() / 1e9,
        cpu as f64 / (n as f64 / (1 << 20) as f64),
    )
}

fn flood(conns: usize) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let a = l.local_addr().expect("addr");
    let acc = std::thread::spawn(move || {
        for _ in 0..conns {
            drop(l.accept().expect("accept"));
        }
    });
    for i in 0..conns {
        let c = TcpStream::connect(a).expect("connect");
        if i % 2 == 0 {
            // Half close with RST (resets), half with FIN (full state sequence).
            nix::sys::socket::setsockopt(
                &c.as_fd(),
                nix::sys::socket::sockopt::Linger,
                &libc::linger {
                    l_onoff: 1,
                    l_linger: 0,
                },
            )
            .expect("linger");
        }
        drop(c);
    }
    acc.join().expect("acceptor");
}

fn lossy_stream(port: u16, writes: usize) {
    let l = TcpListener::bind(("127.0.0.1", port)).expect("bind lossy");
    let a = l.local_addr().expect("addr");
    let mut c = TcpStream::connect(a).expect("connect");
    c.set_nodelay(true).expect("nodelay");
    let (mut s, _) = l.accept().expect("accept");
    let r = std::thread::spawn(move || {
        let mut b = [0u8; 4096];
        while let Ok(k) = s.read(&mut b) {
            if k == 0 {
                break;
            }
        }
    });
    for _ in 0..writes {
        c.write_all(&[3u8; 256]).expect("write");
    }
    drop(c);
    r.join().expect("reader");
}

/// One stream to `port` for 5 s: 512-byte writes every 200 us (one segment
/// each), through the storm's drop rule.
fn paced_stream(port: u16) {
    let l = TcpListener::bind(("127.0.0.1", port)).expect("bind storm");
    let a = l.local_addr().expect("addr");
    let mut c = TcpStream::connect(a).expect("connect");
    c.set_nodelay(true).expect("nodelay");
    let (mut s, _) = l.accept().expect("accept");
    let r = std::thread::spawn(move || {
        let mut b = [0u8; 4096];
        while let Ok(k) = s.read(&mut b) {
            if k == 0 {
                break;
            }
        }
    });
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(5) {
        c.write_all(&[5u8; 512]).expect("write");
        std::thread::sleep(Duration::from_micros(200));
    }
    drop(c);
    r.join().expect("reader");
}

fn sh(cmd: &str, args: &[&str], stdin: Option<&str>) {
    let mut c = Command::new(cmd)
        .args(args)
        .stdin(Stdio::piped())
        .spawn()
        .expect("spawn");
    if let Some(s) = stdin {
        c.stdin
            .take()
            .expect("stdin")
            .write_all(s.as_bytes())
            .expect("stdin");
    }
    assert!(c.wait().expect("wait").success(), "{cmd} {args:?} failed");
}

struct Netns(String);
impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// (run_time_ns, run_cnt) summed over programs whose name starts with one of `prefixes`.
fn prog_stats(prefixes: &[&str]) -> (u64, u64) {
    let out = Command::new("bpftool")
        .args(["prog", "show", "-j"])
        .output()
        .expect("bpftool");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("bpftool json");
    let mut t = (0u64, 0u64);
    for p in v.as_array().into_iter().flatten() {
        let name = p["name"].as_str().unwrap_or("");
        if prefixes.iter().any(|x| name.starts_with(x)) {
            t.0 += p["run_time_ns"].as_u64().unwrap_or(0);
            t.1 += p["run_cnt"].as_u64().unwrap_or(0);
        }
    }
    t
}

/// name -> (run_time_ns, run_cnt) of the TCP tracepoint programs (ours and bpftrace's).
fn per_prog() -> std::collections::BTreeMap<String, (u64, u64)> {
    let out = Command::new("bpftool")
        .args(["prog", "show", "-j"])
        .output()
        .expect("bpftool");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("bpftool json");
    let mut m = std::collections::BTreeMap::new();
    for p in v.as_array().into_iter().flatten() {
        let name = p["name"].as_str().unwrap_or("").to_string();
        if ["pstack_tcp_", "pstack_inet_", "tcp_", "inet_sock_set_"]
            .iter()
            .any(|x| name.starts_with(x))
        {
            let e = m.entry(name).or_insert((0u64, 0u64));
            e.0 += p["run_time_ns"].as_u64().unwrap_or(0);
            e.1 += p["run_cnt"].as_u64().unwrap_or(0);
        }
    }
    m
}

fn wait_line(child: &mut Child, needle: &str) -> std::io::BufReader<std::process::ChildStdout> {
    use std::io::BufRead;
    let mut r = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line).expect("read") == 0 {
            panic!("child exited before {needle:?}");
        }
        if line.contains(needle) {
            return r;
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    v[v.len() / 2]
}

/// One side-by-side per-event CPU measurement: bpftrace and a pstack consumer
/// (`consumer_args`) attached at the same time to the same flood.
fn per_event(exe: &std::path::Path, consumer_args: &[&str], label: &str) {
    let conns = 20_000usize;
    let writes = 20_000usize;
    let ns = Netns(format!("pstk-bench-{}", std::process::id()));
    sh("ip", &["netns", "add", &ns.0], None);
    sh("ip", &["-n", &ns.0, "link", "set", "lo", "up"], None);
    let lossy_port = 47_999u16;
    let rules = format!(
        "table inet pstack_bench {{\n chain input {{\n  type filter hook input priority 0;\n  tcp dport {lossy_port} tcp flags & syn == 0 numgen random mod 100 < 10 drop\n }}\n}}\n"
    );
    sh(
        "ip",
        &["netns", "exec", &ns.0, "nft", "-f", "-"],
        Some(&rules),
    );

    let script = "tracepoint:tcp:tcp_retransmit_skb, tracepoint:tcp:tcp_receive_reset, \
                  tracepoint:tcp:tcp_send_reset, tracepoint:sock:inet_sock_set_state { @[probe] = count(); }";
    let mut bt = Kill(
        Command::new("bpftrace")
            .args(["-e", script])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("bpftrace"),
    );
    let _bt_out = wait_line(&mut bt.0, "Attaching");
    std::thread::sleep(Duration::from_millis(500));
    let mut ps = Kill(
        Command::new(exe)
            .args(consumer_args)
            .stdout(Stdio::piped())
            .spawn()
            .expect("consumer"),
    );
    let mut ps_out = wait_line(&mut ps.0, "READY");
    let bt_pid = bt.0.id();
    let ps_pid = ps.0.id();
    let (bt0, ps0) = (cpu_ns(bt_pid), cpu_ns(ps_pid));
    let ours0 = prog_stats(&["pstack_tcp_", "pstack_inet_"]);
    let theirs0 = prog_stats(&["tcp_", "inet_sock_set_"]);
    let per0 = per_prog();

    let t = Instant::now();
    let ns_file = std::fs::File::open(format!("/run/netns/{}", ns.0)).expect("netns");
    let worker = std::thread::spawn(move || {
        nix::sched::setns(ns_file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        let l = std::thread::spawn(move || lossy_stream(lossy_port, writes));
        flood(conns);
        l.join().expect("lossy");
    });
    worker.join().expect("flood");
    let flood_secs = t.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_millis(500));
    let ours1 = prog_stats(&["pstack_tcp_", "pstack_inet_"]);
    let theirs1 = prog_stats(&["tcp_", "inet_sock_set_"]);
    let per1 = per_prog();
    let (bt1, ps1) = (cpu_ns(bt_pid), cpu_ns(ps_pid));
    drop(ns);
    // Stop the consumer early: SIGINT is not handled, so kill; its CPU was read above.
    let _ = &mut ps_out;
    drop(ps);
    drop(bt);

    let ours_ns = (ours1.0 - ours0.0) as f64;
    let ours_cnt = (ours1.1 - ours0.1) as f64;
    let theirs_ns = (theirs1.0 - theirs0.0) as f64;
    let theirs_cnt = (theirs1.1 - theirs0.1) as f64;
    // Consumer processes' own CPU (user + system time of their threads).
    let ours_user_ns = (ps1 - ps0) as f64;
    let theirs_user_ns = (bt1 - bt0) as f64;
    println!(
        "== per-event CPU, {label}: {conns} short connections + a {writes}-write stream with 10% input drops, in {flood_secs:.1}s"
    );
    println!(
        "pstack   programs: {:>9.0} events  kernel {:>7.1} ns/event  consumer {:>7.1} ns/event  total {:>7.1} ns/event",
        ours_cnt,
        ours_ns / ours_cnt,
        ours_user_ns / ours_cnt,
        (ours_ns + ours_user_ns) / ours_cnt
    );
    println!(
        "bpftrace programs: {:>9.0} events  kernel {:>7.1} ns/event  consumer {:>7.1} ns/event  total {:>7.1} ns/event",
        theirs_cnt,
        theirs_ns / theirs_cnt,
        theirs_user_ns / theirs_cnt,
        (theirs_ns + theirs_user_ns) / theirs_cnt
    );
    println!(
        "ratio pstack/bpftrace: kernel {:.2}x  total {:.2}x  (target <= 0.5x)",
        (ours_ns / ours_cnt) / (theirs_ns / theirs_cnt),
        ((ours_ns + ours_user_ns) / ours_cnt) / ((theirs_ns + theirs_user_ns) / theirs_cnt)
    );

    for (name, (ns1, c1)) in &per1 {
        let (ns0, c0) = per0.get(name).copied().unwrap_or((0, 0));
        if c1 > &c0 {
            println!(
                "   {name:<16} {:>8} runs {:>7.1} ns/run",
                c1 - c0,
                (ns1 - ns0) as f64 / (c1 - c0) as f64
            );
        }
    }
}

fn run() {
    let exe = std::env::current_exe().expect("exe");
    sh("sysctl", &["-q", "-w", "kernel.bpf_stats_enabled=1"], None);

    // ---- 1. per-event CPU, side by side: the recording mode (captures:
    // aggregated in the kernel), then count-only (pstackd's always-attached
    // session). `peers` compares every mode and the other tools at once. ----
    per_event(
        &exe,
        &["consumer", "60"],
        "pstack recording (aggregated in the kernel)",
    );
    per_event(
        &exe,
        &["consumer", "60", "count"],
        "pstack count-only (pstackd always attached)",
    );
    // A capture window filtered to a port the flood does not use: what a
    // transport capture costs the host's unrelated TCP traffic.
    per_event(
        &exe,
        &["consumer", "60", "port1"],
        "pstack recording, port filter matching none of the flood",
    );
    if std::env::var_os("EBPF_BENCH_CPU_ONLY").is_some() {
        return;
    }

    // ---- 2. throughput cost ----
    // Wall throughput on a shared 2-core machine is noisy, so the cost is also
    // measured as the blaster's own CPU per MiB moved (utime+stime, both ends).
    let secs = 1u64;
    let rounds = 15;
    let blast_once = |exe: &std::path::Path| -> (f64, f64) {
        let out = Command::new(exe)
            .args(["blast", &secs.to_string()])
            .output()
            .expect("blast");
        let text = String::from_utf8_lossy(&out.stdout);
        let mut it = text
            .split_whitespace()
            .map(|v| v.parse::<f64>().expect("number"));
        (it.next().expect("gbps"), it.next().expect("cpu"))
    };
    let mut runs: [Vec<(f64, f64)>; 3] = Default::default();
    for _ in 0..rounds {
        runs[0].push(blast_once(&exe));
        {
            let mut c = Kill(
                Command::new(&exe)
                    .args(["consumer", "30"])
                    .stdout(Stdio::piped())
                    .spawn()
                    .expect("consumer"),
            );
            let _o = wait_line(&mut c.0, "READY");
            runs[1].push(blast_once(&exe));
        }
        {
            // Off-CPU too, watching every task (the heaviest setting: sched_switch on every switch).
            let mut c = Kill(
                Command::new(&exe)
                    .args(["consumer", "30", "all"])
                    .stdout(Stdio::piped())
                    .spawn()
                    .expect("consumer"),
            );
            let _o = wait_line(&mut c.0, "READY");
            runs[2].push(blast_once(&exe));
        }
    }
    let g = |i: usize| median(runs[i].iter().map(|r| r.0).collect());
    let c = |i: usize| median(runs[i].iter().map(|r| r.1).collect());
    println!(
        "== loopback throughput: one stream, {secs}s runs x {rounds}, the three settings interleaved; medians"
    );
    for (i, label) in [
        "without pstack",
        "with pstack TCP programs",
        "with TCP + off-CPU (watch all)",
    ]
    .iter()
    .enumerate()
    {
        println!(
            "{label:<32} {:>6.2} Gbit/s (loss {:+6.2}%)   {:>8.0} CPU ns/MiB (cost {:+6.2}%)",
            g(i),
            (g(0) - g(i)) / g(0) * 100.0,
            c(i),
            (c(i) - c(0)) / c(0) * 100.0
        );
    }
}

/// User-space cost alone: decode + digest + aggregate `n` synthetic state-change
/// records over 1000 sockets (no kernel, no ring buffer).
fn aggregate(n: usize) {
    let mut recs = Vec::with_capacity(1000);
    for i in 0..1000u64 {
        let mut b = vec![0u8; pstack_ebpf::record::TCP_EVENT_SIZE];
        b[32] = 4; // state change
        b[33] = 2;
        b[34] = 1;
        b[35] = 4;
        b[36..38].copy_from_slice(&(10_000 + i as u16).to_le_bytes());
        b[38..40].copy_from_slice(&80u16.to_le_bytes());
        b[40..44].copy_from_slice(&[127, 0, 0, 1]);
        b[56..60].copy_from_slice(&[127, 0, 0, 1]);
        b[96..104].copy_from_slice(&(0xffff_8880_0000_0000u64 + i * 4096).to_le_bytes());
        recs.push(b);
    }
    let mut agg = pstack_ebpf::TcpAggregate::new(pstack_ebpf::Limits::default(), None);
    let t = Instant::now();
    for i in 0..n {
        let _ = agg.add_raw(&recs[i % recs.len()]);
    }
    let ns = t.elapsed().as_nanos() as f64 / n as f64;
    println!(
        "decode+digest+aggregate: {ns:.1} ns/record over {n} records, {} flows",
        agg.flows().len()
    );
}

/// The flight recorder's user-space cost alone: decode + fold `n` synthetic
/// records (state changes and retransmits over 1000 flows, one second of
/// buckets per 1000 records) into a `FlowBook`, expiring every 10 000.
fn book(n: usize) {
    let mut recs = Vec::with_capacity(1000);
    for i in 0..1000u64 {
        let mut b = vec![0u8; pstack_ebpf::record::TCP_EVENT_SIZE];
        b[32] = if i % 2 == 0 { 4 } else { 1 };
        b[33] = 2;
        b[34] = 1;
        b[35] = 4;
        b[36..38].copy_from_slice(&(10_000 + i as u16).to_le_bytes());
        b[38..40].copy_from_slice(&80u16.to_le_bytes());
        b[40..44].copy_from_slice(&[127, 0, 0, 1]);
        b[56..60].copy_from_slice(&[127, 0, 0, 1]);
        b[77] = 0x05; // has sock, has windows
        b[96..104].copy_from_slice(&(0xffff_8880_0000_0000u64 + i * 4096).to_le_bytes());
        recs.push(b);
    }
    let mut fb = pstack_ebpf::FlowBook::new(Duration::from_secs(60), 4096, 0);
    let t = Instant::now();
    for i in 0..n {
        let r = &mut recs[i % 1000];
        r[0..8].copy_from_slice(&(i as u64 * 1_000_000).to_le_bytes()); // 1000 records/s
        fb.fold_raw(r);
        if i % 10_000 == 0 {
            fb.expire(i as u64 * 1_000_000);
            let _ = fb.take_incidents();
        }
    }
    let ns = t.elapsed().as_nanos() as f64 / n as f64;
    println!(
        "flight decode+fold: {ns:.1} ns/record over {n} records, {} flows held",
        fb.flows()
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("flight") => consumer_flight(args.get(2).and_then(|s| s.parse().ok()).unwrap_or(30)),
        Some("cost") => cost(args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1)),
        Some("book") => book(
            args.get(2)
                .and_then(|s| s.parse().ok())
                .unwrap_or(1_000_000),
        ),
        Some("consumer") if args.get(3).map(String::as_str) == Some("port1") => {
            consumer_filtered(args.get(2).and_then(|s| s.parse().ok()).unwrap_or(30));
        }
        Some("consumer") if args.get(3).map(String::as_str) == Some("per-event") => {
            consumer_mode(
                args.get(2).and_then(|s| s.parse().ok()).unwrap_or(30),
                None,
                true,
            );
        }
        Some("peers") => peers(
            args.get(2).and_then(|s| s.parse().ok()).unwrap_or(20_000),
            0,
        ),
        Some("peers-storm") => peers(0, args.get(2).and_then(|s| s.parse().ok()).unwrap_or(8)),
        Some("consumer") if args.get(3).map(String::as_str) == Some("count") => {
            consumer_count(args.get(2).and_then(|s| s.parse().ok()).unwrap_or(30));
        }
        Some("consumer") => {
            let secs = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(30);
            let off = args.get(3).map(|s| {
                if s == "all" {
                    0
                } else {
                    s.parse().unwrap_or(0)
                }
            });
            consumer_with(secs, off);
        }
        Some("blast") => {
            let (g, c) = blast(args.get(2).and_then(|s| s.parse().ok()).unwrap_or(3));
            println!("{g:.3} {c:.1}");
        }
        Some("aggregate") => aggregate(
            args.get(2)
                .and_then(|s| s.parse().ok())
                .unwrap_or(1_000_000),
        ),
        Some("flood") => flood(args.get(2).and_then(|s| s.parse().ok()).unwrap_or(10_000)),
        Some("run") | None => run(),
        Some(other) => {
            eprintln!(
                "unknown subcommand {other}: run | cost | peers [CONNS] | peers-storm [STREAMS] | consumer SECS [PID|all|count|port1|per-event] | flight SECS | blast SECS | flood CONNS"
            );
            std::process::exit(2);
        }
    }
}

/// `off`: None = TCP only; Some(0) = also off-CPU watching all; Some(pid) = watching pid.
fn consumer_with(secs: u64, off: Option<u32>) {
    if off == Some(0) {
        let mut cfg = EbpfConfig::tcp();
        cfg.offcpu = true;
        cfg.watch_all = true;
        let _ = window_result(cfg, secs);
        return;
    }
    consumer(secs, off)
}

/// id -> (name, run_time_ns, run_cnt) of every loaded BPF program.
fn prog_table() -> std::collections::BTreeMap<u64, (String, u64, u64)> {
    let out = Command::new("bpftool")
        .args(["prog", "show", "-j"])
        .output()
        .expect("bpftool");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("bpftool json");
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| {
            Some((
                p["id"].as_u64()?,
                (
                    p["name"].as_str().unwrap_or("").to_string(),
                    p["run_time_ns"].as_u64().unwrap_or(0),
                    p["run_cnt"].as_u64().unwrap_or(0),
                ),
            ))
        })
        .collect()
}

/// One tool attached to the flood: its process and its programs.
struct Peer {
    label: String,
    child: Kill,
    ids: Vec<u64>,
}

/// Start `cmd`, then claim the programs that appear (stable for 1 s). A
/// tool that loads nothing within `limit` is reported unavailable with the
/// last line of its stderr.
fn attach_peer(
    label: &str,
    mut cmd: Command,
    name_ok: impl Fn(&str) -> bool,
    want: usize,
    claimed: &mut std::collections::BTreeSet<u64>,
) -> Result<Peer, String> {
    let before: std::collections::BTreeSet<u64> = prog_table().keys().copied().collect();
    let err_path = std::env::temp_dir().join(format!("pstack-peer-{}.err", std::process::id()));
    let err = std::fs::File::create(&err_path).map_err(|e| format!("stderr file: {e}"))?;
    let mut child = Kill(
        cmd.stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .map_err(|e| format!("spawn: {e}"))?,
    );
    let t = Instant::now();
    let mut last: Vec<u64> = Vec::new();
    let mut stable_since = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(250));
        let now: Vec<u64> = prog_table()
            .into_iter()
            .filter(|(id, (name, _, _))| {
                !before.contains(id) && !claimed.contains(id) && !name.is_empty() && name_ok(name)
            })
            .map(|(id, _)| id)
            .collect();
        if now != last {
            last = now;
            stable_since = Instant::now();
        } else if last.len() >= want && stable_since.elapsed() > Duration::from_secs(1) {
            break;
        }
        if let Ok(Some(st)) = child.0.try_wait() {
            let text = std::fs::read_to_string(&err_path).unwrap_or_default();
            let why = text
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("")
                .to_string();
            return Err(format!("exited ({st}) before attaching: {why}"));
        }
        if t.elapsed() > Duration::from_secs(90) {
            return Err(format!("{} programs after 90 s", last.len()));
        }
    }
    claimed.extend(last.iter().copied());
    Ok(Peer {
        label: label.to_string(),
        child,
        ids: last,
    })
}

/// Every mode of pstack and every peer tool, attached at once, one flood:
/// `storm` = 0: `conns` short connections (half RST-closed) + a lossy stream;
/// `storm` > 0: that many paced streams through a 30% input-drop rule for
/// 5 s (retransmits dominate: where per-flow aggregation pays most).
fn peers(conns: usize, storm: usize) {
    let exe = std::env::current_exe().expect("exe");
    sh("sysctl", &["-q", "-w", "kernel.bpf_stats_enabled=1"], None);
    let writes = conns;
    let ns = Netns(format!("pstk-bench-{}", std::process::id()));
    sh("ip", &["netns", "add", &ns.0], None);
    sh("ip", &["-n", &ns.0, "link", "set", "lo", "up"], None);
    let lossy_port = 47_999u16;
    let rules = format!(
        "table inet pstack_bench {{\n chain input {{\n  type filter hook input priority 0;\n  tcp dport {lossy_port} tcp flags & syn == 0 numgen random mod 100 < 10 drop\n  tcp dport {}-{} tcp flags & syn == 0 numgen random mod 100 < 30 drop\n }}\n}}\n",
        lossy_port + 1,
        lossy_port + 64
    );
    sh(
        "ip",
        &["netns", "exec", &ns.0, "nft", "-f", "-"],
        Some(&rules),
    );
    let bt_count = "tracepoint:tcp:tcp_retransmit_skb, tracepoint:tcp:tcp_receive_reset, \
                    tracepoint:tcp:tcp_send_reset, tracepoint:sock:inet_sock_set_state { @[probe] = count(); }";
    // Like tcpstates / tcpretrans: every event, one line each (this kernel
    // has no kprobes, so bpftrace's shipped tcpretrans.bt / tcplife.bt cannot
    // attach: they are tried and reported, and these tracepoint versions run).
    let bt_states = "tracepoint:sock:inet_sock_set_state /args->protocol == 6/ { \
                     printf(\"%llu %d %s %s:%d %s:%d %d -> %d\\n\", nsecs, pid, comm, ntop(args->saddr), \
                     args->sport, ntop(args->daddr), args->dport, args->oldstate, args->newstate); }";
    let bt_retrans = "tracepoint:tcp:tcp_retransmit_skb { printf(\"%llu %d %s:%d %s:%d %d\\n\", nsecs, pid, \
                      ntop(args->saddr), args->sport, ntop(args->daddr), args->dport, args->state); }";
    let pstack = |mode: &str| {
        let mut c = Command::new(&exe);
        c.args(["consumer", "600"]);
        if !mode.is_empty() {
            c.arg(mode);
        }
        c
    };
    let cmd = |prog: &str, args: &[&str]| {
        let mut c = Command::new(prog);
        c.args(args);
        c
    };
    let is_pstack = |n: &str| n.starts_with("pstack_");
    let not_pstack = |n: &str| !n.starts_with("pstack_");
    type NameOk = Box<dyn Fn(&str) -> bool>;
    let plan: Vec<(&str, Command, NameOk, usize)> = vec![
        (
            "pstack aggregated (recording)",
            pstack(""),
            Box::new(is_pstack),
            4,
        ),
        (
            "pstack per-event (debug)",
            pstack("per-event"),
            Box::new(is_pstack),
            4,
        ),
        (
            "pstack count-only (pstackd)",
            pstack("count"),
            Box::new(is_pstack),
            4,
        ),
        (
            "bpftrace count()",
            cmd("bpftrace", &["-e", bt_count]),
            Box::new(not_pstack),
            4,
        ),
        (
            "bpftrace tcpretrans.bt (prints)",
            cmd("bpftrace", &["/usr/sbin/tcpretrans.bt"]),
            Box::new(not_pstack),
            1,
        ),
        (
            "bpftrace tcpstates script (prints)",
            cmd("bpftrace", &["-e", bt_states]),
            Box::new(not_pstack),
            1,
        ),
        (
            "bpftrace tcpretrans script (prints)",
            cmd("bpftrace", &["-e", bt_retrans]),
            Box::new(not_pstack),
            1,
        ),
        (
            "bpftrace tcplife.bt (prints)",
            cmd("bpftrace", &["/usr/sbin/tcplife.bt"]),
            Box::new(not_pstack),
            1,
        ),
        (
            "bcc tcpstates (libbpf-tools)",
            cmd("/usr/sbin/tcpstates", &[]),
            Box::new(not_pstack),
            1,
        ),
        (
            "bcc tcplife (libbpf-tools)",
            cmd("/usr/sbin/tcplife", &[]),
            Box::new(not_pstack),
            1,
        ),
        (
            "bcc tcpretrans-bpfcc (Python)",
            cmd("/usr/sbin/tcpretrans-bpfcc", &[]),
            Box::new(not_pstack),
            1,
        ),
    ];
    // Programs on one tracepoint run newest first, and the first to run takes
    // the cache misses on the socket: PEERS_REVERSE=1 attaches in the
    // opposite order, to see how much the order moves each row.
    let mut plan = plan;
    if std::env::var_os("PEERS_REVERSE").is_some() {
        plan.reverse();
    }
    let mut claimed = std::collections::BTreeSet::new();
    let mut attached = Vec::new();
    for (label, c, ok, want) in plan {
        match attach_peer(label, c, ok, want, &mut claimed) {
            Ok(p) => {
                eprintln!("attached {label}: programs {:?}", p.ids);
                attached.push(p);
            }
            Err(why) => println!("{label:<36} unavailable: {why}"),
        }
    }
    std::thread::sleep(Duration::from_secs(1));
    let cpu0: Vec<u64> = attached.iter().map(|p| cpu_ns(p.child.0.id())).collect();
    let k0 = prog_table();
    let t = Instant::now();
    let ns_file = std::fs::File::open(format!("/run/netns/{}", ns.0)).expect("netns");
    std::thread::spawn(move || {
        nix::sched::setns(ns_file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        if storm > 0 {
            let streams: Vec<_> = (0..storm)
                .map(|i| std::thread::spawn(move || paced_stream(lossy_port + 1 + i as u16)))
                .collect();
            for s in streams {
                s.join().expect("storm stream");
            }
        } else {
            let l = std::thread::spawn(move || lossy_stream(lossy_port, writes));
            flood(conns);
            l.join().expect("lossy");
        }
    })
    .join()
    .expect("flood");
    let secs = t.elapsed().as_secs_f64();
    // Let the printers drain what they were sent.
    std::thread::sleep(Duration::from_secs(2));
    let k1 = prog_table();
    let cpu1: Vec<u64> = attached.iter().map(|p| cpu_ns(p.child.0.id())).collect();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let what = if storm > 0 {
        format!("{storm} paced streams through 30% input drops (retransmit storm)")
    } else {
        format!(
            "{conns} short connections (half RST-closed) + a {writes}-write stream with 10% input drops"
        )
    };
    println!(
        "== peers: {what}, in {secs:.1}s, every tool attached at once; load {}",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!(
        "{:<36} {:>9} {:>12} {:>12} {:>12}",
        "tool", "events", "kernel ns/ev", "consumer ns/ev", "total ns/ev"
    );
    let mut rows = Vec::new();
    for (i, p) in attached.iter().enumerate() {
        let (mut ns, mut cnt) = (0u64, 0u64);
        let mut per = Vec::new();
        for id in &p.ids {
            let (name, n1, c1) = k1.get(id).cloned().unwrap_or_default();
            let (_, n0, c0) = k0.get(id).cloned().unwrap_or_default();
            ns += n1 - n0;
            cnt += c1 - c0;
            if c1 > c0 {
                per.push(format!(
                    "{name} {} runs {:.1} ns/run",
                    c1 - c0,
                    (n1 - n0) as f64 / (c1 - c0) as f64
                ));
            }
        }
        let user = cpu1[i].saturating_sub(cpu0[i]) as f64;
        let (k, u) = (ns as f64 / cnt.max(1) as f64, user / cnt.max(1) as f64);
        println!(
            "{:<36} {:>9} {:>12.1} {:>12.1} {:>12.1}",
            p.label,
            cnt,
            k,
            u,
            k + u
        );
        for line in per {
            println!("      {line}");
        }
        rows.push((p.label.clone(), k, k + u));
    }
    let find = |l: &str| rows.iter().find(|r| r.0.starts_with(l)).map(|r| (r.1, r.2));
    if let Some((ak, at)) = find("pstack aggregated") {
        for peer in [
            "bpftrace count()",
            "bcc tcpstates",
            "bcc tcplife",
            "bcc tcpretrans",
            "bpftrace tcpstates",
            "bpftrace tcpretrans script",
            "pstack per-event",
        ] {
            if let Some((pk, pt)) = find(peer) {
                println!(
                    "ratio pstack aggregated / {peer}: kernel {:.2}x  total {:.2}x",
                    ak / pk,
                    at / pt
                );
            }
        }
    }
    if let (Some((ck, ct)), Some((bk, bt))) = (find("pstack count-only"), find("bpftrace count()"))
    {
        println!(
            "ratio pstack count-only / bpftrace count(): kernel {:.2}x  total {:.2}x",
            ck / bk,
            ct / bt
        );
    }
    drop(attached);
    drop(ns);
}
