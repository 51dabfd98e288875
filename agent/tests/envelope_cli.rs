//! `pstackctl envelope verify|diff|handoff` as an operator runs them: real
//! binary, real files, exit codes and messages.

use std::path::PathBuf;
use std::process::{Command, Output};

fn pstackctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pstackctl"))
        .args(args)
        .output()
        .expect("run pstackctl")
}

fn example(name: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .join(name);
    p.to_string_lossy().into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn shipped_example_is_the_builtin_example_and_verifies() {
    let o = pstackctl(&[
        "envelope",
        "verify",
        &example("process-d-state.envelope.json"),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    let text = stdout(&o);
    assert!(text.contains("valid") && text.contains("partial"), "{text}");
    let shipped = std::fs::read(example("process-d-state.envelope.json")).unwrap();
    assert_eq!(
        shipped,
        pstack_envelope::example::example_sealed().to_json_pretty(),
        "examples/ is stale: regenerate with the print_example example"
    );
}

#[test]
fn tampered_file_exits_1_and_names_the_reason() {
    let o = pstackctl(&["envelope", "verify", &example("tampered.envelope.json")]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stdout(&o).contains("[bad_digest]"), "{}", stdout(&o));
    let o = pstackctl(&[
        "envelope",
        "verify",
        "--json",
        &example("tampered.envelope.json"),
    ]);
    assert_eq!(o.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["valid"], false);
    assert_eq!(report["errors"][0]["rule"], "bad_digest");
}

#[test]
fn stdin_dash_is_read() {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_pstackctl"))
        .args(["envelope", "verify", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(&std::fs::read(example("process-d-state.envelope.json")).unwrap())
        .unwrap();
    assert_eq!(child.wait_with_output().unwrap().status.code(), Some(0));
}

#[test]
fn io_and_usage_errors_exit_2() {
    assert_eq!(
        pstackctl(&["envelope", "verify", "/nonexistent/x.json"])
            .status
            .code(),
        Some(2)
    );
    assert_eq!(pstackctl(&["envelope", "verify"]).status.code(), Some(2));
    assert_eq!(
        pstackctl(&["envelope", "frobnicate"]).status.code(),
        Some(2)
    );
    assert_eq!(pstackctl(&["--help"]).status.code(), Some(0));
}

#[test]
fn garbage_input_is_invalid_not_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let deep = "[".repeat(100_000);
    for (name, bytes) in [
        ("empty", &b""[..]),
        ("binary", &b"\xff\x00\xfe"[..]),
        ("deep", deep.as_bytes()),
    ] {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        let o = pstackctl(&["envelope", "verify", p.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(1), "{name}: {}", stdout(&o));
    }
}

#[test]
fn diff_and_handoff() {
    let ex = example("process-d-state.envelope.json");
    let o = pstackctl(&["envelope", "diff", &ex, &ex]);
    assert_eq!(o.status.code(), Some(0));
    assert!(stdout(&o).contains("no change"));
    let o1 = pstackctl(&["envelope", "diff", "--json", &ex, &ex]);
    let o2 = pstackctl(&["envelope", "diff", "--json", &ex, &ex]);
    assert_eq!(o1.stdout, o2.stdout, "diff output is deterministic");

    // A different subject is refused with exit 1.
    let dir = tempfile::tempdir().unwrap();
    let mut other = pstack_envelope::example::example_unsealed();
    if let pstack_envelope::Subject::Process(p) = &mut other.subject {
        p.pid = 1;
    }
    let other_path = dir.path().join("other.json");
    std::fs::write(&other_path, other.seal().unwrap().to_json_pretty()).unwrap();
    let o = pstackctl(&["envelope", "diff", &ex, other_path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stdout(&o).contains("subject_mismatch"), "{}", stdout(&o));

    let o = pstackctl(&["envelope", "handoff", &ex]);
    assert_eq!(o.status.code(), Some(0));
    let text = stdout(&o);
    assert!(
        text.contains("frontier: surface task/4243/stack (timeout)"),
        "{text}"
    );
    assert!(
        text.contains("probe: pstackctl capture --tid 4243"),
        "{text}"
    );
    let o = pstackctl(&["envelope", "handoff", "--json", &ex]);
    let h: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(h["next_transition"]["action"], "CAPTURE_AGAIN");
}

/// The example envelopes' digests recomputed outside the crate: Python's json module
/// canonicalizes (envelope/tests/oracles/jcs_canonical.py) and coreutils' `sha256sum`
/// hashes. The shipped example's declared digest must match; the tampered one's must not.
#[test]
fn example_digests_agree_with_a_canonicalizer_and_hash_outside_the_crate() {
    pstack_testkit::require!(
        pstack_testkit::have_tool("python3") && pstack_testkit::have_tool("sha256sum"),
        "python3 and sha256sum are needed (scripts/setup.d/60-oracles.sh)"
    );
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../envelope/tests/oracles/jcs_canonical.py");
    let outside_digest = |name: &str| -> String {
        let o = Command::new("bash")
            .arg("-c")
            .arg("set -o pipefail; python3 \"$0\" \"$1\" | sha256sum")
            .arg(&script)
            .arg(example(name))
            .output()
            .expect("bash");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let hex = stdout(&o)
            .split_whitespace()
            .next()
            .unwrap_or("")
            .to_string();
        assert_eq!(hex.len(), 64, "sha256sum printed {:?}", stdout(&o));
        format!("sha256:{hex}")
    };
    let declared = |name: &str| -> String {
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(example(name)).unwrap()).unwrap();
        v["digest"].as_str().unwrap().to_string()
    };
    let good = "process-d-state.envelope.json";
    assert_eq!(outside_digest(good), declared(good));
    let bad = "tampered.envelope.json";
    assert_ne!(
        outside_digest(bad),
        declared(bad),
        "the tampered example must not verify"
    );
}
