//! `pstack-helper`: performs pstack's risky reads in a confined, killable
//! process. Spawned by the agent with pipes on stdin/stdout; reads request
//! frames from stdin and writes response frames to stdout (see
//! `pstack_helper::protocol`). Not meant to be run by hand.
//!
//! - `pstack-helper`: risky procfs reads under the procfs profile; one
//!   response frame per surface.
//! - `pstack-helper --net [--netns-fd N]`: network-namespace samples under the
//!   net profile. With `--netns-fd`, the inherited descriptor `N` (an open
//!   `/proc/PID/ns/net` or `/run/netns/NAME`, opened by the agent) is entered
//!   with `setns` and closed *before* confinement; without it the helper reads
//!   the netns it was started in.
//! - `pstack-helper --sockopt`: socket options (`pidfd_getfd` +
//!   `getsockopt`) of other processes' sockets under the sockopt profile.
//!
//! Exits 0 at EOF, 2 on bad arguments, 3 if it cannot confine itself, 4 on a
//! framing error, 7 on a panic after confinement (then it cannot write to
//! stderr: its seccomp filter allows writes to the response pipe only); 5 if the kernel refused to let it enter the target network
//! namespace (EPERM/EACCES), 6 if it cannot enter it otherwise (e.g. the
//! descriptor is not a network namespace). The agent maps 5 and 6 back to
//! typed namespace errors ([`pstack_helper::protocol::EXIT_NETNS_DENIED`],
//! [`pstack_helper::protocol::EXIT_NETNS_FAILED`]).

use std::io::Write;
use std::os::fd::{FromRawFd, RawFd};

/// How this helper was asked to run.
enum Mode {
    /// `--version`: print the version and the commit built from, exit 0.
    Version,
    Procfs,
    Net {
        netns_fd: Option<RawFd>,
    },
    Sockopt,
}

/// `pstack-helper --help` (exit codes kept equal to the README's table by a test).
const HELP: &str = "\
pstack-helper: pstack's confined, killable reader. Started by pstackctl and
pstackd with pipes on stdin/stdout; not meant to be run by hand.

Usage: pstack-helper [--net [--netns-fd N] | --sockopt]

Exit codes:
  0  end of input: the agent closed the request pipe
  2  bad arguments
  3  cannot confine itself (no_new_privs, capabilities, seccomp or Landlock refused): it refuses to serve
  4  a framing error on the request pipe
  5  the kernel refused entry into the target network namespace (EPERM or EACCES)
  6  cannot enter the target network namespace otherwise (e.g. the descriptor is not one)
";

fn parse_args(args: &[String]) -> Result<Mode, String> {
    match args {
        [] => Ok(Mode::Procfs),
        [v] if v == "--version" || v == "-V" => Ok(Mode::Version),
        [net] if net == "--net" => Ok(Mode::Net { netns_fd: None }),
        [s] if s == "--sockopt" => Ok(Mode::Sockopt),
        [net, flag, fd] if net == "--net" && flag == "--netns-fd" => {
            let fd: RawFd = fd
                .parse()
                .map_err(|_| format!("--netns-fd {fd:?} is not a descriptor number"))?;
            if fd < 3 {
                return Err(format!("--netns-fd {fd} is a standard stream"));
            }
            Ok(Mode::Net { netns_fd: Some(fd) })
        }
        other => Err(format!(
            "unexpected arguments {other:?} (usage: pstack-helper [--net [--netns-fd N] | --sockopt] | --version)"
        )),
    }
}

fn fail(code: i32, message: std::fmt::Arguments<'_>) -> ! {
    let _ = writeln!(std::io::stderr(), "pstack-helper: {message}");
    std::process::exit(code);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if matches!(args.as_slice(), [h] if h == "--help" || h == "-h") {
        let _ = std::io::stdout().write_all(HELP.as_bytes());
        std::process::exit(0);
    }
    let mode = parse_args(&args).unwrap_or_else(|e| fail(2, format_args!("{e}")));
    if let Mode::Version = mode {
        println!("pstack-helper {}", env!("PSTACK_VERSION"));
        return;
    }
    let expected_parent = std::env::var("PSTACK_HELPER_PARENT")
        .ok()
        .and_then(|s| s.parse().ok());
    let net = matches!(mode, Mode::Net { .. });
    if let Mode::Net { netns_fd: Some(fd) } = mode {
        // SAFETY: the agent passed this descriptor for us to own; nothing else
        // in this (still single-threaded) process uses it, and it is closed
        // when `file` drops below.
        let file = unsafe { std::fs::File::from_raw_fd(fd) };
        let path = format!("netns fd {fd}");
        if let Err(e) = pstack_collectors::net::netns::enter(&file, &path) {
            let code = match e {
                pstack_collectors::net::NetnsError::PermissionDenied { .. } => {
                    pstack_helper::protocol::EXIT_NETNS_DENIED
                }
                _ => pstack_helper::protocol::EXIT_NETNS_FAILED,
            };
            fail(
                code,
                format_args!("cannot enter the target network namespace: {e}"),
            );
        }
    }
    let sockopt = matches!(mode, Mode::Sockopt);
    let confined = if net {
        pstack_helper::confine::confine_net(expected_parent)
    } else if sockopt {
        pstack_helper::confine::confine_sockopt(expected_parent)
    } else {
        pstack_helper::confine::confine(expected_parent)
    };
    if let Err(e) = confined {
        fail(3, format_args!("refusing to serve: {e}"));
    }
    // From here on only descriptor 1 is writable: a panic message would be
    // a forbidden write (SIGSYS, indistinguishable from an attack), so a
    // panic ends the process with its own exit status instead.
    std::panic::set_hook(Box::new(|_| {
        // SAFETY: _exit takes an integer and never returns.
        unsafe { libc::_exit(pstack_helper::protocol::EXIT_PANIC) }
    }));
    let mut input = std::io::stdin().lock();
    let mut output = std::io::BufWriter::new(std::io::stdout().lock());
    let served = if net {
        pstack_helper::serve::serve_net(&mut input, &mut output)
    } else if sockopt {
        pstack_helper::sockopt::serve(&mut input, &mut output)
    } else {
        pstack_helper::serve::serve(&mut input, &mut output)
    };
    if served.is_err() {
        // No message: stderr is not writable under the seccomp filter.
        std::process::exit(4);
    }
}
