//! Who is on the other end of the socket, and may they use the API.
//!
//! Invariants:
//! - Identity is the kernel's SO_PEERCRED uid and gid, captured at connect
//!   time. The PID in it is decoration for logs, never an identity (it can be
//!   reused, and a connected fd can be passed to another process).
//! - Allowed: uid 0; the daemon's own uid (only differs from 0 for an
//!   unprivileged development daemon); a peer whose gid is the configured
//!   group; a peer that holds the group as a supplementary group (the
//!   kernel's SO_PEERGROUPS at connect: `newgrp`, `sg`, a service with
//!   `SupplementaryGroups=`); a peer whose uid is a member of that group in
//!   the group database (primary group or listed member). Everyone else is
//!   refused with 403 and one log event carrying uid, gid and pid — never the
//!   request.
//! - Authorization happens at accept, before the connection is counted
//!   against `max_connections`: a peer that may not use the API can never
//!   hold one of its slots (see `run`).
//! - The group is resolved when the configuration is loaded (and on reload),
//!   not per request, so a slow NSS lookup cannot stall the accept path.

use nix::unistd::{Gid, Group, Uid, User};

/// The kernel's view of a connected peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCred {
    /// Effective uid at connect time.
    pub uid: u32,
    /// Effective gid at connect time.
    pub gid: u32,
    /// PID at connect time (for logs only).
    pub pid: Option<i32>,
    /// Whether the configured group was among the peer's supplementary
    /// groups at connect time (SO_PEERGROUPS).
    pub supplementary_member: bool,
}

/// The peer's supplementary groups (SO_PEERGROUPS), as the kernel recorded
/// them at connect.
pub fn peer_groups(fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<Vec<u32>> {
    use std::os::fd::AsRawFd;
    let mut groups = vec![0u32; 64];
    loop {
        let mut len = (groups.len() * std::mem::size_of::<u32>()) as libc::socklen_t;
        // SAFETY: the buffer is `len` bytes of writable, initialised memory
        // owned by `groups`; the kernel writes at most `len` bytes and
        // updates `len`.
        let rc = unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        if rc == 0 {
            groups.truncate(len as usize / std::mem::size_of::<u32>());
            return Ok(groups);
        }
        let e = std::io::Error::last_os_error();
        // ERANGE: `len` now says how much is needed.
        if e.raw_os_error() == Some(libc::ERANGE) && (len as usize) > groups.len() * 4 {
            groups.resize(len as usize / std::mem::size_of::<u32>() + 1, 0);
            continue;
        }
        return Err(e);
    }
}

/// The resolved authorization rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessPolicy {
    /// Name of the configured group.
    pub group_name: String,
    /// Its gid, when the group exists.
    pub gid: Option<u32>,
    /// Its listed members (user names).
    pub members: Vec<String>,
    /// The daemon's own effective uid.
    pub owner_uid: u32,
}

/// Why a group could not be resolved.
#[derive(Debug, thiserror::Error)]
#[error("cannot resolve group {group:?}: {reason}")]
pub struct GroupError {
    /// The group name.
    pub group: String,
    /// What went wrong.
    pub reason: String,
}

impl AccessPolicy {
    /// Resolve `group_name`. A group that does not exist yields a policy that
    /// admits only root (and an error when `required`).
    pub fn resolve(group_name: &str, required: bool) -> Result<AccessPolicy, GroupError> {
        match Group::from_name(group_name) {
            Ok(Some(g)) => Ok(AccessPolicy {
                group_name: group_name.to_owned(),
                gid: Some(g.gid.as_raw()),
                members: g.mem,
                owner_uid: nix::unistd::geteuid().as_raw(),
            }),
            Ok(None) if !required => Ok(AccessPolicy {
                group_name: group_name.to_owned(),
                gid: None,
                members: Vec::new(),
                owner_uid: nix::unistd::geteuid().as_raw(),
            }),
            Ok(None) => Err(GroupError {
                group: group_name.to_owned(),
                reason: "no such group".into(),
            }),
            Err(e) => Err(GroupError {
                group: group_name.to_owned(),
                reason: e.to_string(),
            }),
        }
    }

    /// Whether `peer` may use the API.
    pub fn allows(&self, peer: &PeerCred) -> bool {
        if peer.uid == 0 || peer.uid == self.owner_uid {
            return true;
        }
        let Some(gid) = self.gid else {
            return false;
        };
        if peer.gid == gid || peer.supplementary_member {
            return true;
        }
        match User::from_uid(Uid::from_raw(peer.uid)) {
            Ok(Some(user)) => user.gid == Gid::from_raw(gid) || self.members.contains(&user.name),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(gid: Option<u32>, members: &[&str]) -> AccessPolicy {
        AccessPolicy {
            group_name: "pstack".into(),
            gid,
            members: members.iter().map(|s| s.to_string()).collect(),
            owner_uid: 0,
        }
    }

    #[test]
    fn root_is_always_allowed_and_strangers_never() {
        let p = policy(None, &[]);
        assert!(p.allows(&PeerCred {
            uid: 0,
            gid: 0,
            pid: None,
            supplementary_member: false
        }));
        assert!(!p.allows(&PeerCred {
            uid: 1000,
            gid: 1000,
            pid: None,
            supplementary_member: false
        }));
    }

    #[test]
    fn group_gid_admits_and_other_gids_do_not() {
        let p = policy(Some(4242), &[]);
        assert!(p.allows(&PeerCred {
            uid: 65533,
            gid: 4242,
            pid: Some(1),
            supplementary_member: false
        }));
        assert!(!p.allows(&PeerCred {
            uid: 65533,
            gid: 4243,
            pid: Some(1),
            supplementary_member: false
        }));
    }

    #[test]
    fn a_supplementary_member_is_admitted() {
        let p = policy(Some(4242), &[]);
        let peer = PeerCred {
            uid: 65533,
            gid: 65533,
            pid: None,
            supplementary_member: true,
        };
        assert!(p.allows(&peer));
    }

    #[test]
    fn listed_member_is_admitted_by_name() {
        // uid 65534 is `nobody` on Debian; list it as a member.
        let Ok(Some(nobody)) = User::from_uid(Uid::from_raw(65534)) else {
            eprintln!("skipping: no user with uid 65534 in the passwd database");
            return;
        };
        let p = policy(Some(4242), &[nobody.name.as_str()]);
        assert!(p.allows(&PeerCred {
            uid: 65534,
            gid: 65534,
            pid: None,
            supplementary_member: false
        }));
        let q = policy(Some(4242), &["someone-else"]);
        assert!(!q.allows(&PeerCred {
            uid: 65534,
            gid: 65534,
            pid: None,
            supplementary_member: false
        }));
    }
}
