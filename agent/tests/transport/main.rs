//! Transport truth, tested on a real two-host testbed in network namespaces
//! (root only: every test here creates namespaces, veth pairs and nftables
//! rules, and skips with a printed reason when not root). One test binary of
//! modules; testbed tests run one at a time (see `testbed::serial`).

mod faults;
mod hostile;
mod longhorn;
mod net_helper;
mod netns_semantics;
mod ss_oracle;
mod testbed;
