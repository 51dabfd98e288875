//! The typed model of `pstack.envelope/v1`: ten parts, all required, closed
//! world at every level (`deny_unknown_fields`). Values that can exceed 2^53
//! (monotonic nanoseconds, socket cookies, inode numbers) are decimal strings.
//! Surface facts are free-form JSON objects whose shape each collector fixes;
//! the seal still refuses floats and unsafe integers inside them.
//!
//! Struct fields are declared in alphabetical order on purpose: serde writes
//! fields in declaration order, so the compact serialization of the model
//! (`serde_json::to_vec`, what pstack writes to its spool and ships) is
//! already the RFC 8785 form with the digest in place, and verify's fast path
//! (`canonical_read.rs`) checks and hashes such bytes in one pass. Sealing
//! writes the same order by hand (`canonical_write.rs`); property tests check
//! both against the general canonicalizer byte for byte.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Schema id every envelope carries in `schema`.
pub const SCHEMA_ID: &str = "pstack.envelope/v1";

/// A sealed (or about-to-be-sealed) evidence envelope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Envelope {
    /// 5. Every cap in force.
    pub bounds: Bounds,
    /// 7. Facts, inferences and hypotheses, each bound to surfaces.
    pub claims: Vec<Claim>,
    /// 3. When, and under which deadline.
    pub clock: Clock,
    /// 2. Who observed it.
    pub collector: Collector,
    /// How much of the declared universe the evidence covers.
    pub completeness: Completeness,
    /// 10. `sha256:<hex>` over the canonical form of every other field.
    pub digest: String,
    /// 9. The one legal next action.
    pub next_transition: NextTransition,
    /// Always [`SCHEMA_ID`].
    pub schema: String,
    /// 1. What was observed, by immutable identity.
    pub subject: Subject,
    /// 6. Typed observations, one per surface read.
    pub surfaces: Vec<Surface>,
    /// 4. What set of things the capture meant to cover, and how it ended.
    pub universe: Universe,
    /// 8. Answerable questions that block progress, with their probes.
    pub unknowns: Vec<Unknown>,
}

/// Envelope completeness.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Completeness {
    /// Every surface ok and untruncated, universe exhausted.
    Complete,
    /// A cap cut the universe or a surface.
    Bounded,
    /// Some surface did not succeed.
    Partial,
    /// Identity changed between the reads; nothing is attributed.
    IdentityRace,
}

impl Completeness {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Completeness::Complete => "complete",
            Completeness::Bounded => "bounded",
            Completeness::Partial => "partial",
            Completeness::IdentityRace => "identity_race",
        }
    }
}

/// What an envelope is about: a kind and that kind's identity fields.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(
    tag = "kind",
    content = "identity",
    rename_all = "snake_case",
    deny_unknown_fields
)]
pub enum Subject {
    /// One process.
    Process(ProcessIdentity),
    /// One thread of a process.
    Thread(ThreadIdentity),
    /// One transport flow.
    NetworkStream(StreamIdentity),
    /// One storage transfer (e.g. a Longhorn replica rebuild).
    StorageTransfer(TransferIdentity),
    /// A whole host.
    Host(HostIdentity),
}

impl Serialize for Subject {
    // By hand so `identity` precedes `kind`, the canonical member order.
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = serializer.serialize_struct("Subject", 2)?;
        match self {
            Subject::Process(i) => st.serialize_field("identity", i)?,
            Subject::Thread(i) => st.serialize_field("identity", i)?,
            Subject::NetworkStream(i) => st.serialize_field("identity", i)?,
            Subject::StorageTransfer(i) => st.serialize_field("identity", i)?,
            Subject::Host(i) => st.serialize_field("identity", i)?,
        }
        st.serialize_field("kind", self.kind())?;
        st.end()
    }
}

impl Subject {
    /// The wire name of the kind.
    pub fn kind(&self) -> &'static str {
        match self {
            Subject::Process(_) => "process",
            Subject::Thread(_) => "thread",
            Subject::NetworkStream(_) => "network_stream",
            Subject::StorageTransfer(_) => "storage_transfer",
            Subject::Host(_) => "host",
        }
    }

    /// Identity fields that are present but empty (required ones must not be).
    pub fn empty_identity_fields(&self) -> Vec<&'static str> {
        let mut empty = Vec::new();
        let mut check = |name: &'static str, value: &str| {
            if value.trim().is_empty() {
                empty.push(name);
            }
        };
        match self {
            Subject::Process(p) => p.empty_fields(&mut check),
            Subject::Thread(t) => t.process.empty_fields(&mut check),
            Subject::NetworkStream(s) => {
                check("src", &s.src);
                check("dst", &s.dst);
                check("protocol", &s.protocol);
                check("flow_id", &s.flow_id);
            }
            Subject::StorageTransfer(t) => {
                check("volume", &t.volume);
                check("engine", &t.engine);
                check("source_node", &t.source_node);
                check("target_node", &t.target_node);
                check("transfer_id", &t.transfer_id);
            }
            Subject::Host(h) => {
                check("host", &h.host);
                check("boot_id", &h.boot_id);
            }
        }
        empty
    }

    /// One line naming the subject, for humans and handoffs.
    pub fn describe(&self) -> String {
        match self {
            Subject::Process(p) => format!(
                "process pid {} (start_ticks {}, uid {}) on {} boot {}",
                p.pid, p.start_ticks, p.uid, p.host, p.boot_id
            ),
            Subject::Thread(t) => format!(
                "thread tid {} of pid {} (start_ticks {}) on {} boot {}",
                t.tid, t.process.pid, t.process.start_ticks, t.process.host, t.process.boot_id
            ),
            Subject::NetworkStream(s) => format!(
                "{} stream {} -> {} flow {}{}",
                s.protocol,
                s.src,
                s.dst,
                s.flow_id,
                s.net_ns
                    .as_deref()
                    .map(|n| format!(" netns {n}"))
                    .unwrap_or_default()
            ),
            Subject::StorageTransfer(t) => format!(
                "storage transfer {} of volume {} engine {} ({} -> {})",
                t.transfer_id, t.volume, t.engine, t.source_node, t.target_node
            ),
            Subject::Host(h) => format!("host {} boot {}", h.host, h.boot_id),
        }
    }
}

/// Identity of a process: a PID alone is not one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessIdentity {
    /// `/proc/sys/kernel/random/boot_id`.
    pub boot_id: String,
    /// Contents of `/proc/<pid>/cgroup`, lines joined by `;`.
    pub cgroup: String,
    /// Hostname.
    pub host: String,
    /// PID in the reader's namespace.
    pub pid: u32,
    /// Inode of `/proc/<pid>/ns/pid`, decimal.
    pub pid_ns: String,
    /// Field 22 of `/proc/<pid>/stat`: start time in clock ticks since boot.
    pub start_ticks: u64,
    /// Real uid.
    pub uid: u32,
}

impl ProcessIdentity {
    fn empty_fields(&self, check: &mut impl FnMut(&'static str, &str)) {
        check("host", &self.host);
        check("boot_id", &self.boot_id);
        check("pid_ns", &self.pid_ns);
        check("cgroup", &self.cgroup);
    }
}

/// Identity of a thread: its process plus the TID.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThreadIdentity {
    /// The owning process.
    pub process: ProcessIdentity,
    /// Thread id.
    pub tid: u32,
}

/// Identity of a network stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamIdentity {
    /// Remote endpoint.
    pub dst: String,
    /// Socket cookie, decimal.
    pub flow_id: String,
    /// Network namespace inode, decimal, when known.
    #[serde(
        default,
        deserialize_with = "crate::strict::present",
        skip_serializing_if = "Option::is_none"
    )]
    pub net_ns: Option<String>,
    /// e.g. `tcp`.
    pub protocol: String,
    /// Local endpoint `addr:port` (IPv6 in brackets).
    pub src: String,
}

/// Identity of a storage transfer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransferIdentity {
    /// Engine name.
    pub engine: String,
    /// Node sending the data.
    pub source_node: String,
    /// Node receiving the data.
    pub target_node: String,
    /// Transfer id (e.g. rebuild id).
    pub transfer_id: String,
    /// Volume name.
    pub volume: String,
}

/// Identity of a host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostIdentity {
    /// Boot id.
    pub boot_id: String,
    /// Hostname.
    pub host: String,
}

/// Which collector produced the envelope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Collector {
    /// e.g. `pstackctl`.
    pub name: String,
    /// Exact source commit it was built from.
    pub source_commit: String,
    /// Why the capture ran when no operator asked for it: the watch rule
    /// that fired. Absent on operator captures, so the store can tell them
    /// apart.
    #[serde(
        default,
        deserialize_with = "crate::strict::present",
        skip_serializing_if = "Option::is_none"
    )]
    pub trigger: Option<Trigger>,
    /// Semver of the collector.
    pub version: String,
}

/// Kinds of watch rule a [`Trigger`] may name.
pub const TRIGGER_KINDS: &[&str] = &[
    "d_state",
    "tcp_reset",
    "tcp_rto",
    "listen_overflow",
    "retransmit_rate",
    "longhorn_rebuild",
];

/// The watch rule that started a capture, and what it saw.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Trigger {
    /// The condition's readings when it fired (e.g. `d_state_ms`,
    /// `resets`, `flow`), as decimal or plain strings.
    pub condition: std::collections::BTreeMap<String, String>,
    /// RFC 3339 UTC wall time the condition was seen true.
    pub fired_at: String,
    /// One of [`TRIGGER_KINDS`].
    pub kind: String,
    /// The rule's configured name.
    pub rule: String,
}

/// When the capture happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Clock {
    /// Whole-collection deadline in force, ms.
    pub bundle_deadline_ms: u64,
    /// CLOCK_MONOTONIC at end, ns, decimal string.
    pub monotonic_end_ns: String,
    /// CLOCK_MONOTONIC at start, ns, decimal string.
    pub monotonic_start_ns: String,
    /// RFC 3339 UTC wall time at capture start, e.g. `2026-12-02T11:00:00.123Z`.
    pub wall_time: String,
}

/// The declared set the capture meant to cover.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Universe {
    /// Members the selector matched.
    pub expected_count: u64,
    /// Members actually observed.
    pub observed_count: u64,
    /// e.g. `/proc/4242/task/*`.
    pub selector: String,
    /// `sha256:<hex>` of the selector text.
    pub selector_digest: String,
    /// Why enumeration stopped.
    pub termination: Termination,
}

/// Why universe enumeration stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Termination {
    /// Everything was observed.
    Exhausted,
    /// A count cap cut it.
    Cap,
    /// The bundle deadline cut it.
    Deadline,
}

impl Termination {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Termination::Exhausted => "exhausted",
            Termination::Cap => "cap",
            Termination::Deadline => "deadline",
        }
    }
}

/// Every cap in force during the capture.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bounds {
    /// Whole-collection deadline, ms.
    pub bundle_deadline_ms: u64,
    // Fields stay in name order: compact serde output must be canonical.
    /// Every further cap the collector enforced, by name (`max_fds`,
    /// `max_flows`, `reap_deadline_ms`...): a limit that can cut or skip what
    /// the envelope shows is listed here or above, never only in code.
    /// Names are `[a-z][a-z0-9_]*`. Absent when empty (older envelopes).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub caps: std::collections::BTreeMap<String, u64>,
    /// Unreaped helpers tolerated before risky surfaces are skipped.
    pub leak_budget: u64,
    /// Most raw bytes kept per surface.
    pub max_bytes_per_surface: u64,
    /// Most threads (or universe members) read.
    pub max_threads: u64,
    /// Default per-surface deadline, ms.
    pub surface_deadline_ms: u64,
}

/// Whether `name` may name a cap in [`Bounds::caps`]: `[a-z][a-z0-9_]*`,
/// and not one of the five bounds every envelope names.
pub fn is_cap_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && ![
            "bundle_deadline_ms",
            "leak_budget",
            "max_bytes_per_surface",
            "max_threads",
            "surface_deadline_ms",
        ]
        .contains(&name)
}

/// One observed surface.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Surface {
    /// Where the bytes came from, e.g. `procfs:/proc/4242/task/4243/stack`.
    pub authority: String,
    /// Raw bytes read (kept or not).
    pub bytes: u64,
    /// Cause when status is `error` (or detail for other non-ok statuses).
    #[serde(
        default,
        deserialize_with = "crate::strict::present",
        skip_serializing_if = "Option::is_none"
    )]
    pub cause: Option<StatusCause>,
    /// Deadline the read ran under, ms.
    pub deadline_ms: u64,
    /// `sha256:<hex>` of the raw bytes read; absent when nothing was read.
    #[serde(
        default,
        deserialize_with = "crate::strict::present",
        skip_serializing_if = "Option::is_none"
    )]
    pub digest: Option<String>,
    /// Time the read took (or ran until it was abandoned), µs.
    pub elapsed_us: u64,
    /// Typed facts parsed from the bytes.
    #[serde(deserialize_with = "crate::strict::deserialize_facts")]
    pub facts: Map<String, Value>,
    /// Unique within the envelope, e.g. `task/4243/stack`.
    pub id: String,
    /// Outcome of the read.
    pub status: SurfaceStatus,
    /// Whether the byte cap cut the read.
    pub truncated: bool,
}

/// Why a surface did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatusCause {
    /// errno when a syscall failed.
    #[serde(
        default,
        deserialize_with = "crate::strict::present",
        skip_serializing_if = "Option::is_none"
    )]
    pub errno: Option<i32>,
    /// What happened, for a person.
    pub message: String,
}

/// The closed surface-status vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SurfaceStatus {
    /// Read in full.
    Ok,
    /// Read, but cut at the byte cap.
    Truncated,
    /// Deadline passed; the helper was killed and reaped.
    Timeout,
    /// Deadline passed; the helper could not be reaped (journaled).
    TimeoutUnreapedHelper,
    /// The kernel refused the read.
    PermissionDenied,
    /// The task or object went away.
    Vanished,
    /// Identity changed around the read.
    IdentityRace,
    /// This kernel/host cannot provide it.
    Unsupported,
    /// Not attempted (see cause).
    Skipped,
    /// Failed otherwise (see cause).
    Error,
}

impl SurfaceStatus {
    /// Every status, in declaration order.
    pub const ALL: [SurfaceStatus; 10] = [
        SurfaceStatus::Ok,
        SurfaceStatus::Truncated,
        SurfaceStatus::Timeout,
        SurfaceStatus::TimeoutUnreapedHelper,
        SurfaceStatus::PermissionDenied,
        SurfaceStatus::Vanished,
        SurfaceStatus::IdentityRace,
        SurfaceStatus::Unsupported,
        SurfaceStatus::Skipped,
        SurfaceStatus::Error,
    ];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            SurfaceStatus::Ok => "ok",
            SurfaceStatus::Truncated => "truncated",
            SurfaceStatus::Timeout => "timeout",
            SurfaceStatus::TimeoutUnreapedHelper => "timeout_unreaped_helper",
            SurfaceStatus::PermissionDenied => "permission_denied",
            SurfaceStatus::Vanished => "vanished",
            SurfaceStatus::IdentityRace => "identity_race",
            SurfaceStatus::Unsupported => "unsupported",
            SurfaceStatus::Skipped => "skipped",
            SurfaceStatus::Error => "error",
        }
    }

    /// Map a wire name; an unmapped name is `None`, never a guess.
    pub fn parse(name: &str) -> Option<SurfaceStatus> {
        SurfaceStatus::ALL.into_iter().find(|s| s.as_str() == name)
    }
}

impl std::fmt::Display for SurfaceStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A statement about the subject, with the evidence that binds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Claim {
    /// Typed code, e.g. `thread_in_d_state`.
    pub code: String,
    /// For a hypothesis: the observation that would kill it.
    #[serde(
        default,
        deserialize_with = "crate::strict::present",
        skip_serializing_if = "Option::is_none"
    )]
    pub falsifier: Option<String>,
    /// Unique within the envelope.
    pub id: String,
    /// Fact, inference or hypothesis.
    pub kind: ClaimKind,
    /// Existential ("some thread is in D") or universal ("no thread is in D").
    pub scope: Scope,
    /// The claim in words.
    pub statement: String,
    /// Surface ids that bind it.
    pub surfaces: Vec<String>,
}

/// Epistemic kind of a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClaimKind {
    /// Read directly from a surface.
    Fact,
    /// Derived from facts.
    Inference,
    /// A candidate explanation, with a falsifier.
    Hypothesis,
}

impl ClaimKind {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            ClaimKind::Fact => "fact",
            ClaimKind::Inference => "inference",
            ClaimKind::Hypothesis => "hypothesis",
        }
    }
}

/// Quantifier of a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// About some member.
    Existential,
    /// About every member of the universe.
    Universal,
}

/// A question whose answer would unblock a transition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Unknown {
    /// The transition it blocks.
    pub blocks: String,
    /// Unique within the envelope.
    pub id: String,
    /// Who can answer it.
    pub owner: String,
    /// The discriminating probe (a command or call) that answers it.
    #[serde(default)]
    pub probe: String,
    /// The answerable question.
    pub question: String,
    /// The surface whose failure raised it, if any.
    #[serde(
        default,
        deserialize_with = "crate::strict::present",
        skip_serializing_if = "Option::is_none"
    )]
    pub surface: Option<String>,
}

/// The one legal next action.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NextTransition {
    /// Conditions that abort it.
    pub abort_conditions: Vec<String>,
    /// The action, e.g. `CAPTURE_AGAIN` or `INSPECT_WCHAN_OWNER`.
    pub action: String,
    /// What proves it succeeded.
    pub success_receipt: String,
}
