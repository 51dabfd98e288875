//! Subject identity as the store indexes it.
//!
//! An envelope's subject is flattened into a map of identity field → decimal or
//! text value (a thread's process fields sit beside `tid`). Invariants:
//! - The **subject key** is `sha256:` over the canonical JSON of
//!   `{"identity": <flattened map>, "kind": <kind>}`; two envelopes share a
//!   history exactly when every identity field is equal. A PID alone never
//!   names a subject.
//! - The **locator** is the one field every history query must give (the host
//!   for process, thread and host subjects, the flow id of a stream, the
//!   transfer id of a storage transfer); with the PID it selects an index range
//!   that the other given fields narrow.
//! - Wall times are RFC 3339 UTC as the envelope validator admits them
//!   (`YYYY-MM-DDTHH:MM:SS[.f]Z`) and are ordered as integer nanoseconds since
//!   the Unix epoch, never as strings (fraction widths vary).

use std::collections::BTreeMap;

use pstack_envelope::{Subject, sha256_digest};

/// Identity fields of each subject kind, in a fixed order, and whether each is
/// required (only a stream's `net_ns` is optional).
pub fn identity_fields(kind: &str) -> Option<&'static [&'static str]> {
    const PROCESS: &[&str] = &[
        "host",
        "boot_id",
        "pid",
        "start_ticks",
        "uid",
        "pid_ns",
        "cgroup",
    ];
    const THREAD: &[&str] = &[
        "host",
        "boot_id",
        "pid",
        "start_ticks",
        "uid",
        "pid_ns",
        "cgroup",
        "tid",
    ];
    const STREAM: &[&str] = &["src", "dst", "protocol", "flow_id", "net_ns"];
    const TRANSFER: &[&str] = &[
        "volume",
        "engine",
        "source_node",
        "target_node",
        "transfer_id",
    ];
    const HOST: &[&str] = &["host", "boot_id"];
    match kind {
        "process" => Some(PROCESS),
        "thread" => Some(THREAD),
        "network_stream" => Some(STREAM),
        "storage_transfer" => Some(TRANSFER),
        "host" => Some(HOST),
        _ => None,
    }
}

/// The field that locates a subject's history in the index, per kind.
pub fn locator_field(kind: &str) -> Option<&'static str> {
    match kind {
        "process" | "thread" | "host" => Some("host"),
        "network_stream" => Some("flow_id"),
        "storage_transfer" => Some("transfer_id"),
        _ => None,
    }
}

/// A subject, flattened for indexing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubjectIndex {
    /// Wire name of the kind.
    pub kind: &'static str,
    /// Every identity field present, as text.
    pub fields: BTreeMap<&'static str, String>,
    /// `sha256:` of the canonical kind + fields.
    pub key: String,
    /// Value of [`locator_field`].
    pub locator: String,
    /// The PID of process and thread subjects.
    pub pid: Option<i64>,
    /// Canonical JSON of `fields` (what is stored and filtered on).
    pub identity_json: String,
}

impl SubjectIndex {
    /// Flatten an envelope subject.
    pub fn of(subject: &Subject) -> SubjectIndex {
        let mut f: BTreeMap<&'static str, String> = BTreeMap::new();
        let mut pid = None;
        match subject {
            Subject::Process(p) => {
                put_process(&mut f, p);
                pid = Some(i64::from(p.pid));
            }
            Subject::Thread(t) => {
                put_process(&mut f, &t.process);
                f.insert("tid", t.tid.to_string());
                pid = Some(i64::from(t.process.pid));
            }
            Subject::NetworkStream(s) => {
                f.insert("src", s.src.clone());
                f.insert("dst", s.dst.clone());
                f.insert("protocol", s.protocol.clone());
                f.insert("flow_id", s.flow_id.clone());
                if let Some(ns) = &s.net_ns {
                    f.insert("net_ns", ns.clone());
                }
            }
            Subject::StorageTransfer(t) => {
                f.insert("volume", t.volume.clone());
                f.insert("engine", t.engine.clone());
                f.insert("source_node", t.source_node.clone());
                f.insert("target_node", t.target_node.clone());
                f.insert("transfer_id", t.transfer_id.clone());
            }
            Subject::Host(h) => {
                f.insert("host", h.host.clone());
                f.insert("boot_id", h.boot_id.clone());
            }
        }
        let kind = subject.kind();
        let locator = locator_field(kind)
            .and_then(|l| f.get(l).cloned())
            .unwrap_or_default();
        let identity_json = serde_json::to_string(&f).unwrap_or_default();
        let key = subject_key(kind, &identity_json);
        SubjectIndex {
            kind,
            fields: f,
            key,
            locator,
            pid,
            identity_json,
        }
    }
}

/// Subject key from a kind and the canonical JSON of its flattened identity
/// (a `BTreeMap<_, String>` serializes canonically: sorted keys, strings only).
pub fn subject_key(kind: &str, identity_json: &str) -> String {
    let kind_json = serde_json::to_string(kind).unwrap_or_default();
    sha256_digest(format!("{{\"identity\":{identity_json},\"kind\":{kind_json}}}").as_bytes())
}

fn put_process(f: &mut BTreeMap<&'static str, String>, p: &pstack_envelope::ProcessIdentity) {
    f.insert("host", p.host.clone());
    f.insert("boot_id", p.boot_id.clone());
    f.insert("pid", p.pid.to_string());
    f.insert("start_ticks", p.start_ticks.to_string());
    f.insert("uid", p.uid.to_string());
    f.insert("pid_ns", p.pid_ns.clone());
    f.insert("cgroup", p.cgroup.clone());
}

/// Nanoseconds since the Unix epoch of a wall time in the envelope's form
/// (`YYYY-MM-DDTHH:MM:SS[.f]Z`, a real date); `None` otherwise.
pub fn wall_time_ns(s: &str) -> Option<i64> {
    pstack_envelope::wall_time::parse_unix_ns(s)
}

/// RFC 3339 UTC rendering (millisecond precision) of Unix nanoseconds.
pub fn format_ns(ns: i64) -> String {
    pstack_envelope::wall_time::format_unix_ns(ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wall_time_parses_and_orders_across_fraction_widths() {
        let a = wall_time_ns("2026-12-02T11:00:00.9Z").unwrap();
        let b = wall_time_ns("2026-12-02T11:00:00.10Z").unwrap();
        assert!(
            a > b,
            "0.9 s is later than 0.10 s although it sorts first as text"
        );
        assert_eq!(wall_time_ns("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            wall_time_ns("2000-03-01T00:00:00Z"),
            Some(951_868_800_000_000_000)
        );
        assert_eq!(
            format_ns(951_868_800_123_000_000),
            "2000-03-01T00:00:00.123Z"
        );
    }

    #[test]
    fn wall_time_refuses_impossible_dates() {
        for bad in [
            "2026-02-30T00:00:00Z",
            "2026-13-01T00:00:00Z",
            "2026-12-02T24:00:00Z",
            "2026-12-02T11:00:00.Z",
            "2026-12-02 11:00:00Z",
            "2026-12-02T11:00:00+01:00",
        ] {
            assert_eq!(wall_time_ns(bad), None, "{bad}");
        }
    }

    #[test]
    fn subject_key_separates_pid_reuse() {
        let e = pstack_envelope::example::example_sealed();
        let a = SubjectIndex::of(&e.subject);
        let mut s2 = e.subject.clone();
        if let Subject::Process(p) = &mut s2 {
            p.start_ticks += 1;
        }
        let b = SubjectIndex::of(&s2);
        assert_eq!(a.locator, b.locator);
        assert_eq!(a.pid, b.pid);
        assert_ne!(
            a.key, b.key,
            "same pid, different start_ticks: different subjects"
        );
    }
}
