//! The freezer state of a task's cgroup. A task in a FROZEN cgroup shows
//! state `D` without waiting on I/O or a lock; reading the freezer tells the
//! two apart. Safe to read in the agent: a cgroupfs attribute read takes no
//! lock of the frozen task.
//!
//! cgroup v1: `N:freezer:/path` → `/sys/fs/cgroup/freezer/path/freezer.state`
//! (`THAWED`, `FREEZING`, `FROZEN`). cgroup v2: `0::/path` →
//! `<unified mount>/path/cgroup.freeze` (`0`/`1`), the unified mount being
//! `/sys/fs/cgroup` or, on hybrid hosts, `/sys/fs/cgroup/unified`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::raw::{ReadError, Reading, read_seq_capped};

/// What the freezer says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FreezerFacts {
    /// `v1` or `v2`.
    pub hierarchy: String,
    /// The cgroup path within the hierarchy.
    pub cgroup: String,
    /// Normalized: `thawed`, `freezing` or `frozen`.
    pub state: String,
}

impl FreezerFacts {
    /// Whether tasks in it are (being) frozen.
    pub fn frozen(&self) -> bool {
        self.state != "thawed"
    }
}

/// The freezer file for an identity's `cgroup` text (lines joined by `;`),
/// with its hierarchy and cgroup path; `None` when the task is in no
/// freezer-capable, non-root cgroup. v1 is preferred when both exist.
pub fn freezer_file(cgroup: &str) -> Option<(PathBuf, &'static str, String)> {
    let mut v2 = None;
    for line in cgroup.split(';') {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        if path == "/" || path.is_empty() {
            continue;
        }
        if controllers.split(',').any(|c| c == "freezer") {
            let f = Path::new("/sys/fs/cgroup/freezer")
                .join(path.trim_start_matches('/'))
                .join("freezer.state");
            if f.exists() {
                return Some((f, "v1", path.to_string()));
            }
        } else if controllers.is_empty() {
            for root in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
                if Path::new(root).join("cgroup.controllers").exists() {
                    let f = Path::new(root)
                        .join(path.trim_start_matches('/'))
                        .join("cgroup.freeze");
                    if f.exists() {
                        v2 = Some((f, "v2", path.to_string()));
                        break;
                    }
                }
            }
        }
    }
    v2
}

/// Parse a freezer file's text for `hierarchy`.
pub fn parse_freezer(hierarchy: &str, bytes: &[u8]) -> Result<String, String> {
    let text = String::from_utf8_lossy(bytes);
    match (hierarchy, text.trim()) {
        ("v1", "THAWED") | ("v2", "0") => Ok("thawed".into()),
        ("v1", "FREEZING") => Ok("freezing".into()),
        ("v1", "FROZEN") | ("v2", "1") => Ok("frozen".into()),
        (_, other) => Err(format!("unmapped freezer state {other:?}")),
    }
}

/// Read the freezer of an identity's cgroup, if it has one.
pub fn read_freezer(cgroup: &str) -> Option<Result<Reading<FreezerFacts>, ReadError>> {
    let (file, hierarchy, path) = freezer_file(cgroup)?;
    Some(read_seq_capped(&file, 64).and_then(|raw| {
        let state = parse_freezer(hierarchy, &raw.bytes).map_err(|reason| ReadError::Parse {
            path: file.display().to_string(),
            reason,
        })?;
        Ok(Reading {
            facts: FreezerFacts {
                hierarchy: hierarchy.into(),
                cgroup: path,
                state,
            },
            raw: raw.meta(),
        })
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_map_and_unknown_is_refused() {
        assert_eq!(parse_freezer("v1", b"FROZEN\n").unwrap(), "frozen");
        assert_eq!(parse_freezer("v1", b"THAWED\n").unwrap(), "thawed");
        assert_eq!(parse_freezer("v2", b"1\n").unwrap(), "frozen");
        assert!(parse_freezer("v1", b"1\n").is_err());
    }

    #[test]
    fn root_cgroups_have_no_freezer_file() {
        assert!(freezer_file("0::/;7:freezer:/").is_none());
        assert!(freezer_file("garbage").is_none());
    }
}
