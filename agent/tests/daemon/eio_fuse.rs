//! A one-file FUSE filesystem whose every read fails with EIO, mounted
//! directly over an existing regular file (FUSE allows a regular-file root,
//! `rootmode=100000`): the path stays a regular file of the size it claims,
//! opens fine, and `read(2)` returns EIO — a failing disk block, without a
//! block device.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

#[path = "../support/fuse_wire.rs"]
mod fuse_wire;
use fuse_wire::*;

/// The mount; unmounted (and its server joined) on drop.
pub struct EioFile {
    target: PathBuf,
    /// READ requests answered with EIO.
    pub reads: Arc<AtomicU32>,
    /// The process (thread group) behind each READ, in order: a test that
    /// also reads the file itself counts only its subject's reads.
    readers: Arc<Mutex<Vec<u32>>>,
    server: Option<std::thread::JoinHandle<()>>,
}

impl EioFile {
    /// Mount over the regular file `target`, claiming `size` bytes.
    pub fn mount(target: &Path, size: u64) -> Result<EioFile, String> {
        let c_target = std::ffi::CString::new(target.as_os_str().as_encoded_bytes())
            .map_err(|e| format!("{}: {e}", target.display()))?;
        // SAFETY: NUL-terminated path; flags are constants.
        let fd = unsafe { libc::open(c"/dev/fuse".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(format!(
                "cannot open /dev/fuse: {}",
                std::io::Error::last_os_error()
            ));
        }
        // (No NUL can occur in these digits.)
        let opts = std::ffi::CString::new(format!("fd={fd},rootmode=100000,user_id=0,group_id=0"))
            .map_err(|e| e.to_string())?;
        // SAFETY: all pointers are NUL-terminated strings that outlive the call.
        let rc = unsafe {
            libc::mount(
                c"pstack-eio".as_ptr(),
                c_target.as_ptr(),
                c"fuse".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                opts.as_ptr().cast(),
            )
        };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            // SAFETY: fd was opened above.
            unsafe { libc::close(fd) };
            return Err(format!("mount -t fuse over a file failed: {e}"));
        }
        let reads = Arc::new(AtomicU32::new(0));
        let r = reads.clone();
        let readers = Arc::new(Mutex::new(Vec::new()));
        let who = readers.clone();
        let server = std::thread::spawn(move || {
            let mut buf = vec![0u8; 1 << 20 | 4096];
            loop {
                // SAFETY: buf is a live, writable buffer of buf.len() bytes.
                let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
                if n < 0 {
                    let e = std::io::Error::last_os_error();
                    if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN)) {
                        continue;
                    }
                    break; // ENODEV after unmount
                }
                if (n as usize) < 40 {
                    continue;
                }
                let opcode = u32::from_ne_bytes(buf[4..8].try_into().unwrap());
                let unique = u64::from_ne_bytes(buf[8..16].try_into().unwrap());
                match opcode {
                    FUSE_FORGET | FUSE_BATCH_FORGET | FUSE_INTERRUPT => {}
                    FUSE_INIT => {
                        let mut body = Vec::new();
                        body.extend_from_slice(&7u32.to_ne_bytes()); // major
                        body.extend_from_slice(&31u32.to_ne_bytes()); // minor
                        body.extend_from_slice(&0u32.to_ne_bytes()); // max_readahead
                        body.extend_from_slice(&0u32.to_ne_bytes()); // flags
                        body.extend_from_slice(&16u16.to_ne_bytes()); // max_background
                        body.extend_from_slice(&12u16.to_ne_bytes()); // congestion_threshold
                        body.extend_from_slice(&4096u32.to_ne_bytes()); // max_write
                        body.extend_from_slice(&1u32.to_ne_bytes()); // time_gran
                        body.extend_from_slice(&[0u8; 64 - 28]);
                        reply(fd, unique, 0, &body);
                    }
                    FUSE_GETATTR => reply(fd, unique, 0, &attr(libc::S_IFREG | 0o600, size, 1)),
                    // fuse_open_out: fh, open_flags (FOPEN_DIRECT_IO: every
                    // read reaches us, none is served from the page cache), padding.
                    FUSE_OPEN => {
                        let mut body = Vec::new();
                        body.extend_from_slice(&1u64.to_ne_bytes());
                        body.extend_from_slice(&1u32.to_ne_bytes());
                        body.extend_from_slice(&0u32.to_ne_bytes());
                        reply(fd, unique, 0, &body);
                    }
                    FUSE_READ => {
                        // fuse_in_header.pid is the calling thread; it is
                        // blocked in read(2) now, so its Tgid is readable.
                        let tid = u32::from_ne_bytes(buf[32..36].try_into().unwrap());
                        who.lock().unwrap().push(thread_group(tid));
                        r.fetch_add(1, Ordering::SeqCst);
                        reply(fd, unique, -libc::EIO, &[]);
                    }
                    FUSE_FLUSH | FUSE_RELEASE => reply(fd, unique, 0, &[]),
                    FUSE_LOOKUP => reply(fd, unique, -libc::ENOENT, &[]),
                    _ => reply(fd, unique, -libc::ENOSYS, &[]),
                }
            }
            // SAFETY: fd is owned by this thread from here on.
            unsafe { libc::close(fd) };
        });
        Ok(EioFile {
            target: target.to_owned(),
            reads,
            readers,
            server: Some(server),
        })
    }
}

impl EioFile {
    /// READ requests that came from process `pid` (any of its threads).
    pub fn reads_by(&self, pid: u32) -> usize {
        self.readers
            .lock()
            .unwrap()
            .iter()
            .filter(|&&p| p == pid)
            .count()
    }
}

/// The thread group (process) of thread `tid`; `tid` itself when gone.
fn thread_group(tid: u32) -> u32 {
    std::fs::read_to_string(format!("/proc/{tid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Tgid:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(tid)
}

impl Drop for EioFile {
    fn drop(&mut self) {
        let c = std::ffi::CString::new(self.target.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: NUL-terminated path. MNT_FORCE on FUSE aborts the connection;
        // MNT_DETACH removes whatever is left.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_FORCE) };
        // SAFETY: as above.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        if let Some(s) = self.server.take() {
            let _ = s.join();
        }
    }
}

/// The test of the fixture itself: the path is a regular file that opens
/// and fails every read with EIO.
#[test]
fn root_only_eio_fuse_file_is_regular_and_reads_fail_with_eio() {
    pstack_testkit::require!(super::common::is_root(), "mounting FUSE needs root");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("victim");
    std::fs::write(&path, b"original").unwrap();
    let fuse = EioFile::mount(&path, 4096);
    pstack_testkit::require!(
        fuse.is_ok(),
        "{} (scripts/setup.d/10-kernel.sh loads fuse)",
        fuse.as_ref().err().cloned().unwrap_or_default()
    );
    let fuse = fuse.unwrap();
    let meta = std::fs::symlink_metadata(&path).unwrap();
    assert!(meta.is_file(), "{meta:?}");
    assert_eq!(meta.len(), 4096);
    let err = std::fs::read(&path).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    assert!(fuse.reads.load(Ordering::SeqCst) >= 1);
}
