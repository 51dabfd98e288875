//! TLS in front of the store (issue 19, item 7): Debian's nginx, configured
//! with the server block of `docs/store-tls.md` (read from the file, so the
//! documented configuration is the tested one), terminates HTTPS with a
//! throwaway private CA in front of a real `pstack-store serve`. An envelope
//! goes in through the proxy and comes back through the query CLI; a client
//! that does not trust the CA is refused.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::sealed;

fn tool(name: &str) -> PathBuf {
    for dir in ["/usr/sbin", "/usr/bin", "/sbin", "/bin"] {
        let p = Path::new(dir).join(name);
        if p.exists() {
            return p;
        }
    }
    panic!("{name} is not installed (scripts/setup.d/60-store-tls.sh installs it)");
}

fn run(cmd: &mut Command) {
    let o = cmd.output().expect("spawn");
    assert!(
        o.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn wait_listening(port: u16, what: &str, child: &mut Child) {
    let until = Instant::now() + Duration::from_secs(15);
    while Instant::now() < until {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{what} exited before listening: {status}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{what} did not listen on {port} within 15 s");
}

/// Killed (and reaped) on drop.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            if !matches!(self.0.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The ```nginx block of docs/store-tls.md.
fn documented_server_block() -> String {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/store-tls.md"))
        .expect("docs/store-tls.md");
    let start = doc.find("```nginx\n").expect("an nginx block") + "```nginx\n".len();
    let end = start + doc[start..].find("```").expect("its end");
    doc[start..end].to_string()
}

fn make_ca_and_cert(dir: &Path) {
    let openssl = tool("openssl");
    run(Command::new(&openssl)
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ])
        .args([
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=pstack-test-ca",
        ])
        .current_dir(dir));
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1,DNS:store.example\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    run(Command::new(&openssl)
        .args([
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ])
        .args([
            "-keyout",
            "privkey.pem",
            "-out",
            "server.csr",
            "-subj",
            "/CN=store.example",
        ])
        .current_dir(dir));
    run(Command::new(&openssl)
        .args([
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
        ])
        .args([
            "-CAcreateserial",
            "-out",
            "fullchain.pem",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
        ])
        .current_dir(dir));
}

#[test]
fn root_https_through_the_documented_nginx_proxy() {
    let nginx = tool("nginx");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // nginx's workers run as nobody: they traverse the directory.
    std::fs::set_permissions(d, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    make_ca_and_cert(d);

    let db = d.join("s.db");
    let store_bin = env!("CARGO_BIN_EXE_pstack-store");
    let o = Command::new(store_bin)
        .arg("--db")
        .arg(&db)
        .args(["keys", "create", "--name", "tls", "--scope", "ingest,read"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let key = String::from_utf8(o.stdout).unwrap().trim().to_string();
    std::fs::write(d.join("key"), format!("{key}\n")).unwrap();

    let store_port = free_port();
    let tls_port = free_port();
    let mut store = Command::new(store_bin)
        .arg("--db")
        .arg(&db)
        .args(["serve", "--listen", &format!("127.0.0.1:{store_port}")])
        // The name MCP clients use through the proxy (issue 28).
        .args(["--public-url", &format!("https://store.example:{tls_port}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_listening(store_port, "pstack-store", &mut store);
    let _store = Reaped(store);

    let block = documented_server_block()
        .replace(
            "listen 7443 ssl;",
            &format!("listen 127.0.0.1:{tls_port} ssl;"),
        )
        .replace("/etc/pstack-store/tls/", &format!("{}/", d.display()))
        .replace("127.0.0.1:7470", &format!("127.0.0.1:{store_port}"));
    assert!(
        block.contains(&format!("127.0.0.1:{tls_port} ssl")),
        "{block}"
    );
    let p = d.display();
    let conf = format!(
        "daemon off;\nuser nobody nogroup;\nworker_processes 1;\npid {p}/nginx.pid;\nerror_log {p}/error.log;\n\
         events {{ worker_connections 64; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {p}/body;\n  proxy_temp_path {p}/proxy;\n\
         fastcgi_temp_path {p}/fastcgi;\n  uwsgi_temp_path {p}/uwsgi;\n  scgi_temp_path {p}/scgi;\n{block}\n}}\n"
    );
    std::fs::write(d.join("nginx.conf"), conf).unwrap();
    run(Command::new(&nginx)
        .args(["-t", "-p"])
        .arg(d)
        .arg("-c")
        .arg(d.join("nginx.conf"))
        .arg("-e")
        .arg(d.join("error.log")));
    let mut proxy = Command::new(&nginx)
        .arg("-p")
        .arg(d)
        .arg("-c")
        .arg(d.join("nginx.conf"))
        .arg("-e")
        .arg(d.join("error.log"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_listening(tls_port, "nginx", &mut proxy);
    let _proxy = Reaped(proxy);
    let url = format!("https://127.0.0.1:{tls_port}");

    // Ship one envelope through the proxy over HTTPS (as pstackd's shipper does).
    let (digest, bytes) = sealed("node-tls", 77, 1);
    let ca = std::fs::read(d.join("ca.pem")).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let status = runtime.block_on(async {
        let client = reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
            .build()
            .unwrap();
        client
            .post(format!("{url}/v1/envelopes"))
            .bearer_auth(&key)
            .header("content-type", "application/json")
            .body(bytes.clone())
            .send()
            .await
            .expect("POST through the proxy")
            .status()
    });
    assert!(status.is_success(), "{status}");

    // Read it back with the query CLI over HTTPS, trusting the private CA.
    let get = |extra: &[&str]| {
        Command::new(store_bin)
            .args(["envelopes", "get", &digest, "--url", &url, "--api-key-file"])
            .arg(d.join("key"))
            .args(extra)
            .env_remove("PSTACK_STORE_CA_CERT")
            .output()
            .unwrap()
    };
    let ca_path = d.join("ca.pem");
    let o = get(&["--ca-cert", ca_path.to_str().unwrap()]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let mut expected = bytes.clone();
    expected.push(b'\n');
    assert_eq!(o.stdout, expected, "the exact bytes shipped");

    // Without the CA the certificate is refused, and the operator is told why.
    let o = get(&[]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr).to_lowercase();
    assert!(err.contains("certificate"), "{err}");

    // Regression (issue 28): an MCP session through the proxy. nginx
    // forwards `Host: store.example` ($host, no port), which /mcp refused
    // with 403 until serve learned its public URL.
    let (init, listed) = runtime.block_on(async {
        let client = reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
            .resolve(
                "store.example",
                std::net::SocketAddr::from(([127, 0, 0, 1], tls_port)),
            )
            .build()
            .unwrap();
        let mcp = format!("https://store.example:{tls_port}/mcp");
        let send = |session: Option<&str>, body: serde_json::Value| {
            let mut req = client
                .post(&mcp)
                .bearer_auth(&key)
                .header("accept", "application/json, text/event-stream")
                .json(&body);
            if let Some(id) = session {
                req = req
                    .header("mcp-session-id", id)
                    .header("mcp-protocol-version", "2025-03-26");
            }
            req.send()
        };
        let init = send(
            None,
            serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-03-26", "capabilities": {},
                "clientInfo": {"name": "tls-proxy-test", "version": "1"}}}),
        )
        .await
        .expect("MCP initialize through the proxy");
        let status = init.status();
        let session = init
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let head = format!(
            "{status} {session:?} {}",
            init.text().await.unwrap_or_default()
        );
        let Some(session) = session else {
            return (head, String::new());
        };
        let initialized =
            serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let r = send(Some(&session), initialized).await.unwrap();
        assert_eq!(r.status().as_u16(), 202);
        let list = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
        let r = send(Some(&session), list).await.unwrap();
        (head, r.text().await.unwrap_or_default())
    });
    assert!(init.starts_with("200 OK Some("), "{init}");
    assert!(listed.contains("\"list_incidents\""), "{listed}");
}
