//! Risky reads never run in the agent's own process: no source file of the
//! agent calls a risky procfs reader (they exist only for `pstack-helper`).
//! The runtime side of the same rule is `fuse_hang`: a capture whose subject
//! holds an fd into a hung FUSE mount still returns.

use std::path::Path;

/// The readers of `pstack_collectors::procfs::read` that can block on the
/// task being diagnosed (see `procfs::RISKY`).
const RISKY_READERS: [&str; 7] = [
    "read_wchan",
    "read_stack",
    "read_syscall",
    "read_cmdline",
    "read_environ",
    "read_fd_targets",
    "read_thread_wchans",
];

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_agent_source_calls_a_risky_reader() {
    // The agent's sources: the binaries, the daemon, the CLI and the wire crate.
    let agent = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["src", "daemon/src", "ctl/src", "api/src"] {
        let before = files.len();
        rust_files(&agent.join(dir), &mut files);
        assert!(files.len() > before, "no source under agent/{dir}");
    }
    assert!(files.len() > 5, "found only {files:?}");
    let mut offenders = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for reader in RISKY_READERS {
            if text.contains(reader) {
                offenders.push(format!("{} calls {reader}", f.display()));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "risky reads must go through pstack-helper: {offenders:?}"
    );
    // Every name listed is a real reader (a renamed reader must be renamed here too).
    let read_rs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../collectors/src/procfs/read.rs");
    let readers = std::fs::read_to_string(read_rs).unwrap();
    for reader in RISKY_READERS {
        assert!(
            readers.contains(&format!("pub fn {reader}(")),
            "{reader} is not in procfs::read"
        );
    }
}
