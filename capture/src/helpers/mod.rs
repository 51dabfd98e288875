//! The helper machinery every engine shares: `pstack-helper` processes run
//! under a deadline and killed, reaped or journalled as leaked
//! ([`helper_process`], [`leak`]), the risky per-process reads
//! ([`risky`]), the network-namespace samples ([`net_helper`]), the socket
//! options of a flow's owner ([`sockopt_helper`]), and why a read was denied
//! ([`denial`]).
//!
//! Invariants (stated in full by each module): no helper runs without a
//! deadline; a helper that outlives it is killed and reaped, or counted
//! against the [`leak::LeakBudget`] and journalled; no thread of the caller
//! enters another process's namespace or takes its locks.

pub mod denial;
pub mod helper_process;
pub mod leak;
pub mod net_helper;
pub mod risky;
pub mod sockopt_helper;
