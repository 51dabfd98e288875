# shellcheck shell=bash
# Kernel surfaces the tests need (sourced by scripts/test; uses apt_need). Idempotent.
#
# - cgroup-v1 freezer at /sys/fs/cgroup/freezer: the D-state, unreapable-helper and
#   off-CPU tests freeze a task there (a FROZEN v1 task shows `D` and ignores SIGKILL
#   until thawed; the cgroup-v2 freezer shows `S`, so it cannot stand in). On a pure
#   cgroup-v2 host the v1 freezer controller is free (cgroup2's freezer is core, not a
#   controller), so it mounts as its own v1 hierarchy; when /sys/fs/cgroup is itself the
#   cgroup2 root the mount point is an empty v2 child directory (mkdir there makes one).
# - FUSE (/dev/fuse; built in or the `fuse` module) and fuse3 userspace: the hung-FUSE test.
# - nf_conntrack: the conntrack-pressure transport test.
# - tracefs (30-ebpf.sh mounts it too) and kernel BTF: eBPF; BTF cannot be installed,
#   so its absence is reported (the eBPF tests then fail by name under PSTACK_STRICT=1).
# README.md "Kernel requirements" lists what the kernel must be built with.

apt_need fuse3 kmod procps

_kernel_setup() {
    local fz=/sys/fs/cgroup/freezer
    if [ ! -e "$fz/cgroup.procs" ]; then
        # On a cgroup2 root, mkdir makes an (empty, unused) v2 child cgroup: it only
        # serves as the mount point the v1 hierarchy is mounted over.
        mkdir -p "$fz"
        mount -t cgroup -o freezer freezer "$fz"
    fi
    echo "10-kernel: cgroup-v1 freezer at $fz"

    if [ ! -e /dev/fuse ]; then
        modprobe fuse 2>/dev/null || true
    fi
    if [ ! -e /dev/fuse ]; then
        echo "10-kernel: /dev/fuse is missing and the fuse module did not load" >&2
        return 1
    fi

    if [ ! -e /proc/sys/net/netfilter/nf_conntrack_max ]; then
        modprobe nf_conntrack 2>/dev/null || true
    fi
    if [ ! -e /proc/sys/net/netfilter/nf_conntrack_max ]; then
        echo "10-kernel: nf_conntrack is unavailable (neither built in nor loadable)" >&2
        return 1
    fi

    if ! mountpoint -q /sys/kernel/tracing 2>/dev/null; then
        mount -t tracefs nodev /sys/kernel/tracing || echo "10-kernel: could not mount tracefs" >&2
    fi
    if [ ! -e /sys/kernel/btf/vmlinux ]; then
        echo "10-kernel: no kernel BTF (/sys/kernel/btf/vmlinux): the eBPF tests need CONFIG_DEBUG_INFO_BTF=y" >&2
    fi
}
_kernel_setup
unset -f _kernel_setup
