//! One running `pstack-helper`: spawn it with pipes, send a request frame
//! under a deadline, receive response frames under a deadline (non-blocking
//! pipe + `poll(2)`, never a blocking read), kill it and try to reap it.
//!
//! `PR_SET_PDEATHSIG` in the helper fires when the *thread* that spawned it
//! exits, so a caller must spawn from a thread that outlives the capture (the
//! calling thread of [`super::capture`] does).
//!
//! [`HelperProcess::spawn`] starts a procfs helper; [`HelperProcess::spawn_net`]
//! starts `pstack-helper --net`, handing it the already-open namespace file
//! as descriptor 3 (the only descriptor it inherits besides its pipes and
//! stderr). Both speak the same framing; [`HelperProcess::send_message`] and
//! [`HelperProcess::next_message`] carry either protocol's messages.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use pstack_collectors::procfs::read::{TaskRef, read_stat};
use pstack_helper::protocol::{FrameError, MAX_FRAME, Request, Response, decode, encode};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::leak::HelperIdentity;

/// Requested capacity of the helper's output pipe.
const PIPE_BYTES: libc::c_int = 1 << 20;

/// What waiting for the next message produced.
#[derive(Debug)]
pub enum Received<T = Response> {
    /// A response frame.
    Response(T),
    /// The deadline passed first.
    Timeout,
    /// The helper closed its stdout (it exited or died).
    Closed,
    /// The helper sent bytes that are not a valid frame.
    Protocol(FrameError),
}

/// Outcome of SIGKILL + bounded wait.
#[derive(Debug)]
pub enum Reap {
    /// It exited and was reaped.
    Reaped(ExitStatus),
    /// It did not exit within the reap deadline; the child is handed back
    /// so a reaper can keep trying.
    Unreaped(Child),
}

/// A live helper.
#[derive(Debug)]
pub struct HelperProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: ChildStdout,
    buf: Vec<u8>,
    /// Who it is.
    pub identity: HelperIdentity,
}

fn set_nonblocking(fd: RawFd) -> std::io::Result<()> {
    // SAFETY: fcntl on an fd we own, with integer arguments.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Wait until `fd` is ready for `events` or `deadline` passes; whether ready.
fn poll_until(fd: RawFd, events: libc::c_short, deadline: Instant) -> std::io::Result<bool> {
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Ok(false);
        }
        let wait = deadline - now;
        // Round up so a sub-millisecond remainder does not spin.
        let ms = i32::try_from(wait.as_micros().div_ceil(1000)).unwrap_or(i32::MAX);
        let mut pfd = libc::pollfd {
            fd,
            events,
            revents: 0,
        };
        // SAFETY: pfd is one live pollfd; nfds is 1.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        if rc < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if rc > 0 {
            return Ok(true);
        }
    }
}

impl HelperProcess {
    /// Spawn the procfs helper at `path` with a cleared environment.
    pub fn spawn(path: &std::path::Path, boot_id: &str) -> std::io::Result<HelperProcess> {
        HelperProcess::start(Command::new(path), boot_id)
    }

    /// Spawn `path --net` with a cleared environment. With `netns`, that open
    /// namespace file becomes the helper's descriptor 3 (`--netns-fd 3`),
    /// which it enters before confining itself; without, it reads the netns
    /// it inherits.
    pub fn spawn_net(
        path: &std::path::Path,
        boot_id: &str,
        netns: Option<&std::fs::File>,
    ) -> std::io::Result<HelperProcess> {
        let cmd = pstack_helper::launch::net_command(path, netns);
        HelperProcess::start(cmd, boot_id)
    }

    /// Spawn `path --sockopt` (the socket-option reader) with a cleared
    /// environment.
    pub fn spawn_sockopt(path: &std::path::Path, boot_id: &str) -> std::io::Result<HelperProcess> {
        HelperProcess::start(pstack_helper::launch::sockopt_command(path), boot_id)
    }

    fn start(mut cmd: Command, boot_id: &str) -> std::io::Result<HelperProcess> {
        let mut child = cmd
            .env_clear()
            .env("PSTACK_HELPER_PARENT", std::process::id().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::other("helper spawned without pipes"));
        };
        set_nonblocking(stdin.as_raw_fd())?;
        set_nonblocking(stdout.as_raw_fd())?;
        // A larger pipe lets the helper stream a host-wide sweep while this
        // process does its own reads, instead of stalling at 64 KiB. Best
        // effort: the kernel caps it at /proc/sys/fs/pipe-max-size.
        // SAFETY: fcntl on a pipe fd we own, with integer arguments.
        unsafe { libc::fcntl(stdout.as_raw_fd(), libc::F_SETPIPE_SZ, PIPE_BYTES) };
        let pid = child.id();
        let start_ticks = read_stat(TaskRef::process(pid), 4096)
            .map(|s| s.facts.start_ticks)
            .unwrap_or(0);
        Ok(HelperProcess {
            child,
            stdin: Some(stdin),
            stdout,
            buf: Vec::new(),
            identity: HelperIdentity {
                pid,
                start_ticks,
                boot_id: boot_id.to_string(),
            },
        })
    }

    /// Send one request frame; `Ok(false)` if the deadline passed first.
    pub fn send(&mut self, request: &Request, deadline: Instant) -> Result<bool, FrameError> {
        self.send_message(request, deadline)
    }

    /// Send one frame of any protocol message; `Ok(false)` if the deadline
    /// passed first.
    pub fn send_message<T: Serialize>(
        &mut self,
        message: &T,
        deadline: Instant,
    ) -> Result<bool, FrameError> {
        let frame = encode(message, MAX_FRAME)?;
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| FrameError::Io("stdin already closed".into()))?;
        let mut off = 0;
        while off < frame.len() {
            match stdin.write(&frame[off..]) {
                Ok(0) => return Err(FrameError::Io("helper closed its stdin".into())),
                Ok(n) => off += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if !poll_until(stdin.as_raw_fd(), libc::POLLOUT, deadline)
                        .map_err(|e| FrameError::Io(e.to_string()))?
                    {
                        return Ok(false);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(FrameError::Io(e.to_string())),
            }
        }
        Ok(true)
    }

    /// Close stdin: the helper exits after its current batch.
    pub fn close_input(&mut self) {
        self.stdin = None;
    }

    /// The next response, waiting at most until `deadline`. Responses that
    /// already arrived are returned even if the deadline has passed.
    pub fn next_response(&mut self, deadline: Instant) -> Received {
        self.next_message(deadline, MAX_FRAME)
    }

    /// The next message of type `T` (a frame of at most `max` bytes),
    /// waiting at most until `deadline`.
    pub fn next_message<T: DeserializeOwned>(
        &mut self,
        deadline: Instant,
        max: u32,
    ) -> Received<T> {
        let mut chunk = [0u8; 64 * 1024];
        loop {
            match decode::<T>(&self.buf, max) {
                Ok(Some((resp, used))) => {
                    self.buf.drain(..used);
                    return Received::Response(resp);
                }
                Ok(None) => {}
                Err(e) => return Received::Protocol(e),
            }
            match self.stdout.read(&mut chunk) {
                Ok(0) => {
                    return if self.buf.is_empty() {
                        Received::Closed
                    } else {
                        Received::Protocol(FrameError::Truncated {
                            wanted: 4,
                            got: self.buf.len() as u64,
                        })
                    };
                }
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    continue;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Received::Protocol(FrameError::Io(e.to_string())),
            }
            match poll_until(self.stdout.as_raw_fd(), libc::POLLIN, deadline) {
                Ok(true) => {}
                Ok(false) => return Received::Timeout,
                Err(e) => return Received::Protocol(FrameError::Io(e.to_string())),
            }
        }
    }

    /// Wait up to `within` for the helper to exit on its own.
    pub fn wait_exit(&mut self, within: Duration) -> Option<ExitStatus> {
        let until = Instant::now() + within;
        loop {
            match self.child.try_wait() {
                Ok(Some(st)) => return Some(st),
                Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(1)),
                _ => return None,
            }
        }
    }

    /// SIGKILL it and wait up to `within` for the kernel to let it go.
    pub fn kill_and_reap(mut self, within: Duration) -> Reap {
        self.stdin = None;
        let _ = self.child.kill();
        match self.wait_exit(within) {
            Some(st) => Reap::Reaped(st),
            None => Reap::Unreaped(self.child),
        }
    }
}
