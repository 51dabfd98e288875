//! Output as operators expect (issue 19, item 1), each with the command that
//! went wrong: `--json` and `-o -` write to stdout and nothing else; no file
//! appears in the current directory unless asked (a read-only one is fine);
//! a closed pipe ends every command quietly; rows fit the terminal with an
//! ellipsis; `NO_COLOR` and non-terminals get no escape codes.

use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;
use std::process::{Command, Output, Stdio};

use pstack_envelope::Subject;

use crate::bad_input::{no_panic, pstackctl};
use crate::fixtures::{Freezer, Proc, wait_state};

fn subject_pid(env: &pstack_envelope::Envelope) -> Option<u32> {
    match &env.subject {
        Subject::Process(p) => Some(p.pid),
        _ => None,
    }
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "leaks.jsonl")
        .collect();
    names.sort();
    names
}

fn ok(o: &Output) {
    no_panic(o);
    assert_eq!(
        o.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// `cd /proc && pstackctl capture --pid $$ --json`: the JSON is printed,
/// nothing is written (the directory is read-only).
#[test]
fn json_in_a_read_only_cwd_prints_the_envelope_and_writes_nothing() {
    let p = Proc::spawn("sleep", &["1000"]);
    let scratch = tempfile::tempdir().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_pstackctl"))
        .args(["capture", "--pid", &p.pid().to_string(), "--json"])
        .current_dir("/proc")
        .env("PSTACK_LEAK_JOURNAL", scratch.path().join("leaks.jsonl"))
        .env("PSTACKD_SOCKET", scratch.path().join("no-daemon.sock"))
        .env_remove("PSTACK_OUT_DIR")
        .output()
        .unwrap();
    ok(&o);
    let env = pstack_envelope::verify(&o.stdout).expect("stdout is exactly one envelope");
    assert_eq!(subject_pid(&env), Some(p.pid()));
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains("cannot write"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// `-o -` is stdout: the compact envelope and nothing else; no file named `-`.
#[test]
fn dash_o_dash_is_stdout_only() {
    let p = Proc::spawn("sleep", &["1000"]);
    let dir = tempfile::tempdir().unwrap();
    let o = pstackctl(&["--pid", &p.pid().to_string(), "-o", "-"], dir.path());
    ok(&o);
    let env = pstack_envelope::verify(&o.stdout).expect("stdout is exactly one envelope");
    assert_eq!(o.stdout.iter().filter(|b| **b == b'\n').count(), 1);
    assert_eq!(o.stdout.last(), Some(&b'\n'));
    assert_eq!(subject_pid(&env), Some(p.pid()));
    assert_eq!(files_in(dir.path()), Vec::<String>::new());
}

/// The summary alone writes nothing into the current directory; the file
/// appears only with -o or a configured --out-dir / PSTACK_OUT_DIR.
#[test]
fn the_envelope_file_is_written_only_when_asked() {
    let p = Proc::spawn("sleep", &["1000"]);
    let pid = p.pid().to_string();
    let dir = tempfile::tempdir().unwrap();
    let o = pstackctl(&["--pid", &pid], dir.path());
    ok(&o);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("written:      nowhere"), "{text}");
    assert_eq!(files_in(dir.path()), Vec::<String>::new());

    let kept = dir.path().join("evidence");
    std::fs::create_dir(&kept).unwrap();
    let o = pstackctl(
        &["--pid", &pid, "--out-dir", kept.to_str().unwrap()],
        dir.path(),
    );
    ok(&o);
    let names = files_in(&kept);
    assert_eq!(names.len(), 1, "{names:?}");
    let env = pstack_envelope::verify(&std::fs::read(kept.join(&names[0])).unwrap()).unwrap();
    assert_eq!(names[0], format!("{}.json", env.digest.replace(':', "-")));
    assert!(String::from_utf8_lossy(&o.stdout).contains(&names[0]));

    let o = Command::new(env!("CARGO_BIN_EXE_pstackctl"))
        .args(["capture", "--pid", &pid, "--json"])
        .current_dir(dir.path())
        .env("PSTACK_LEAK_JOURNAL", dir.path().join("leaks.jsonl"))
        .env("PSTACKD_SOCKET", dir.path().join("no-daemon.sock"))
        .env("PSTACK_OUT_DIR", &kept)
        .output()
        .unwrap();
    ok(&o);
    pstack_envelope::verify(&o.stdout).unwrap();
    assert_eq!(
        files_in(&kept).len(),
        2,
        "the configured directory keeps it"
    );
    assert_eq!(files_in(dir.path()), vec!["evidence".to_string()]);
}

/// A pipe whose reader is already gone.
fn closed_pipe() -> OwnedFd {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two descriptors into the live array.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both descriptors are fresh and owned here; the reader is closed at once.
    let (reader, writer) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(reader);
    writer
}

/// `pstackctl envelope verify FILE | true` and every other printing command:
/// exit 0, no panic, nothing on stderr.
#[test]
fn a_closed_pipe_ends_every_command_quietly() {
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/process-d-state.envelope.json"
    );
    let tampered = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/tampered.envelope.json"
    );
    let p = Proc::spawn("sleep", &["1000"]);
    let pid = p.pid().to_string();
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<(Vec<&str>, i32)> = vec![
        (vec!["envelope", "verify", example], 0),
        (vec!["envelope", "verify", "--json", example], 0),
        (vec!["envelope", "handoff", example], 0),
        (vec!["envelope", "diff", example, example], 0),
        (vec!["--help"], 0),
        (vec!["capture", "--help"], 0),
        (vec!["capture", "--pid", &pid], 0),
        (vec!["capture", "--pid", &pid, "--json"], 0),
        (vec!["capture", "--pid", &pid, "-o", "-"], 0),
        (vec!["capture", "--host"], 0),
        // The verdict's exit code is printed to stdout; the pipe ends it first.
        (vec!["envelope", "verify", tampered], 0),
    ];
    for (args, code) in cases {
        let o = Command::new(env!("CARGO_BIN_EXE_pstackctl"))
            .args(&args)
            .current_dir(dir.path())
            .env("PSTACK_LEAK_JOURNAL", dir.path().join("leaks.jsonl"))
            .env("PSTACKD_SOCKET", dir.path().join("no-daemon.sock"))
            .env_remove("PSTACK_OUT_DIR")
            .stdout(Stdio::from(closed_pipe()))
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {err}");
        assert!(err.is_empty(), "{args:?} said: {err}");
    }
    assert_eq!(files_in(dir.path()), Vec::<String>::new());
    // pstackd prints too: its help and --check-config.
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/pstackd.toml");
    for args in [vec!["--help"], vec!["--check-config", "-c", example]] {
        let o = Command::new(env!("CARGO_BIN_EXE_pstackd"))
            .args(&args)
            .stdout(Stdio::from(closed_pipe()))
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "pstackd {args:?}: {err}");
        assert!(err.is_empty(), "pstackd {args:?} said: {err}");
    }
}

/// Run pstackctl with stdout on a pseudo-terminal of `cols` columns; what it printed.
fn on_a_terminal(args: &[&str], cols: u16, envs: &[(&str, &str)], dir: &Path) -> String {
    on_a_terminal_with(args, cols, envs, dir, false)
}

/// As [`on_a_terminal`]; with `stderr_too` stderr shares the terminal.
fn on_a_terminal_with(
    args: &[&str],
    cols: u16,
    envs: &[(&str, &str)],
    dir: &Path,
    stderr_too: bool,
) -> String {
    let (mut master, mut slave) = (0, 0);
    let ws = libc::winsize {
        ws_row: 50,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: openpty writes two descriptors; name and termios are optional (null).
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            &ws,
        )
    };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: fresh descriptors from openpty, owned here.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pstackctl"));
    cmd.args(args)
        .current_dir(dir)
        .env("PSTACK_LEAK_JOURNAL", dir.join("leaks.jsonl"))
        .env("PSTACKD_SOCKET", dir.join("no-daemon.sock"))
        .env_remove("NO_COLOR")
        .env_remove("COLUMNS")
        .env("TERM", "xterm")
        .stderr(if stderr_too {
            Stdio::from(slave.try_clone().unwrap())
        } else {
            Stdio::null()
        })
        .stdout(Stdio::from(slave));
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    drop(cmd); // the parent's copy of the slave closes, so EOF (EIO) comes at exit
    let mut file = std::fs::File::from(master);
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(_) => break, // EIO: the slave side is closed
        }
    }
    assert_eq!(child.wait().unwrap().code(), Some(0));
    String::from_utf8_lossy(&out).replace("\r\n", "\n")
}

/// A process in D (cgroup-v1 freezer): its row is marked in colour on a
/// terminal, and never with NO_COLOR or through a pipe.
#[test]
fn root_no_color_and_pipes_get_no_escape_codes() {
    let freezer = Freezer::new("no-color")
        .expect("cgroup-v1 freezer at /sys/fs/cgroup/freezer (scripts/setup.d mounts it)");
    let p = Proc::spawn("sleep", &["1000"]);
    assert!(wait_state(p.pid(), 'S'));
    freezer.add(p.pid());
    freezer.freeze();
    assert!(wait_state(p.pid(), 'D'));
    let pid = p.pid().to_string();
    let dir = tempfile::tempdir().unwrap();
    let args = ["capture", "--pid", &pid];

    let colored = on_a_terminal(&args, 200, &[], dir.path());
    assert!(
        colored.contains("\x1b["),
        "a terminal gets colour: {colored}"
    );
    let plain = on_a_terminal(&args, 200, &[("NO_COLOR", "1")], dir.path());
    assert!(!plain.contains('\x1b'), "NO_COLOR: {plain}");
    assert!(plain.contains(&format!("{pid:<9} D ")), "{plain}");
    let piped = pstackctl(&["--pid", &pid], dir.path());
    ok(&piped);
    let piped = String::from_utf8_lossy(&piped.stdout);
    assert!(!piped.contains('\x1b'), "a pipe: {piped}");
    assert!(piped.contains(&format!("{pid:<9} D ")), "{piped}");
    drop(freezer);
}

/// Rows fit the terminal (cut with an ellipsis); a pipe gets whole rows.
#[test]
fn rows_fit_the_terminal_width_with_an_ellipsis() {
    let p = Proc::spawn("sleep", &["1000"]);
    assert!(wait_state(p.pid(), 'S'));
    let pid = p.pid().to_string();
    let dir = tempfile::tempdir().unwrap();
    let narrow = on_a_terminal(
        &["capture", "--pid", &pid, "--surface", "task/*/stack"],
        60,
        &[("NO_COLOR", "1")],
        dir.path(),
    );
    let table: Vec<&str> = narrow
        .lines()
        .skip_while(|l| !l.starts_with("TID"))
        .take(2)
        .collect();
    assert_eq!(table.len(), 2, "{narrow}");
    for line in &table {
        assert!(line.chars().count() <= 60, "{line:?} is wider than 60");
    }
    assert!(
        table[1].ends_with('…'),
        "the stack column is cut: {:?}",
        table[1]
    );
    let piped = pstackctl(&["--pid", &pid, "--surface", "task/*/stack"], dir.path());
    let piped = String::from_utf8_lossy(&piped.stdout).into_owned();
    let row = piped
        .lines()
        .find(|l| l.starts_with(&pid))
        .expect("the thread's row");
    assert!(!row.ends_with('…') && row.chars().count() > 60, "{row:?}");
}

/// A window shows a countdown on a terminal's stderr, and nothing of it
/// through a pipe (stdout stays the envelope alone).
#[test]
fn root_a_window_counts_down_on_a_terminal_only() {
    let p = Proc::spawn("sleep", &["1000"]);
    let pid = p.pid().to_string();
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "capture",
        "--pid",
        &pid,
        "--window",
        "1s",
        "--surface",
        "task/*/stat",
    ];
    let seen = on_a_terminal_with(&args, 120, &[("NO_COLOR", "1")], dir.path(), true);
    assert!(seen.contains("left of 1s"), "{seen:?}");
    let o = Command::new(env!("CARGO_BIN_EXE_pstackctl"))
        .args(["capture", "--pid", &pid, "--window", "1s", "-o", "-"])
        .current_dir(dir.path())
        .env("PSTACK_LEAK_JOURNAL", dir.path().join("leaks.jsonl"))
        .env("PSTACKD_SOCKET", dir.path().join("no-daemon.sock"))
        .output()
        .unwrap();
    ok(&o);
    pstack_envelope::verify(&o.stdout).unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("left of") && !err.contains('\x1b'), "{err:?}");
}

/// `trace tcp` whose reader went away stops at the next event instead of
/// watching out its whole window, and still exits 0 quietly.
#[test]
fn root_trace_tcp_stops_when_its_reader_is_gone() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let started = std::time::Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_pstackctl"))
        .args([
            "trace",
            "tcp",
            "--window",
            "60s",
            "--port",
            &port.to_string(),
        ])
        .stdout(Stdio::from(closed_pipe()))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Connections on the port until the trace has seen one and stopped.
    while child.try_wait().unwrap().is_none() {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "trace tcp did not stop after its reader went away"
        );
        let c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (s, _) = listener.accept().unwrap();
        drop((c, s));
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        !err.contains("panicked") && !err.contains("Broken pipe"),
        "{err}"
    );
}

/// Issue 19: a long wchan (`poll_schedule_timeout.constprop.0`) pushed the
/// table's columns out of line. It is cut to its column with `…` (the full
/// name stays in the envelope), and SYSCALL starts under its header.
#[test]
fn root_a_long_wchan_keeps_the_columns_aligned() {
    let p = Proc::spawn(
        "python3",
        &["-c", "import select; select.select([], [], [], 1000)"],
    );
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let wchan = loop {
        let w = std::fs::read_to_string(format!("/proc/{}/wchan", p.pid())).unwrap_or_default();
        if w.len() > 28 || std::time::Instant::now() > until {
            break w;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(
        wchan.len() > 28,
        "need a wchan longer than its column, got {wchan:?}"
    );
    let dir = tempfile::tempdir().unwrap();
    let pid = p.pid().to_string();
    let o = pstackctl(&["--pid", &pid], dir.path());
    ok(&o);
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let header = text.lines().find(|l| l.starts_with("TID")).unwrap();
    let row = text.lines().find(|l| l.starts_with(&pid)).unwrap();
    let col = |line: &str, at: usize| line.chars().skip(at).collect::<String>();
    let syscall_at = header.find("SYSCALL").unwrap();
    let wchan_at = header.find("WCHAN").unwrap();
    let cut: String = col(row, wchan_at).chars().take(28).collect();
    assert_eq!(cut, format!("{}…", &wchan[..27]), "{row}");
    assert!(
        col(row, syscall_at).starts_with("select") || col(row, syscall_at).starts_with("pselect"),
        "{row}"
    );
    let env_o = pstackctl(&["--pid", &pid, "--json"], dir.path());
    let env = pstack_envelope::verify(&env_o.stdout).unwrap();
    let full = env
        .surfaces
        .iter()
        .find(|s| s.id == format!("task/{pid}/wchan"))
        .unwrap();
    assert_eq!(
        full.facts["wchan"],
        wchan.as_str(),
        "the envelope keeps the full name"
    );
}
