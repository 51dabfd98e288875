# shellcheck shell=bash
# Setup for pstack-ebpf's tests and benchmarks (sourced by scripts/test; uses apt_need).
#
# - clang/llvm (Debian 12: clang 14) + libbpf-dev + bpftool: rebuild ebpf/bpf/*.bpf.c and
#   check that the committed objects are exactly what the sources produce;
# - nftables: the TCP fault fixtures (input-hook drops, `reject with tcp reset`);
# - iproute2: network namespaces / veth; bpftrace: the side-by-side benchmark.
# - tracefs is mounted at /sys/kernel/tracing (the loader also does this itself).

apt_need clang llvm libbpf-dev bpftool nftables iproute2 bpftrace

if ! mountpoint -q /sys/kernel/tracing 2>/dev/null; then
    mount -t tracefs nodev /sys/kernel/tracing || echo "30-ebpf: could not mount tracefs" >&2
fi

# Committed objects must be byte-identical to a rebuild with this machine's Debian clang.
# ebpf/build.sh --check rebuilds into a temp dir and compares (exit 1 on mismatch).
if ! ebpf/build.sh --check; then
    echo "30-ebpf: committed eBPF objects differ from a rebuild of ebpf/bpf/*.bpf.c (run ebpf/build.sh and commit)" >&2
    return 1 2>/dev/null || exit 1
fi
