//! Assembly: from surfaces and their typed readings to a sealed envelope,
//! through the one [`EnvelopeBuilder`].
//!
//! Invariants (the builder enforces the first three as each part is added;
//! the validator re-checks everything at seal):
//! - completeness is the builder's one rule, the same for every subject kind;
//! - a fact cites only read surfaces, a hypothesis carries its falsifier, a
//!   universal claim appears only in a `complete` envelope;
//! - every unknown has an owner, a probe and the transition it blocks, and
//!   there is one next transition with a success receipt and an abort list;
//! - `identity_race` wins: every read surface becomes `identity_race` with
//!   its facts and typed reading withheld (digest kept), and no claim is made.
//!
//! The claim rules are in [`super::assemble_claims`] (pure functions of the
//! typed readings), the unknowns in [`super::assemble_unknowns`].

use std::time::Duration;

use pstack_envelope::{
    Bounds, BuildError, Clock, Collector, Completeness, Envelope, EnvelopeBuilder, NextTransition,
    StatusCause, Subject, Surface, SurfaceStatus, Termination, Universe, Unknown, sha256_digest,
};
use serde_json::Map;

use super::assemble_claims::{self as rules};
use super::assemble_readings::{Readings, SurfaceId};
use super::{ProcessPlan, SupervisorConfig, SurfaceFamily};
use pstack_envelope::ClaimCode;

/// Which flow produced the surfaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A process and its threads.
    Process,
    /// One thread.
    Thread,
    /// The whole host.
    Host,
}

/// An envelope being assembled.
#[derive(Debug)]
pub struct Assembly {
    mode: Mode,
    subject: Subject,
    collector: Collector,
    clock: Clock,
    universe: Universe,
    bounds: Bounds,
    /// Surfaces read.
    pub surfaces: Vec<Surface>,
    /// Typed readings of those surfaces (what the claim rules read).
    pub readings: Readings,
    /// What changed, when the identity did.
    pub identity_race: Option<String>,
}

fn ok(s: &Surface) -> bool {
    matches!(s.status, SurfaceStatus::Ok | SurfaceStatus::Truncated)
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Assembly {
    /// Start an assembly.
    pub fn new(
        mode: Mode,
        subject: Subject,
        config: &SupervisorConfig,
        request: &ProcessPlan,
        leak_budget: u64,
        wall_time: String,
        monotonic_start_ns: u64,
    ) -> Assembly {
        Assembly {
            mode,
            subject,
            collector: Collector {
                name: config.collector_name.clone(),
                version: env!("CARGO_PKG_VERSION").to_string(),
                source_commit: config.source_commit.clone(),
                trigger: request.trigger.clone(),
            },
            clock: Clock {
                wall_time,
                monotonic_start_ns: monotonic_start_ns.to_string(),
                monotonic_end_ns: monotonic_start_ns.to_string(),
                bundle_deadline_ms: ms(request.deadlines.bundle),
            },
            universe: Universe {
                selector: String::new(),
                selector_digest: sha256_digest(b""),
                expected_count: 0,
                observed_count: 0,
                termination: Termination::Exhausted,
            },
            bounds: bounds(mode, config, request, leak_budget),
            surfaces: Vec::new(),
            readings: Readings::default(),
            identity_race: None,
        }
    }

    /// Declare the universe.
    pub fn set_universe(
        &mut self,
        selector: String,
        expected: u64,
        observed: u64,
        termination: Termination,
    ) {
        self.universe = Universe {
            selector_digest: sha256_digest(selector.as_bytes()),
            selector,
            expected_count: expected,
            observed_count: observed,
            termination,
        };
    }

    /// Sort surfaces: process-level first, then by thread id, then by name.
    pub fn order_surfaces(&mut self) {
        self.surfaces.sort_by_key(|s| {
            let (process_level, n) = match s.id.parse::<SurfaceId>() {
                Ok(SurfaceId::Proc(_)) => (true, 0),
                Ok(SurfaceId::HostTasks(pid) | SurfaceId::HostWchan(pid)) => (true, pid),
                Ok(SurfaceId::Task(tid, _)) => (false, tid),
                _ => (false, 0),
            };
            (!process_level, n, s.id.clone())
        });
    }

    /// Record the end of the capture.
    pub fn finish_clock(&mut self, monotonic_end_ns: u64) {
        self.clock.monotonic_end_ns = monotonic_end_ns.to_string();
    }

    fn target_command(&self) -> String {
        crate::probes::capture_again(&self.subject)
    }

    /// Build claims, unknowns and the next transition through the
    /// [`EnvelopeBuilder`], and seal.
    pub fn seal(mut self) -> Result<Envelope, BuildError> {
        if let Some(why) = &self.identity_race {
            for s in &mut self.surfaces {
                if ok(s) {
                    s.status = SurfaceStatus::IdentityRace;
                    s.cause = Some(StatusCause {
                        errno: None,
                        message: format!("{why}; facts withheld"),
                    });
                    s.facts = Map::new();
                }
            }
            self.readings.clear();
        }
        let mut builder = EnvelopeBuilder::new(
            self.subject.clone(),
            self.collector.clone(),
            self.clock.clone(),
            self.universe.clone(),
            self.bounds.clone(),
        );
        if self.identity_race.is_some() {
            builder.identity_race();
        }
        for s in &self.surfaces {
            builder.surface(s.clone())?;
        }
        let completeness = builder.completeness();
        let (claims, d_threads) = if completeness == Completeness::IdentityRace {
            (Vec::new(), Vec::new())
        } else {
            self.claims(completeness)
        };
        let frozen = claims
            .iter()
            .find(|c| c.code == ClaimCode::DStateFromCgroupFreezer)
            .map(|c| c.statement.clone());
        for c in claims {
            builder.claim(c)?;
        }
        let unknowns = super::assemble_unknowns::unknowns(
            &self.subject,
            &self.surfaces,
            self.identity_race.as_deref(),
            self.bounds.bundle_deadline_ms,
        );
        let next = self.next_transition(&d_threads, &unknowns, frozen);
        for u in unknowns {
            builder.unknown(u)?;
        }
        builder.seal(next)
    }

    /// The claims of this capture's kind, from its typed readings.
    fn claims(&self, completeness: Completeness) -> (Vec<pstack_envelope::Claim>, Vec<String>) {
        match self.mode {
            Mode::Host => {
                rules::host_claims(&self.readings.host_view(&self.surfaces), completeness)
            }
            Mode::Process | Mode::Thread => {
                let cgroup = match &self.subject {
                    Subject::Process(p) => p.cgroup.as_str(),
                    Subject::Thread(t) => t.process.cgroup.as_str(),
                    _ => "",
                };
                rules::task_claims(
                    &self.readings.task_view(&self.surfaces, cgroup),
                    &self.subject,
                    completeness,
                )
            }
        }
    }

    fn next_transition(
        &self,
        d_threads: &[String],
        unknowns: &[Unknown],
        frozen: Option<String>,
    ) -> NextTransition {
        let again = self.target_command();
        if self.identity_race.is_some() {
            return NextTransition {
                action: "CAPTURE_AGAIN".into(),
                success_receipt: "an envelope whose two identity reads agree".into(),
                abort_conditions: vec!["the subject keeps exiting or being replaced: capture its parent or the host instead".into()],
            };
        }
        if let Some(why) = frozen {
            return NextTransition {
                action: "INSPECT_FREEZER_OWNER".into(),
                success_receipt: format!(
                    "the agent that froze the cgroup is named, or after it thaws a new capture shows the thread out of D ({why})"
                ),
                abort_conditions: vec![
                    "the cgroup thaws on its own (capture again and diff)".into(),
                    "the identity changes".into(),
                ],
            };
        }
        if let Some(first) = d_threads.first() {
            return NextTransition {
                action: "INSPECT_BLOCKING_WAIT".into(),
                success_receipt: format!("the owner of the wait is named with evidence ({first})"),
                abort_conditions: vec![
                    "the thread leaves D before inspection (capture again and diff)".into(),
                    "the identity changes".into(),
                ],
            };
        }
        if let Some(u) = unknowns.first() {
            return NextTransition {
                action: "RESOLVE_UNKNOWN".into(),
                success_receipt: format!("unknown {} answered by its probe: {}", u.id, u.probe),
                abort_conditions: vec![
                    "the probe itself blocks past its own deadline".into(),
                    "the identity changes".into(),
                ],
            };
        }
        NextTransition {
            action: "CAPTURE_AGAIN_AFTER_CHANGE".into(),
            success_receipt: format!(
                "`pstackctl envelope diff` of this envelope and a later `{again}` shows the change"
            ),
            abort_conditions: vec!["the identity changes (a new process is a new subject)".into()],
        }
    }
}

/// Every cap in force for a process, thread or host capture: the five every
/// envelope names, and in `caps` each further limit that can cut, skip or
/// summarize what the envelope shows (the tests hold each `MAX_*` constant to a cap: `LIMIT_CONSTS`).
fn bounds(
    mode: Mode,
    config: &SupervisorConfig,
    request: &ProcessPlan,
    leak_budget: u64,
) -> Bounds {
    let (selection, deadlines) = (&request.surfaces, request.deadlines);
    let mut caps = std::collections::BTreeMap::new();
    let mut cap = |name: &str, v: u64| {
        caps.insert(name.to_string(), v);
    };
    cap("reap_deadline_ms", ms(config.reap_deadline));
    cap(
        "max_helper_frame_bytes",
        u64::from(pstack_helper::protocol::MAX_FRAME),
    );
    cap(
        "max_unknowns",
        super::assemble_unknowns::MAX_UNKNOWNS as u64,
    );
    cap("max_d_claims", rules::MAX_D_CLAIMS as u64);
    if mode != Mode::Host {
        if selection.wants(SurfaceFamily::ProcFd) {
            cap("max_fds", request.max_fds);
        }
        if selection.wants(SurfaceFamily::K8sPod) && config.kubelet_url.is_some() {
            cap("max_pod_list_bytes", super::MAX_POD_LIST_BYTES);
        }
        if request.window.is_some() {
            let limits = match &config.offcpu {
                Some(source) => source.limits(),
                None => super::OffCpuSource::limits(&super::OneShotOffCpu),
            };
            cap("offcpu_max_tasks", limits.max_tasks as u64);
            cap("offcpu_max_d_episodes", limits.max_episodes as u64);
        }
    }
    Bounds {
        surface_deadline_ms: ms(deadlines.surface),
        bundle_deadline_ms: ms(deadlines.bundle),
        max_threads: request.max_threads,
        max_bytes_per_surface: request.max_bytes_per_surface,
        leak_budget,
        caps,
    }
}

/// Each `MAX_*` constant of the supervisor and the cap that declares it (or
/// why none does). A test scans the supervisor's sources for `const MAX_` and
/// fails on one missing here.
#[cfg(test)]
const LIMIT_CONSTS: [(&str, &str); 4] = [
    ("MAX_D_CLAIMS", "max_d_claims"),
    ("MAX_UNKNOWNS", "max_unknowns"),
    ("MAX_POD_LIST_BYTES", "max_pod_list_bytes"),
    // Validated when the request is made: a longer window is refused, nothing
    // is cut; the window itself is the `ebpf:offcpu` surface's deadline.
    ("MAX_WINDOW", "-"),
];

#[cfg(test)]
pub(in crate::process) mod tests {
    use super::*;
    use crate::process::{Deadlines, SurfaceSelection};
    use pstack_collectors::procfs::parse::{TaskStat, TaskState};
    use pstack_collectors::procfs::read::WchanFacts;

    use super::super::assemble_readings::{TaskFile, Typed};

    fn surface(id: SurfaceId) -> Surface {
        Surface::read(
            id.to_string(),
            format!("procfs:/proc/{id}"),
            250,
            3,
            Some((sha256_digest(id.to_string().as_bytes()), 10)),
            Map::new(),
        )
    }

    pub(in crate::process) fn stat(tid: u32, state: TaskState) -> TaskStat {
        TaskStat {
            pid: tid,
            comm: "worker".into(),
            state,
            ppid: 1,
            flags: 0,
            minflt: 0,
            majflt: 0,
            utime: 0,
            stime: 0,
            priority: 20,
            nice: 0,
            num_threads: 2,
            start_ticks: 100,
            vsize: 0,
            rss_pages: 0,
            processor: None,
            policy: None,
            blkio_ticks: None,
        }
    }

    fn assembly(mode: Mode) -> Assembly {
        let e = pstack_envelope::example::example_unsealed();
        Assembly {
            mode,
            subject: e.subject,
            collector: e.collector,
            clock: e.clock,
            universe: e.universe,
            bounds: e.bounds,
            surfaces: Vec::new(),
            readings: Readings::default(),
            identity_race: None,
        }
    }

    fn fuse_process() -> Assembly {
        let mut a = assembly(Mode::Process);
        for (tid, state) in [(11, TaskState::Sleeping), (12, TaskState::DiskSleep)] {
            let id = SurfaceId::Task(tid, TaskFile::Stat);
            a.surfaces.push(surface(id));
            a.readings.insert(id, Typed::Stat(stat(tid, state)));
        }
        let w = SurfaceId::Task(12, TaskFile::Wchan);
        a.surfaces.push(surface(w));
        a.readings.insert(
            w,
            Typed::Wchan(WchanFacts {
                wchan: Some("request_wait_answer".into()),
            }),
        );
        a
    }

    #[test]
    fn a_process_capture_seals_through_the_builder_with_its_hypothesis() {
        let env = fuse_process().seal().expect("seals");
        let fuse = env
            .claims
            .iter()
            .find(|c| c.code == ClaimCode::FuseServerNotAnswering)
            .expect("the hypothesis");
        assert_eq!(fuse.kind, pstack_envelope::ClaimKind::Hypothesis);
        assert_eq!(fuse.surfaces, ["task/12/stat", "task/12/wchan"]);
        assert_eq!(env.completeness, Completeness::Complete);
        assert_eq!(env.next_transition.action, "INSPECT_BLOCKING_WAIT");
    }

    #[test]
    fn an_identity_race_withholds_readings_and_claims() {
        let mut a = fuse_process();
        a.identity_race = Some("pid 12 -> 13".into());
        let env = a.seal().expect("seals");
        assert_eq!(env.completeness, Completeness::IdentityRace);
        assert!(env.claims.is_empty(), "{:?}", env.claims);
        assert!(
            env.surfaces
                .iter()
                .all(|s| s.status == SurfaceStatus::IdentityRace && s.facts.is_empty())
        );
        assert_eq!(env.next_transition.action, "CAPTURE_AGAIN");
    }

    #[test]
    fn a_reading_of_a_surface_that_was_not_read_is_not_seen() {
        let mut a = fuse_process();
        // The wchan surface timed out after all: its reading must not count.
        a.surfaces[2].status = SurfaceStatus::Timeout;
        a.surfaces[2].cause = Some(StatusCause {
            errno: None,
            message: "deadline".into(),
        });
        let env = a.seal().expect("seals");
        assert_eq!(env.completeness, Completeness::Partial);
        assert!(
            !env.claims
                .iter()
                .any(|c| c.code == ClaimCode::FuseServerNotAnswering)
        );
        assert!(
            env.unknowns
                .iter()
                .any(|u| u.surface.as_deref() == Some("task/12/wchan"))
        );
    }

    /// Every limit a process capture enforces is declared in `bounds`: each
    /// limit field of the request (the destructuring below stops compiling
    /// when a field is added, until it is classified here), each `MAX_*`
    /// constant of the supervisor's sources, the reap deadline, the helper's
    /// frame cap and the off-CPU session's caps.
    #[test]
    fn every_enforced_limit_is_declared_in_bounds() {
        let config = SupervisorConfig {
            reap_deadline: Duration::from_millis(321),
            kubelet_url: Some("http://127.0.0.1:10255".into()),
            ..SupervisorConfig::new("test", "/nonexistent/pstack-helper".into()).unwrap()
        };
        let request = ProcessPlan {
            target: super::super::Target::Process { pid: 4242 },
            deadlines: Deadlines {
                surface: Duration::from_millis(250),
                bundle: Duration::from_millis(5000),
            },
            max_threads: 11,
            max_bytes_per_surface: 12,
            max_fds: 13,
            window: Some(Duration::from_millis(1000)),
            surfaces: SurfaceSelection::all(),
            trigger: None,
        };
        // `trigger` is not a bound: it names the rule, not a limit.
        let ProcessPlan {
            target: _,
            deadlines: _,
            max_threads,
            max_bytes_per_surface,
            max_fds,
            window: _,
            surfaces: _,
            trigger: _,
        } = &request;
        let b = bounds(Mode::Process, &config, &request, 4);
        assert_eq!(
            (
                b.surface_deadline_ms,
                b.bundle_deadline_ms,
                b.max_threads,
                b.max_bytes_per_surface,
                b.leak_budget
            ),
            (250, 5000, *max_threads, *max_bytes_per_surface, 4)
        );
        let caps = |name: &str| b.caps.get(name).copied();
        assert_eq!(caps("max_fds"), Some(*max_fds));
        assert_eq!(caps("reap_deadline_ms"), Some(321));
        assert_eq!(
            caps("max_helper_frame_bytes"),
            Some(u64::from(pstack_helper::protocol::MAX_FRAME))
        );
        let limits = pstack_ebpf::EbpfConfig::offcpu(vec![]).limits;
        assert_eq!(caps("offcpu_max_tasks"), Some(limits.max_tasks as u64));
        assert_eq!(
            caps("offcpu_max_d_episodes"),
            Some(limits.max_episodes as u64)
        );
        // Every MAX_* constant in the supervisor's sources is classified, and
        // each declared one is in bounds with its value.
        let sources = [
            include_str!("assemble.rs"),
            include_str!("assemble_claims.rs"),
            include_str!("assemble_readings.rs"),
            include_str!("assemble_unknowns.rs"),
            include_str!("capture.rs"),
            include_str!("../helpers/risky.rs"),
            include_str!("../helpers/helper_process.rs"),
            include_str!("../helpers/leak.rs"),
            include_str!("selection.rs"),
            include_str!("mod.rs"),
        ];
        for src in sources {
            for (i, _) in src.match_indices("const MAX_") {
                let name: String = src[i + "const ".len()..]
                    .chars()
                    .take_while(|c| c.is_ascii_uppercase() || *c == '_' || c.is_ascii_digit())
                    .collect();
                if !src[i + "const ".len() + name.len()..].starts_with(':') {
                    continue; // not a declaration (this test's own text)
                }
                let Some((_, cap)) = LIMIT_CONSTS.iter().find(|(c, _)| *c == name) else {
                    panic!(
                        "{name} is a limit the supervisor enforces but LIMIT_CONSTS does not declare"
                    );
                };
                assert!(
                    *cap == "-" || caps(cap).is_some(),
                    "{name}: cap {cap} not in bounds {:?}",
                    b.caps
                );
            }
        }
        assert_eq!(caps("max_d_claims"), Some(rules::MAX_D_CLAIMS as u64));
        assert_eq!(
            caps("max_pod_list_bytes"),
            Some(super::super::MAX_POD_LIST_BYTES)
        );
        // Not read, not in force: no fd cap without the fd surface, no
        // off-CPU caps without a window.
        let only_stat = SurfaceSelection::parse(&["task/*/stat"])
            .unwrap()
            .resolve(&request.target, false)
            .unwrap();
        let b = bounds(
            Mode::Process,
            &config,
            &ProcessPlan {
                window: None,
                surfaces: only_stat,
                ..request.clone()
            },
            4,
        );
        assert!(
            !b.caps.contains_key("max_fds") && !b.caps.contains_key("offcpu_max_tasks"),
            "{:?}",
            b.caps
        );
    }
}
