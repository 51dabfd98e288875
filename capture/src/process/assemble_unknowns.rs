//! Unknowns of a process, thread or host capture: every surface that was
//! not read raises one, with a question, an owner and a probe that would
//! answer it (at most [`MAX_UNKNOWNS`] listed, the rest summarized in one).
//!
//! Invariant: the probe names a command the owner can run as is; an eBPF
//! surface that failed says whether privilege or kernel support is missing.

use pstack_envelope::{Subject, Surface, SurfaceStatus, Unknown};

/// Most unknowns listed one by one (the rest are summarized in one more).
pub(super) const MAX_UNKNOWNS: usize = 200;

fn ok(s: &Surface) -> bool {
    matches!(s.status, SurfaceStatus::Ok | SurfaceStatus::Truncated)
}

/// The unknowns raised by `surfaces`, and by an `identity_race` (what changed).
pub(super) fn unknowns(
    subject: &Subject,
    surfaces: &[Surface],
    identity_race: Option<&str>,
    bundle_deadline_ms: u64,
) -> Vec<Unknown> {
    let owner = match subject {
        Subject::Process(p) => format!("operator of {}", p.host),
        Subject::Thread(t) => format!("operator of {}", t.process.host),
        Subject::Host(h) => format!("operator of {}", h.host),
        _ => "operator".into(),
    };
    let again = crate::probes::capture_again(subject);
    let mut out = Vec::new();
    if let Some(why) = identity_race {
        out.push(Unknown {
            id: "u-identity".into(),
            question: format!("Is the subject still the process first observed? ({why})"),
            blocks: "ATTRIBUTE_EVIDENCE".into(),
            owner: owner.clone(),
            probe: again.clone(),
            surface: None,
        });
    }
    let mut ebpf_failed = 0;
    for s in surfaces
        .iter()
        .filter(|s| s.id.starts_with("ebpf:") && !ok(s) && s.status != SurfaceStatus::IdentityRace)
    {
        ebpf_failed += 1;
        let cause = s.cause.as_ref().map(|c| c.message.as_str()).unwrap_or("");
        let window = std::time::Duration::from_millis(s.deadline_ms.max(1));
        let (question, probe) = match s.status {
            SurfaceStatus::PermissionDenied => (
                format!("How long were the subject's threads off CPU, and in D, during a window? (eBPF denied: {cause})"),
                crate::probes::with_privilege(
                    &crate::probes::capture_window(subject, window),
                    &crate::helpers::denial::Caller::current(),
                ),
            ),
            SurfaceStatus::Unsupported => (
                format!("How long were the subject's threads off CPU, and in D, during a window? (eBPF unsupported here: {cause})"),
                "ls -l /sys/kernel/btf/vmlinux; grep -E 'CONFIG_DEBUG_INFO_BTF|CONFIG_BPF_SYSCALL' /boot/config-$(uname -r)".into(),
            ),
            _ => (
                format!("Why did the eBPF surface {} fail? ({cause})", s.id),
                crate::probes::capture_window(subject, window),
            ),
        };
        out.push(Unknown {
            id: format!("u-{}", s.id.replace([':', '/'], "-")),
            question,
            blocks: "CLASSIFY_BLOCKING".into(),
            owner: owner.clone(),
            probe,
            surface: Some(s.id.clone()),
        });
    }
    let failed: Vec<&Surface> = surfaces
        .iter()
        .filter(|s| !s.id.starts_with("ebpf:"))
        .filter(|s| {
            matches!(
                s.status,
                SurfaceStatus::Timeout
                    | SurfaceStatus::TimeoutUnreapedHelper
                    | SurfaceStatus::PermissionDenied
                    | SurfaceStatus::Error
                    | SurfaceStatus::Skipped
            ) || (s.status == SurfaceStatus::IdentityRace && identity_race.is_none())
        })
        .collect();
    for s in failed.iter().take(MAX_UNKNOWNS.saturating_sub(ebpf_failed)) {
        let path = s
            .authority
            .strip_prefix("procfs:")
            .unwrap_or(&s.authority)
            .to_string();
        let look = if path.ends_with("/fd/*") {
            format!("ls -l {}", path.trim_end_matches('*'))
        } else {
            format!("cat {path}")
        };
        let cause = s.cause.as_ref().map(|c| c.message.as_str()).unwrap_or("");
        let (question, probe) = match s.status {
            SurfaceStatus::Timeout => (
                format!(
                    "What does {path} show when given longer than {} ms?",
                    s.deadline_ms
                ),
                format!("timeout -s KILL 30 {look}"),
            ),
            SurfaceStatus::TimeoutUnreapedHelper => {
                let helper = cause
                    .split("helper pid ")
                    .nth(1)
                    .and_then(|r| r.split_whitespace().next())
                    .unwrap_or("?");
                (
                    format!(
                        "Why is the helper (pid {helper}) that read {path} stuck, and what does {path} hold?"
                    ),
                    format!(
                        "cat /proc/{helper}/stack; grep -E 'State|Cgroup' /proc/{helper}/status; cat /proc/{helper}/cgroup"
                    ),
                )
            }
            SurfaceStatus::PermissionDenied => (
                format!("What does {path} show to a caller allowed to read it?"),
                crate::probes::with_privilege(&again, &crate::helpers::denial::Caller::current()),
            ),
            SurfaceStatus::Skipped if cause.contains("leak budget") => (
                format!("What does {path} show once leaked helpers have exited?"),
                format!("wait for the helpers journaled as leaked to exit, then {again}"),
            ),
            SurfaceStatus::Skipped => (
                format!("What does {path} show with more time?"),
                crate::probes::capture_longer(
                    subject,
                    std::time::Duration::from_millis(bundle_deadline_ms.saturating_mul(2)),
                ),
            ),
            SurfaceStatus::IdentityRace => (
                format!("Which process does {path} belong to now? ({cause})"),
                look.clone(),
            ),
            _ => (
                format!("Why did reading {path} fail? ({cause})"),
                look.clone(),
            ),
        };
        out.push(Unknown {
            id: format!("u-{}", s.id.replace('/', "-")),
            question,
            blocks: "CLASSIFY_BLOCKING".into(),
            owner: owner.clone(),
            probe,
            surface: Some(s.id.clone()),
        });
    }
    if failed.len() + ebpf_failed > MAX_UNKNOWNS {
        out.push(Unknown {
            id: "u-more".into(),
            question: format!(
                "{} more surfaces did not succeed: what do they show?",
                failed.len() + ebpf_failed - MAX_UNKNOWNS
            ),
            blocks: "CLASSIFY_BLOCKING".into(),
            owner,
            probe: crate::probes::capture_failed_surfaces(subject),
            surface: None,
        });
    }
    out
}
