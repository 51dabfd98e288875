//! Transport truth, tested on a real two-host testbed in network namespaces
//! (root only: every test here creates namespaces, veth pairs and nftables
//! rules, and skips with a printed reason when not root). One test binary of
//! modules; testbed tests run one at a time (see `testbed::serial`).

// The pstackd harness of the daemon tests, for captures through the socket.
#[path = "../daemon/common.rs"]
#[allow(dead_code, reason = "shared harness; this binary uses part of it")]
mod daemon_common;
mod daemon_e2e;
mod faults;
mod hostile;
mod longhorn;
mod net_helper;
mod netns_semantics;
mod sockets_cli;
mod sockopt_helper;
mod ss_oracle;
mod testbed;
mod trace_daemon;
mod watch_flows;
mod watch_longhorn;
