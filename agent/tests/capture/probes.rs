//! Messages that are true (issue 19, item 6): every `pstackctl` command an
//! envelope names as a probe parses with `pstackctl`'s own parser (the
//! example envelope once suggested a flag that did not exist), and root
//! refused by the kernel inside a user namespace is told that, not "run as
//! root".

use std::process::Command;

use clap::Parser;
use pstackctl::cli::Cli;

use crate::fixtures::{Freezer, Proc, capture_pid, wait_state};

/// Split a shell word list (single and double quotes; no expansions needed).
fn shell_words(text: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    for c in text.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            (None, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

/// The `pstackctl ...` commands inside a probe (a probe may be a pipeline,
/// carry `sudo`, a trailing `# comment` or an alternative in parentheses).
fn pstackctl_commands(probe: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut rest = probe;
    while let Some(at) = rest.find("pstackctl ") {
        let tail = &rest[at..];
        let end = tail.find(['|', ';', '(', '#', '`']).unwrap_or(tail.len());
        let words = shell_words(&tail[..end]);
        let words: Vec<String> = words
            .into_iter()
            .take_while(|w| !matches!(w.as_str(), "during" | "then" | "&&"))
            .collect();
        out.push(words);
        rest = &tail[end..];
    }
    out
}

fn assert_parses(probe: &str) -> usize {
    let commands = pstackctl_commands(probe);
    for words in &commands {
        if let Err(e) = Cli::try_parse_from(words) {
            panic!(
                "probe {probe:?}: `{}` does not parse:\n{e}",
                words.join(" ")
            );
        }
    }
    commands.len()
}

#[test]
fn every_probe_the_code_emits_parses() {
    let mut parsed = 0;
    for probe in pstack_capture::probes::samples() {
        assert_eq!(assert_parses(&probe), 1, "{probe}");
        parsed += 1;
    }
    for u in pstack_envelope::example::example_sealed().unknowns {
        parsed += assert_parses(&u.probe);
    }
    assert!(parsed > 20, "{parsed}");
}

/// Probes of real envelopes: a task frozen into D as root, and a capture as
/// nobody whose surfaces and eBPF window are denied.
#[test]
fn root_probes_of_real_envelopes_parse() {
    let freezer = Freezer::new("probes")
        .expect("cgroup-v1 freezer at /sys/fs/cgroup/freezer (scripts/setup.d mounts it)");
    let p = Proc::spawn("sleep", &["1000"]);
    assert!(wait_state(p.pid(), 'S'));
    freezer.add(p.pid());
    freezer.freeze();
    assert!(wait_state(p.pid(), 'D'));
    let env = capture_pid(p.pid());
    let mut probes: Vec<String> = env.unknowns.iter().map(|u| u.probe.clone()).collect();
    drop(freezer);

    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let out = dir.path().join("nobody.json");
    let mut own = Command::new("sleep");
    own.arg("1000");
    std::os::unix::process::CommandExt::uid(&mut own, 65534);
    std::os::unix::process::CommandExt::gid(&mut own, 65534);
    let own = Proc(own.spawn().unwrap());
    assert!(wait_state(own.pid(), 'S'));
    let pid = own.pid().to_string();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pstackctl"));
    cmd.args(["capture", "--pid", &pid, "--window", "200ms", "-o"])
        .arg(&out)
        .current_dir(dir.path())
        .env("PSTACK_LEAK_JOURNAL", dir.path().join("leaks.jsonl"))
        .env("PSTACKD_SOCKET", dir.path().join("no-daemon.sock"));
    std::os::unix::process::CommandExt::uid(&mut cmd, 65534);
    std::os::unix::process::CommandExt::gid(&mut cmd, 65534);
    let o = cmd.output().unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let denied = pstack_envelope::verify(&std::fs::read(&out).unwrap()).unwrap();
    probes.extend(denied.unknowns.iter().map(|u| u.probe.clone()));
    let commands: usize = probes.iter().map(|p| assert_parses(p)).sum();
    assert!(commands >= 2, "{probes:#?}");
    assert!(
        denied
            .unknowns
            .iter()
            .any(|u| u.probe.starts_with("sudo pstackctl")),
        "nobody is told to use sudo: {:#?}",
        denied.unknowns
    );
}

/// No module but `probes` writes a `pstackctl <subcommand> --flag` string by hand.
#[test]
fn probes_are_built_only_in_the_probes_module() {
    // The CLI and daemon sources, and the engines in pstack-capture.
    let roots = [
        concat!(env!("CARGO_MANIFEST_DIR"), "/src"),
        concat!(env!("CARGO_MANIFEST_DIR"), "/daemon/src"),
        concat!(env!("CARGO_MANIFEST_DIR"), "/ctl/src"),
        concat!(env!("CARGO_MANIFEST_DIR"), "/api/src"),
        concat!(env!("CARGO_MANIFEST_DIR"), "/../capture/src"),
    ];
    let mut strays = Vec::new();
    let mut stack: Vec<std::path::PathBuf> = roots.iter().map(std::path::PathBuf::from).collect();
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") || path.ends_with("probes.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for (n, line) in text.lines().enumerate() {
                let code = line.trim_start();
                if code.starts_with("//") {
                    continue;
                }
                for sub in ["capture", "trace", "envelope", "status"] {
                    let needle = format!("pstackctl {sub} ");
                    if let Some(at) = code.find(&needle) {
                        let after = &code[at + needle.len()..];
                        let next = after.split_whitespace().next().unwrap_or("");
                        let next = if next == "tcp" {
                            after.split_whitespace().nth(1).unwrap_or("")
                        } else {
                            next
                        };
                        if next.starts_with("--") {
                            strays.push(format!("{}:{}: {code}", path.display(), n + 1));
                        }
                    }
                }
            }
        }
    }
    assert!(
        strays.is_empty(),
        "probe strings outside probes.rs:\n{}",
        strays.join("\n")
    );
}

/// Issue 19: root capturing PID 1 from inside a container was told to "run
/// as root". A user namespace (`unshare --user --map-root-user`) is such a
/// root: uid 0, full capabilities, none over the host's processes.
#[test]
fn root_in_a_user_namespace_is_told_the_kernel_refused() {
    let dir = tempfile::tempdir().unwrap();
    let o = Command::new("unshare")
        .args(["--user", "--map-root-user"])
        .arg(env!("CARGO_BIN_EXE_pstackctl"))
        .args(["capture", "--one-shot", "--pid", "1"])
        .current_dir(dir.path())
        .env("PSTACK_LEAK_JOURNAL", dir.path().join("leaks.jsonl"))
        .output()
        .expect("unshare (util-linux) runs");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("permission denied"), "{err}");
    assert!(!err.contains("run as root"), "{err}");
    assert!(err.contains("although this process is root"), "{err}");
    assert!(err.contains("user namespace"), "{err}");

    let o = Command::new("unshare")
        .args(["--user", "--map-root-user"])
        .arg(env!("CARGO_BIN_EXE_pstackctl"))
        .args(["trace", "tcp", "--window", "100ms"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(4), "{err}");
    assert!(!err.contains("run it as root"), "{err}");
    assert!(err.contains("user namespace"), "{err}");
}
