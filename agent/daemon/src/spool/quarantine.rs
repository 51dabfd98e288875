//! Quarantine: files the spool will not serve, moved aside with their bytes
//! (evidence is kept, never silently deleted) under a unique name, and the
//! cap that keeps the quarantine itself bounded.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use super::{QUARANTINE_CAP, Spool};

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

impl Spool {
    /// Move `path` (named `name` in logs) to `quarantine/` for `reason`,
    /// under a name no other quarantined file has; if it cannot be moved,
    /// delete it rather than stall on it forever. Counted either way.
    pub(super) fn quarantine_file(&self, path: &Path, name: &str, reason: QuarantineReason) {
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
        if let Err(e) = self.fs.rename(path, &target) {
            let removed = self.fs.remove(path);
            tracing::warn!(
                file = %path.display(),
                error = %e,
                removed = removed.is_ok(),
                "quarantine rename failed; file deleted (or, if that failed too, forgotten until the next start)"
            );
        }
        self.counters.quarantined.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            file = name,
            reason = reason.as_str(),
            "spool file quarantined"
        );
        self.trim_quarantine();
    }

    /// Keep at most [`QUARANTINE_CAP`] files in `quarantine/`, oldest deleted first.
    pub(super) fn trim_quarantine(&self) {
        let Ok(entries) = self.fs.list(&self.quarantine) else {
            return;
        };
        if entries.len() <= QUARANTINE_CAP {
            return;
        }
        let mut files: Vec<(std::time::SystemTime, PathBuf)> = entries
            .into_iter()
            .map(|e| (e.modified, self.quarantine.join(e.name)))
            .collect();
        files.sort();
        let excess = files.len() - QUARANTINE_CAP;
        for (_, p) in files.into_iter().take(excess) {
            let _ = self.fs.remove(&p);
        }
    }
}
