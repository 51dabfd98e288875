//! Subject identity: a PID alone is not one. A process is identified by
//! host, boot id, pid, start ticks, uid, pid namespace and cgroup; the agent
//! reads this before the slow surfaces and again before emit, and any change
//! means the evidence cannot be attributed (`identity_race`).
//!
//! These reads are safe in the agent's own process: `stat`, `status`,
//! `cgroup` and the `ns/pid` link do not take the target's memory locks.

use pstack_envelope::ProcessIdentity;

use super::parse;
use super::raw::{ReadError, read_seq_capped as read_capped};
use super::read::TaskRef;

/// Facts about the host shared by every identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFacts {
    /// `/proc/sys/kernel/hostname`.
    pub host: String,
    /// `/proc/sys/kernel/random/boot_id`.
    pub boot_id: String,
}

/// Read hostname and boot id.
pub fn read_host_facts() -> Result<HostFacts, ReadError> {
    let one_line = |p: &str| -> Result<String, ReadError> {
        let raw = read_capped(std::path::Path::new(p), 256)?;
        let s = String::from_utf8_lossy(&raw.bytes).trim().to_string();
        if s.is_empty() {
            return Err(ReadError::Parse {
                path: p.into(),
                reason: "empty".into(),
            });
        }
        Ok(s)
    };
    Ok(HostFacts {
        host: one_line("/proc/sys/kernel/hostname")?,
        boot_id: one_line("/proc/sys/kernel/random/boot_id")?,
    })
}

/// An identity read plus what else the same reads showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentityReading {
    /// The identity of the thread group (`pid` is the tgid).
    pub identity: ProcessIdentity,
    /// `comm` of the task read.
    pub comm: String,
    /// Whether it is a kernel thread.
    pub kernel_thread: bool,
    /// Start ticks of the task itself (differs from the process's for a thread).
    pub task_start_ticks: u64,
}

/// Read the identity of the process owning `task` (a pid, or a tid whose
/// thread group is resolved from `status`). The task itself must exist.
pub fn read_identity(host: &HostFacts, task: u32) -> Result<IdentityReading, ReadError> {
    let me = TaskRef::process(task);
    let status_path = me.file("status");
    let status_raw = read_capped(&status_path, 1 << 16)?;
    let status = parse::parse_status(&status_raw.bytes).map_err(|reason| ReadError::Parse {
        path: status_path.display().to_string(),
        reason,
    })?;
    let stat_path = me.file("stat");
    let stat_raw = read_capped(&stat_path, 4096)?;
    let stat = parse::parse_stat(&stat_raw.bytes).map_err(|reason| ReadError::Parse {
        path: stat_path.display().to_string(),
        reason,
    })?;
    let missing = |what: &str| ReadError::Parse {
        path: status_path.display().to_string(),
        reason: format!("no {what} line"),
    };
    let tgid = status.tgid.ok_or_else(|| missing("Tgid"))?;
    let uid = status.uid.ok_or_else(|| missing("Uid"))?[0];
    let group = TaskRef::process(tgid);
    let group_stat = if tgid == task {
        stat.clone()
    } else {
        let p = group.file("stat");
        let raw = read_capped(&p, 4096)?;
        parse::parse_stat(&raw.bytes).map_err(|reason| ReadError::Parse {
            path: p.display().to_string(),
            reason,
        })?
    };
    let ns_path = group.dir().join("ns/pid");
    let link = std::fs::read_link(&ns_path).map_err(|e| ReadError::from_io(&ns_path, &e))?;
    let pid_ns =
        parse::parse_ns_inode(&link.to_string_lossy()).map_err(|reason| ReadError::Parse {
            path: ns_path.display().to_string(),
            reason,
        })?;
    let cg_path = group.file("cgroup");
    let cgroup = parse::join_cgroup(&read_capped(&cg_path, 1 << 16)?.bytes);
    Ok(IdentityReading {
        identity: ProcessIdentity {
            host: host.host.clone(),
            boot_id: host.boot_id.clone(),
            pid: tgid,
            start_ticks: group_stat.start_ticks,
            uid,
            pid_ns,
            cgroup: if cgroup.is_empty() {
                "-".into()
            } else {
                cgroup
            },
        },
        kernel_thread: stat.is_kernel_thread(),
        comm: stat.comm,
        task_start_ticks: stat.start_ticks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_identity_is_stable() {
        let host = read_host_facts().unwrap();
        let a = read_identity(&host, std::process::id()).unwrap();
        let b = read_identity(&host, std::process::id()).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.identity.pid, std::process::id());
        assert!(!a.kernel_thread);
    }

    #[test]
    fn kthreadd_is_a_kernel_thread() {
        let host = read_host_facts().unwrap();
        let k = read_identity(&host, 2).unwrap();
        assert!(k.kernel_thread, "{k:?}");
    }

    #[test]
    fn nonexistent_pid_vanished() {
        let host = read_host_facts().unwrap();
        let e = read_identity(&host, 0).unwrap_err();
        assert!(matches!(e, ReadError::Vanished { .. }), "{e:?}");
    }
}
