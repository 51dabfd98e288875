//! Clocks for the envelope: CLOCK_MONOTONIC nanoseconds (decimal strings in
//! the envelope) and RFC 3339 UTC wall time.

use std::time::SystemTime;

/// CLOCK_MONOTONIC now, ns.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a live timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// Wall time now as `YYYY-MM-DDTHH:MM:SS.mmmZ` (the envelope's form).
pub fn wall_time_now() -> String {
    pstack_envelope::wall_time::format_millis(SystemTime::now())
}
