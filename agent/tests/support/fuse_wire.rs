//! The raw `/dev/fuse` wire the suite's hand-run FUSE servers share (the
//! hanging mount of the capture tests, the EIO file of the daemon tests):
//! opcodes, the reply frame, and `fuse_attr_out`. Hand-written because the
//! servers must misbehave on purpose (never answer, answer EIO), which FUSE
//! libraries are built to prevent.

#![allow(dead_code, reason = "each test binary uses its own part")]

pub const FUSE_LOOKUP: u32 = 1;
pub const FUSE_FORGET: u32 = 2;
pub const FUSE_GETATTR: u32 = 3;
pub const FUSE_OPEN: u32 = 14;
pub const FUSE_READ: u32 = 15;
pub const FUSE_RELEASE: u32 = 18;
pub const FUSE_FLUSH: u32 = 25;
pub const FUSE_INIT: u32 = 26;
pub const FUSE_OPENDIR: u32 = 27;
pub const FUSE_INTERRUPT: u32 = 36;
pub const FUSE_BATCH_FORGET: u32 = 42;

/// Answer request `unique` with `error` (0 or a negative errno) and `body`.
pub fn reply(fd: i32, unique: u64, error: i32, body: &[u8]) {
    let mut out = Vec::with_capacity(16 + body.len());
    out.extend_from_slice(&((16 + body.len()) as u32).to_ne_bytes());
    out.extend_from_slice(&error.to_ne_bytes());
    out.extend_from_slice(&unique.to_ne_bytes());
    out.extend_from_slice(body);
    // SAFETY: out is a live buffer of out.len() bytes; fd is the /dev/fuse fd.
    unsafe { libc::write(fd, out.as_ptr().cast(), out.len()) };
}

/// `fuse_attr_out` for inode 1, owned by root, with `mode` (type and
/// permission bits), `size` bytes and `nlink` links; attr_valid 0, so every
/// stat asks the server again.
pub fn attr(mode: u32, size: u64, nlink: u32) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&0u64.to_ne_bytes()); // attr_valid
    b.extend_from_slice(&0u32.to_ne_bytes()); // attr_valid_nsec
    b.extend_from_slice(&0u32.to_ne_bytes()); // dummy
    b.extend_from_slice(&1u64.to_ne_bytes()); // ino
    b.extend_from_slice(&size.to_ne_bytes()); // size
    b.extend_from_slice(&size.div_ceil(512).to_ne_bytes()); // blocks
    for _ in 0..3 {
        b.extend_from_slice(&0u64.to_ne_bytes()); // atime, mtime, ctime
    }
    for _ in 0..3 {
        b.extend_from_slice(&0u32.to_ne_bytes()); // *timensec
    }
    b.extend_from_slice(&mode.to_ne_bytes()); // mode
    b.extend_from_slice(&nlink.to_ne_bytes()); // nlink
    for _ in 0..5 {
        b.extend_from_slice(&0u32.to_ne_bytes()); // uid gid rdev blksize flags
    }
    b
}
