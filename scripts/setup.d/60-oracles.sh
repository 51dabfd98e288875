# shellcheck shell=bash
# Independent oracles the suite compares pstack against (sourced by scripts/test; uses apt_need).
#
# - prometheus: `promtool check metrics` on the live /metrics of pstackd and pstack-store,
#   and the server itself, which scrapes pstack-exposition's text on loopback and
#   reads back hostile label values (exposition/tests/oracles.rs);
# - libcap2-bin: `capsh --decode` names the capability sets the tests read from /proc;
# - procps: `ps` for the planted-task oracle (state, wchan, start time);
# - iproute2: `ss -tin` for the transport testbed's tcp_info oracle;
# - python3 + openssl: the example envelopes' digests recomputed outside the crate
#   (envelope/tests/oracles/jcs_canonical.py canonicalizes, sha256sum hashes).

apt_need prometheus libcap2-bin procps iproute2 python3 openssl
