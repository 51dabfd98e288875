//! Start-up: index the directory from one scan (names, kinds and sizes; no
//! envelope file is read) and settle what a crash left behind.
//!
//! - `<hex>.json`, regular, 1 byte ..= [`MAX_ENVELOPE_BYTES`]: indexed in
//!   mtime order (verified later, when it is read).
//! - `.tmp-<hex>-…` holding the complete envelope `sha256:<hex>` (a crash
//!   between fsync and rename, or a rename that did not survive the crash):
//!   fsynced, renamed into place and indexed (`recovered_total`) — unless
//!   `<hex>.json` exists, then the temp file is a duplicate and is removed.
//!   If the fsync or rename fails it stays where it is, for the next start:
//!   a complete, valid envelope is never quarantined.
//! - A temp file that does not verify (torn by a crash mid-write), an empty
//!   or oversized envelope file, a name the spool never writes, a temp file
//!   that cannot be read: quarantined with the reason.

use std::path::Path;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use pstack_envelope::DIGEST_PREFIX;

use super::fs::{EntryKind, ReadError, SpoolFs};
use super::index::Index;
use super::{
    MAX_ENVELOPE_BYTES, QUARANTINE_DIR, QuarantineReason, Spool, SpoolCounters, SpoolError,
    SpoolLimits, TMP_PREFIX, io_err, is_hex64,
};

/// What became of one temp file.
enum Tmp {
    /// Renamed into place: index it.
    Recovered { hex: String, size: u64 },
    /// `<hex>.json` already exists: removed.
    Duplicate,
    /// Complete and valid, but making it durable failed: left in place.
    Deferred,
    /// Quarantine it for this reason.
    Quarantine(QuarantineReason),
}

impl Spool {
    /// Open (creating) the spool directory over `fs` and index it: names and
    /// sizes only. Temp files are recovered or quarantined, empty files and
    /// unexpected names quarantined (see the module comment).
    pub fn open_with(
        fs: Arc<dyn SpoolFs>,
        dir: &Path,
        limits: SpoolLimits,
    ) -> Result<Spool, SpoolError> {
        fs.create_dir_all(dir).map_err(io_err("create", dir))?;
        let quarantine = dir.join(QUARANTINE_DIR);
        fs.create_dir_all(&quarantine)
            .map_err(io_err("create", &quarantine))?;
        let spool = Spool {
            fs,
            dir: dir.to_owned(),
            quarantine,
            index: Mutex::new(Index::default()),
            limits: Mutex::new(limits),
            tmp_counter: AtomicU64::new(0),
            quarantine_counter: AtomicU64::new(0),
            counters: SpoolCounters::default(),
        };
        let mut found: Vec<(std::time::SystemTime, String, u64)> = Vec::new();
        for entry in spool.fs.list(dir).map_err(io_err("read directory", dir))? {
            let path = dir.join(&entry.name);
            let Some(name) = entry.name.to_str().map(str::to_owned) else {
                let lossy = entry.name.to_string_lossy().replace(['/', '\u{fffd}'], "_");
                spool.quarantine_file(
                    &path,
                    &format!("non-utf8-{lossy}"),
                    QuarantineReason::UnexpectedName,
                );
                continue;
            };
            if name == QUARANTINE_DIR {
                continue;
            }
            if name.starts_with(TMP_PREFIX) {
                match spool.recover_tmp(&path, &name) {
                    Tmp::Recovered { hex, size } => found.push((entry.modified, hex, size)),
                    Tmp::Duplicate | Tmp::Deferred => {}
                    Tmp::Quarantine(reason) => spool.quarantine_file(&path, &name, reason),
                }
                continue;
            }
            let hex = name.strip_suffix(".json").filter(|h| is_hex64(h));
            match hex {
                Some(hex) if entry.kind == EntryKind::File => {
                    if entry.len == 0 {
                        spool.quarantine_file(&path, &name, QuarantineReason::Empty);
                    } else if entry.len > MAX_ENVELOPE_BYTES {
                        spool.quarantine_file(&path, &name, QuarantineReason::Oversized);
                    } else {
                        found.push((entry.modified, hex.to_owned(), entry.len));
                    }
                }
                _ => spool.quarantine_file(&path, &name, QuarantineReason::UnexpectedName),
            }
        }
        found.sort();
        {
            let mut index = spool.lock_index();
            for (mtime, hex, size) in found {
                // A recovered temp file and a listed `<hex>.json` can name
                // the same envelope when the listing saw both.
                if !index.by_hex.contains_key(&hex) {
                    index.insert(hex, size, mtime);
                }
            }
        }
        spool.trim_quarantine();
        Ok(spool)
    }

    /// Settle a temp file `.tmp-<hex>-…`.
    fn recover_tmp(&self, path: &Path, name: &str) -> Tmp {
        let Some(hex) = name
            .strip_prefix(TMP_PREFIX)
            .and_then(|rest| rest.get(..64))
            .filter(|h| is_hex64(h))
            .map(str::to_owned)
        else {
            return Tmp::Quarantine(QuarantineReason::StrayTmp);
        };
        let bytes = match self.fs.read_regular(path, MAX_ENVELOPE_BYTES + 1) {
            Ok(b) => b,
            Err(ReadError::NotRegular(_)) => return Tmp::Quarantine(QuarantineReason::NotRegular),
            Err(ReadError::Io(e)) => {
                tracing::warn!(file = name, error = %e, "temp file unreadable");
                return Tmp::Quarantine(QuarantineReason::Unreadable);
            }
        };
        let digest = format!("{DIGEST_PREFIX}{hex}");
        match pstack_envelope::verify_digest(&bytes) {
            Ok(d) if d.to_string() == digest => {}
            _ => return Tmp::Quarantine(QuarantineReason::StrayTmp),
        }
        let final_path = self.final_path(&hex);
        if self.fs.exists(&final_path) {
            // The rename happened after all (or a copy exists): drop ours.
            let _ = self.fs.remove(path);
            tracing::info!(
                file = name,
                "temp file duplicates a spooled envelope; removed"
            );
            return Tmp::Duplicate;
        }
        if let Err(e) = self.fs.sync_file(path) {
            tracing::warn!(file = name, error = %e, "cannot fsync a recoverable temp file; left for the next start");
            return Tmp::Deferred;
        }
        if let Err(e) = self.fs.rename(path, &final_path) {
            tracing::warn!(file = name, error = %e, "cannot rename a recoverable temp file; left for the next start");
            return Tmp::Deferred;
        }
        if let Err(e) = self.fs.sync_dir(&self.dir) {
            // The temp file's bytes are durable; if the rename is lost the
            // next start finds the temp file again.
            tracing::warn!(error = %e, "fsync of the spool directory failed after a recovery");
        }
        self.counters.recovered.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(digest = %digest, "recovered a complete envelope from a temp file left by a crash");
        Tmp::Recovered {
            hex,
            size: bytes.len() as u64,
        }
    }
}
