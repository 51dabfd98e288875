//! A secret in a rewritten process title never leaves the host (issue 10):
//! `perl -e '$0="worker --token=TOKzzSECRET456"; sleep 3600'` is captured
//! through pstackd (shipped to a real `pstack-store`) and by one-shot
//! `pstackctl`; the token is then absent from the envelope, pstackctl's
//! stdout, the spool, pstackd's log, the store's database and WAL and the
//! store API's answer — every byte under the test's directory is searched.
//! And `args_digest` is keyed: hashing a guess does not reproduce it.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::collector::Collector;
use super::common::*;

const TOKEN: &str = "TOKzzSECRET456";

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn get(addr: SocketAddr, path: &str, key: &str) -> (u16, Vec<u8>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let r = reqwest::Client::new()
            .get(format!("http://{addr}{path}"))
            .bearer_auth(key)
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.bytes().await.unwrap().to_vec())
    })
}

/// Every file under `dir` (recursively) that contains `needle`.
fn files_containing(dir: &Path, needle: &[u8]) -> Vec<String> {
    let mut hits = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let p = entry.path();
            let ft = entry.file_type().unwrap();
            if ft.is_dir() {
                stack.push(p);
            } else if ft.is_file() {
                let bytes = std::fs::read(&p).unwrap_or_default();
                if bytes.windows(needle.len()).any(|w| w == needle) {
                    hits.push(p.display().to_string());
                }
            }
        }
    }
    hits
}

fn perl_with_token_title() -> Killed {
    let child = Command::new("perl")
        .args(["-e", &format!("$0=\"worker --token={TOKEN}\"; sleep 3600")])
        .spawn()
        .expect("perl (Debian: apt-get install perl-base)");
    let pid = child.id();
    wait_until(Duration::from_secs(5), "perl rewrote its title", || {
        std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|b| b.starts_with(b"worker --token="))
            .unwrap_or(false)
    });
    Killed(child)
}

#[test]
fn a_token_in_a_rewritten_title_reaches_no_output_file_store_or_api() {
    let Some(store_bin) = sibling_bin("pstack-store", "pstack-store") else {
        panic!("pstack-store could not be built (cargo build -p pstack-store)");
    };
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("store.db");
    let out = Command::new(&store_bin)
        .arg("--db")
        .arg(&db)
        .args([
            "keys",
            "create",
            "--name",
            "secrets-test",
            "--scope",
            "ingest,read",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let key = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let addr = Collector::reserve_port();
    let _store = Killed(
        Command::new(&store_bin)
            .arg("--db")
            .arg(&db)
            .args(["serve", "--listen", &addr.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let settings = Settings {
        collector_url: Some(format!("http://{addr}")),
        api_key: Some(key.clone()),
        backoff_initial_ms: 50,
        backoff_max_ms: 200,
        ..Settings::default()
    };
    let d = Daemon::start(dir.path(), &settings);
    let perl = perl_with_token_title();
    let pid = perl.0.id();

    let envelope = d.capture_pid(pid).expect("capture the perl process");
    let text = serde_json::to_string(&envelope).unwrap();
    assert!(!text.contains(TOKEN), "token in the envelope");
    // The title's program word is kept; its argument is only counted.
    assert!(text.contains("\"argv0\":\"worker\""), "{text}");

    // pstackctl through the daemon (summary and JSON) and one-shot (no
    // daemon at that socket), each with its output file in the test dir.
    let ctl = |args: &[&str]| {
        let o = Command::new(pstackctl_bin())
            .env("PSTACK_HELPER", helper_bin())
            .args(args)
            .output()
            .unwrap();
        assert!(o.status.success(), "{args:?}: {o:?}");
        [o.stdout, o.stderr].concat()
    };
    let sock = d.socket.display().to_string();
    let none = dir.path().join("no-daemon.sock").display().to_string();
    let pid_s = pid.to_string();
    let out = |n: &str| dir.path().join(n).display().to_string();
    let (out1, out2, out3, out4) = (
        out("ctl-daemon.json"),
        out("ctl-daemon-json.json"),
        out("ctl-oneshot.json"),
        out("ctl-oneshot-json.json"),
    );
    for args in [
        vec!["capture", "--pid", &pid_s, "--socket", &sock, "-o", &out1],
        vec![
            "capture", "--pid", &pid_s, "--socket", &sock, "--json", "-o", &out2,
        ],
        vec!["capture", "--pid", &pid_s, "--socket", &none, "-o", &out3],
        vec![
            "capture", "--pid", &pid_s, "--socket", &none, "--json", "-o", &out4,
        ],
    ] {
        let printed = ctl(&args);
        assert!(
            !printed.windows(TOKEN.len()).any(|w| w == TOKEN.as_bytes()),
            "token on pstackctl's output for {args:?}"
        );
    }
    for f in [&out1, &out2, &out3, &out4] {
        assert!(Path::new(f).is_file(), "{f}");
        // pstackctl -o files are created 0600 (issue 10).
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(f).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{f} mode {mode:o}");
    }

    d.wait_status(Duration::from_secs(30), "shipped to the store", |s| {
        s["spool"]["files"] == 0 && s["shipping"]["accepted_total"].as_u64() >= Some(2)
    });
    let (code, body) = get(addr, &format!("/v1/envelopes/{}", envelope.digest), &key);
    assert_eq!(code, 200);
    assert!(
        !String::from_utf8_lossy(&body).contains(TOKEN),
        "token in the API"
    );

    // The database, its WAL, the spool, pstackd's log, pstackctl's files.
    assert!(db.is_file());
    let hits = files_containing(dir.path(), TOKEN.as_bytes());
    assert!(hits.is_empty(), "token in {hits:?}");

    // A store key holder cannot confirm a guess: the digest is keyed.
    let digest = text
        .split("\"args_digest\":\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .expect("an args_digest for the title's argument")
        .to_string();
    assert!(digest.starts_with("hmac-sha256:"), "{digest}");
    let guess = format!("--token={TOKEN}");
    assert_ne!(
        &digest["hmac-sha256:".len()..],
        &pstack_envelope::sha256_digest(guess.as_bytes())["sha256:".len()..]
    );
    assert!(!text.contains(&pstack_envelope::sha256_digest(guess.as_bytes())));
}
