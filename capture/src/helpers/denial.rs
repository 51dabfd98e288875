//! Why the kernel said "permission denied" to this process, in words that
//! are true for who we are. "Run as root" is advice for an unprivileged
//! caller only; root refused (a container's user namespace, a capability
//! dropped, seccomp, an LSM) is told that instead.
//!
//! [`explain`] is a pure function of [`Caller`] (table-tested);
//! [`Caller::current`] reads it from `/proc/self`.

/// What decides whether this process may read another's `/proc/<pid>` files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Caller {
    /// Effective uid.
    pub euid: u32,
    /// `CAP_SYS_PTRACE` in the effective set.
    pub cap_sys_ptrace: bool,
    /// The process runs in a user namespace other than the initial one
    /// (its `uid_map` is not the identity map of all uids).
    pub user_namespace: bool,
    /// `Seccomp:` of `/proc/self/status` (0 off, 1 strict, 2 filter).
    pub seccomp: u8,
    /// The capability bounding set lacks capabilities the kernel has (as in
    /// a container): processes holding them are guarded against us.
    pub bounding_reduced: bool,
}

/// CAP_SYS_PTRACE's bit in the capability masks.
const CAP_SYS_PTRACE_BIT: u32 = 19;

impl Caller {
    /// This process, from `/proc/self/status` and `/proc/self/uid_map`.
    pub fn current() -> Caller {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(str::trim)
                .unwrap_or("")
                .to_string()
        };
        let cap_eff = u64::from_str_radix(&field("CapEff:"), 16).unwrap_or(0);
        let cap_bnd = u64::from_str_radix(&field("CapBnd:"), 16).unwrap_or(u64::MAX);
        let last_cap: u32 = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(40);
        let all_caps = if last_cap >= 63 {
            u64::MAX
        } else {
            (1u64 << (last_cap + 1)) - 1
        };
        let uid_map = std::fs::read_to_string("/proc/self/uid_map").unwrap_or_default();
        let identity_map =
            uid_map.split_whitespace().collect::<Vec<_>>() == ["0", "0", "4294967295"];
        Caller {
            // SAFETY: geteuid has no preconditions and cannot fail.
            euid: unsafe { libc::geteuid() },
            cap_sys_ptrace: cap_eff & (1 << CAP_SYS_PTRACE_BIT) != 0,
            user_namespace: !uid_map.is_empty() && !identity_map,
            seccomp: field("Seccomp:").parse().unwrap_or(0),
            bounding_reduced: cap_bnd & all_caps != all_caps,
        }
    }
}

/// The advice that follows "permission denied" on another process's files.
pub fn explain(c: &Caller) -> String {
    if c.euid != 0 {
        return "run as root (or with CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH) to capture other users' processes".into();
    }
    // What this process runs under that commonly explains a refusal; stated
    // as what was seen, not as the proven cause.
    let mut seen = Vec::new();
    if c.user_namespace {
        seen.push(
            "it is inside a user namespace (a container or `unshare --user`), which holds no capability over processes outside it, such as the host's",
        );
    }
    if !c.cap_sys_ptrace {
        seen.push("CAP_SYS_PTRACE is not in its effective capabilities");
    }
    if c.seccomp != 0 {
        seen.push("a seccomp filter is active on it");
    }
    if c.bounding_reduced {
        seen.push("its capability bounding set is reduced (as in a container)");
    }
    let head = "the kernel refused although this process is root";
    let fix = "run pstackctl where it has authority over the target: on the node itself, in the host's namespaces, with full capabilities";
    if seen.is_empty() {
        format!(
            "{head}; none of the usual reasons shows on this process (user namespace, missing CAP_SYS_PTRACE, seccomp, reduced bounding set), so an LSM (AppArmor, SELinux, Yama ptrace_scope), /proc mounted with hidepid or a sandboxed kernel decides; {fix}"
        )
    } else {
        format!("{head}; seen on this process: {}; {fix}", seen.join("; "))
    }
}

/// The advice that follows a refused eBPF load (`bpf(2)`, perf events).
pub fn explain_bpf(c: &Caller) -> String {
    if c.euid != 0 {
        return "run it as root, or grant CAP_BPF and CAP_PERFMON".into();
    }
    let mut why = vec!["the kernel refused although this process is root"];
    if c.user_namespace {
        why.push("this root is inside a user namespace, where eBPF tracing is not allowed");
    }
    if c.seccomp != 0 {
        why.push("a seccomp filter is active (container runtimes deny bpf() by default)");
    }
    if why.len() == 1 {
        why.push(
            "check kernel.unprivileged_bpf_disabled, kernel lockdown (/sys/kernel/security/lockdown) and the LSM policy",
        );
    }
    why.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advice_matches_who_was_refused() {
        let unprivileged = Caller {
            euid: 1000,
            ..Caller::default()
        };
        assert!(explain(&unprivileged).starts_with("run as root"));
        let host_root = Caller {
            euid: 0,
            cap_sys_ptrace: true,
            ..Caller::default()
        };
        let text = explain(&host_root);
        assert!(
            !text.contains("run as root") && text.contains("LSM"),
            "{text}"
        );
        let container_root = Caller {
            euid: 0,
            cap_sys_ptrace: true,
            user_namespace: true,
            seccomp: 2,
            bounding_reduced: true,
        };
        let text = explain(&container_root);
        assert!(text.contains("bounding set"), "{text}");
        assert!(!text.contains("run as root"), "{text}");
        assert!(
            text.contains("user namespace") && text.contains("seccomp"),
            "{text}"
        );
        let capless_root = Caller {
            euid: 0,
            ..Caller::default()
        };
        assert!(explain(&capless_root).contains("CAP_SYS_PTRACE is not"));
        for text in [
            explain(&host_root),
            explain(&container_root),
            explain(&capless_root),
        ] {
            assert!(text.contains("on the node itself"), "{text}");
        }
    }

    #[test]
    fn bpf_advice_matches_who_was_refused() {
        let user = Caller {
            euid: 1000,
            ..Caller::default()
        };
        assert!(explain_bpf(&user).contains("CAP_BPF"));
        let contained = Caller {
            euid: 0,
            cap_sys_ptrace: true,
            user_namespace: true,
            seccomp: 2,
            bounding_reduced: false,
        };
        let text = explain_bpf(&contained);
        assert!(
            !text.contains("run it as root") && text.contains("user namespace"),
            "{text}"
        );
    }

    #[test]
    fn this_process_is_read() {
        let c = Caller::current();
        // SAFETY: geteuid has no preconditions.
        assert_eq!(c.euid, unsafe { libc::geteuid() });
    }
}
