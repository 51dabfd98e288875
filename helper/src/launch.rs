//! How an agent starts `pstack-helper --net` and `--sockopt`: the one place
//! that knows their command lines and how the namespace descriptor reaches
//! the net helper.

use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

/// The descriptor number the namespace file has in the helper.
pub const NETNS_FD: RawFd = 3;

/// `path --net`, and with `netns` that open namespace file as the helper's
/// descriptor [`NETNS_FD`] (`--netns-fd 3`), which it enters before confining
/// itself; without, the helper reads the netns it inherits. The caller adds
/// environment and stdio and must keep `netns` open until `spawn` returns.
pub fn net_command(path: &Path, netns: Option<&File>) -> Command {
    let mut cmd = Command::new(path);
    cmd.arg("--net");
    if let Some(file) = netns {
        let fd = file.as_raw_fd();
        cmd.args(["--netns-fd", &NETNS_FD.to_string()]);
        // SAFETY: the closure runs in the forked child before exec and only
        // calls dup2/fcntl (async-signal-safe) on its own descriptor table.
        // dup2 leaves the copy without FD_CLOEXEC; when `fd` already is
        // NETNS_FD the flag is cleared instead.
        unsafe {
            cmd.pre_exec(move || {
                let rc = if fd == NETNS_FD {
                    libc::fcntl(NETNS_FD, libc::F_SETFD, 0)
                } else {
                    libc::dup2(fd, NETNS_FD)
                };
                if rc < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    cmd
}

/// `path --sockopt`: the socket-option reader (no descriptor passed).
pub fn sockopt_command(path: &Path) -> Command {
    let mut cmd = Command::new(path);
    cmd.arg("--sockopt");
    cmd
}
