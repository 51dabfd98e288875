//! Benchmark: a TCP snapshot (every socket with `tcp_info`) of N established
//! loopback sockets, pstack's sock_diag reader vs `ss -tin`, in the same run,
//! in a private network namespace (so nothing else on the host is counted).
//!
//! Two comparisons, both printed with their ratio (pstack / ss; ≤ 1.0 means
//! pstack is at least as fast):
//! - **process vs process**: `ss -tin` vs this binary re-executed in
//!   `--snapshot` mode, which dumps every socket and writes one JSON line per
//!   socket (state, endpoints, cookie, full tcp_info) to stdout — the same job
//!   `ss` does, output read to the end by the parent in both cases;
//! - **in-process**: the reader alone (`dump_tcp`, parse included), the cost
//!   the net helper (`pstack-helper --net`) pays per sample.
//!
//! With `--pstackctl PATH`, it also times, interleaved with the others,
//! what an operator runs: `pstackctl sockets` (the same reader, a table like
//! `ss -tin`'s) and `pstackctl sockets --json` (every field, one JSON object a
//! line), each against `ss -tin` in the same round; and runs
//! `pstackctl capture transport` over the same sockets (`--max-flows 200`)
//! to report envelope bytes per flow.
//!
//! Usage (root): `cargo run --release --manifest-path bench/transport/Cargo.toml -- \
//!   [--sockets 10000] [--runs 15] [--pstackctl target/release/pstackctl]`

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pstack_collectors::net::sockdiag::dump_tcp;

fn arg(name: &str) -> Option<String> {
    let mut it = std::env::args();
    while let Some(a) = it.next() {
        if a == name {
            return it.next();
        }
    }
    None
}

fn snapshot_to_stdout() {
    let dump = dump_tcp(&|_| true).expect("sock_diag dump");
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::with_capacity(1 << 20, stdout.lock());
    for s in &dump.sockets {
        serde_json::to_writer(&mut out, s).expect("write");
        out.write_all(b"\n").expect("write");
    }
    out.flush().expect("flush");
}

/// Run a command to completion, reading all its output; returns (elapsed, bytes).
fn timed_run(cmd: &mut Command) -> (Duration, usize) {
    let t = Instant::now();
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let mut buf = Vec::with_capacity(16 << 20);
    child
        .stdout
        .take()
        .unwrap()
        .read_to_end(&mut buf)
        .expect("read");
    let status = child.wait().expect("wait");
    assert!(status.success(), "{cmd:?} failed");
    (t.elapsed(), buf.len())
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    if std::env::args().any(|a| a == "--snapshot") {
        snapshot_to_stdout();
        return;
    }
    if let Some(n) = arg("--hold") {
        let port = std::env::args().skip_while(|a| a != "--hold").nth(2);
        hold(
            n.parse().expect("--hold N"),
            port.and_then(|p| p.parse().ok()).expect("--hold N PORT"),
        );
        return;
    }
    let sockets: usize = arg("--sockets")
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000);
    let runs: usize = arg("--runs").and_then(|s| s.parse().ok()).unwrap_or(15);
    let pstackctl = arg("--pstackctl");

    // A private netns, still single-threaded here.
    // SAFETY: unshare with a constant flag; checked.
    assert_eq!(
        unsafe { libc::unshare(libc::CLONE_NEWNET) },
        0,
        "unshare(CLONE_NEWNET) needs root"
    );
    let st = Command::new("ip")
        .args(["link", "set", "lo", "up"])
        .status()
        .expect("ip");
    assert!(st.success());

    // The sockets are held by child processes of at most HOLD_PAIRS pairs
    // each: a process may not hold more than RLIMIT_NOFILE descriptors, and
    // some machines (this VM: 20,000, not raisable) cap it below 50,000.
    let pairs = sockets / 2;
    let exe = std::env::current_exe().expect("exe");
    let mut holders = Vec::new();
    let mut left = pairs;
    let mut port = 10_001u16;
    while left > 0 {
        let n = left.min(HOLD_PAIRS);
        let mut child = Command::new(&exe)
            .args(["--hold", &n.to_string(), &port.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn a socket holder");
        let mut ready = [0u8; 6];
        child
            .stdout
            .as_mut()
            .unwrap()
            .read_exact(&mut ready)
            .expect("holder ready");
        assert_eq!(&ready, b"ready\n");
        holders.push(child);
        left -= n;
        port += 1;
    }
    let check = dump_tcp(&|s| s.state == 1).expect("dump");
    println!(
        "established sockets in the bench netns: {}",
        check.sockets.len()
    );
    assert_eq!(check.sockets.len(), pairs * 2);

    // Warm both (page cache, binaries).
    timed_run(Command::new("ss").arg("-tin"));
    timed_run(Command::new(&exe).arg("--snapshot"));

    let (mut ss_t, mut ps_t, mut inproc_t) = (Vec::new(), Vec::new(), Vec::new());
    let (mut ss_bytes, mut ps_bytes) = (0, 0);
    let (mut table_t, mut json_t) = (Vec::new(), Vec::new());
    let (mut table_bytes, mut json_bytes) = (0, 0);
    if let Some(p) = &pstackctl {
        timed_run(Command::new(p).arg("sockets"));
    }
    for _ in 0..runs {
        // Interleaved so both see the same machine state.
        let (t, b) = timed_run(Command::new("ss").arg("-tin"));
        ss_t.push(t);
        ss_bytes = b;
        let (t, b) = timed_run(Command::new(&exe).arg("--snapshot"));
        ps_t.push(t);
        ps_bytes = b;
        let t = Instant::now();
        let d = dump_tcp(&|_| true).expect("dump");
        inproc_t.push(t.elapsed());
        assert!(d.sockets.len() >= pairs * 2);
        if let Some(p) = &pstackctl {
            let (t, b) = timed_run(Command::new(p).arg("sockets"));
            table_t.push(t);
            table_bytes = b;
            let (t, b) = timed_run(Command::new(p).args(["sockets", "--json"]));
            json_t.push(t);
            json_bytes = b;
        }
    }
    let (ss_m, ps_m, in_m) = (median(ss_t), median(ps_t), median(inproc_t));
    println!("runs: {runs} (medians)");
    println!(
        "ss -tin                         : {:>8.2} ms  ({ss_bytes} bytes of output)",
        ss_m.as_secs_f64() * 1e3
    );
    println!(
        "pstack reader, as a process     : {:>8.2} ms  ({ps_bytes} bytes of JSON lines)",
        ps_m.as_secs_f64() * 1e3
    );
    println!(
        "pstack reader, in-process       : {:>8.2} ms",
        in_m.as_secs_f64() * 1e3
    );
    println!(
        "ratio process/ss                : {:.2}x",
        ps_m.as_secs_f64() / ss_m.as_secs_f64()
    );
    println!(
        "ratio in-process/ss             : {:.2}x",
        in_m.as_secs_f64() / ss_m.as_secs_f64()
    );

    if !table_t.is_empty() {
        let (table_m, json_m) = (median(table_t), median(json_t));
        println!(
            "pstackctl sockets (table)       : {:>8.2} ms  ({table_bytes} bytes)  ratio {:.2}x",
            table_m.as_secs_f64() * 1e3,
            table_m.as_secs_f64() / ss_m.as_secs_f64()
        );
        println!(
            "pstackctl sockets --json        : {:>8.2} ms  ({json_bytes} bytes)  ratio {:.2}x",
            json_m.as_secs_f64() * 1e3,
            json_m.as_secs_f64() / ss_m.as_secs_f64()
        );
    }
    if let Some(p) = pstackctl {
        let out = Command::new(&p)
            .args([
                "capture",
                "transport",
                "--peer",
                "127.0.0.1:10001",
                "--window",
                "100ms",
                "--max-flows",
                "200",
                "--json",
                "--no-ebpf",
            ])
            .output()
            .expect("pstackctl");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let lines: Vec<&[u8]> = out
            .stdout
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .collect();
        let total: usize = lines.iter().map(|l| l.len()).sum();
        let max = lines.iter().map(|l| l.len()).max().unwrap_or(0);
        println!(
            "envelope per flow (compact JSON, {} flows): mean {} bytes, max {max} bytes",
            lines.len(),
            total / lines.len().max(1)
        );
    }
    for mut h in holders {
        drop(h.stdin.take());
        let _ = h.wait();
    }
}

/// Most socket pairs one holder process opens (2 descriptors each).
const HOLD_PAIRS: usize = 7_000;

/// `--hold N PORT`: listen on 127.0.0.1:PORT, open N connected pairs, say
/// `ready`, and keep them until stdin closes.
fn hold(pairs: usize, port: u16) {
    let l = TcpListener::bind(("127.0.0.1", port)).expect("bind");
    let mut keep = Vec::with_capacity(pairs * 2);
    for _ in 0..pairs {
        let c = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        let (s, _) = l.accept().expect("accept");
        keep.push(c);
        keep.push(s);
    }
    let mut out = std::io::stdout();
    out.write_all(b"ready\n").expect("ready");
    out.flush().expect("flush");
    let mut rest = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut rest);
    drop(keep);
}
