//! `tcp/sockopt` runs in `pstack-helper --sockopt` under its deadline: the
//! options of a socket this (root) test owns are read through the helper,
//! and a helper that stops answering is SIGKILLed at the deadline and
//! reaped, its sockets `Abandoned` (→ `timeout`), nothing leaked.

use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pstack_capture::helpers::sockopt_helper::read_sockopts;
use pstack_capture::process::{LeakBudget, LeakJournal, SupervisorConfig};
use pstack_collectors::net::sockopt::SockOptError;
use pstack_helper::sockopt::SockoptTarget;

use crate::testbed::root_or_skip;

fn config() -> SupervisorConfig {
    let mut c = SupervisorConfig::locate("pstack-test").unwrap_or_else(|e| {
        panic!("{e}\nbuild the helper first: cargo build -p pstack-helper (cargo test --workspace does)")
    });
    c.reap_deadline = Duration::from_millis(500);
    c
}

fn budget(dir: &std::path::Path) -> LeakBudget {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    LeakBudget::new(4, LeakJournal::new(dir.join("leaks.jsonl")), boot.trim())
}

/// A connected loopback socket with TCP_USER_TIMEOUT set, and its target.
fn socket(
    user_timeout_ms: libc::c_int,
) -> (std::net::TcpListener, std::net::TcpStream, SockoptTarget) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
    // SAFETY: a valid socket and a correctly sized int option.
    let rc = unsafe {
        libc::setsockopt(
            c.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_USER_TIMEOUT,
            (&user_timeout_ms as *const libc::c_int).cast(),
            4,
        )
    };
    assert_eq!(rc, 0);
    let inode = std::fs::metadata(format!("/proc/self/fd/{}", c.as_raw_fd()))
        .unwrap()
        .ino();
    let t = SockoptTarget {
        inode,
        pid: std::process::id(),
        fd: c.as_raw_fd(),
    };
    (l, c, t)
}

#[test]
fn root_sockopt_helper_reads_the_options_and_the_agent_the_owner() {
    if !root_or_skip("root_sockopt_helper_reads_the_options_and_the_agent_the_owner") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_l, _c, t) = socket(31_337);
    let spawned = Arc::new(Mutex::new(Vec::new()));
    let mut cfg = config();
    let seen = spawned.clone();
    cfg.on_helper_spawned = Some(Arc::new(move |h| seen.lock().unwrap().push(h.pid)));
    let b = budget(dir.path());
    let got = read_sockopts(&[t], &cfg, &b, "test", Duration::from_secs(2));
    let o = got[&t.inode].value.as_ref().expect("read");
    assert_eq!(o.user_timeout_ms, 31_337);
    assert_eq!(o.owner_pid, std::process::id());
    let comm = std::fs::read_to_string("/proc/self/comm").unwrap();
    assert_eq!(o.owner_comm, comm.trim(), "comm is read by the agent");
    assert_eq!(spawned.lock().unwrap().len(), 1, "one helper per batch");
}

#[test]
fn root_sockopt_helper_that_stops_answering_is_killed_at_the_deadline() {
    if !root_or_skip("root_sockopt_helper_that_stops_answering_is_killed_at_the_deadline") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_l1, _c1, a) = socket(1000);
    let (_l2, _c2, b2) = socket(2000);
    let helper = Arc::new(Mutex::new(None));
    let mut cfg = config();
    let seen = helper.clone();
    // The helper is stopped as soon as it exists: it never answers.
    cfg.on_helper_spawned = Some(Arc::new(move |h| {
        // SAFETY: kill with integer arguments, to our own child.
        unsafe { libc::kill(h.pid as i32, libc::SIGSTOP) };
        *seen.lock().unwrap() = Some(h.pid);
    }));
    let budget = budget(dir.path());
    let deadline = Duration::from_millis(400);
    let started = Instant::now();
    let got = read_sockopts(&[a, b2], &cfg, &budget, "test", deadline);
    let took = started.elapsed();
    assert!(
        took < deadline + cfg.reap_deadline + Duration::from_millis(500),
        "returned after {took:?}"
    );
    assert!(took >= deadline, "gave up early: {took:?}");
    for t in [a, b2] {
        assert!(
            matches!(
                got[&t.inode].value,
                Err(SockOptError::Abandoned { deadline_ms: 400 })
            ),
            "{:?}",
            got[&t.inode]
        );
    }
    let pid = helper.lock().unwrap().expect("a helper was spawned");
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "the stopped helper was killed and reaped"
    );
    assert_eq!(budget.in_use(), 0, "nothing leaked");
}
