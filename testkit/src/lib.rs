//! pstack-testkit: preconditions for tests that cannot lie.
//!
//! Invariants:
//! - Under strict mode (`PSTACK_STRICT=1`, which `scripts/test` exports, or `CI=true`) a
//!   missing precondition *fails* the test with its reason: green means the test ran.
//! - Outside strict mode a skip is written unbuffered to stderr (past libtest's capture)
//!   and appended to the skip log, so `scripts/test` can end with a summary of every
//!   skipped test and why. Nothing is skipped silently.
//!
//! Use [`require!`] at the top of a test:
//!
//! ```ignore
//! pstack_testkit::require!(pstack_testkit::is_root(), "needs root to mount a tmpfs");
//! ```

pub mod jcs;

pub use jcs::{check_envelope, jcs_oracle, jcs_oracle_digest, verify};

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Environment variable that turns skips into failures.
pub const STRICT_ENV: &str = "PSTACK_STRICT";
/// Environment variable naming the skip log (default: `<target dir>/pstack-skips.log`).
pub const SKIP_LOG_ENV: &str = "PSTACK_SKIP_LOG";

/// Whether a missing precondition must fail the test (`PSTACK_STRICT=1` or `CI=true`).
pub fn strict() -> bool {
    let on = |k: &str, v: &str| std::env::var(k).is_ok_and(|x| x == v);
    on(STRICT_ENV, "1") || on("CI", "true")
}

/// The skip log: `$PSTACK_SKIP_LOG`, else `pstack-skips.log` in the cargo target dir that
/// holds the running test binary (`target/debug/deps/x` → `target/`).
pub fn skip_log() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(SKIP_LOG_ENV) {
        return Some(PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok()?;
    let target = exe.ancestors().find(|a| a.join("CACHEDIR.TAG").exists())?;
    Some(target.join("pstack-skips.log"))
}

/// The running test's name: libtest names each test's thread after the test.
fn test_name(fallback: &std::panic::Location<'_>) -> String {
    match std::thread::current().name() {
        Some(n) if n != "main" => n.to_string(),
        _ => format!("{}:{}", fallback.file(), fallback.line()),
    }
}

/// Check a precondition. `true`: go on. `false`: the test must return now (the skip has
/// been reported and logged). Under strict mode a missing precondition panics instead.
#[track_caller]
pub fn precondition(holds: bool, reason: &str) -> bool {
    if holds {
        return true;
    }
    let at = std::panic::Location::caller();
    let test = test_name(at);
    if strict() {
        panic!(
            "precondition failed under strict mode ({STRICT_ENV}=1 or CI=true): {test}: {reason}"
        );
    }
    report_skip(&test, reason);
    false
}

fn report_skip(test: &str, reason: &str) {
    let line = format!("SKIPPED {test}: {reason}");
    // Straight to fd 2 (not eprintln!, which libtest captures for passing tests).
    // SAFETY: write(2) on fd 2 with a valid buffer of the given length.
    unsafe {
        libc::write(2, format!("{line}\n").as_ptr().cast(), line.len() + 1);
    }
    if let Some(log) = skip_log() {
        append_line(&log, &format!("{test}\t{reason}"));
    }
}

fn append_line(path: &Path, line: &str) {
    // One write(2) per line with O_APPEND: concurrent test binaries do not interleave.
    if let Ok(mut f) = OpenOptions::new().create(true).append(true).open(path) {
        let _ = f.write_all(format!("{line}\n").as_bytes());
    }
}

/// `require!(cond, "reason")`: return from the test (reported skip) or, in strict mode,
/// fail it when `cond` is false. Works in tests returning `()` or any `Default` type.
#[macro_export]
macro_rules! require {
    ($cond:expr, $($reason:tt)+) => {
        if !$crate::precondition($cond, &format!($($reason)+)) {
            return Default::default();
        }
    };
}

/// Whether the test runs as root (effective uid 0).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Where the cgroup-v1 freezer is mounted (scripts/setup.d/10-kernel.sh mounts it).
pub const FREEZER: &str = "/sys/fs/cgroup/freezer";

/// Whether the cgroup-v1 freezer hierarchy is mounted at [`FREEZER`].
pub fn freezer_mounted() -> bool {
    Path::new(FREEZER).join("freezer.state").exists()
        || Path::new(FREEZER).join("cgroup.procs").exists()
}

/// Whether `tool` runs (`tool --version` or `tool -V` exits at all).
pub fn have_tool(tool: &str) -> bool {
    ["--version", "-V"].iter().any(|a| {
        std::process::Command::new(tool)
            .arg(a)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok()
    })
}

/// `promtool check metrics` (Prometheus's linter; Debian `prometheus`) on an exposition:
/// `Err(what it said)` unless it exits 0 and says nothing (or it could not run at all).
pub fn promtool_check_metrics(text: &str) -> Result<(), String> {
    use std::process::{Command, Stdio};
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            format!("promtool does not run ({e}); scripts/setup.d/60-oracles.sh installs it")
        })?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(text.as_bytes())
            .map_err(|e| format!("feeding promtool: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("waiting for promtool: {e}"))?;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() && said.trim().is_empty() {
        Ok(())
    } else {
        Err(format!("exit {:?}: {said}", out.status.code()))
    }
}

/// The capability names in a `/proc/PID/status` mask (`CapEff:` etc., hex), decoded by
/// libcap's `capsh --decode` (an oracle written by others, not pstack's `caps` crate),
/// upper-cased (`CAP_SYS_ADMIN`).
pub fn capsh_decode(mask_hex: &str) -> std::collections::BTreeSet<String> {
    let out = std::process::Command::new("capsh")
        .arg(format!("--decode={}", mask_hex.trim()))
        .output()
        .expect("capsh runs (libcap2-bin; scripts/setup.d/60-oracles.sh installs it)");
    let text = String::from_utf8_lossy(&out.stdout);
    let names = text.trim().split_once('=').map_or("", |(_, n)| n);
    names
        .split(',')
        .filter(|n| !n.is_empty())
        .map(str::to_ascii_uppercase)
        .collect()
}

/// A set of names from literals, for comparing with [`capsh_decode`].
pub fn names(list: &[&str]) -> std::collections::BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn promtool_flags_a_family_without_help() {
        if !have_tool("promtool") {
            assert!(!strict(), "promtool missing under strict mode");
            return;
        }
        assert!(
            promtool_check_metrics("# HELP a_total A.\n# TYPE a_total counter\na_total 1\n")
                .is_ok()
        );
        let bad = promtool_check_metrics("# TYPE a_total counter\na_total 1\n").unwrap_err();
        assert!(bad.contains("no help text"), "{bad}");
    }

    #[test]
    fn capsh_decodes_by_name() {
        if !have_tool("capsh") {
            assert!(!strict(), "capsh missing under strict mode");
            return;
        }
        assert_eq!(
            capsh_decode("0000000000280004"),
            names(&["CAP_DAC_READ_SEARCH", "CAP_SYS_PTRACE", "CAP_SYS_ADMIN"])
        );
        assert!(capsh_decode("0000000000000000").is_empty());
    }

    #[test]
    fn a_held_precondition_is_true() {
        assert!(precondition(true, "unused"));
    }

    #[test]
    fn strict_mode_turns_a_skip_into_a_failure() {
        // Run ourselves as a child with strict mode on: the child must fail with the reason.
        if std::env::var_os("PSTACK_TESTKIT_CHILD").is_some() {
            let _ = precondition(false, "the reason the child gives");
            return;
        }
        let exe = std::env::current_exe().unwrap();
        let log = std::env::temp_dir().join(format!("pstack-testkit-{}.log", std::process::id()));
        let run = |strict: bool| {
            let mut c = std::process::Command::new(&exe);
            c.args([
                "--exact",
                "tests::strict_mode_turns_a_skip_into_a_failure",
                "--nocapture",
            ])
            .env("PSTACK_TESTKIT_CHILD", "1")
            .env(SKIP_LOG_ENV, &log)
            .env_remove("CI")
            .env(STRICT_ENV, if strict { "1" } else { "0" });
            c.output().unwrap()
        };
        let strict_run = run(true);
        let text = String::from_utf8_lossy(&strict_run.stdout).to_string()
            + &String::from_utf8_lossy(&strict_run.stderr);
        assert!(!strict_run.status.success(), "strict child passed:\n{text}");
        assert!(text.contains("the reason the child gives"), "{text}");

        let _ = std::fs::remove_file(&log);
        let lax = run(false);
        let err = String::from_utf8_lossy(&lax.stderr).to_string();
        assert!(lax.status.success(), "lax child failed:\n{err}");
        assert!(
            err.contains("SKIPPED") && err.contains("the reason the child gives"),
            "{err}"
        );
        let logged = std::fs::read_to_string(&log).unwrap_or_default();
        let _ = std::fs::remove_file(&log);
        assert!(
            logged.contains(
                "tests::strict_mode_turns_a_skip_into_a_failure\tthe reason the child gives"
            ),
            "skip log: {logged:?}"
        );
    }
}
