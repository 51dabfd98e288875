//! The in-memory index: what the spool holds, in arrival order, with the
//! reservations of writes in flight. It is the only accounting the bounds
//! are checked against, so it must equal the directory (invariant 5 in
//! `mod.rs`): every insert follows a durable write, every remove precedes or
//! follows an unlink of the same file under the same call.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::SpoolEntry;

/// Held entries and in-flight reservations.
#[derive(Debug, Default)]
pub(super) struct Index {
    pub(super) by_seq: BTreeMap<u64, SpoolEntry>,
    pub(super) by_hex: HashMap<String, u64>,
    pub(super) bytes: u64,
    pub(super) reserved_bytes: u64,
    pub(super) reserved_files: u64,
    pub(super) reserved_hex: HashSet<String>,
    pub(super) next_seq: u64,
}

impl Index {
    pub(super) fn insert(&mut self, hex: String, size: u64, spooled_at: std::time::SystemTime) {
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

    pub(super) fn remove(&mut self, hex: &str) -> Option<SpoolEntry> {
        let seq = self.by_hex.remove(hex)?;
        let entry = self.by_seq.remove(&seq)?;
        self.bytes -= entry.size;
        Some(entry)
    }

    pub(super) fn files(&self) -> u64 {
        self.by_seq.len() as u64
    }

    /// The oldest held entry's hex.
    pub(super) fn oldest_hex(&self) -> Option<String> {
        self.by_seq.values().next().map(|e| e.hex.clone())
    }
}
