//! The operator's `pstack-store` (issue 19, item 7): the query CLI against a
//! real server over real HTTP, `serve` refusing to invent a database in the
//! current directory, and plain logs off a terminal.

use std::process::{Command, Output, Stdio};

use crate::on_both_backends;
use crate::support::{Db, Harness, sealed};

on_both_backends!(query_cli_reads_what_the_store_holds);

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_pstack-store"));
    c.env_remove("PSTACK_STORE_DB")
        .env_remove("PSTACK_STORE_API_KEY")
        .env_remove("PSTACK_STORE_URL")
        .env_remove("STATE_DIRECTORY");
    c
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Run the CLI off the test's async runtime (it blocks on the child).
async fn query(h: &Harness, key_file: &std::path::Path, args: &[&str]) -> Output {
    let mut cmd = bin();
    cmd.args(args)
        .arg("--url")
        .arg(&h.base)
        .arg("--api-key-file")
        .arg(key_file);
    tokio::task::spawn_blocking(move || cmd.output().expect("run pstack-store"))
        .await
        .expect("join")
}

async fn query_cli_reads_what_the_store_holds(db: Db) {
    let Some(h) = Harness::start(db).await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("key");
    std::fs::write(&key_file, format!("{}\n", h.key)).unwrap();
    let (digest, bytes) = sealed("node-q", 4242, 1);
    let (status, body) = h.post_raw(bytes.clone(), &[]).await;
    assert!(status.is_success(), "{body}");

    // envelopes get: the exact stored bytes.
    let o = query(&h, &key_file, &["envelopes", "get", &digest]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let mut expected = bytes.clone();
    expected.push(b'\n');
    assert_eq!(o.stdout, expected);
    let o = query(&h, &key_file, &["envelopes", "get", &digest, "--handoff"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains(&digest), "{}", stdout(&o));

    // Not found: exit 3, the store's words.
    let missing = format!("sha256:{}", "0".repeat(64));
    let o = query(&h, &key_file, &["envelopes", "get", &missing]).await;
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(stderr(&o).contains("not found"), "{}", stderr(&o));
    // A malformed digest: the store calls the query bad, exit 2.
    let o = query(&h, &key_file, &["envelopes", "get", "nope"]).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));

    // subjects history by identity, then by the key it reports.
    let o = query(
        &h,
        &key_file,
        &[
            "subjects",
            "history",
            "--kind",
            "process",
            "--id",
            "host=node-q",
            "--id",
            "pid=4242",
            "--json",
        ],
    )
    .await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let page: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(page["items"][0]["digest"], digest.as_str());
    let subject = page["items"][0]["subject_key"]
        .as_str()
        .unwrap()
        .to_string();
    let o = query(
        &h,
        &key_file,
        &["subjects", "history", "--subject", &subject],
    )
    .await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(
        text.contains("CAPTURED") && text.contains(&digest),
        "{text}"
    );
    assert!(!text.contains('\x1b'));
    let o = query(&h, &key_file, &["envelopes", "list", "--subject", &subject]).await;
    assert_eq!(stdout(&o), format!("{digest}\n"));

    // unknowns and receipts answer (a table each).
    let o = query(&h, &key_file, &["unknowns", "--all"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).starts_with("STATE"), "{}", stdout(&o));
    let o = query(&h, &key_file, &["receipts", "--subject", &subject]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).starts_with("ID"), "{}", stdout(&o));

    // A reader that is already gone: a quiet exit 0.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let mut cmd = bin();
    cmd.args([
        "envelopes",
        "get",
        &digest,
        "--url",
        &h.base,
        "--api-key-file",
    ])
    .arg(&key_file)
    .stdout(writer)
    .stderr(Stdio::piped());
    let o = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(o.stderr.is_empty(), "{}", stderr(&o));

    // A wrong key: exit 1, the key never echoed.
    std::fs::write(&key_file, "psk_0000000000000000_bad\n").unwrap();
    let o = query(&h, &key_file, &["envelopes", "get", &digest]).await;
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("refused the API key"), "{}", stderr(&o));
    assert!(!stderr(&o).contains("psk_0000000000000000_bad"));
    h.finish().await;
}

/// `pstack-store serve` with no --db used to create ./pstack-store.db.
#[test]
fn serve_without_db_never_creates_one_in_the_current_directory() {
    let cwd = tempfile::tempdir().unwrap();
    let o = bin()
        .args(["serve", "--listen", "127.0.0.1:0"])
        .current_dir(cwd.path())
        // A state directory that does not exist.
        .env("STATE_DIRECTORY", cwd.path().join("absent"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("does not exist"), "{}", stderr(&o));
    assert!(stderr(&o).contains("--db"), "{}", stderr(&o));
    assert_eq!(std::fs::read_dir(cwd.path()).unwrap().count(), 0);

    let state = tempfile::tempdir().unwrap();
    let o = bin()
        .arg("migrate")
        .current_dir(cwd.path())
        .env("STATE_DIRECTORY", state.path())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(state.path().join("pstack-store.db").exists());
    assert_eq!(std::fs::read_dir(cwd.path()).unwrap().count(), 0);
}

/// Logs written to a file (a pipe here) carry no colour escapes.
#[test]
fn logs_are_plain_off_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.db");
    let mut child = bin()
        .args(["--db"])
        .arg(&db)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut err = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        use std::io::Read;
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = err.read(&mut buf) {
            if n == 0 {
                break;
            }
            seen.extend_from_slice(&buf[..n]);
        }
        seen
    });
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let sent = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    assert!(child.wait().unwrap().success());
    let logs = String::from_utf8_lossy(&reader.join().unwrap()).into_owned();
    assert!(logs.contains("serving"), "{logs}");
    assert!(!logs.contains('\x1b'), "{logs:?}");
}
