//! The spool: sealed envelopes waiting to be shipped, one file each.
//!
//! On-disk format. `<dir>/<hex>.json` holds the exact sealed bytes of the
//! envelope whose digest is `sha256:<hex>`; nothing else is in the file (no
//! header, no framing), so a file can be checked on its own with
//! `pstack_envelope::verify` and its name. `<dir>/quarantine/` holds files
//! that failed that check, renamed `<original name>.<reason>`.
//!
//! Durability. [`Spool::put`] writes `.tmp-<hex>-<pid>-<n>` (`O_EXCL`),
//! `fsync`s it, renames it to `<hex>.json` and `fsync`s the directory before it
//! returns; only then is a capture acknowledged to its caller. A crash before
//! the rename leaves a tmp file (quarantined at the next start); a crash after
//! it leaves a complete file. A torn file can therefore only come from the
//! storage lying about `fsync` or from outside tampering — and it is caught
//! anyway: every file is verified (digest recomputed and matched to its name)
//! before it is shipped or served, and quarantined if it fails.
//!
//! Who deletes what. The shipper deletes a file only after the collector has
//! acknowledged that exact digest (accepted or duplicate). The spool itself
//! deletes only under the overflow policy `drop_oldest` (each drop counted and
//! journaled at WARN with its digest) and when the quarantine holds more than
//! [`QUARANTINE_CAP`] files (the oldest quarantined file goes first).
//!
//! Bounds. Bytes and files are accounted in memory from one directory scan at
//! start (names and sizes only; no file is read, so a 10,000-file backlog
//! starts in milliseconds and holds no fds). Writes reserve their size before
//! touching the disk, so concurrent captures cannot overshoot the bounds.
//! ENOSPC from the filesystem is treated as "full" under the same policy.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use pstack_envelope::{DIGEST_PREFIX, is_sha256_digest};

use super::config::OverflowPolicy;

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

/// Why a spooled file was quarantined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuarantineReason {
    /// Zero bytes.
    Empty,
    /// Bytes do not verify, or the digest differs from the name.
    Invalid,
    /// A tmp file left by an interrupted write.
    StrayTmp,
    /// A name the spool never writes.
    UnexpectedName,
    /// Larger than [`MAX_ENVELOPE_BYTES`].
    Oversized,
    /// The collector rejected it permanently.
    RejectedByCollector,
    /// Not a regular file (a FIFO, a directory, a device) where an envelope
    /// was indexed: replaced after the index was built.
    NotRegular,
    /// Opening or reading it failed with something other than "not found"
    /// (a symlink, a symlink loop, EIO, EACCES).
    Unreadable,
    /// The collector refused it alone with 413 (too large for it).
    TooLargeForCollector,
}

impl QuarantineReason {
    /// Suffix and log name.
    pub fn as_str(self) -> &'static str {
        match self {
            QuarantineReason::Empty => "empty",
            QuarantineReason::Invalid => "invalid",
            QuarantineReason::StrayTmp => "stray_tmp",
            QuarantineReason::UnexpectedName => "unexpected_name",
            QuarantineReason::Oversized => "oversized",
            QuarantineReason::RejectedByCollector => "rejected",
            QuarantineReason::NotRegular => "not_regular",
            QuarantineReason::Unreadable => "unreadable",
            QuarantineReason::TooLargeForCollector => "too_large_for_collector",
        }
    }
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

#[derive(Debug, Default)]
struct Index {
    by_seq: BTreeMap<u64, SpoolEntry>,
    by_hex: HashMap<String, u64>,
    bytes: u64,
    reserved_bytes: u64,
    reserved_files: u64,
    reserved_hex: std::collections::HashSet<String>,
    next_seq: u64,
}

impl Index {
    fn insert(&mut self, hex: String, size: u64, spooled_at: std::time::SystemTime) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.bytes += size;
        self.by_hex.insert(hex.clone(), seq);
        self.by_seq.insert(
            seq,
            SpoolEntry {
                hex,
                size,
                seq,
                spooled_at,
            },
        );
    }

    fn remove(&mut self, hex: &str) -> Option<SpoolEntry> {
        let seq = self.by_hex.remove(hex)?;
        let entry = self.by_seq.remove(&seq)?;
        self.bytes -= entry.size;
        Some(entry)
    }

    fn files(&self) -> u64 {
        self.by_seq.len() as u64
    }
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

fn sync_dir(dir: &Path) -> Result<(), SpoolError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("fsync directory", dir))
}

impl Spool {
    /// Open (creating) the spool directory and index it: names and sizes only.
    /// Stray tmp files, empty files and unexpected names are quarantined.
    pub fn open(dir: &Path, limits: SpoolLimits) -> Result<Spool, SpoolError> {
        fs::create_dir_all(dir).map_err(io_err("create", dir))?;
        let quarantine = dir.join(QUARANTINE_DIR);
        fs::create_dir_all(&quarantine).map_err(io_err("create", &quarantine))?;
        let spool = Spool {
            dir: dir.to_owned(),
            quarantine,
            index: Mutex::new(Index::default()),
            limits: Mutex::new(limits),
            tmp_counter: AtomicU64::new(0),
            quarantine_counter: AtomicU64::new(0),
            counters: SpoolCounters::default(),
        };
        let mut found: Vec<(std::time::SystemTime, String, u64)> = Vec::new();
        for entry in fs::read_dir(dir).map_err(io_err("read directory", dir))? {
            let entry = entry.map_err(io_err("read directory", dir))?;
            let name = entry.file_name();
            let Some(name) = name.to_str().map(str::to_owned) else {
                let lossy = name.to_string_lossy().replace(['/', '\u{fffd}'], "_");
                spool.quarantine_file(
                    &entry.path(),
                    &format!("non-utf8-{lossy}"),
                    QuarantineReason::UnexpectedName,
                );
                continue;
            };
            if name == QUARANTINE_DIR {
                continue;
            }
            let meta = match entry.metadata() {
                Ok(m) => m,
                Err(_) => continue,
            };
            if name.starts_with(TMP_PREFIX) {
                match spool.recover_tmp(&entry.path(), &name) {
                    Some((hex, size)) => {
                        let mtime = meta.modified().unwrap_or(std::time::UNIX_EPOCH);
                        found.push((mtime, hex, size));
                    }
                    // (Unless it was a duplicate and is already gone.)
                    None if fs::symlink_metadata(entry.path()).is_ok() => {
                        spool.quarantine_file(&entry.path(), &name, QuarantineReason::StrayTmp)
                    }
                    None => {}
                }
                continue;
            }
            let hex = name.strip_suffix(".json").filter(|h| is_hex64(h));
            match hex {
                Some(hex) if meta.is_file() => {
                    if meta.len() == 0 {
                        spool.quarantine_file(&entry.path(), &name, QuarantineReason::Empty);
                    } else if meta.len() > MAX_ENVELOPE_BYTES {
                        spool.quarantine_file(&entry.path(), &name, QuarantineReason::Oversized);
                    } else {
                        let mtime = meta.modified().unwrap_or(std::time::UNIX_EPOCH);
                        found.push((mtime, hex.to_owned(), meta.len()));
                    }
                }
                _ => spool.quarantine_file(&entry.path(), &name, QuarantineReason::UnexpectedName),
            }
        }
        found.sort();
        {
            let mut index = spool.lock_index();
            for (mtime, hex, size) in found {
                index.insert(hex, size, mtime);
            }
        }
        spool.trim_quarantine();
        Ok(spool)
    }

    /// A temp file `.tmp-<hex>-…` that holds the complete, valid envelope
    /// `sha256:<hex>` (killed between fsync and rename): rename it into place
    /// (unless that file already exists) and return it for indexing.
    fn recover_tmp(&self, path: &Path, name: &str) -> Option<(String, u64)> {
        let hex = name.strip_prefix(TMP_PREFIX)?.get(..64)?.to_owned();
        if !is_hex64(&hex) {
            return None;
        }
        let bytes = read_regular(path).ok()?;
        let env = pstack_envelope::verify(&bytes).ok()?;
        if env.digest != format!("{DIGEST_PREFIX}{hex}") {
            return None;
        }
        let final_path = self.dir.join(format!("{hex}.json"));
        if final_path.exists() {
            // The rename happened after all (or a copy exists): drop ours.
            let _ = fs::remove_file(path);
            tracing::info!(
                file = name,
                "temp file duplicates a spooled envelope; removed"
            );
            return None;
        }
        File::open(path).and_then(|f| f.sync_all()).ok()?;
        fs::rename(path, &final_path).ok()?;
        let _ = sync_dir(&self.dir);
        self.counters.recovered.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(digest = %env.digest, "recovered a complete envelope from a temp file left by a crash");
        Some((hex, bytes.len() as u64))
    }

    fn lock_index(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
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
                let oldest = index.by_seq.values().next().map(|e| e.hex.clone());
                if let Some(old) = oldest {
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

    fn write_file(
        &self,
        hex: &str,
        bytes: &[u8],
        limits: SpoolLimits,
        dropped: &mut u64,
    ) -> Result<(), SpoolError> {
        let final_path = self.dir.join(format!("{hex}.json"));
        let mut attempts = 0;
        loop {
            let n = self.tmp_counter.fetch_add(1, Ordering::Relaxed);
            let tmp = self
                .dir
                .join(format!("{TMP_PREFIX}{hex}-{}-{n}", std::process::id()));
            match write_synced(&tmp, bytes) {
                Ok(()) => {}
                Err(e) => {
                    let _ = fs::remove_file(&tmp);
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
                            let old = index.by_seq.values().next().map(|e| e.hex.clone());
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
            }
            fs::rename(&tmp, &final_path).map_err(|e| {
                let _ = fs::remove_file(&tmp);
                SpoolError::Io {
                    op: "rename",
                    path: final_path.clone(),
                    source: e,
                }
            })?;
            sync_dir(&self.dir)?;
            return Ok(());
        }
    }

    fn drop_file(&self, hex: &str, why: &'static str) {
        let path = self.dir.join(format!("{hex}.json"));
        let _ = fs::remove_file(&path);
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
    /// is quarantined and `Ok(None)` returned; a missing file is forgotten.
    pub fn read_verified(&self, digest: &str) -> Result<Option<Vec<u8>>, SpoolError> {
        let hex = hex_of(digest)?.to_owned();
        let name = format!("{hex}.json");
        let path = self.dir.join(&name);
        let bytes = match read_regular(&path) {
            Ok(b) => b,
            Err(ReadRegular::Io(e)) if e.kind() == ErrorKind::NotFound => {
                self.lock_index().remove(&hex);
                return Ok(None);
            }
            Err(ReadRegular::NotRegular(kind)) => {
                tracing::warn!(file = %name, kind, "spool entry is not a regular file");
                self.lock_index().remove(&hex);
                self.quarantine_file(&path, &name, QuarantineReason::NotRegular);
                return Ok(None);
            }
            Err(ReadRegular::Io(e)) => {
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
            match pstack_envelope::verify(&bytes) {
                Ok(env) if env.digest == digest => None,
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

    pub fn acknowledge(&self, digest: &str) -> Result<(), SpoolError> {
        let hex = hex_of(digest)?.to_owned();
        let removed = self.lock_index().remove(&hex);
        let path = self.dir.join(format!("{hex}.json"));
        match fs::remove_file(&path) {
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
        self.lock_index().remove(&hex);
        let name = format!("{hex}.json");
        self.quarantine_file(&self.dir.join(&name), &name, reason);
        Ok(())
    }

    fn quarantine_file(&self, path: &Path, name: &str, reason: QuarantineReason) {
        // Unique: two entries with the same (or the same lossy) name never
        // overwrite each other's evidence.
        let n = self.quarantine_counter.fetch_add(1, Ordering::Relaxed);
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let target = self.quarantine.join(format!(
            "{name}.{}.{stamp}-{}-{n}",
            reason.as_str(),
            std::process::id()
        ));
        if let Err(e) = fs::rename(path, &target) {
            // Cannot move it aside: delete it rather than stall on it forever.
            let _ = fs::remove_file(path);
            tracing::warn!(file = %path.display(), error = %e, "quarantine rename failed; file deleted");
        }
        self.counters.quarantined.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            file = name,
            reason = reason.as_str(),
            "spool file quarantined"
        );
        self.trim_quarantine();
    }

    fn trim_quarantine(&self) {
        let Ok(rd) = fs::read_dir(&self.quarantine) else {
            return;
        };
        let mut files: Vec<(std::time::SystemTime, PathBuf)> = rd
            .filter_map(|e| e.ok())
            .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
            .collect();
        if files.len() <= QUARANTINE_CAP {
            return;
        }
        files.sort();
        let excess = files.len() - QUARANTINE_CAP;
        for (_, p) in files.into_iter().take(excess) {
            let _ = fs::remove_file(p);
        }
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

/// Why [`read_regular`] returned no bytes.
#[derive(Debug)]
enum ReadRegular {
    /// Opening, `fstat` or reading failed.
    Io(std::io::Error),
    /// Not a regular file: what it is.
    NotRegular(&'static str),
}

/// Read a spool file that must be a regular file: opened `O_NONBLOCK`
/// (a FIFO cannot block the open or the read) and `O_NOFOLLOW` (a symlink
/// or symlink loop fails with ELOOP), checked with `fstat` before any read,
/// read up to [`MAX_ENVELOPE_BYTES`] + 1.
fn read_regular(path: &Path) -> Result<Vec<u8>, ReadRegular> {
    use std::os::unix::fs::FileTypeExt;
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(ReadRegular::Io)?;
    let ft = file.metadata().map_err(ReadRegular::Io)?.file_type();
    if !ft.is_file() {
        let kind = if ft.is_dir() {
            "directory"
        } else if ft.is_fifo() {
            "fifo"
        } else if ft.is_socket() {
            "socket"
        } else if ft.is_char_device() || ft.is_block_device() {
            "device"
        } else {
            "other"
        };
        return Err(ReadRegular::NotRegular(kind));
    }
    let mut bytes = Vec::new();
    file.take(MAX_ENVELOPE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(ReadRegular::Io)?;
    Ok(bytes)
}

fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pstack_envelope::example::example_unsealed;

    fn sealed(n: u64) -> (String, Vec<u8>) {
        let mut e = example_unsealed();
        e.clock.monotonic_start_ns = (1_000 + n).to_string();
        let e = e.seal().unwrap();
        (e.digest.clone(), serde_json::to_vec(&e).unwrap())
    }

    fn limits(max_files: u64, overflow: OverflowPolicy) -> SpoolLimits {
        SpoolLimits {
            max_bytes: 1 << 30,
            max_files,
            overflow,
        }
    }

    #[test]
    fn put_is_durable_and_reindexed_after_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let s = Spool::open(dir.path(), limits(10, OverflowPolicy::DropOldest)).unwrap();
        let (d, b) = sealed(1);
        assert_eq!(s.put(&d, &b).unwrap(), PutOutcome::Written { dropped: 0 });
        assert_eq!(s.put(&d, &b).unwrap(), PutOutcome::AlreadySpooled);
        drop(s);
        let s = Spool::open(dir.path(), limits(10, OverflowPolicy::DropOldest)).unwrap();
        let snap = s.snapshot();
        assert_eq!((snap.files, snap.bytes), (1, b.len() as u64));
        assert_eq!(s.read_verified(&d).unwrap().unwrap(), b);
    }

    #[test]
    fn drop_oldest_drops_in_arrival_order_and_counts() {
        let dir = tempfile::tempdir().unwrap();
        let s = Spool::open(dir.path(), limits(2, OverflowPolicy::DropOldest)).unwrap();
        let items: Vec<_> = (0..3).map(sealed).collect();
        for (d, b) in &items {
            s.put(d, b).unwrap();
        }
        assert!(!s.contains(&items[0].0));
        assert!(s.contains(&items[1].0) && s.contains(&items[2].0));
        assert_eq!(s.snapshot().dropped_total, 1);
    }

    #[test]
    fn refuse_new_refuses_and_keeps_what_it_has() {
        let dir = tempfile::tempdir().unwrap();
        let s = Spool::open(dir.path(), limits(1, OverflowPolicy::RefuseNew)).unwrap();
        let (d0, b0) = sealed(0);
        let (d1, b1) = sealed(1);
        s.put(&d0, &b0).unwrap();
        assert!(matches!(s.put(&d1, &b1), Err(SpoolError::Full { .. })));
        assert!(s.contains(&d0));
        assert_eq!(s.snapshot().refused_total, 1);
        assert!(!s.has_room_for(10));
    }

    #[test]
    fn acknowledge_deletes_and_accounts() {
        let dir = tempfile::tempdir().unwrap();
        let s = Spool::open(dir.path(), limits(10, OverflowPolicy::DropOldest)).unwrap();
        let (d, b) = sealed(7);
        s.put(&d, &b).unwrap();
        s.acknowledge(&d).unwrap();
        let snap = s.snapshot();
        assert_eq!((snap.files, snap.bytes, snap.acknowledged_total), (0, 0, 1));
        assert!(!dir.path().join(format!("{}.json", &d[7..])).exists());
    }

    /// Torn writes at sector and page boundaries (what a lying disk or a
    /// crash without our fsync discipline would leave): never served, always
    /// quarantined, accounting follows.
    #[test]
    fn torn_files_at_512_and_4096_byte_boundaries_are_quarantined_not_served() {
        let dir = tempfile::tempdir().unwrap();
        let mut e = example_unsealed();
        // Make the envelope larger than two pages so every cut is inside it.
        e.surfaces[0].authority = format!("procfs:/proc/4242/{}", "x".repeat(9000));
        let e = e.seal().unwrap();
        let bytes = serde_json::to_vec(&e).unwrap();
        assert!(bytes.len() > 8192);
        for cut in [512usize, 4096, 8192, bytes.len() - 1] {
            let s = Spool::open(dir.path(), limits(10, OverflowPolicy::DropOldest)).unwrap();
            s.put(&e.digest, &bytes).unwrap();
            let path = dir.path().join(format!("{}.json", &e.digest[7..]));
            std::fs::write(&path, &bytes[..cut]).unwrap();
            assert_eq!(
                s.read_verified(&e.digest).unwrap(),
                None,
                "cut at {cut} was served"
            );
            assert!(!s.contains(&e.digest));
            assert_eq!(s.snapshot().files, 0);
            assert_eq!(s.snapshot().quarantined_total, 1);
            assert!(!path.exists());
        }
    }

    #[test]
    fn a_complete_temp_file_is_recovered_and_a_torn_one_quarantined() {
        let dir = tempfile::tempdir().unwrap();
        let (d, b) = sealed(11);
        let (d2, b2) = sealed(12);
        // Killed between fsync and rename: a complete, valid envelope.
        std::fs::write(dir.path().join(format!(".tmp-{}-77-0", &d[7..])), &b).unwrap();
        // Killed mid-write: a torn one.
        std::fs::write(
            dir.path().join(format!(".tmp-{}-77-1", &d2[7..])),
            &b2[..b2.len() / 2],
        )
        .unwrap();
        let s = Spool::open(dir.path(), limits(10, OverflowPolicy::DropOldest)).unwrap();
        assert!(s.contains(&d));
        assert_eq!(s.read_verified(&d).unwrap().unwrap(), b);
        assert!(!s.contains(&d2));
        let snap = s.snapshot();
        assert_eq!((snap.recovered_total, snap.quarantined_total), (1, 1));
    }

    #[test]
    fn quarantine_names_are_unique() {
        let dir = tempfile::tempdir().unwrap();
        let s = Spool::open(dir.path(), limits(10, OverflowPolicy::DropOldest)).unwrap();
        for _ in 0..2 {
            let p = dir.path().join("same");
            std::fs::write(&p, b"x").unwrap();
            s.quarantine_file(&p, "same", QuarantineReason::UnexpectedName);
        }
        assert_eq!(
            std::fs::read_dir(dir.path().join("quarantine"))
                .unwrap()
                .count(),
            2
        );
    }

    #[test]
    fn bad_digest_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let s = Spool::open(dir.path(), limits(10, OverflowPolicy::DropOldest)).unwrap();
        assert!(matches!(
            s.put("sha256:../../etc/passwd", b"{}"),
            Err(SpoolError::BadDigest(_))
        ));
        assert!(matches!(
            s.put("md5:00", b"{}"),
            Err(SpoolError::BadDigest(_))
        ));
    }
}
