//! Conntrack pressure: table occupancy against its maximum and the per-CPU
//! drop counters of `/proc/net/stat/nf_conntrack`.
//!
//! `nf_conntrack_count` and `/proc/net/stat/nf_conntrack` are per network
//! namespace; `nf_conntrack_max` is global (read-only outside the initial
//! netns on current kernels) but is checked against each namespace's count.
//! When `nf_conntrack` is not loaded the files are absent: that is
//! [`ConntrackError::NotLoaded`], which becomes an `unsupported` surface.
//!
//! Values in the stat file are hexadecimal, one line per possible CPU; the
//! `entries` column repeats the namespace-wide count on every line, every other
//! column is summed.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Occupancy and summed per-CPU statistics.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConntrackFacts {
    /// Entries in this netns.
    pub count: u64,
    /// Global maximum.
    pub max: u64,
    /// Per-CPU statistics summed (`drop`, `early_drop`, `insert_failed`, …).
    pub stats: BTreeMap<String, u64>,
}

impl ConntrackFacts {
    /// count / max in parts per million (0 when max is 0, i.e. unlimited).
    pub fn fill_ppm(&self) -> u64 {
        self.count
            .saturating_mul(1_000_000)
            .checked_div(self.max)
            .unwrap_or(0)
    }
}

/// Why conntrack facts could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub enum ConntrackError {
    /// The module is not loaded in this kernel (no files).
    #[error("nf_conntrack is not loaded: {0} is absent")]
    NotLoaded(String),
    /// A file had an unexpected shape.
    #[error("{path}: cannot parse: {reason}")]
    Parse {
        /// File.
        path: String,
        /// What was wrong.
        reason: String,
    },
    /// Reading failed otherwise.
    #[error("{path}: {message}")]
    Io {
        /// File.
        path: String,
        /// The OS's description.
        message: String,
        /// errno.
        errno: i32,
    },
}

/// Parse the stat file: header of column names, then hex values per CPU.
pub fn parse_stat(text: &str) -> Result<BTreeMap<String, u64>, String> {
    let mut lines = text.lines();
    let header: Vec<&str> = lines
        .next()
        .ok_or("empty file")?
        .split_whitespace()
        .collect();
    if header.is_empty() {
        return Err("empty header".into());
    }
    let mut out: BTreeMap<String, u64> = header.iter().map(|h| (h.to_string(), 0)).collect();
    let mut cpus = 0;
    for line in lines.filter(|l| !l.trim().is_empty()) {
        let vals: Vec<&str> = line.split_whitespace().collect();
        if vals.len() != header.len() {
            return Err(format!(
                "{} columns in header, {} in a CPU line",
                header.len(),
                vals.len()
            ));
        }
        for (h, v) in header.iter().zip(vals) {
            let n = u64::from_str_radix(v, 16).map_err(|_| format!("{h}={v:?} is not hex"))?;
            let slot = out.entry(h.to_string()).or_default();
            if *h == "entries" {
                *slot = n;
            } else {
                *slot = slot.saturating_add(n);
            }
        }
        cpus += 1;
    }
    if cpus == 0 {
        return Err("no CPU lines".into());
    }
    Ok(out)
}

fn read(path: &str) -> Result<String, ConntrackError> {
    std::fs::read_to_string(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            ConntrackError::NotLoaded(path.into())
        } else {
            ConntrackError::Io {
                path: path.into(),
                message: e.to_string(),
                errno: e.raw_os_error().unwrap_or(0),
            }
        }
    })
}

fn number(path: &str) -> Result<u64, ConntrackError> {
    let t = read(path)?;
    t.trim().parse().map_err(|_| ConntrackError::Parse {
        path: path.into(),
        reason: format!("{:?} is not a number", t.trim()),
    })
}

/// Read conntrack facts in the calling thread's netns. Returns the facts and
/// the raw bytes read (for the surface digest).
pub fn read_conntrack() -> Result<(ConntrackFacts, Vec<u8>), ConntrackError> {
    const COUNT: &str = "/proc/sys/net/netfilter/nf_conntrack_count";
    const MAX: &str = "/proc/sys/net/netfilter/nf_conntrack_max";
    const STAT: &str = "/proc/thread-self/net/stat/nf_conntrack";
    let count = number(COUNT)?;
    let max = number(MAX)?;
    let stat_text = read(STAT)?;
    let stats = parse_stat(&stat_text).map_err(|reason| ConntrackError::Parse {
        path: STAT.into(),
        reason,
    })?;
    let raw = format!("{count}\n{max}\n{stat_text}").into_bytes();
    Ok((ConntrackFacts { count, max, stats }, raw))
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "entries  clashres found new invalid ignore delete chainlength insert insert_failed drop early_drop icmp_error  expect_new expect_create expect_delete search_restart\n\
        000003e8  00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000002 00000005 00000001 00000000  00000000 00000000 00000000 00000000\n\
        000003e8  00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000001 0000000a 00000000 00000000  00000000 00000000 00000000 00000000\n";

    #[test]
    fn sums_cpus_but_not_entries() {
        let s = parse_stat(STAT).unwrap();
        assert_eq!(s["entries"], 1000);
        assert_eq!(s["drop"], 15);
        assert_eq!(s["insert_failed"], 3);
        assert_eq!(s["early_drop"], 1);
    }

    #[test]
    fn ragged_or_non_hex_lines_are_refused() {
        assert!(parse_stat("entries drop\n1\n").is_err());
        assert!(parse_stat("entries drop\n1 zz\n").is_err());
        assert!(parse_stat("entries drop\n").is_err());
        assert!(parse_stat("").is_err());
    }

    #[test]
    fn fill_ppm() {
        let f = ConntrackFacts {
            count: 950,
            max: 1000,
            stats: BTreeMap::new(),
        };
        assert_eq!(f.fill_ppm(), 950_000);
        let unlimited = ConntrackFacts { max: 0, ..f };
        assert_eq!(unlimited.fill_ppm(), 0);
    }
}
