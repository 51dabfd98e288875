//! The spool: sealed envelopes waiting to be shipped, one file each.
//!
//! # Invariants
//!
//! These are what the model test (`spool/model_tests.rs`) checks after every
//! step of random operation sequences run over a fault-injecting filesystem
//! (`spool/fault_fs.rs`: torn writes, ENOSPC, EIO on fsync, lost renames,
//! EIO on read, and a crash between any two filesystem calls):
//!
//! 1. **No acknowledged envelope is lost.** Once [`Spool::put`] returns `Ok`
//!    (the capture is acknowledged to its caller), the envelope stays held —
//!    across any crash and restart — until one of these, each counted: the
//!    collector acknowledged it ([`Spool::acknowledge`],
//!    `acknowledged_total`); the overflow policy dropped it
//!    (`dropped_total`); or the storage failed on it (EIO reading it, or
//!    bytes that no longer verify) and it was moved to `quarantine/` with its
//!    bytes (`quarantined_total`).
//! 2. **Nothing torn is ever served.** [`Spool::read_verified`] returns only
//!    bytes whose recomputed digest is the one in the file's name; anything
//!    else is quarantined, never returned.
//! 3. **Recovery never quarantines a complete, valid envelope.** At start a
//!    temp file holding the complete envelope its name promises (a crash
//!    between fsync and rename) is renamed into place and counted in
//!    `recovered_total`; only what fails verification (or cannot be read)
//!    goes to `quarantine/`. A temp file whose recovery cannot be made
//!    durable (fsync fails) is left where it is for the next start.
//! 4. **Bounds hold at admission.** After a put is admitted the spool holds
//!    at most `max_files` files and `max_bytes` bytes (drop-oldest drops,
//!    refuse-new refuses, ENOSPC is "full" under the same policy). A crash
//!    can bring back files whose unlink was not yet durable (re-shipped;
//!    the collector dedupes by digest); they count against the bounds at the
//!    next put.
//! 5. **The accounting is the disk.** The index's files and bytes equal the
//!    `<hex>.json` files in the directory whenever no call is in flight, and
//!    the counters count exactly the events above.
//!
//! # On disk
//!
//! `<dir>/<hex>.json` holds the exact sealed bytes of the envelope whose
//! digest is `sha256:<hex>`; nothing else is in the file (no header, no
//! framing), so a file can be checked on its own with
//! `pstack_envelope::verify` and its name. `<dir>/quarantine/` holds files
//! that failed that check, renamed `<original name>.<reason>.<unique>`.
//!
//! # Durability
//!
//! [`Spool::put`] creates `.tmp-<hex>-<pid>-<n>` (`O_EXCL`), writes and
//! `fsync`s it, renames it to `<hex>.json` and `fsync`s the directory before
//! it returns; only then is a capture acknowledged. If any step fails the
//! put fails (counted in `refused_total`) and leaves no file behind: a
//! failed directory fsync unlinks the renamed file, so nothing unacknowledged
//! sits in the directory unaccounted. A crash before the rename is durable
//! leaves a temp file, which start-up recovers (invariant 3).
//!
//! # Who deletes what
//!
//! The shipper deletes a file only after the collector has acknowledged that
//! exact digest (accepted or duplicate). The spool itself deletes only under
//! `drop_oldest` (each drop counted and journaled at WARN with its digest)
//! and when the quarantine holds more than [`QUARANTINE_CAP`] files (the
//! oldest quarantined file goes first).
//!
//! # Bounds
//!
//! Bytes and files are accounted in memory from one directory scan at start
//! (names and sizes only; no file is read, so a 10,000-file backlog starts in
//! milliseconds and holds no fds). Writes reserve their size before touching
//! the disk, so concurrent captures cannot overshoot the bounds.
//!
//! Every filesystem call goes through [`SpoolFs`]: [`RealFs`] in
//! pstackd, the fault double in tests.

mod fs;
mod index;
mod quarantine;
mod recover;

#[cfg(test)]
mod fault_fs;
#[cfg(test)]
mod model_tests;
#[cfg(test)]
mod tests;

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use pstack_envelope::{DIGEST_PREFIX, is_sha256_digest};

use super::config::OverflowPolicy;

pub use fs::{EntryKind, ListedEntry, ReadError, RealFs, SpoolFile, SpoolFs};
use index::Index;
pub use quarantine::QuarantineReason;

/// Most files kept in `quarantine/`; beyond it the oldest is deleted.
pub const QUARANTINE_CAP: usize = 1_000;

/// Largest envelope the spool accepts or reads back, bytes.
pub const MAX_ENVELOPE_BYTES: u64 = 4 << 20;

const TMP_PREFIX: &str = ".tmp-";
const QUARANTINE_DIR: &str = "quarantine";

/// Why the spool refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    /// The spool is full and the policy is `refuse_new`.
    #[error(
        "spool is full ({files} files, {bytes} bytes; limits {max_files} files, {max_bytes} bytes) and the overflow policy refuses new envelopes"
    )]
    Full {
        /// Files held.
        files: u64,
        /// Bytes held.
        bytes: u64,
        /// File limit.
        max_files: u64,
        /// Byte limit.
        max_bytes: u64,
    },
    /// The filesystem has no space left and nothing can be dropped.
    #[error("spool filesystem is out of space at {path}")]
    NoSpace {
        /// The file being written.
        path: PathBuf,
    },
    /// One envelope is larger than the spool could ever hold.
    #[error("envelope of {size} bytes exceeds the spool's per-envelope limit of {limit} bytes")]
    TooLarge {
        /// Its size.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// Not a `sha256:<hex>` digest.
    #[error("not a sha256 digest: {0:?}")]
    BadDigest(String),
    /// A filesystem call failed.
    #[error("spool I/O: {op} {path}: {source}")]
    Io {
        /// The operation.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// Result of a put.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    /// Written and synced.
    Written {
        /// Envelopes dropped (oldest first) to make room.
        dropped: u64,
    },
    /// Already spooled under that digest (same bytes by construction).
    AlreadySpooled,
}

/// One spooled envelope, as the index knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpoolEntry {
    /// Lowercase hex of the digest.
    pub hex: String,
    /// File size, bytes.
    pub size: u64,
    /// Order of arrival (older is smaller).
    pub seq: u64,
    /// When it was spooled (file mtime after a restart).
    pub spooled_at: std::time::SystemTime,
}

impl SpoolEntry {
    /// `sha256:<hex>`.
    pub fn digest(&self) -> String {
        format!("{DIGEST_PREFIX}{}", self.hex)
    }
}

/// Limits and policy (changeable at reload).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpoolLimits {
    /// Most bytes.
    pub max_bytes: u64,
    /// Most files.
    pub max_files: u64,
    /// Overflow policy.
    pub overflow: OverflowPolicy,
}

/// Counters, monotonically increasing since start.
#[derive(Debug, Default)]
pub struct SpoolCounters {
    /// Temp files found complete and valid at start and renamed into place.
    pub recovered: AtomicU64,
    /// Envelopes written.
    pub written: AtomicU64,
    /// Envelopes dropped by `drop_oldest`.
    pub dropped: AtomicU64,
    /// Puts refused (`refuse_new`, or out of space with nothing to drop).
    pub refused: AtomicU64,
    /// Files quarantined.
    pub quarantined: AtomicU64,
    /// Envelopes deleted after the collector acknowledged them.
    pub acknowledged: AtomicU64,
}

impl From<SpoolSnapshot> for pstackd_api::status::SpoolStatus {
    fn from(s: SpoolSnapshot) -> Self {
        pstackd_api::status::SpoolStatus {
            files: s.files,
            bytes: s.bytes,
            max_files: s.max_files,
            max_bytes: s.max_bytes,
            overflow: s.overflow.to_string(),
            written_total: s.written_total,
            dropped_total: s.dropped_total,
            refused_total: s.refused_total,
            quarantined_total: s.quarantined_total,
            acknowledged_total: s.acknowledged_total,
            recovered_total: s.recovered_total,
        }
    }
}

/// A snapshot for `/v1/status` and `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct SpoolSnapshot {
    /// Files held.
    pub files: u64,
    /// Bytes held.
    pub bytes: u64,
    /// File limit.
    pub max_files: u64,
    /// Byte limit.
    pub max_bytes: u64,
    /// Overflow policy.
    pub overflow: &'static str,
    /// Written since start.
    pub written_total: u64,
    /// Dropped since start.
    pub dropped_total: u64,
    /// Refused since start.
    pub refused_total: u64,
    /// Quarantined since start.
    pub quarantined_total: u64,
    /// Deleted after acknowledgement since start.
    pub acknowledged_total: u64,
    /// Temp files recovered at start (complete, valid envelopes killed
    /// between fsync and rename).
    pub recovered_total: u64,
}

/// The spool.
#[derive(Debug)]
pub struct Spool {
    fs: Arc<dyn SpoolFs>,
    dir: PathBuf,
    quarantine: PathBuf,
    index: Mutex<Index>,
    limits: Mutex<SpoolLimits>,
    tmp_counter: AtomicU64,
    quarantine_counter: AtomicU64,
    /// Counters.
    pub counters: SpoolCounters,
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> SpoolError + 'a {
    move |source| SpoolError::Io {
        op,
        path: path.to_owned(),
        source,
    }
}

fn hex_of(digest: &str) -> Result<&str, SpoolError> {
    if !is_sha256_digest(digest) {
        return Err(SpoolError::BadDigest(digest.to_owned()));
    }
    Ok(&digest[DIGEST_PREFIX.len()..])
}

fn is_hex64(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl Spool {
    /// Open (creating) the spool directory on the real filesystem and index
    /// it (see [`Spool::open_with`]).
    pub fn open(dir: &Path, limits: SpoolLimits) -> Result<Spool, SpoolError> {
        Spool::open_with(Arc::new(RealFs), dir, limits)
    }

    fn lock_index(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn final_path(&self, hex: &str) -> PathBuf {
        self.dir.join(format!("{hex}.json"))
    }

    /// Replace limits and policy (reload). Does not drop anything by itself.
    pub fn set_limits(&self, limits: SpoolLimits) {
        *self.limits.lock().unwrap_or_else(|p| p.into_inner()) = limits;
    }

    /// Current limits.
    pub fn limits(&self) -> SpoolLimits {
        *self.limits.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a new envelope of about `size` bytes could be stored without
    /// refusing (always true under `drop_oldest`).
    pub fn has_room_for(&self, size: u64) -> bool {
        let limits = self.limits();
        if limits.overflow == OverflowPolicy::DropOldest {
            return true;
        }
        let index = self.lock_index();
        index.files() + index.reserved_files < limits.max_files
            && index.bytes + index.reserved_bytes + size <= limits.max_bytes
    }

    /// Durably store `bytes` under `digest` (the caller has sealed them).
    pub fn put(&self, digest: &str, bytes: &[u8]) -> Result<PutOutcome, SpoolError> {
        let hex = hex_of(digest)?.to_owned();
        let size = bytes.len() as u64;
        let limits = self.limits();
        if size > MAX_ENVELOPE_BYTES || size > limits.max_bytes {
            self.counters.refused.fetch_add(1, Ordering::Relaxed);
            return Err(SpoolError::TooLarge {
                size,
                limit: MAX_ENVELOPE_BYTES.min(limits.max_bytes),
            });
        }
        let mut dropped = 0u64;
        // Reserve room under the lock; write outside it.
        {
            let mut index = self.lock_index();
            if index.by_hex.contains_key(&hex) || index.reserved_hex.contains(&hex) {
                return Ok(PutOutcome::AlreadySpooled);
            }
            loop {
                let files = index.files() + index.reserved_files;
                let held = index.bytes + index.reserved_bytes;
                if files < limits.max_files && held + size <= limits.max_bytes {
                    break;
                }
                if limits.overflow == OverflowPolicy::RefuseNew || index.by_seq.is_empty() {
                    self.counters.refused.fetch_add(1, Ordering::Relaxed);
                    return Err(SpoolError::Full {
                        files,
                        bytes: held,
                        max_files: limits.max_files,
                        max_bytes: limits.max_bytes,
                    });
                }
                if let Some(old) = index.oldest_hex() {
                    index.remove(&old);
                    self.drop_file(&old, "overflow");
                    dropped += 1;
                }
            }
            index.reserved_bytes += size;
            index.reserved_files += 1;
            index.reserved_hex.insert(hex.clone());
        }
        let result = self.write_file(&hex, bytes, limits, &mut dropped);
        let mut index = self.lock_index();
        index.reserved_bytes -= size;
        index.reserved_files -= 1;
        index.reserved_hex.remove(&hex);
        match result {
            Ok(()) => {
                index.insert(hex, size, std::time::SystemTime::now());
                self.counters.written.fetch_add(1, Ordering::Relaxed);
                Ok(PutOutcome::Written { dropped })
            }
            Err(e) => {
                self.counters.refused.fetch_add(1, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    /// tmp → write → fsync → rename → fsync dir. On failure nothing of ours
    /// is left in the directory (best effort: the unlinks themselves can fail).
    fn write_file(
        &self,
        hex: &str,
        bytes: &[u8],
        limits: SpoolLimits,
        dropped: &mut u64,
    ) -> Result<(), SpoolError> {
        let final_path = self.final_path(hex);
        let mut attempts = 0;
        loop {
            let n = self.tmp_counter.fetch_add(1, Ordering::Relaxed);
            let tmp = self
                .dir
                .join(format!("{TMP_PREFIX}{hex}-{}-{n}", std::process::id()));
            if let Err(e) = self.write_synced(&tmp, bytes) {
                let _ = self.fs.remove(&tmp);
                let enospc = e.raw_os_error() == Some(libc::ENOSPC)
                    || e.raw_os_error() == Some(libc::EDQUOT);
                if !enospc {
                    return Err(SpoolError::Io {
                        op: "write",
                        path: tmp,
                        source: e,
                    });
                }
                attempts += 1;
                // Out of space below our own byte bound: apply the policy.
                if limits.overflow == OverflowPolicy::DropOldest && attempts < 64 {
                    let oldest = {
                        let mut index = self.lock_index();
                        let old = index.oldest_hex();
                        if let Some(old) = &old {
                            index.remove(old);
                        }
                        old
                    };
                    if let Some(old) = oldest {
                        self.drop_file(&old, "filesystem_full");
                        *dropped += 1;
                        continue;
                    }
                }
                return Err(SpoolError::NoSpace { path: tmp });
            }
            if let Err(e) = self.fs.rename(&tmp, &final_path) {
                let _ = self.fs.remove(&tmp);
                return Err(io_err("rename", &final_path)(e));
            }
            if let Err(e) = self.fs.sync_dir(&self.dir) {
                // Not durable, so not acknowledged: take it back out rather
                // than leave an unindexed file that the bounds do not count.
                let _ = self.fs.remove(&final_path);
                return Err(io_err("fsync directory", &self.dir)(e));
            }
            return Ok(());
        }
    }

    fn write_synced(&self, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
        let mut f = self.fs.create_new(path)?;
        f.write_all(bytes)?;
        f.sync()
    }

    fn drop_file(&self, hex: &str, why: &'static str) {
        let _ = self.fs.remove(&self.final_path(hex));
        self.counters.dropped.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            digest = %format!("{DIGEST_PREFIX}{hex}"),
            reason = why,
            "spool overflow: dropped the oldest unshipped envelope"
        );
    }

    /// The oldest entries, up to `max_items` and (after the first) `max_bytes`.
    pub fn oldest(&self, max_items: usize, max_bytes: u64) -> Vec<SpoolEntry> {
        let index = self.lock_index();
        let mut out = Vec::new();
        let mut bytes = 0;
        for entry in index.by_seq.values() {
            if out.len() >= max_items || (!out.is_empty() && bytes + entry.size > max_bytes) {
                break;
            }
            bytes += entry.size;
            out.push(entry.clone());
        }
        out
    }

    /// When the oldest held envelope was spooled.
    pub fn oldest_spooled_at(&self) -> Option<std::time::SystemTime> {
        self.lock_index()
            .by_seq
            .values()
            .next()
            .map(|e| e.spooled_at)
    }

    /// Whether `digest` is spooled.
    pub fn contains(&self, digest: &str) -> bool {
        hex_of(digest).is_ok_and(|h| self.lock_index().by_hex.contains_key(h))
    }

    /// Read and verify one spooled envelope. A file that fails verification
    /// or cannot be read (anything but "not found") is quarantined and
    /// `Ok(None)` returned; a missing file is forgotten.
    pub fn read_verified(&self, digest: &str) -> Result<Option<Vec<u8>>, SpoolError> {
        let hex = hex_of(digest)?.to_owned();
        let name = format!("{hex}.json");
        let path = self.dir.join(&name);
        let bytes = match self.fs.read_regular(&path, MAX_ENVELOPE_BYTES + 1) {
            Ok(b) => b,
            Err(ReadError::Io(e)) if e.kind() == ErrorKind::NotFound => {
                self.lock_index().remove(&hex);
                return Ok(None);
            }
            Err(ReadError::NotRegular(kind)) => {
                tracing::warn!(file = %name, kind, "spool entry is not a regular file");
                self.lock_index().remove(&hex);
                self.quarantine_file(&path, &name, QuarantineReason::NotRegular);
                return Ok(None);
            }
            Err(ReadError::Io(e)) => {
                // Never retry an unreadable entry forever (a symlink, ELOOP,
                // EIO): move it aside, or forget it if even that fails.
                tracing::warn!(file = %name, error = %e, "spool entry unreadable");
                self.lock_index().remove(&hex);
                self.quarantine_file(&path, &name, QuarantineReason::Unreadable);
                return Ok(None);
            }
        };
        let reason = if bytes.is_empty() {
            Some(QuarantineReason::Empty)
        } else if bytes.len() as u64 > MAX_ENVELOPE_BYTES {
            Some(QuarantineReason::Oversized)
        } else {
            // The digest alone is needed: the one-pass check, no typed model.
            match pstack_envelope::verify_digest(&bytes) {
                Ok(d) if d.to_string() == digest => None,
                _ => Some(QuarantineReason::Invalid),
            }
        };
        if let Some(reason) = reason {
            self.lock_index().remove(&hex);
            self.quarantine_file(&path, &name, reason);
            return Ok(None);
        }
        Ok(Some(bytes))
    }

    /// The collector acknowledged `digest`: delete it.
    pub fn acknowledge(&self, digest: &str) -> Result<(), SpoolError> {
        let hex = hex_of(digest)?.to_owned();
        let removed = self.lock_index().remove(&hex);
        let path = self.final_path(&hex);
        match self.fs.remove(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(io_err("remove", &path)(e)),
        }
        if removed.is_some() {
            self.counters.acknowledged.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Move a spooled envelope to quarantine for `reason`.
    pub fn quarantine(&self, digest: &str, reason: QuarantineReason) -> Result<(), SpoolError> {
        let hex = hex_of(digest)?.to_owned();
        let name = format!("{hex}.json");
        self.quarantine_file(&self.dir.join(&name), &name, reason);
        // Out of the index only once moved and counted: a snapshot never
        // shows the file gone from `files` and not yet in
        // `quarantined_total`.
        self.lock_index().remove(&hex);
        Ok(())
    }

    /// Counters and sizes.
    pub fn snapshot(&self) -> SpoolSnapshot {
        let limits = self.limits();
        let (files, bytes) = {
            let index = self.lock_index();
            (index.files(), index.bytes)
        };
        let c = &self.counters;
        SpoolSnapshot {
            files,
            bytes,
            max_files: limits.max_files,
            max_bytes: limits.max_bytes,
            overflow: limits.overflow.as_str(),
            written_total: c.written.load(Ordering::Relaxed),
            dropped_total: c.dropped.load(Ordering::Relaxed),
            refused_total: c.refused.load(Ordering::Relaxed),
            quarantined_total: c.quarantined.load(Ordering::Relaxed),
            acknowledged_total: c.acknowledged.load(Ordering::Relaxed),
            recovered_total: c.recovered.load(Ordering::Relaxed),
        }
    }
}
