//! A two-host testbed in network namespaces: `A` (the sending node) and `B`
//! (the receiving node) joined by a veth pair, IPv4 10.77.0.1/2 and IPv6
//! fd77::1/2, with a Longhorn-like bulk stream A→B:10001 and an idle control
//! connection A→B:10000. Everything is torn down by `Drop` guards (namespaces,
//! which take their veth ends and nftables tables with them; the global
//! conntrack max), names carry the test process id, and traffic never leaves
//! the namespaces this module creates.
//!
//! [`LonghornBed`] is Longhorn's real rebuild pattern in three namespaces
//! joined by a bridge in a fourth: E (engine node), S (source replica's
//! instance manager) and T (target's), each replica with a ten-port block
//! P…P+9 — T's sync agent holds an idle control connection to S:P_S+2 while
//! S streams a file to T:P_T+3, E writes to T:P_T and holds `FilesSync` on
//! T:P_T+2, and other volumes' flows run between the same S and T.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use pstack_envelope::Envelope;

pub const A_V4: &str = "10.77.0.1";
pub const B_V4: &str = "10.77.0.2";
pub const A_V6: &str = "fd77::1";
pub const B_V6: &str = "fd77::2";
pub const DATA_PORT: u16 = 10001;
pub const CONTROL_PORT: u16 = 10000;
/// TCP_USER_TIMEOUT the sender sets on the data stream, ms.
pub const USER_TIMEOUT_MS: i32 = 20_000;
/// TCP_KEEPIDLE the sender sets on the data stream, s.
pub const KEEPIDLE_S: i32 = 45;

/// Testbed tests share the machine's 2 CPUs and the global conntrack max:
/// they run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether this process can build the testbed; a missing precondition is a reported skip
/// (a failure under `PSTACK_STRICT=1`/`CI=true`, see pstack-testkit).
pub fn root_or_skip(test: &str) -> bool {
    if !pstack_testkit::precondition(
        pstack_testkit::is_root(),
        "needs root (network namespaces, veth, nftables)",
    ) {
        return false;
    }
    for tool in ["ip", "nft"] {
        if Command::new(tool).arg("-V").output().is_err() {
            panic!("{test}: `{tool}` is not installed (scripts/setup.d/40-net.sh installs it)");
        }
    }
    true
}

pub fn run(cmd: &str, args: &[&str]) -> Output {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("spawn {cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn run_stdin(cmd: &str, args: &[&str], input: &str) {
    let mut child = Command::new(cmd)
        .args(args)
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {cmd}: {e}"));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{cmd} {args:?} <<{input}>> failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A named netns, deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    fn new(name: String) -> Netns {
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        run("ip", &["netns", "add", &name]);
        Netns { name }
    }

    pub fn ip(&self, args: &[&str]) {
        let mut v = vec!["-n", self.name.as_str()];
        v.extend_from_slice(args);
        run("ip", &v);
    }

    /// Load an nftables ruleset into this netns (it dies with the netns).
    pub fn nft(&self, ruleset: &str) {
        // nft wants a newline (not `;`) before a block's closing brace.
        let ruleset = ruleset.replace("; }", "\n}").replace("} }", "}\n}");
        run_stdin(
            "ip",
            &["netns", "exec", &self.name, "nft", "-f", "-"],
            &ruleset,
        );
    }

    /// Spawn a thread that runs `f` inside this netns.
    pub fn spawn<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> JoinHandle<T> {
        let file = std::fs::File::open(format!("/run/netns/{}", self.name)).unwrap();
        std::thread::spawn(move || {
            // SAFETY: setns on a valid netns fd; affects only this thread.
            let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
            f()
        })
    }

    /// Run `f` inside this netns and wait for it.
    pub fn within<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        self.spawn(f).join().expect("netns thread panicked")
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// Two namespaces joined by veth `pa0` (in A) / `pb0` (in B) — or, routed,
/// A —`pa0`/`ra0`— R —`rb0`/`pb0`— B with R forwarding between 10.77.1.0/24
/// and 10.77.2.0/24.
pub struct Testbed {
    pub a: Netns,
    pub b: Netns,
    /// The router, when routed.
    pub r: Option<Netns>,
    /// B's IPv4 address as A reaches it.
    pub b_v4: &'static str,
}

pub const ROUTED_B_V4: &str = "10.77.2.2";

impl Testbed {
    pub fn new(tag: &str) -> Testbed {
        let pid = std::process::id();
        let a = Netns::new(format!("pst{pid}-{tag}-a"));
        let b = Netns::new(format!("pst{pid}-{tag}-b"));
        run(
            "ip",
            &[
                "link", "add", "pa0", "netns", &a.name, "type", "veth", "peer", "name", "pb0",
                "netns", &b.name,
            ],
        );
        for (ns, dev, v4, v6) in [(&a, "pa0", A_V4, A_V6), (&b, "pb0", B_V4, B_V6)] {
            ns.ip(&["link", "set", "lo", "up"]);
            ns.ip(&["addr", "add", &format!("{v4}/24"), "dev", dev]);
            ns.ip(&["addr", "add", &format!("{v6}/64"), "dev", dev, "nodad"]);
            ns.ip(&["link", "set", dev, "up"]);
        }
        Testbed {
            a,
            b,
            r: None,
            b_v4: B_V4,
        }
    }

    pub fn routed(tag: &str) -> Testbed {
        let pid = std::process::id();
        let a = Netns::new(format!("pst{pid}-{tag}-a"));
        let b = Netns::new(format!("pst{pid}-{tag}-b"));
        let r = Netns::new(format!("pst{pid}-{tag}-r"));
        run(
            "ip",
            &[
                "link", "add", "pa0", "netns", &a.name, "type", "veth", "peer", "name", "ra0",
                "netns", &r.name,
            ],
        );
        run(
            "ip",
            &[
                "link", "add", "rb0", "netns", &r.name, "type", "veth", "peer", "name", "pb0",
                "netns", &b.name,
            ],
        );
        for (ns, dev, addr) in [
            (&a, "pa0", "10.77.1.1/24"),
            (&r, "ra0", "10.77.1.254/24"),
            (&r, "rb0", "10.77.2.254/24"),
            (&b, "pb0", "10.77.2.2/24"),
        ] {
            ns.ip(&["link", "set", "lo", "up"]);
            ns.ip(&["addr", "add", addr, "dev", dev]);
            ns.ip(&["link", "set", dev, "up"]);
        }
        a.ip(&["route", "add", "default", "via", "10.77.1.254"]);
        b.ip(&["route", "add", "default", "via", "10.77.2.254"]);
        run(
            "ip",
            &[
                "netns",
                "exec",
                &r.name,
                "sysctl",
                "-qw",
                "net.ipv4.ip_forward=1",
            ],
        );
        Testbed {
            a,
            b,
            r: Some(r),
            b_v4: ROUTED_B_V4,
        }
    }
}

/// The global conntrack max, lowered for a test and restored on drop.
/// (`nf_conntrack_max` is read-only outside the initial netns on this kernel,
/// and each netns's count is checked against it.)
pub struct ConntrackMax {
    saved: String,
}

const CT_MAX: &str = "/proc/sys/net/netfilter/nf_conntrack_max";

impl ConntrackMax {
    pub fn set(max: u64) -> ConntrackMax {
        let saved = std::fs::read_to_string(CT_MAX).expect("nf_conntrack loaded");
        std::fs::write(CT_MAX, max.to_string()).expect("write nf_conntrack_max");
        ConntrackMax { saved }
    }
}

impl Drop for ConntrackMax {
    fn drop(&mut self) {
        let _ = std::fs::write(CT_MAX, self.saved.trim());
    }
}

/// A listener with a small receive buffer (inherited by accepted sockets).
fn listener(addr: SocketAddr, rcvbuf: Option<i32>) -> TcpListener {
    let domain = if addr.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: socket(2) with constant arguments; checked below.
    let fd = unsafe { libc::socket(domain, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    assert!(fd >= 0);
    // SAFETY: fd is a fresh socket we own.
    let l = unsafe { TcpListener::from_raw_fd(fd) };
    let one: libc::c_int = 1;
    // SAFETY: valid fd and option pointer/length.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            (&one as *const i32).cast(),
            4,
        );
        if let Some(b) = rcvbuf {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVBUF,
                (&b as *const i32).cast(),
                4,
            );
        }
    }
    let (sa, len) = sockaddr(addr);
    // SAFETY: sa is a valid sockaddr of len bytes; fd is a live socket.
    let rc = unsafe { libc::bind(fd, (&sa as *const libc::sockaddr_storage).cast(), len) };
    assert_eq!(rc, 0, "bind {addr}: {}", std::io::Error::last_os_error());
    // SAFETY: fd is a live, bound socket.
    let rc = unsafe { libc::listen(fd, 16) };
    assert_eq!(rc, 0);
    l
}

fn sockaddr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data; zero is valid.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as u16,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_in fits in sockaddr_storage.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin) };
            (ss, std::mem::size_of::<libc::sockaddr_in>() as u32)
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as u16,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: 0,
            };
            // SAFETY: sockaddr_in6 fits in sockaddr_storage.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin6) };
            (ss, std::mem::size_of::<libc::sockaddr_in6>() as u32)
        }
    }
}

/// SO_LINGER {1, 0}: closing `s` sends a RST instead of a FIN.
pub fn reset_on_close(s: &impl AsRawFd) {
    let lg = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: valid fd and option pointer/length.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&lg as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as u32,
        )
    };
    assert_eq!(rc, 0, "SO_LINGER: {}", std::io::Error::last_os_error());
}

/// Shared switches and counters of a running rebuild-like transfer.
#[derive(Default)]
pub struct Knobs {
    pub stop: AtomicBool,
    /// Receiver stops reading while set.
    pub pause_reading: AtomicBool,
    /// Receiver aborts (SO_LINGER {1,0} close) its data socket when set.
    pub abort_data: AtomicBool,
    /// Sender sleeps this many µs between 4 KiB writes (0 = as fast as possible).
    pub pace_us: AtomicU64,
    pub sent: AtomicU64,
    pub received: AtomicU64,
    pub send_error: Mutex<Option<String>>,
}

/// A bulk stream A→B:10001 plus an idle control connection A→B:10000.
pub struct Transfer {
    pub knobs: Arc<Knobs>,
    threads: Vec<JoinHandle<()>>,
}

impl Transfer {
    pub fn start(bed: &Testbed, v6: bool, rcvbuf: Option<i32>) -> Transfer {
        Transfer::start_paced(bed, v6, rcvbuf, 0)
    }

    pub fn start_paced(bed: &Testbed, v6: bool, rcvbuf: Option<i32>, pace_us: u64) -> Transfer {
        let knobs = Arc::new(Knobs::default());
        knobs.pace_us.store(pace_us, Ordering::Relaxed);
        let baddr = if v6 { B_V6 } else { bed.b_v4 };
        let data: SocketAddr = SocketAddr::new(baddr.parse().unwrap(), DATA_PORT);
        let control: SocketAddr = SocketAddr::new(baddr.parse().unwrap(), CONTROL_PORT);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let mut threads = Vec::new();
        // Receiver (node B): accepts both, reads data until told otherwise.
        let k = knobs.clone();
        threads.push(bed.b.spawn(move || {
            let ld = listener(data, rcvbuf);
            let lc = listener(control, None);
            ready_tx.send(()).unwrap();
            let (_ctl, _) = lc.accept().unwrap();
            let (mut s, _) = ld.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_millis(100)))
                .unwrap();
            let mut buf = vec![0u8; 65536];
            while !k.stop.load(Ordering::Relaxed) {
                if k.abort_data.load(Ordering::Relaxed) {
                    reset_on_close(&s);
                    drop(s);
                    while !k.stop.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    return;
                }
                if k.pause_reading.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
                match s.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        k.received.fetch_add(n as u64, Ordering::Relaxed);
                    }
                    Err(_) => {}
                }
            }
        }));
        ready_rx
            .recv_timeout(Duration::from_secs(5))
            .expect("receiver listening");
        // Sender (node A): control first, then the bulk stream in small chunks.
        let k = knobs.clone();
        let (conn_tx, conn_rx) = std::sync::mpsc::channel();
        threads.push(bed.a.spawn(move || {
            let ctl = TcpStream::connect_timeout(&control, Duration::from_secs(5)).unwrap();
            let mut s = TcpStream::connect_timeout(&data, Duration::from_secs(5)).unwrap();
            // Settings a rebuild client might use; the capture reads them back.
            for (level, name, v) in [
                (libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, USER_TIMEOUT_MS),
                (libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1),
                (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, KEEPIDLE_S),
            ] {
                // SAFETY: valid fd and option pointer/length.
                let rc = unsafe {
                    libc::setsockopt(s.as_raw_fd(), level, name, (&v as *const i32).cast(), 4)
                };
                assert_eq!(rc, 0);
            }
            conn_tx.send(()).unwrap();
            s.set_write_timeout(Some(Duration::from_millis(100)))
                .unwrap();
            let chunk = vec![0x5au8; 4096];
            while !k.stop.load(Ordering::Relaxed) {
                let pace = k.pace_us.load(Ordering::Relaxed);
                if pace > 0 {
                    std::thread::sleep(Duration::from_micros(pace));
                }
                match s.write(&chunk) {
                    Ok(n) => {
                        k.sent.fetch_add(n as u64, Ordering::Relaxed);
                    }
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) => {}
                    Err(e) => {
                        *k.send_error.lock().unwrap() = Some(e.to_string());
                        // Keep the socket (and the control connection) open until stopped.
                        while !k.stop.load(Ordering::Relaxed) {
                            std::thread::sleep(Duration::from_millis(50));
                        }
                        break;
                    }
                }
            }
            drop(ctl);
        }));
        conn_rx
            .recv_timeout(Duration::from_secs(5))
            .expect("sender connected");
        // Let the stream reach steady state.
        std::thread::sleep(Duration::from_millis(300));
        Transfer { knobs, threads }
    }
}

impl Drop for Transfer {
    fn drop(&mut self) {
        self.knobs.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Send one UDP datagram from A to each of `count` ports on B (new conntrack entries in B).
pub fn udp_spray(bed: &Testbed, first_port: u16, count: u16) {
    bed.a.within(move || {
        let s = UdpSocket::bind((A_V4, 0)).unwrap();
        for p in first_port..first_port + count {
            let _ = s.send_to(b"x", (B_V4, p));
        }
    });
}

/// A socket path where no pstackd listens: testbed captures run one-shot
/// unless a test names a daemon's socket with `--socket`.
pub const NO_DAEMON: &str = "/nonexistent/pstackd.sock";

/// `pstackctl` with arguments; returns (exit code, stdout, stderr).
pub fn pstackctl(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_pstackctl"))
        .args(args)
        .env("PSTACKD_SOCKET", NO_DAEMON)
        .output()
        .expect("run pstackctl");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Spawn `pstackctl` in the background.
pub fn pstackctl_bg(args: &[&str]) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_pstackctl"))
        .args(args)
        .env("PSTACKD_SOCKET", NO_DAEMON)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn pstackctl")
}

/// Every stdout line must be a sealed envelope that verifies.
pub fn envelopes(stdout: &str) -> Vec<Envelope> {
    stdout
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            pstack_testkit::verify(l.as_bytes())
                .unwrap_or_else(|e| panic!("envelope does not verify: {e}\n{l}"))
        })
        .collect()
}

pub fn finish(child: std::process::Child) -> Vec<Envelope> {
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "pstackctl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    envelopes(&stdout)
}

/// `capture transport --netns NS --peer PEER --window W --json` plus `extra`.
fn capture_args<'a>(
    ns: &'a Netns,
    peer: &'a str,
    window: &'a str,
    extra: &[&'a str],
) -> Vec<&'a str> {
    let mut args = vec![
        "capture",
        "transport",
        "--netns",
        ns.name.as_str(),
        "--peer",
        peer,
        "--window",
        window,
        "--json",
    ];
    args.extend_from_slice(extra);
    args
}

/// Capture `transport` in `ns` for `window`, JSON lines out.
pub fn capture(ns: &Netns, peer: &str, window: &str, extra: &[&str]) -> Vec<Envelope> {
    let args = capture_args(ns, peer, window, extra);
    let (code, out, err) = pstackctl(&args);
    assert_eq!(code, 0, "pstackctl {args:?}: {err}");
    envelopes(&out)
}

/// The same capture in the background; [`finish`] collects its envelopes.
pub fn capture_bg(ns: &Netns, peer: &str, window: &str, extra: &[&str]) -> std::process::Child {
    pstackctl_bg(&capture_args(ns, peer, window, extra))
}

/// The stream envelope whose remote port is `port`.
pub fn flow_to(envs: &[Envelope], port: u16) -> &Envelope {
    envs.iter()
        .find(|e| matches!(&e.subject, pstack_envelope::Subject::NetworkStream(s) if s.dst.ends_with(&format!(":{port}"))))
        .unwrap_or_else(|| panic!("no envelope for a flow to port {port}: {:?}", envs.iter().map(|e| e.subject.describe()).collect::<Vec<_>>()))
}

/// The stream envelope whose local port is `port`.
pub fn flow_from(envs: &[Envelope], port: u16) -> &Envelope {
    envs.iter()
        .find(|e| matches!(&e.subject, pstack_envelope::Subject::NetworkStream(s) if s.src.ends_with(&format!(":{port}"))))
        .unwrap_or_else(|| panic!("no envelope for a flow from port {port}"))
}

pub fn codes(e: &Envelope) -> Vec<String> {
    e.claims.iter().map(|c| c.code.clone()).collect()
}

pub fn fact_codes(e: &Envelope) -> Vec<String> {
    e.claims
        .iter()
        .filter(|c| c.kind != pstack_envelope::ClaimKind::Hypothesis)
        .map(|c| c.code.clone())
        .collect()
}

pub fn surface<'a>(e: &'a Envelope, id: &str) -> &'a pstack_envelope::Surface {
    e.surfaces
        .iter()
        .find(|s| s.id == id)
        .unwrap_or_else(|| panic!("no surface {id}"))
}

/// A netns-wide Tcp/TcpExt counter delta from the `netstat` surface.
pub fn counter(e: &Envelope, name: &str) -> i64 {
    surface(e, "netstat").facts["tcp_delta"][name]
        .as_i64()
        .unwrap_or_else(|| panic!("no counter {name}"))
}

/// A per-flow tcp_info delta from `tcp/end`. A missing or non-integer field is a test
/// failure, never a zero (a zero would make `== 0` assertions pass vacuously).
pub fn flow_delta(e: &Envelope, name: &str) -> i64 {
    let end = surface(e, "tcp/end");
    end.facts["delta"][name].as_i64().unwrap_or_else(|| {
        panic!(
            "tcp/end has no integer delta.{name}: {}",
            serde_json::to_string(&end.facts["delta"]).unwrap_or_default()
        )
    })
}

/// Longhorn namespaces' addresses (the manager fixtures use the same).
pub const LH_E: &str = "10.78.0.1";
pub const LH_S: &str = "10.78.0.2";
pub const LH_T: &str = "10.78.0.3";
/// Storage-network (Multus-like) addresses: a second veth pair per
/// namespace on a second bridge ([`LonghornBed::add_storage_network`]).
pub const LH_E_STORAGE: &str = "10.79.0.1";
pub const LH_S_STORAGE: &str = "10.79.0.2";
pub const LH_T_STORAGE: &str = "10.79.0.3";
/// S's replica port block starts here (P_S…P_S+9).
pub const P_S: u16 = 10000;
/// T's replica port block starts here (P_T…P_T+9).
pub const P_T: u16 = 10500;
/// A second source replica of the volume (v1.11+ `fromReplicaList`), in
/// S's instance manager (replica soft anti-affinity), block P_S2…P_S2+9.
pub const P_S2: u16 = 10200;
/// Other volumes' replicas on T listen from here (between the two blocks,
/// so the narrowed port span still sees them and they must be excluded).
pub const OTHER_FIRST: u16 = 10010;

/// E, S and T on a bridge (in a fourth namespace).
pub struct LonghornBed {
    pub e: Netns,
    pub s: Netns,
    pub t: Netns,
    _sw: Netns,
}

impl LonghornBed {
    pub fn new(tag: &str) -> LonghornBed {
        let pid = std::process::id();
        let sw = Netns::new(format!("pst{pid}-{tag}-w"));
        sw.ip(&["link", "add", "br0", "type", "bridge"]);
        sw.ip(&["link", "set", "br0", "up"]);
        let mut nss = Vec::new();
        for (n, ip) in [("e", LH_E), ("s", LH_S), ("t", LH_T)] {
            let ns = Netns::new(format!("pst{pid}-{tag}-{n}"));
            let (inner, outer) = (format!("l{n}0"), format!("w{n}0"));
            run(
                "ip",
                &[
                    "link", "add", &inner, "netns", &ns.name, "type", "veth", "peer", "name",
                    &outer, "netns", &sw.name,
                ],
            );
            sw.ip(&["link", "set", &outer, "master", "br0"]);
            sw.ip(&["link", "set", &outer, "up"]);
            ns.ip(&["link", "set", "lo", "up"]);
            ns.ip(&["addr", "add", &format!("{ip}/24"), "dev", &inner]);
            ns.ip(&["link", "set", &inner, "up"]);
            nss.push(ns);
        }
        let t = nss.pop().unwrap();
        let s = nss.pop().unwrap();
        let e = nss.pop().unwrap();
        LonghornBed { e, s, t, _sw: sw }
    }

    /// A second network: veth `s{n}0` per namespace on bridge `br1`, with
    /// the storage addresses (as Multus's `lhnet1` gives the instance
    /// managers under Longhorn's `storage-network` setting).
    pub fn add_storage_network(&self) {
        self._sw.ip(&["link", "add", "br1", "type", "bridge"]);
        self._sw.ip(&["link", "set", "br1", "up"]);
        for (n, ns, ip) in [
            ("e", &self.e, LH_E_STORAGE),
            ("s", &self.s, LH_S_STORAGE),
            ("t", &self.t, LH_T_STORAGE),
        ] {
            let (inner, outer) = (format!("s{n}0"), format!("x{n}0"));
            run(
                "ip",
                &[
                    "link",
                    "add",
                    &inner,
                    "netns",
                    &ns.name,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    &outer,
                    "netns",
                    &self._sw.name,
                ],
            );
            self._sw.ip(&["link", "set", &outer, "master", "br1"]);
            self._sw.ip(&["link", "set", &outer, "up"]);
            ns.ip(&["addr", "add", &format!("{ip}/24"), "dev", &inner]);
            ns.ip(&["link", "set", &inner, "up"]);
        }
    }

    /// Start the rebuild's connections and `others` other volumes' flows.
    /// `control_opts`: (keepidle s, keepintvl s, user timeout ms) set on S's
    /// accepted socket of the control channel: grpc-go sets its user timeout
    /// on the server's accepted socket only (`http2_server.go`), Go's
    /// listener its 15 s keepalive; Longhorn's client (T) sets neither.
    pub fn start_rebuild(&self, others: u16, control_opts: Option<(i32, i32, i32)>) -> Rebuild {
        self.start_rebuild_on([LH_S, LH_T], others, control_opts)
    }

    /// [`LonghornBed::start_rebuild`] towards S's and T's addresses
    /// `[S, T]` (the storage network's, or the pod network's); every
    /// client's own address is the one its route to them picks.
    pub fn start_rebuild_on(
        &self,
        [lh_s, lh_t]: [&'static str; 2],
        others: u16,
        control_opts: Option<(i32, i32, i32)>,
    ) -> Rebuild {
        let addr = |ip: &str, port: u16| -> SocketAddr { format!("{ip}:{port}").parse().unwrap() };
        let listen = |ns: &Netns, ip: &'static str, port: u16| {
            ns.within(move || TcpListener::bind(format!("{ip}:{port}")).expect("bind"))
        };
        let connect = |ns: &Netns, to: SocketAddr| {
            ns.within(move || {
                let mut last = None;
                for _ in 0..50 {
                    match TcpStream::connect_timeout(&to, Duration::from_secs(2)) {
                        Ok(s) => return s,
                        Err(e) => last = Some(e),
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                panic!("connect {to}: {last:?}")
            })
        };
        let mut held = Vec::new();
        // C3: T's sync agent → S:P_S+2 (FileSend), idle.
        let l = listen(&self.s, lh_s, P_S + 2);
        let control_t = connect(&self.t, addr(lh_s, P_S + 2));
        let (control_s, _) = l.accept().unwrap();
        if let Some((idle, intvl, ut)) = control_opts {
            let fd = control_s.as_raw_fd();
            for (level, name, v) in [
                (libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1),
                (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, idle),
                (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, intvl),
                (libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, ut),
            ] {
                // SAFETY: setsockopt on an open socket with a 4-byte int.
                let rc = unsafe { libc::setsockopt(fd, level, name, (&v as *const i32).cast(), 4) };
                assert_eq!(rc, 0, "setsockopt: {}", std::io::Error::last_os_error());
            }
        }
        let control_local = control_t.local_addr().unwrap();
        // C4: S's sync agent → T:P_T+3, a file streaming.
        let l = listen(&self.t, lh_t, P_T + 3);
        let mut bulk_s = connect(&self.s, addr(lh_t, P_T + 3));
        let (mut bulk_t, _) = l.accept().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let writer = std::thread::spawn(move || {
            let buf = vec![0x5au8; 64 << 10];
            while !st.load(Ordering::Relaxed) {
                if bulk_s.write_all(&buf).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        let reader = std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 << 10];
            while let Ok(n) = bulk_t.read(&mut buf) {
                if n == 0 {
                    break;
                }
            }
        });
        // C1/C2: E → T:P_T (live writes) and T:P_T+2 (FilesSync).
        for port in [P_T, P_T + 2] {
            let l = listen(&self.t, lh_t, port);
            held.push(connect(&self.e, addr(lh_t, port)));
            held.push(l.accept().unwrap().0);
        }
        // Other volumes' replicas on T, written to from S's node.
        for i in 0..others {
            let port = OTHER_FIRST + i;
            let l = listen(&self.t, lh_t, port);
            held.push(connect(&self.s, addr(lh_t, port)));
            held.push(l.accept().unwrap().0);
        }
        Rebuild {
            control_t: Some(control_t),
            control_s: Some(control_s),
            control_local,
            held,
            stop,
            threads: vec![writer, reader],
        }
    }
}

/// A running rebuild's sockets; everything closes on drop.
pub struct Rebuild {
    control_t: Option<TcpStream>,
    control_s: Option<TcpStream>,
    /// T's end of the control channel (the ephemeral port Longhorn's error names).
    pub control_local: SocketAddr,
    held: Vec<TcpStream>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Rebuild {
    /// S resets the control channel (SO_LINGER 0, close): T reads
    /// `connection reset by peer`, as in #11006 / #13905.
    pub fn source_resets_control(&mut self) {
        if let Some(s) = self.control_s.take() {
            reset_on_close(&s);
            drop(s);
        }
    }
}

impl Drop for Rebuild {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.control_t.take();
        self.control_s.take();
        for s in self.held.drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
