//! Which surfaces a capture reads: every surface of its kind by default, or
//! a caller's selection of surface families (`POST /v1/captures` `surfaces`,
//! `pstackctl capture --surface`).
//!
//! A family is named like the surface ids it produces, with `*` where a
//! thread or process id goes (`task/*/stack` selects `task/4243/stack` for
//! every thread read). The family that observes the universe (`task/*/stat`
//! for a process or thread, `proc/*/tasks` for a host) is always read: without
//! it the envelope could not say how many of the universe's members it saw.
//! A window implies `ebpf:offcpu`. Surfaces that were not selected are not read and do not appear; the
//! universe selector records the selection, so two envelopes of different
//! selections are never mistaken for one another.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use super::Target;

/// A family of surfaces, named like the ids it produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SurfaceFamily {
    /// `proc/status` (process or thread subject).
    ProcStatus,
    /// `proc/io`.
    ProcIo,
    /// `proc/freezer` (only where a freezer cgroup exists).
    ProcFreezer,
    /// `proc/container` (only for a process in a recognised container:
    /// container ID, runtime, pod UID from its cgroup path).
    ProcContainer,
    /// `k8s/pod` (only for a process in a pod: name, namespace, container
    /// name; `unsupported` while no kubelet endpoint is configured).
    K8sPod,
    /// `proc/cmdline` (risky: helper).
    ProcCmdline,
    /// `proc/environ` (risky: helper).
    ProcEnviron,
    /// `proc/fd` (risky: helper).
    ProcFd,
    /// `task/*/stat` — always read for a process or thread subject.
    TaskStat,
    /// `task/*/status`.
    TaskStatus,
    /// `task/*/schedstat`.
    TaskSchedstat,
    /// `task/*/wchan` (risky: helper).
    TaskWchan,
    /// `task/*/syscall` (risky: helper).
    TaskSyscall,
    /// `task/*/stack` (risky: helper).
    TaskStack,
    /// `ebpf:offcpu` (needs an off-CPU window).
    EbpfOffcpu,
    /// `proc/*/tasks` — always read for a host subject.
    HostTasks,
    /// `proc/*/wchan` (host subject; risky: helper).
    HostWchan,
}

impl SurfaceFamily {
    /// Every family, in a stable order.
    pub const ALL: [SurfaceFamily; 17] = [
        SurfaceFamily::ProcStatus,
        SurfaceFamily::ProcIo,
        SurfaceFamily::ProcFreezer,
        SurfaceFamily::ProcContainer,
        SurfaceFamily::K8sPod,
        SurfaceFamily::ProcCmdline,
        SurfaceFamily::ProcEnviron,
        SurfaceFamily::ProcFd,
        SurfaceFamily::TaskStat,
        SurfaceFamily::TaskStatus,
        SurfaceFamily::TaskSchedstat,
        SurfaceFamily::TaskWchan,
        SurfaceFamily::TaskSyscall,
        SurfaceFamily::TaskStack,
        SurfaceFamily::EbpfOffcpu,
        SurfaceFamily::HostTasks,
        SurfaceFamily::HostWchan,
    ];

    /// The family's name, as callers write it.
    pub fn name(self) -> &'static str {
        match self {
            SurfaceFamily::ProcStatus => "proc/status",
            SurfaceFamily::ProcIo => "proc/io",
            SurfaceFamily::ProcFreezer => "proc/freezer",
            SurfaceFamily::ProcContainer => "proc/container",
            SurfaceFamily::K8sPod => "k8s/pod",
            SurfaceFamily::ProcCmdline => "proc/cmdline",
            SurfaceFamily::ProcEnviron => "proc/environ",
            SurfaceFamily::ProcFd => "proc/fd",
            SurfaceFamily::TaskStat => "task/*/stat",
            SurfaceFamily::TaskStatus => "task/*/status",
            SurfaceFamily::TaskSchedstat => "task/*/schedstat",
            SurfaceFamily::TaskWchan => "task/*/wchan",
            SurfaceFamily::TaskSyscall => "task/*/syscall",
            SurfaceFamily::TaskStack => "task/*/stack",
            SurfaceFamily::EbpfOffcpu => "ebpf:offcpu",
            SurfaceFamily::HostTasks => "proc/*/tasks",
            SurfaceFamily::HostWchan => "proc/*/wchan",
        }
    }

    /// Whether the family belongs to a host capture (else to a process or
    /// thread capture).
    pub fn is_host(self) -> bool {
        matches!(self, SurfaceFamily::HostTasks | SurfaceFamily::HostWchan)
    }

    /// The family every capture of that kind reads regardless of selection.
    fn universe_family(host: bool) -> SurfaceFamily {
        if host {
            SurfaceFamily::HostTasks
        } else {
            SurfaceFamily::TaskStat
        }
    }

    /// The names of the families a subject kind can select, comma-separated.
    pub fn names_for(host: bool) -> String {
        SurfaceFamily::ALL
            .iter()
            .filter(|f| f.is_host() == host)
            .map(|f| f.name())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl fmt::Display for SurfaceFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A surface name that names no family.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown surface {name:?}: a process or thread capture takes {}; a host capture takes {}",
    SurfaceFamily::names_for(false),
    SurfaceFamily::names_for(true)
)]
pub struct UnknownSurface {
    /// What the caller wrote.
    pub name: String,
}

impl FromStr for SurfaceFamily {
    type Err = UnknownSurface;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SurfaceFamily::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| UnknownSurface {
                name: s.to_string(),
            })
    }
}

/// Why a selection does not fit its capture.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectionError {
    /// The selection is empty.
    #[error("the surface list is empty: omit it to read every surface")]
    Empty,
    /// A family of the other subject kind.
    #[error("surface {family} does not apply to a {subject} capture (it takes {allowed})")]
    WrongSubject {
        /// The family.
        family: SurfaceFamily,
        /// `host` or `process/thread`.
        subject: &'static str,
        /// The families it does take.
        allowed: String,
    },
    /// `ebpf:offcpu` without a window.
    #[error("{0}")]
    Window(&'static str),
}

/// The surfaces a capture reads.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SurfaceSelection {
    /// `None`: every surface of the capture's kind.
    families: Option<BTreeSet<SurfaceFamily>>,
}

impl SurfaceSelection {
    /// Every surface.
    pub fn all() -> Self {
        SurfaceSelection::default()
    }

    /// Only these families (plus the universe's, added when the selection is
    /// checked against its target).
    pub fn only(families: impl IntoIterator<Item = SurfaceFamily>) -> Self {
        SurfaceSelection {
            families: Some(families.into_iter().collect()),
        }
    }

    /// Parse caller-written names.
    pub fn parse<S: AsRef<str>>(names: &[S]) -> Result<Self, UnknownSurface> {
        names
            .iter()
            .map(|n| n.as_ref().trim().parse())
            .collect::<Result<BTreeSet<_>, _>>()
            .map(|families| SurfaceSelection {
                families: Some(families),
            })
    }

    /// Whether the selection is "every surface".
    pub fn is_all(&self) -> bool {
        self.families.is_none()
    }

    /// Whether `family` is read.
    pub fn wants(&self, family: SurfaceFamily) -> bool {
        self.families.as_ref().is_none_or(|f| f.contains(&family))
    }

    /// Check the selection against its capture and add the universe's family.
    pub fn resolve(&self, target: &Target, window: bool) -> Result<Self, SelectionError> {
        let Some(families) = &self.families else {
            return Ok(self.clone());
        };
        if families.is_empty() {
            return Err(SelectionError::Empty);
        }
        let host = matches!(target, Target::Host);
        if let Some(&family) = families.iter().find(|f| f.is_host() != host) {
            return Err(SelectionError::WrongSubject {
                family,
                subject: if host { "host" } else { "process/thread" },
                allowed: SurfaceFamily::names_for(host),
            });
        }
        let offcpu = families.contains(&SurfaceFamily::EbpfOffcpu);
        if offcpu && !window {
            return Err(SelectionError::Window(
                "surface ebpf:offcpu needs an off-CPU window (window_ms / --window)",
            ));
        }
        let mut families = families.clone();
        families.insert(SurfaceFamily::universe_family(host));
        if window {
            // Asking for a window is asking for what it observes.
            families.insert(SurfaceFamily::EbpfOffcpu);
        }
        Ok(SurfaceSelection {
            families: Some(families),
        })
    }

    /// The suffix the universe selector carries for this selection (empty for
    /// "every surface").
    pub fn selector_suffix(&self) -> String {
        match &self.families {
            None => String::new(),
            Some(f) => format!(
                " surfaces={}",
                f.iter().map(|f| f.name()).collect::<Vec<_>>().join(",")
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_list_the_valid_ones() {
        for f in SurfaceFamily::ALL {
            assert_eq!(f.name().parse::<SurfaceFamily>().unwrap(), f);
        }
        let e = "task/*/stak".parse::<SurfaceFamily>().unwrap_err();
        let text = e.to_string();
        assert!(text.contains("\"task/*/stak\""), "{text}");
        assert!(text.contains("task/*/stack") && text.contains("proc/*/wchan"));
    }

    #[test]
    fn resolve_adds_the_universe_family_and_refuses_misfits() {
        let pid = Target::Process { pid: 7 };
        let s = SurfaceSelection::parse(&["task/*/wchan"])
            .unwrap()
            .resolve(&pid, false)
            .unwrap();
        assert!(s.wants(SurfaceFamily::TaskStat) && s.wants(SurfaceFamily::TaskWchan));
        assert!(!s.wants(SurfaceFamily::TaskStack) && !s.wants(SurfaceFamily::ProcIo));
        assert_eq!(s.selector_suffix(), " surfaces=task/*/stat,task/*/wchan");

        let host = SurfaceSelection::parse(&["proc/*/wchan"])
            .unwrap()
            .resolve(&Target::Host, false)
            .unwrap();
        assert!(host.wants(SurfaceFamily::HostTasks));
        assert!(matches!(
            SurfaceSelection::parse(&["proc/*/wchan"])
                .unwrap()
                .resolve(&pid, false),
            Err(SelectionError::WrongSubject { .. })
        ));
        assert!(matches!(
            SurfaceSelection::parse(&["task/*/stack"])
                .unwrap()
                .resolve(&Target::Host, false),
            Err(SelectionError::WrongSubject { .. })
        ));
        assert_eq!(
            SurfaceSelection::only([]).resolve(&pid, false),
            Err(SelectionError::Empty)
        );
        assert!(matches!(
            SurfaceSelection::parse(&["ebpf:offcpu"])
                .unwrap()
                .resolve(&pid, false),
            Err(SelectionError::Window(_))
        ));
        let windowed = SurfaceSelection::parse(&["task/*/stack"])
            .unwrap()
            .resolve(&pid, true)
            .unwrap();
        assert!(windowed.wants(SurfaceFamily::EbpfOffcpu));
        let all = SurfaceSelection::all().resolve(&pid, true).unwrap();
        assert!(all.is_all() && all.wants(SurfaceFamily::ProcEnviron));
        assert_eq!(all.selector_suffix(), "");
    }
}
