//! A minimal netlink transport over raw `libc` sockets, plus pure iterators
//! over netlink messages and route attributes.
//!
//! Why raw: the readers need things the netlink crates on crates.io do not do
//! well together — a length-aware `tcp_info` (kernels return different
//! lengths), `IFLA_TARGET_NETNSID` lookups of a veth peer in another netns, and
//! a sock_diag dump of 10,000 sockets that must be at least as fast as `ss`.
//! The wire formats are small and stable (uapi), so we encode requests and
//! decode replies ourselves; every decoder is pure and tested on captured bytes.
//!
//! Invariants:
//! - **Bounds-checked decoding.** Every length read from the wire is checked
//!   against the buffer before use; a malformed message is a typed
//!   [`NetlinkError::Malformed`], never a panic or an out-of-bounds read.
//! - **One socket per request, in the calling thread's netns.** A netlink
//!   socket is bound to the network namespace of the task that created it, so
//!   a reader run after `setns` (see [`super::netns`]) sees that namespace.
//! - **Dumps end at `NLMSG_DONE`.** A kernel error inside a dump is returned
//!   with its errno; a reply to another sequence number is skipped.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `NLMSG_ERROR`.
pub const NLMSG_ERROR: u16 = 2;
/// `NLMSG_DONE`.
pub const NLMSG_DONE: u16 = 3;
/// `NLM_F_REQUEST`.
pub const NLM_F_REQUEST: u16 = 0x1;
/// `NLM_F_DUMP` (`NLM_F_ROOT | NLM_F_MATCH`).
pub const NLM_F_DUMP: u16 = 0x300;
/// Size of `struct nlmsghdr`.
pub const NLMSG_HDRLEN: usize = 16;

/// A netlink failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub enum NetlinkError {
    /// A socket syscall failed.
    #[error("netlink {syscall} failed: {message} (errno {errno})")]
    Syscall {
        /// The syscall.
        syscall: String,
        /// errno.
        errno: i32,
        /// The OS's description.
        message: String,
    },
    /// The kernel answered the request with an error.
    #[error("kernel refused netlink request: {message} (errno {errno})")]
    Kernel {
        /// Positive errno.
        errno: i32,
        /// The OS's description.
        message: String,
    },
    /// The bytes did not have the uapi shape.
    #[error("malformed netlink message: {0}")]
    Malformed(String),
}

impl NetlinkError {
    fn last(syscall: &'static str) -> NetlinkError {
        let e = std::io::Error::last_os_error();
        NetlinkError::Syscall {
            syscall: syscall.into(),
            errno: e.raw_os_error().unwrap_or(0),
            message: e.to_string(),
        }
    }

    /// errno, when there is one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            NetlinkError::Syscall { errno, .. } | NetlinkError::Kernel { errno, .. } => {
                Some(*errno)
            }
            NetlinkError::Malformed(_) => None,
        }
    }
}

/// Round up to the 4-byte netlink alignment.
pub const fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// One netlink message: type, flags, sequence and payload (after the header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NlMsg<'a> {
    /// `nlmsg_type`.
    pub kind: u16,
    /// `nlmsg_flags`.
    pub flags: u16,
    /// `nlmsg_seq`.
    pub seq: u32,
    /// Bytes after the 16-byte header.
    pub payload: &'a [u8],
}

/// Iterate the messages in one `recv` buffer.
#[derive(Debug, Clone)]
pub struct NlMsgIter<'a> {
    buf: &'a [u8],
}

impl<'a> NlMsgIter<'a> {
    /// Messages in `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        NlMsgIter { buf }
    }
}

impl<'a> Iterator for NlMsgIter<'a> {
    type Item = Result<NlMsg<'a>, NetlinkError>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.buf.is_empty() {
            return None;
        }
        if self.buf.len() < NLMSG_HDRLEN {
            self.buf = &[];
            return Some(Err(NetlinkError::Malformed(
                "trailing bytes shorter than a netlink header".into(),
            )));
        }
        let len = u32::from_ne_bytes(self.buf[0..4].try_into().unwrap_or_default()) as usize;
        if len < NLMSG_HDRLEN || len > self.buf.len() {
            let have = self.buf.len();
            self.buf = &[];
            return Some(Err(NetlinkError::Malformed(format!(
                "nlmsg_len {len} outside [16, {have}]"
            ))));
        }
        let msg = NlMsg {
            kind: u16::from_ne_bytes([self.buf[4], self.buf[5]]),
            flags: u16::from_ne_bytes([self.buf[6], self.buf[7]]),
            seq: u32::from_ne_bytes(self.buf[8..12].try_into().unwrap_or_default()),
            payload: &self.buf[NLMSG_HDRLEN..len],
        };
        let next = align4(len).min(self.buf.len());
        self.buf = &self.buf[next..];
        Some(Ok(msg))
    }
}

/// One route attribute (`struct rtattr` / `struct nlattr`): type and value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr<'a> {
    /// Attribute type with the nested/byte-order flag bits cleared.
    pub kind: u16,
    /// The value bytes.
    pub value: &'a [u8],
}

impl Attr<'_> {
    /// The value as a native-endian u32, if it is at least 4 bytes.
    pub fn u32(&self) -> Option<u32> {
        self.value
            .get(0..4)?
            .try_into()
            .ok()
            .map(u32::from_ne_bytes)
    }
    /// The value as a native-endian i32.
    pub fn i32(&self) -> Option<i32> {
        self.value
            .get(0..4)?
            .try_into()
            .ok()
            .map(i32::from_ne_bytes)
    }
    /// The first byte.
    pub fn u8(&self) -> Option<u8> {
        self.value.first().copied()
    }
    /// A NUL-terminated string value.
    pub fn str(&self) -> String {
        let end = self
            .value
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(self.value.len());
        String::from_utf8_lossy(&self.value[..end]).into_owned()
    }
}

/// Iterate route attributes; a malformed attribute ends iteration with an error.
#[derive(Debug, Clone)]
pub struct AttrIter<'a> {
    buf: &'a [u8],
}

impl<'a> AttrIter<'a> {
    /// Attributes in `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        AttrIter { buf }
    }
}

impl<'a> Iterator for AttrIter<'a> {
    type Item = Result<Attr<'a>, NetlinkError>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.buf.len() < 4 {
            // Up to 3 bytes of alignment padding may trail.
            self.buf = &[];
            return None;
        }
        let len = u16::from_ne_bytes([self.buf[0], self.buf[1]]) as usize;
        let kind = u16::from_ne_bytes([self.buf[2], self.buf[3]]) & 0x3fff;
        if len < 4 || len > self.buf.len() {
            let have = self.buf.len();
            self.buf = &[];
            return Some(Err(NetlinkError::Malformed(format!(
                "attribute type {kind} length {len} outside [4, {have}]"
            ))));
        }
        let attr = Attr {
            kind,
            value: &self.buf[4..len],
        };
        let next = align4(len).min(self.buf.len());
        self.buf = &self.buf[next..];
        Some(Ok(attr))
    }
}

/// Append a route attribute to a request being built.
pub fn push_attr(out: &mut Vec<u8>, kind: u16, value: &[u8]) {
    let len = 4 + value.len();
    out.extend_from_slice(&(len as u16).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(value);
    out.resize(align4(out.len()), 0);
}

/// Frame `payload` as one netlink request message.
pub fn request(kind: u16, flags: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
    let len = NLMSG_HDRLEN + payload.len();
    let mut out = Vec::with_capacity(align4(len));
    out.extend_from_slice(&(len as u32).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(&flags.to_ne_bytes());
    out.extend_from_slice(&seq.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes());
    out.extend_from_slice(payload);
    out.resize(align4(out.len()), 0);
    out
}

/// The errno carried by an `NLMSG_ERROR` payload (0 is an ACK).
pub fn error_code(payload: &[u8]) -> Result<i32, NetlinkError> {
    let code = payload
        .get(0..4)
        .and_then(|b| b.try_into().ok())
        .map(i32::from_ne_bytes)
        .ok_or_else(|| NetlinkError::Malformed("NLMSG_ERROR shorter than 4 bytes".into()))?;
    // The kernel sends 0 or a negated errno; i32::MIN has no positive errno (and
    // negating it overflowed: found by the netlink_parsers fuzz target).
    code.checked_neg().ok_or_else(|| {
        NetlinkError::Malformed(format!("NLMSG_ERROR code {code} is not a negated errno"))
    })
}

/// A netlink socket of one protocol, in the creating thread's netns.
#[derive(Debug)]
pub struct NetlinkSocket {
    fd: OwnedFd,
    seq: u32,
}

/// Receive buffer size: larger than the kernel's dump skb (32 KiB), so one
/// `recv` never truncates a message.
const RECV_BUF: usize = 64 * 1024;

impl NetlinkSocket {
    /// Open a netlink socket of `protocol` (e.g. `NETLINK_SOCK_DIAG`).
    pub fn open(protocol: i32) -> Result<NetlinkSocket, NetlinkError> {
        // SAFETY: plain socket(2) with constant arguments; the result is checked.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                protocol,
            )
        };
        if fd < 0 {
            return Err(NetlinkError::last("socket"));
        }
        // SAFETY: fd is a fresh, valid descriptor that we now own exclusively.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // A larger receive buffer lets the kernel batch a big dump; failure is harmless.
        let rcvbuf: libc::c_int = 1 << 20;
        // SAFETY: fd is valid; the option value points at a live c_int of the given size.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUF,
                (&rcvbuf as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
        // Strict checking: the kernel validates our headers and filters (5.x+);
        // ignored on kernels that lack it.
        let one: libc::c_int = 1;
        // SAFETY: as above.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_NETLINK,
                libc::NETLINK_GET_STRICT_CHK,
                (&one as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
        Ok(NetlinkSocket { fd, seq: 1 })
    }

    fn send(&mut self, msg: &[u8]) -> Result<(), NetlinkError> {
        // SAFETY: sockaddr_nl is plain old data; all-zero is a valid value.
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        // SAFETY: fd is valid; msg and addr outlive the call with the lengths given.
        let n = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                msg.as_ptr().cast(),
                msg.len(),
                0,
                (&addr as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if n < 0 {
            return Err(NetlinkError::last("sendto"));
        }
        Ok(())
    }

    fn recv(&self, buf: &mut [u8]) -> Result<usize, NetlinkError> {
        loop {
            // SAFETY: fd is valid and buf is a writable region of buf.len() bytes.
            let n =
                unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                return Err(NetlinkError::last("recv"));
            }
            return Ok(n as usize);
        }
    }

    /// Send one request and call `on_msg` for every reply message until the
    /// request is answered (`NLMSG_DONE` for a dump, the first non-error
    /// message or ACK otherwise). Each raw reply buffer is passed to `on_raw`
    /// (for digests) before it is decoded.
    pub fn transact(
        &mut self,
        kind: u16,
        flags: u16,
        payload: &[u8],
        on_raw: &mut dyn FnMut(&[u8]),
        on_msg: &mut dyn FnMut(NlMsg<'_>) -> Result<(), NetlinkError>,
    ) -> Result<(), NetlinkError> {
        let seq = self.seq;
        self.seq = self.seq.wrapping_add(1);
        let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        self.send(&request(kind, flags, seq, payload))?;
        let mut buf = vec![0u8; RECV_BUF];
        loop {
            let n = self.recv(&mut buf)?;
            if n == 0 {
                return Err(NetlinkError::Malformed("netlink socket closed".into()));
            }
            let chunk = &buf[..n];
            on_raw(chunk);
            for msg in NlMsgIter::new(chunk) {
                let msg = msg?;
                if msg.seq != seq {
                    continue;
                }
                match msg.kind {
                    NLMSG_DONE => {
                        // A dump may carry an error in its DONE payload.
                        if msg.payload.len() >= 4 {
                            let errno = error_code(msg.payload)?;
                            if errno > 0 {
                                return Err(kernel_error(errno));
                            }
                        }
                        return Ok(());
                    }
                    NLMSG_ERROR => {
                        let errno = error_code(msg.payload)?;
                        if errno != 0 {
                            return Err(kernel_error(errno));
                        }
                        return Ok(());
                    }
                    _ => {
                        on_msg(msg)?;
                        if !dump {
                            return Ok(());
                        }
                    }
                }
            }
        }
    }
}

fn kernel_error(errno: i32) -> NetlinkError {
    NetlinkError::Kernel {
        errno,
        message: std::io::Error::from_raw_os_error(errno).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nlmsg_error_code_of_i32_min_is_malformed_not_an_overflow() {
        // Regression: the netlink_parsers fuzz target's first crash.
        let e = error_code(&i32::MIN.to_ne_bytes()).unwrap_err();
        assert!(matches!(e, NetlinkError::Malformed(_)), "{e:?}");
        assert_eq!(error_code(&(-13i32).to_ne_bytes()).unwrap(), 13);
        assert_eq!(error_code(&0i32.to_ne_bytes()).unwrap(), 0);
    }

    #[test]
    fn truncated_header_is_malformed_not_a_panic() {
        let mut it = NlMsgIter::new(&[1, 2, 3]);
        assert!(matches!(it.next(), Some(Err(NetlinkError::Malformed(_)))));
        assert!(it.next().is_none());
    }

    #[test]
    fn length_past_buffer_is_malformed() {
        let mut m = request(20, 0, 7, &[0; 8]);
        m[0..4].copy_from_slice(&1000u32.to_ne_bytes());
        assert!(matches!(
            NlMsgIter::new(&m).next(),
            Some(Err(NetlinkError::Malformed(_)))
        ));
    }

    #[test]
    fn attributes_round_trip_and_bad_length_stops() {
        let mut b = Vec::new();
        push_attr(&mut b, 3, b"eth0\0");
        push_attr(&mut b, 4, &1500u32.to_ne_bytes());
        let attrs: Vec<_> = AttrIter::new(&b).collect::<Result<_, _>>().unwrap();
        assert_eq!(attrs.len(), 2);
        assert_eq!(attrs[0].str(), "eth0");
        assert_eq!(attrs[1].u32(), Some(1500));
        let mut bad = b.clone();
        bad[0] = 200;
        assert!(AttrIter::new(&bad).next().unwrap().is_err());
    }

    #[test]
    fn request_frames_and_iterates_back() {
        let m = request(26, NLM_F_REQUEST, 9, &[1, 2, 3, 4, 5]);
        assert_eq!(m.len(), 24);
        let got: Vec<_> = NlMsgIter::new(&m).collect::<Result<_, _>>().unwrap();
        assert_eq!(got[0].kind, 26);
        assert_eq!(got[0].seq, 9);
        assert_eq!(got[0].payload, &[1, 2, 3, 4, 5]);
    }
}
