# shellcheck shell=bash
# Setup for the transport (network) tests and benchmark (sourced by scripts/test; uses apt_need).
#
# - iproute2: `ip netns` / veth for the two-host testbed (agent/tests/transport), and `ss`
#   for the side-by-side benchmark (bench/transport);
# - nftables: fault injection (input-hook drops, `reject with tcp reset`, ICMP drops, ct rules);
# - conntrack: conntrack-tools, to inspect the testbed's table by hand when a test fails
#   (`ip netns exec NS conntrack -L`); the tests themselves read procfs.
# - procps: `sysctl` (the testbed turns tail-loss probes off in one namespace).
#
# The conntrack test lowers the global net.netfilter.nf_conntrack_max for a few seconds and
# restores it (a Drop guard); nothing else outside the test namespaces is changed.

apt_need iproute2 nftables conntrack procps

# nf_conntrack must be available for the conntrack-pressure test (built in or a module).
if [ ! -e /proc/sys/net/netfilter/nf_conntrack_max ]; then
    modprobe nf_conntrack 2>/dev/null || echo "40-net: nf_conntrack unavailable; the conntrack test fails under PSTACK_STRICT=1" >&2
fi
