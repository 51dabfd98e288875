//! `pstack-agent`: the node side of pstack — capture supervision (risky reads in
//! a killable helper, deadlines, identity re-reads), the operator CLI's
//! subcommands, and (with `pstackd`) the Unix-socket API, spool and shipper.

pub mod cli;
pub mod client;
pub mod daemon;
pub mod digest_key;
pub mod probes;
pub mod supervisor;
