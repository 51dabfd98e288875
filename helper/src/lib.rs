//! `pstack-helper`: the isolated, killable process that performs pstack's
//! risky reads (procfs, and network-namespace samples), and the framing
//! protocol the agent speaks to it.
//!
//! Why a separate process: `/proc/<pid>/stack`, `wchan`, `syscall`,
//! `cmdline`, `environ` and `stat` of fd targets can block on the very task
//! being diagnosed (its `mmap_lock`, a filesystem whose server stopped
//! answering). A timer around a synchronous read is not a deadline; a process
//! the agent can SIGKILL is.
//!
//! Invariants:
//! - **Bounded framing** ([`protocol`]): every frame is a 4-byte big-endian
//!   length and that many bytes of JSON; a length above the receiver's cap is
//!   refused before any allocation, a short read at EOF is an error, not a
//!   partial message. The decoder is fuzzed (`fuzz/`) and round-trip
//!   property-tested in `cargo test`.
//! - **One result per surface, in order, as each completes** ([`serve`]): the
//!   agent knows which surface is in flight from how many results it has
//!   received, so it can attribute a missed deadline to exactly one surface.
//! - **No request without a deadline**: a surface whose `deadline_ms` is 0 is
//!   refused (the agent refuses it first; this is the second lock).
//! - **Least privilege** ([`confine`], [`filter`], [`view`]): before reading
//!   any request the helper sets `PR_SET_PDEATHSIG(SIGKILL)`, moves into its
//!   own mount namespace whose only content is a read-only `/proc`, empties
//!   its bounding set, keeps only the capabilities its reads need (each
//!   justified in [`confine`]), sets `no_new_privs`, disables core dumps and
//!   installs a seccomp allow-list with argument filters whose mismatch
//!   action kills the process (SIGSYS): it cannot open anything for writing,
//!   write anywhere but its response pipe, signal another process, trace,
//!   mount, load modules, open sockets or exec.
//! - **Net reads in a second, separate profile** (`pstack-helper --net`,
//!   [`serve::serve_net`], [`confine::confine_net`]): the helper enters the
//!   target network namespace from a descriptor the agent opened, *then*
//!   confines itself to `CAP_NET_ADMIN` alone and a seccomp allow-list that
//!   permits `socket` only for `AF_NETLINK` (route, sock_diag) — never
//!   `AF_INET`/`AF_INET6` — and answers one [`protocol::NetResponse`] (a
//!   typed `NetSample` plus the netns inode it read) per
//!   [`protocol::NetRequest`]. The procfs profile is unchanged by it.
//! - **Socket options in a third profile** (`pstack-helper --sockopt`,
//!   [`sockopt::serve`], [`confine::confine_sockopt`]): `pidfd_getfd` +
//!   `getsockopt` of other processes' sockets with `CAP_SYS_PTRACE` alone,
//!   no filesystem access at all, one answer per socket.

pub mod confine;
pub mod confine_error;
pub mod filter;
pub mod launch;
pub mod protocol;
pub mod serve;
pub mod sockopt;
pub mod view;
