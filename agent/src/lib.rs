//! `pstack-agent`: the node side of pstack — capture supervision (risky reads in
//! a killable helper, deadlines, identity re-reads), the operator CLI's
//! subcommands, and (with `pstackd`) the Unix-socket API, spool and shipper.

pub mod cli;
pub mod client;
pub mod daemon;

// The engines moved to `pstack-capture`; their paths stay reachable here.
pub use pstack_capture::{digest_key, probes, supervisor};
