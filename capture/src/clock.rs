//! The one clock of every envelope: `clock.monotonic_start_ns` /
//! `monotonic_end_ns`, eBPF window stamps and transport sample times all
//! come from [`monotonic_ns`], and `clock.wall_time` from [`wall_time_now`].
//!
//! Invariants:
//! - **One monotonic source**: CLOCK_MONOTONIC, read in exactly one place in
//!   the workspace, [`pstack_ebpf::monotonic_ns`] — the lowest crate that
//!   needs it (its programs stamp events with `bpf_ktime_get_ns`, the same
//!   clock, and it cannot depend on this crate). Every engine, CLI and
//!   daemon path reads it through this module, so a capture's start/end and
//!   the kernel's event stamps are on one time line.
//! - **Never CLOCK_BOOTTIME** for envelope timing: suspend would open a gap
//!   between the envelope's stamps and the kernel's event stamps.
//! - Durations measured with `std::time::Instant` (deadlines, a surface's
//!   `elapsed_us`) are not stamps: they never appear as an absolute time in
//!   an envelope. (`Instant` is CLOCK_MONOTONIC on Linux, so they agree.)

use std::time::{Duration, SystemTime};

/// CLOCK_MONOTONIC now, ns.
pub fn monotonic_ns() -> u64 {
    pstack_ebpf::monotonic_ns()
}

/// Wall time now as `YYYY-MM-DDTHH:MM:SS.mmmZ` (the envelope's form).
pub fn wall_time_now() -> String {
    pstack_envelope::wall_time::format_millis(SystemTime::now())
}

/// Wall time of the CLOCK_MONOTONIC instant `mono_ns` (before or after now),
/// in the envelope's form: now's wall time moved by the monotonic distance.
pub fn wall_time_of(mono_ns: u64) -> String {
    let now_wall = SystemTime::now();
    let now_mono = monotonic_ns();
    let t = if mono_ns <= now_mono {
        now_wall - Duration::from_nanos(now_mono - mono_ns)
    } else {
        now_wall + Duration::from_nanos(mono_ns - now_mono)
    };
    pstack_envelope::wall_time::format_millis(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_envelope_clock_is_the_kernel_event_clock_and_moves_forward() {
        let a = monotonic_ns();
        let k = pstack_ebpf::monotonic_ns();
        let b = monotonic_ns();
        assert!(a > 0 && a <= k && k <= b, "{a} {k} {b}");
        // CLOCK_MONOTONIC, not BOOTTIME or REALTIME: within 1 s of a direct read.
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: ts is a live, writable timespec.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        let direct = ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64;
        assert!(direct.abs_diff(monotonic_ns()) < 1_000_000_000);
        assert!(wall_time_now().ends_with('Z'));
        // A stamp an hour ago (or half the uptime, on a machine up for less:
        // the monotonic clock starts at boot) is that long before now on the wall.
        let back_ns = (monotonic_ns() / 2).min(3_600_000_000_000);
        let then = wall_time_of(monotonic_ns() - back_ns);
        let now = wall_time_now();
        let parse = |s: &str| pstack_envelope::wall_time::parse(s).unwrap();
        let d = parse(&now).duration_since(parse(&then)).unwrap();
        assert!(
            d.as_secs().abs_diff(back_ns / 1_000_000_000) <= 1,
            "{then} -> {now} ({back_ns} ns back)"
        );
    }
}
