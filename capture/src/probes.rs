//! The `pstackctl` commands that envelopes name as probes (what to run to
//! answer an unknown), built in one place so a test can run every one of
//! them through `pstackctl`'s own argument parser ([`samples`]).
//!
//! Invariant: no other module writes a `pstackctl ... --flag` probe by hand
//! (`agent/tests/capture/probes.rs` scans the sources for strays).

use std::net::IpAddr;
use std::time::Duration;

use pstack_envelope::Subject;

use crate::helpers::denial::Caller;

/// `pstackctl capture` of the same subject.
pub fn capture_again(subject: &Subject) -> String {
    match subject {
        Subject::Process(p) => format!("pstackctl capture --pid {}", p.pid),
        Subject::Thread(t) => format!("pstackctl capture --tid {}", t.tid),
        _ => "pstackctl capture --host".into(),
    }
}

/// `command` by a caller the kernel will allow: `sudo` for an unprivileged
/// caller; for root that was refused (a container, a sandbox), the same
/// command on the node itself — `sudo` would change nothing.
pub fn with_privilege(command: &str, caller: &Caller) -> String {
    if caller.euid != 0 {
        format!("sudo {command}")
    } else {
        format!("{command}  # on the node itself, outside this container or sandbox")
    }
}

/// The same capture with an off-CPU window, one-shot.
pub fn capture_window(subject: &Subject, window: Duration) -> String {
    format!(
        "{} --window {} --one-shot",
        capture_again(subject),
        pstack_units::format_duration(window)
    )
}

/// The same capture with a longer bundle deadline.
pub fn capture_longer(subject: &Subject, bundle: Duration) -> String {
    format!(
        "{} --bundle-deadline {}",
        capture_again(subject),
        pstack_units::format_duration(bundle)
    )
}

/// The JSON of the same capture filtered to its failed surfaces.
pub fn capture_failed_surfaces(subject: &Subject) -> String {
    format!(
        "{} --json | jq '.surfaces[] | select(.status != \"ok\")'",
        capture_again(subject)
    )
}

/// `trace tcp` again with a larger ring buffer (events were lost).
pub fn trace_tcp_larger_ring(window: Duration, ring_bytes: u32, port: Option<u16>) -> String {
    format!(
        "pstackctl trace tcp --window {} --ring-bytes {ring_bytes}{}",
        pstack_units::format_duration(window),
        port.map(|p| format!(" --port {p}")).unwrap_or_default()
    )
}

/// `trace tcp` as a caller allowed to load eBPF.
pub fn trace_tcp_privileged(caller: &Caller) -> String {
    with_privilege("pstackctl trace tcp --window 10s", caller)
}

/// `trace tcp` of one address during the next failure.
pub fn trace_tcp_addr(addr: IpAddr) -> String {
    format!("pstackctl trace tcp --addr {addr} --window 60s")
}

/// One instance of every probe above, for the parser test.
pub fn samples() -> Vec<String> {
    let process = pstack_envelope::example::example_sealed().subject;
    let thread = match &process {
        Subject::Process(p) => Subject::Thread(pstack_envelope::ThreadIdentity {
            process: p.clone(),
            tid: p.pid + 1,
        }),
        other => other.clone(),
    };
    let host = Subject::Host(pstack_envelope::HostIdentity {
        host: "node-a".into(),
        boot_id: "00000000-0000-0000-0000-000000000000".into(),
    });
    let user = Caller {
        euid: 1000,
        ..Caller::default()
    };
    let root = Caller::default();
    let mut out = Vec::new();
    for s in [&process, &thread, &host] {
        out.push(capture_again(s));
        out.push(with_privilege(&capture_again(s), &user));
        out.push(with_privilege(&capture_again(s), &root));
        // A window is for a process or thread (`--host` refuses one).
        if !matches!(s, Subject::Host(_)) {
            out.push(capture_window(s, Duration::from_millis(5000)));
            out.push(with_privilege(
                &capture_window(s, Duration::from_millis(250)),
                &user,
            ));
        }
        out.push(capture_longer(s, Duration::from_millis(20_000)));
        out.push(capture_failed_surfaces(s));
    }
    out.push(trace_tcp_larger_ring(
        Duration::from_millis(1500),
        1 << 20,
        Some(10001),
    ));
    out.push(trace_tcp_larger_ring(
        Duration::from_secs(10),
        1 << 20,
        None,
    ));
    out.push(trace_tcp_privileged(&user));
    out.push(trace_tcp_privileged(&root));
    out.push(trace_tcp_addr("10.0.0.2".parse().expect("literal address")));
    out.push(trace_tcp_addr("fd00::2".parse().expect("literal address")));
    out
}
