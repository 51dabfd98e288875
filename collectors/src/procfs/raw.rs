//! Bounded raw reads and the typed read error.
//!
//! A read keeps at most `max_bytes` bytes; it reads one byte past the cap to
//! learn whether the file had more, and says so in [`RawMeta::truncated`]. The
//! digest is over exactly the bytes kept.

use std::io::Read;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What a read failed with. `Vanished` and `PermissionDenied` are expected
/// outcomes (the task exited; the kernel refused), not collector failures.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ReadError {
    /// The task or file went away (ENOENT, ESRCH).
    #[error("{path}: vanished (errno {errno})")]
    Vanished {
        /// The path read.
        path: String,
        /// The errno the kernel returned.
        errno: i32,
    },
    /// The kernel refused the read (EACCES, EPERM).
    #[error("{path}: permission denied (errno {errno})")]
    PermissionDenied {
        /// The path read.
        path: String,
        /// The errno the kernel returned.
        errno: i32,
    },
    /// Any other I/O failure.
    #[error("{path}: {message} (errno {errno})")]
    Io {
        /// The path read.
        path: String,
        /// The errno (0 when the kernel gave none).
        errno: i32,
        /// The OS's description.
        message: String,
    },
    /// The bytes did not have the shape the kernel documents.
    #[error("{path}: cannot parse: {reason}")]
    Parse {
        /// The path read.
        path: String,
        /// What was wrong.
        reason: String,
    },
}

impl ReadError {
    /// Classify an I/O error on `path`.
    pub fn from_io(path: &Path, err: &std::io::Error) -> ReadError {
        let path = path.display().to_string();
        let errno = err.raw_os_error().unwrap_or(0);
        match errno {
            libc::ENOENT | libc::ESRCH => ReadError::Vanished { path, errno },
            libc::EACCES | libc::EPERM => ReadError::PermissionDenied { path, errno },
            _ => ReadError::Io {
                path,
                errno,
                message: err.to_string(),
            },
        }
    }

    /// The errno, when there is one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            ReadError::Vanished { errno, .. }
            | ReadError::PermissionDenied { errno, .. }
            | ReadError::Io { errno, .. } => Some(*errno),
            ReadError::Parse { .. } => None,
        }
    }
}

/// Digest, length and truncation of the bytes a reading was parsed from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMeta {
    /// `sha256:<hex>` of the kept bytes.
    pub digest: String,
    /// Number of kept bytes.
    pub bytes: u64,
    /// Whether the byte cap cut the read.
    pub truncated: bool,
}

impl RawMeta {
    /// Meta of `bytes` as kept.
    pub fn of(bytes: &[u8], truncated: bool) -> RawMeta {
        RawMeta {
            digest: pstack_envelope::sha256_digest(bytes),
            bytes: bytes.len() as u64,
            truncated,
        }
    }
}

/// Bytes read under a cap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawRead {
    /// The kept bytes (at most the cap).
    pub bytes: Vec<u8>,
    /// Whether the file had more than the cap.
    pub truncated: bool,
}

impl RawRead {
    /// Digest/length/truncation of these bytes.
    pub fn meta(&self) -> RawMeta {
        RawMeta::of(&self.bytes, self.truncated)
    }

    /// Keep at most `cap` of `bytes`.
    pub fn capped(mut bytes: Vec<u8>, cap: u64) -> RawRead {
        let cap = usize::try_from(cap).unwrap_or(usize::MAX);
        let truncated = bytes.len() > cap;
        bytes.truncate(cap);
        RawRead { bytes, truncated }
    }
}

/// Typed facts plus the evidence they came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reading<T> {
    /// Parsed facts.
    pub facts: T,
    /// Digest, length, truncation of the raw bytes.
    pub raw: RawMeta,
}

/// Read `path` keeping at most `max_bytes` (one extra byte is read to detect
/// truncation).
pub fn read_capped(path: &Path, max_bytes: u64) -> Result<RawRead, ReadError> {
    let file = std::fs::File::open(path).map_err(|e| ReadError::from_io(path, &e))?;
    let mut bytes = Vec::with_capacity(usize::try_from(max_bytes.min(4096)).unwrap_or(4096));
    file.take(max_bytes.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| ReadError::from_io(path, &e))?;
    Ok(RawRead::capped(bytes, max_bytes))
}

/// Read a procfs `seq_file` (`stat`, `status`, `wchan`, `stack`, `syscall`,
/// `schedstat`, `io`, `cgroup`, ...) keeping at most `max_bytes`.
///
/// A `seq_file` read fills the caller's buffer until it is full or the
/// records are exhausted, so a read that returns less than asked for is the
/// end of the file: one `read(2)` suffices whenever the content fits, where
/// [`read_capped`] needs a second one to see EOF. Not for `cmdline`/`environ`,
/// which the kernel serves at most a page per call.
pub fn read_seq_capped(path: &Path, max_bytes: u64) -> Result<RawRead, ReadError> {
    let file = std::fs::File::open(path).map_err(|e| ReadError::from_io(path, &e))?;
    read_seq_from(file, path, max_bytes)
}

fn read_seq_from(
    mut file: std::fs::File,
    path: &Path,
    max_bytes: u64,
) -> Result<RawRead, ReadError> {
    let want = usize::try_from(max_bytes.saturating_add(1)).unwrap_or(usize::MAX);
    let mut bytes = vec![0u8; want.min(4096)];
    let mut len = 0;
    loop {
        match file.read(&mut bytes[len..]) {
            Ok(0) => break,
            Ok(n) => {
                len += n;
                if len < bytes.len() {
                    break; // short read of a seq_file: end of file
                }
                if bytes.len() >= want {
                    break; // cap + 1 bytes seen: truncated
                }
                let grow = (bytes.len() * 2).min(want);
                bytes.resize(grow, 0);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ReadError::from_io(path, &e)),
        }
    }
    bytes.truncate(len);
    Ok(RawRead::capped(bytes, max_bytes))
}

/// A directory opened once so many files under it are opened relative to it
/// (`openat(2)`), skipping the repeated `/proc/<pid>/task/` path walk in
/// whole-process sweeps.
#[derive(Debug)]
pub struct ProcDir {
    fd: std::os::fd::OwnedFd,
    path: std::path::PathBuf,
}

impl ProcDir {
    /// Open `path` as a directory.
    pub fn open(path: &Path) -> Result<ProcDir, ReadError> {
        use std::os::unix::fs::OpenOptionsExt;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY)
            .open(path)
            .map_err(|e| ReadError::from_io(path, &e))?;
        Ok(ProcDir {
            fd: f.into(),
            path: path.to_path_buf(),
        })
    }

    /// [`read_seq_capped`] of `rel` (e.g. `4243/stat`) under this directory.
    pub fn read_seq(&self, rel: &str, max_bytes: u64) -> Result<RawRead, ReadError> {
        use std::os::fd::{AsRawFd, FromRawFd};
        let full = || self.path.join(rel);
        let c = std::ffi::CString::new(rel).map_err(|_| ReadError::Parse {
            path: full().display().to_string(),
            reason: "path contains NUL".into(),
        })?;
        // SAFETY: the dirfd is owned by self and open; `c` is NUL-terminated and
        // outlives the call; flags are constants.
        let fd = unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(ReadError::from_io(
                &full(),
                &std::io::Error::last_os_error(),
            ));
        }
        // SAFETY: fd was just returned by openat and is owned by nothing else.
        let file = unsafe { std::fs::File::from_raw_fd(fd) };
        read_seq_from(file, &full(), max_bytes)
    }
}

/// Largest integer the envelope carries as a JSON number (2^53 - 1).
const MAX_SAFE: u64 = (1 << 53) - 1;

/// Make a serialized facts value envelope-safe: integers beyond ±(2^53-1)
/// become decimal strings (the envelope refuses them as numbers), everything
/// else is kept. Floats are never produced by these collectors.
pub fn json_safe(value: Value) -> Value {
    match value {
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                if u > MAX_SAFE {
                    return Value::String(u.to_string());
                }
            } else if let Some(i) = n.as_i64()
                && i.unsigned_abs() > MAX_SAFE
            {
                return Value::String(i.to_string());
            }
            Value::Number(n)
        }
        Value::Array(a) => Value::Array(a.into_iter().map(json_safe).collect()),
        Value::Object(m) => Value::Object(m.into_iter().map(|(k, v)| (k, json_safe(v))).collect()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_truncates_and_reports() {
        let r = RawRead::capped(b"abcdef".to_vec(), 4);
        assert_eq!(r.bytes, b"abcd");
        assert!(r.truncated);
        assert_eq!(r.meta().bytes, 4);
        let r = RawRead::capped(b"abcd".to_vec(), 4);
        assert!(!r.truncated);
    }

    #[test]
    fn read_capped_reports_truncation_on_a_real_file() {
        let dir = std::env::temp_dir().join(format!("pstack-raw-{}", std::process::id()));
        std::fs::write(&dir, b"0123456789").unwrap();
        let r = read_capped(&dir, 3).unwrap();
        std::fs::remove_file(&dir).unwrap();
        assert_eq!((r.bytes.as_slice(), r.truncated), (&b"012"[..], true));
    }

    #[test]
    fn seq_read_matches_generic_read_and_reports_truncation() {
        let me = std::process::id();
        for name in ["stat", "status", "schedstat", "io", "cgroup"] {
            let path = std::path::PathBuf::from(format!("/proc/{me}/{name}"));
            let a = read_seq_capped(&path, 1 << 20).unwrap();
            let b = read_capped(&path, 1 << 20).unwrap();
            // Counters may move between the reads; lengths of stable files agree.
            if name == "cgroup" {
                assert_eq!(a, b);
            }
            assert!(!a.truncated && !a.bytes.is_empty(), "{name}");
        }
        let path = std::path::PathBuf::from(format!("/proc/{me}/status"));
        let cut = read_seq_capped(&path, 10).unwrap();
        assert_eq!((cut.bytes.len(), cut.truncated), (10, true));
        let big = read_seq_capped(&path, 5000).unwrap();
        assert!(!big.truncated && big.bytes.len() > 10);
    }

    #[test]
    fn missing_file_is_vanished_not_io() {
        let err = read_capped(Path::new("/proc/0/stat"), 10).unwrap_err();
        assert!(matches!(err, ReadError::Vanished { .. }), "{err:?}");
    }

    #[test]
    fn json_safe_stringifies_big_integers_only() {
        let v = serde_json::json!({"a": 1u64, "b": u64::MAX, "c": [i64::MIN, -3]});
        let s = json_safe(v);
        assert_eq!(s["a"], 1);
        assert_eq!(s["b"], u64::MAX.to_string());
        assert_eq!(s["c"][0], i64::MIN.to_string());
        assert_eq!(s["c"][1], -3);
    }
}
