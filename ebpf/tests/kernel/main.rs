//! Kernel tests of pstack-ebpf: real programs on this kernel, real sockets in
//! network namespaces this binary creates, real nftables rules, a real
//! cgroup-v1 freezer. They need root (CAP_BPF, CAP_PERFMON, CAP_NET_ADMIN,
//! CAP_SYS_ADMIN), kernel BTF, `ip` and `nft`; a test skips with a printed
//! reason only when one of those is truly absent.

mod aggregated;
mod fixtures;
mod flight;
mod flood;
mod lifecycle;
mod objects;
mod offcpu;
mod privilege;
mod resets;
mod retransmits;

use pstack_ebpf::{EbpfConfig, EbpfSession};

/// Why kernel tests cannot run here, if they cannot.
pub fn kernel_unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root".into());
    }
    if !std::path::Path::new(pstack_ebpf::host::KERNEL_BTF).exists() {
        return Some("no kernel BTF at /sys/kernel/btf/vmlinux".into());
    }
    for tool in ["ip", "nft"] {
        if !fixtures::have(tool) {
            return Some(format!(
                "{tool} not installed (scripts/setup.d/30-ebpf.sh installs it)"
            ));
        }
    }
    None
}

/// Skip (with the reason printed) when the kernel side is truly absent.
#[macro_export]
macro_rules! require_kernel {
    () => {
        let why = $crate::kernel_unavailable();
        pstack_testkit::require!(why.is_none(), "{}", why.unwrap_or_default());
    };
}

/// Start a session or fail the test with the full typed error.
pub fn session(cfg: EbpfConfig) -> EbpfSession {
    EbpfSession::start(cfg).unwrap_or_else(|e| panic!("EbpfSession::start: {e}\n{e:?}"))
}
