//! The committed objects are exactly what the sources produce (rebuilt with
//! the pinned Debian clang 14 by `ebpf/build.sh --check`), and they hold the
//! programs and maps the loader expects.

use std::process::Command;

#[test]
fn committed_objects_match_a_rebuild_from_source() {
    let clang14 = Command::new("clang")
        .arg("-dumpversion")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).starts_with("14."));
    pstack_testkit::require!(
        clang14.is_some(),
        "clang not installed (scripts/setup.d/30-ebpf.sh installs clang 14)"
    );
    pstack_testkit::require!(
        clang14 == Some(true),
        "clang is not Debian 12's clang 14; objects are pinned to it"
    );
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/build.sh");
    let out = Command::new(script)
        .arg("--check")
        .output()
        .expect("run build.sh --check");
    assert!(
        out.status.success(),
        "committed objects differ from a rebuild; run ebpf/build.sh and commit:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn embedded_objects_hold_the_expected_programs_and_maps() {
    for (obj, needles) in [
        (
            pstack_ebpf::objects::TCP,
            &[
                "pstack_tcp_retransmit",
                "pstack_tcp_receive_reset",
                "pstack_tcp_send_reset",
                "pstack_inet_sock_set_state",
                "EVENTS",
                "COUNTERS",
                "filter_port_lo",
                "filter_port_hi",
            ][..],
        ),
        (
            pstack_ebpf::objects::OFFCPU,
            &[
                "pstack_sched_switch",
                "pstack_sched_wakeup",
                "EPISODES",
                "START",
                "TOTALS",
                "WATCHED",
            ][..],
        ),
    ] {
        assert_eq!(&obj[..4], b"\x7fELF");
        for n in needles {
            assert!(
                obj.windows(n.len()).any(|w| w == n.as_bytes()),
                "{n} missing"
            );
        }
        assert!(obj.windows(4).any(|w| w == b".BTF"), "BTF kept for CO-RE");
    }
}
