//! A collector contract server: the store's `POST /v1/envelopes` contract
//! (bearer key, gzip JSON array, per-item results with `accepted` /
//! `duplicate` / `rejected`) over real TCP on 127.0.0.1, with injectable
//! faults. It verifies every item it receives with `pstack_envelope::verify`
//! and counts anything that does not verify as torn.

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::value::RawValue;

use super::common::API_KEY;

/// A fault applied to one request.
#[derive(Debug, Clone)]
pub enum Fault {
    /// Answer this status (with an optional Retry-After) and store nothing.
    Status(u16, Option<&'static str>),
    /// Read the request, then answer nothing for this long.
    Hang(Duration),
    /// Read the headers and part of the body, then reset the connection.
    ResetMidBody,
    /// Store everything except: reject these indices, and give no result
    /// for the last item.
    Partial { reject: Vec<usize>, omit_last: bool },
}

#[derive(Debug, Default)]
pub struct Record {
    /// Stored digests and how many times each arrived (1 + duplicates).
    pub arrivals: HashMap<String, u64>,
    /// Items that did not verify.
    pub torn: u64,
    /// Requests seen (time, fault label).
    pub requests: Vec<(Instant, &'static str)>,
    /// Requests with a wrong or missing bearer key.
    pub bad_auth: u64,
}

#[derive(Debug)]
pub struct Collector {
    pub addr: SocketAddr,
    pub faults: Arc<Mutex<VecDeque<Fault>>>,
    pub record: Arc<Mutex<Record>>,
    stop: Arc<AtomicBool>,
}

impl Collector {
    /// A free loopback port for a collector started later. It is picked below
    /// the kernel's ephemeral range, so neither `bind(:0)` nor the daemon's own
    /// outgoing connections can take it while nothing listens on it.
    pub fn reserve_port() -> SocketAddr {
        use std::sync::atomic::AtomicU32;
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let seed = std::process::id().wrapping_mul(2_654_435_761)
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos();
        for _ in 0..1000 {
            let n = seed.wrapping_add(NEXT.fetch_add(7919, Ordering::Relaxed));
            let addr = SocketAddr::from(([127, 0, 0, 1], 20_000 + (n % 12_000) as u16));
            // Never the same port twice in this process: two tests that
            // reserved one port before either listened would ship to each
            // other's collector (seen once: 9,800 of 10,000 arrived).
            if TcpListener::bind(addr).is_ok() && handed_out().lock().unwrap().insert(addr.port()) {
                return addr;
            }
        }
        panic!("no free loopback port in 20000..32000");
    }

    pub fn start() -> Collector {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind collector");
        Collector::serve(listener, None)
    }

    pub fn start_on(addr: SocketAddr) -> Collector {
        Collector::start_with(addr, None)
    }

    /// A collector speaking TLS (rustls) with this certificate chain and key.
    pub fn start_tls(cert_pem: &std::path::Path, key_pem: &std::path::Path) -> Collector {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert_pem)
            .unwrap()
            .map(|c| c.unwrap())
            .collect();
        let key = PrivateKeyDer::from_pem_file(key_pem).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind collector");
        Collector::serve(listener, Some(Arc::new(config)))
    }

    fn start_with(addr: SocketAddr, tls: Option<Arc<rustls::ServerConfig>>) -> Collector {
        let listener = TcpListener::bind(addr).expect("bind collector");
        Collector::serve(listener, tls)
    }

    fn serve(listener: TcpListener, tls: Option<Arc<rustls::ServerConfig>>) -> Collector {
        let c = Collector {
            addr: listener.local_addr().unwrap(),
            faults: Arc::default(),
            record: Arc::default(),
            stop: Arc::default(),
        };
        let (faults, record, stop) = (c.faults.clone(), c.record.clone(), c.stop.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                let (faults, record, stop) = (faults.clone(), record.clone(), stop.clone());
                let tls = tls.clone();
                std::thread::spawn(move || match tls {
                    None => {
                        let raw = stream.try_clone().ok();
                        serve(stream, raw, faults, record, stop)
                    }
                    Some(config) => {
                        let Ok(conn) = rustls::ServerConnection::new(config) else {
                            return;
                        };
                        let tls = rustls::StreamOwned::new(conn, stream);
                        serve(tls, None, faults, record, stop)
                    }
                });
            }
        });
        c
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn push(&self, f: Fault) {
        self.faults.lock().unwrap().push_back(f);
    }

    pub fn stored(&self) -> usize {
        self.record.lock().unwrap().arrivals.len()
    }

    pub fn torn(&self) -> u64 {
        self.record.lock().unwrap().torn
    }

    pub fn duplicates(&self) -> u64 {
        self.record
            .lock()
            .unwrap()
            .arrivals
            .values()
            .map(|n| n - 1)
            .sum()
    }

    /// Every digest that arrived (each once, however often it was sent).
    pub fn arrived(&self) -> std::collections::HashSet<String> {
        self.record
            .lock()
            .unwrap()
            .arrivals
            .keys()
            .cloned()
            .collect()
    }

    pub fn has(&self, digest: &str) -> bool {
        self.record.lock().unwrap().arrivals.contains_key(digest)
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

fn serve<S: Read + Write>(
    stream: S,
    raw: Option<TcpStream>,
    faults: Arc<Mutex<VecDeque<Fault>>>,
    record: Arc<Mutex<Record>>,
    stop: Arc<AtomicBool>,
) {
    let mut reader = BufReader::new(stream);
    loop {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        // Request line and headers.
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut headers: Vec<(String, String)> = Vec::new();
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
            }
        }
        let header = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
        let len: usize = header("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let fault = faults.lock().unwrap().pop_front();
        if let Some(Fault::ResetMidBody) = fault {
            let mut part = vec![0u8; len / 2];
            let _ = reader.read_exact(&mut part);
            record
                .lock()
                .unwrap()
                .requests
                .push((Instant::now(), "reset"));
            if let Some(raw) = &raw {
                linger_zero(raw);
            }
            return;
        }
        let mut body = vec![0u8; len];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        if !line.starts_with("POST /v1/envelopes ") {
            respond(&mut Out(&mut reader), 404, None, b"{}");
            continue;
        }
        if header("authorization").as_deref() != Some(&format!("Bearer {API_KEY}")) {
            record.lock().unwrap().bad_auth += 1;
            respond(
                &mut Out(&mut reader),
                401,
                None,
                br#"{"error":{"code":"unknown_api_key"}}"#,
            );
            continue;
        }
        match fault {
            Some(Fault::Status(code, ra)) => {
                record
                    .lock()
                    .unwrap()
                    .requests
                    .push((Instant::now(), "status"));
                respond(
                    &mut Out(&mut reader),
                    code,
                    ra,
                    br#"{"error":{"code":"injected"}}"#,
                );
                continue;
            }
            Some(Fault::Hang(d)) => {
                record
                    .lock()
                    .unwrap()
                    .requests
                    .push((Instant::now(), "hang"));
                std::thread::sleep(d);
                return;
            }
            _ => {}
        }
        let decoded = if header("content-encoding").as_deref() == Some("gzip") {
            let mut d = Vec::new();
            if flate2::read::GzDecoder::new(body.as_slice())
                .read_to_end(&mut d)
                .is_err()
            {
                respond(
                    &mut Out(&mut reader),
                    400,
                    None,
                    br#"{"error":{"code":"malformed_gzip"}}"#,
                );
                continue;
            }
            d
        } else {
            body
        };
        let Ok(items) = serde_json::from_slice::<Vec<&RawValue>>(&decoded) else {
            respond(
                &mut Out(&mut reader),
                400,
                None,
                br#"{"error":{"code":"malformed_batch"}}"#,
            );
            continue;
        };
        let (reject, omit_last) = match &fault {
            Some(Fault::Partial { reject, omit_last }) => (reject.clone(), *omit_last),
            _ => (Vec::new(), false),
        };
        let mut results = Vec::new();
        let (mut a, mut dup, mut rej) = (0, 0, 0);
        let mut rec = record.lock().unwrap();
        rec.requests.push((
            Instant::now(),
            if fault.is_some() { "partial" } else { "ok" },
        ));
        for (i, item) in items.iter().enumerate() {
            if omit_last && i + 1 == items.len() {
                continue;
            }
            match pstack_testkit::verify(item.get().as_bytes()) {
                Ok(env) if !reject.contains(&i) => {
                    let n = rec.arrivals.entry(env.digest.clone()).or_insert(0);
                    *n += 1;
                    let status = if *n == 1 {
                        a += 1;
                        "accepted"
                    } else {
                        dup += 1;
                        "duplicate"
                    };
                    results.push(
                        serde_json::json!({"index": i, "digest": env.digest, "status": status}),
                    );
                }
                Ok(env) => {
                    rej += 1;
                    results.push(
                        serde_json::json!({"index": i, "digest": env.digest, "status": "rejected",
                        "reasons": [{"rule": "injected", "message": "rejected by the test"}]}),
                    );
                }
                Err(_) => {
                    rec.torn += 1;
                    rej += 1;
                    results.push(
                        serde_json::json!({"index": i, "digest": null, "status": "rejected"}),
                    );
                }
            }
        }
        drop(rec);
        let body = serde_json::to_vec(&serde_json::json!({
            "accepted": a, "duplicate": dup, "rejected": rej, "results": results
        }))
        .unwrap();
        respond(&mut Out(&mut reader), 200, None, &body);
    }
}

/// Writes go to the stream under the reader's buffer.
struct Out<'a, S>(&'a mut BufReader<S>);

impl<S: Read + Write> Write for Out<'_, S> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.get_mut().write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.get_mut().flush()
    }
}

fn respond(out: &mut impl Write, code: u16, retry_after: Option<&str>, body: &[u8]) {
    let mut head = format!(
        "HTTP/1.1 {code} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
        body.len()
    );
    if let Some(ra) = retry_after {
        head.push_str(&format!("retry-after: {ra}\r\n"));
    }
    head.push_str("\r\n");
    let _ = out.write_all(head.as_bytes());
    let _ = out.write_all(body);
    let _ = out.flush();
}

/// Set SO_LINGER {1, 0} so that close sends RST.
fn linger_zero(s: &TcpStream) {
    use std::os::fd::AsRawFd;
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt on a socket fd we own, with a properly sized linger struct.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&l as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

/// Ports `Collector::reserve_port` has handed out in this test process.
fn handed_out() -> &'static std::sync::Mutex<std::collections::HashSet<u16>> {
    static PORTS: std::sync::OnceLock<std::sync::Mutex<std::collections::HashSet<u16>>> =
        std::sync::OnceLock::new();
    PORTS.get_or_init(Default::default)
}
