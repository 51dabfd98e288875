//! `pstackctl`: the operator CLI's subcommands ([`cli`]) and the
//! synchronous client of pstackd's Unix socket ([`client`]). What crosses
//! the socket is `pstackd_api`'s; this crate never links the daemon.

pub mod cli;
pub mod client;
