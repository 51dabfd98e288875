//! Watch rules as operators write them (`[[watch]]` tables in
//! `pstackd.toml`) and as the engine runs them.
//!
//! Invariants:
//! - **Closed world, per kind.** A rule names a kind and may set only that
//!   kind's keys; a key of another kind (`ports` on a `d_state` rule) is
//!   refused naming the rule, never ignored.
//! - **Names are unique** and safe to show in a label (`[a-z0-9_.-]`, ≤ 64).
//! - **Conservative limits by default**: [`DEFAULT_PER_SUBJECT_PER_HOUR`]
//!   captures of one subject and [`DEFAULT_PER_HOUR`] in all, per rule.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Default captures of one subject per rule per hour.
pub const DEFAULT_PER_SUBJECT_PER_HOUR: u32 = 2;
/// Default captures per rule per hour.
pub const DEFAULT_PER_HOUR: u32 = 12;
/// Default `min_seconds` of a `d_state` rule.
pub const DEFAULT_D_STATE_SECONDS: u64 = 10;
/// Default watched ports of the TCP kinds: Longhorn v1's instance-manager range.
pub const DEFAULT_PORTS: (u16, u16) = (10_000, 20_000);
/// Default `poll_seconds` of a `longhorn_rebuild` rule (the manager's own
/// engine poll interval, `EnginePollInterval`).
pub const DEFAULT_LONGHORN_POLL_SECONDS: u64 = 5;
/// Default longest window of one `longhorn_rebuild` capture.
pub const DEFAULT_LONGHORN_WINDOW: Duration = Duration::from_secs(120);
/// Longest window a `longhorn_rebuild` rule may set.
pub const MAX_LONGHORN_WINDOW: Duration = Duration::from_secs(3600);
/// Longest window the other kinds may set.
pub const MAX_WINDOW: Duration = Duration::from_secs(60);
/// Most rules a configuration may hold.
pub const MAX_RULES: usize = 64;

/// A rule's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum RuleKind {
    /// A task continuously in D state for `min_seconds`.
    DState,
    /// A reset on a flow of the watched ports.
    TcpReset,
    /// An RTO retransmit on a flow of the watched ports.
    TcpRto,
    /// `ListenOverflows` growing faster than the threshold.
    ListenOverflow,
    /// `RetransSegs` growing faster than the threshold.
    RetransmitRate,
    /// A Longhorn replica rebuild that starts, ends or fails, read from the
    /// manager.
    LonghornRebuild,
}

impl RuleKind {
    /// Wire name (also `collector.trigger.kind`).
    pub fn as_str(self) -> &'static str {
        match self {
            RuleKind::DState => "d_state",
            RuleKind::TcpReset => "tcp_reset",
            RuleKind::TcpRto => "tcp_rto",
            RuleKind::ListenOverflow => "listen_overflow",
            RuleKind::RetransmitRate => "retransmit_rate",
            RuleKind::LonghornRebuild => "longhorn_rebuild",
        }
    }

    /// Whether the rule reads the flight recorder (eBPF, BTF).
    pub fn needs_flows(self) -> bool {
        matches!(self, RuleKind::TcpReset | RuleKind::TcpRto)
    }
}

/// One `[[watch]]` table as written.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WatchRuleConfig {
    /// Unique name; shown in status, metrics and the envelope's trigger.
    pub name: String,
    /// What the rule watches.
    pub kind: RuleKind,
    /// `d_state`: seconds a task must stay in D (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_seconds: Option<u64>,
    /// TCP kinds: watched local or remote port range, `"lo-hi"` or `"p"`
    /// (default `"10000-20000"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<String>,
    /// Rate kinds: counter increase per second that fires the rule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threshold_per_second: Option<u64>,
    /// Length of the capture the rule starts (`"5s"`, `"500ms"`): the
    /// off-CPU window of a `d_state` capture (default 2 s, 0 = none), the
    /// live window of a `tcp_rto` capture (default 5 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<String>,
    /// Captures of one subject per hour (default 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_per_subject_per_hour: Option<u32>,
    /// Captures by this rule per hour (default 12).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_per_hour: Option<u32>,
    /// `longhorn_rebuild`: the manager's base URL (`http://…:9500`, with or
    /// without `/v1`). Required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manager_url: Option<String>,
    /// `longhorn_rebuild`: only these volumes (default: every volume).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volumes: Option<Vec<String>>,
    /// `longhorn_rebuild`: seconds between manager reads (default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poll_seconds: Option<u64>,
    /// `longhorn_rebuild`: this node's Longhorn node name, matched against
    /// `hostId` (default: `$NODE_NAME`, else the hostname).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// `longhorn_rebuild`: the instance-manager pod's netns by name
    /// (`/run/netns/NAME`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<String>,
    /// `longhorn_rebuild`: the instance-manager pod's netns by a PID in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns_pid: Option<u32>,
    /// `longhorn_rebuild`: the Kubernetes API for a failed rebuild's Events
    /// (`https://…`; `http://` only on loopback). Default: the in-cluster
    /// service account, when pstackd runs in a pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_api: Option<String>,
    /// `longhorn_rebuild`: the bearer token's file (default: the service
    /// account's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_token_file: Option<std::path::PathBuf>,
    /// `longhorn_rebuild`: the API server's CA (default: the service
    /// account's `ca.crt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_ca_file: Option<std::path::PathBuf>,
}

/// What a `longhorn_rebuild` rule reads and where it captures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LonghornRule {
    /// Manager base URL (validated).
    pub manager_url: String,
    /// Volume filter (empty: every volume).
    pub volumes: Vec<String>,
    /// Between manager reads.
    pub poll: Duration,
    /// This node's Longhorn name (None: `$NODE_NAME`, else the hostname, at run time).
    pub node: Option<String>,
    /// Capture netns by name.
    pub netns: Option<String>,
    /// Capture netns by PID.
    pub netns_pid: Option<u32>,
    /// The Kubernetes API as configured (None: the in-cluster one, if any,
    /// at run time).
    pub kubernetes: Option<pstack_capture::longhorn::kube::KubeApi>,
}

/// What a rule waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Condition {
    /// A task in D for at least this long.
    DState {
        /// T.
        min: Duration,
    },
    /// A reset on a watched flow.
    TcpReset {
        /// Inclusive port range.
        ports: (u16, u16),
    },
    /// An RTO retransmit on a watched flow.
    TcpRto {
        /// Inclusive port range.
        ports: (u16, u16),
    },
    /// `TcpExt.ListenOverflows` per second above the threshold.
    ListenOverflow {
        /// Per second.
        threshold_per_second: u64,
    },
    /// `Tcp.RetransSegs` per second above the threshold.
    RetransmitRate {
        /// Per second.
        threshold_per_second: u64,
    },
    /// A rebuild started, ended or failed (see [`super::rebuild`]).
    LonghornRebuild(Box<LonghornRule>),
}

/// A validated rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchRule {
    /// Its name.
    pub name: String,
    /// Its kind.
    pub kind: RuleKind,
    /// Its condition.
    pub condition: Condition,
    /// Length of the capture it starts (zero: none / default of the engine).
    pub window: Duration,
    /// Captures of one subject per hour.
    pub max_per_subject_per_hour: u32,
    /// Captures per hour.
    pub max_per_hour: u32,
}

/// A rule the configuration cannot hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("watch rule {rule:?}: {reason}")]
pub struct RuleError {
    /// The rule's name (or `#N` when it has none).
    pub rule: String,
    /// What is wrong and what is accepted.
    pub reason: String,
}

/// Parse `"lo-hi"` or `"p"` into an inclusive, non-empty port range.
pub fn parse_ports(text: &str) -> Result<(u16, u16), String> {
    let port = |s: &str| -> Result<u16, String> {
        match s.trim().parse::<u16>() {
            Ok(p) if p > 0 => Ok(p),
            _ => Err(format!("{s:?} is not a port (1-65535)")),
        }
    };
    let (lo, hi) = match text.split_once('-') {
        Some((a, b)) => (port(a)?, port(b)?),
        None => {
            let p = port(text)?;
            (p, p)
        }
    };
    if lo > hi {
        return Err(format!("range {text:?} is empty (low end above high end)"));
    }
    Ok((lo, hi))
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_.-".contains(&b))
}

impl WatchRuleConfig {
    /// Validate into a runnable rule.
    pub fn validate(&self) -> Result<WatchRule, RuleError> {
        let err = |reason: String| RuleError {
            rule: self.name.clone(),
            reason,
        };
        if !valid_name(&self.name) {
            return Err(err(
                "name must be 1-64 characters of a-z, 0-9, '_', '.', '-'".into(),
            ));
        }
        let kind = self.kind;
        let foreign = |key: &str, set: bool| -> Result<(), RuleError> {
            if set {
                Err(err(format!(
                    "`{key}` does not apply to a {} rule",
                    kind.as_str()
                )))
            } else {
                Ok(())
            }
        };
        let is_rate = matches!(kind, RuleKind::ListenOverflow | RuleKind::RetransmitRate);
        if kind != RuleKind::DState {
            foreign("min_seconds", self.min_seconds.is_some())?;
        }
        if !kind.needs_flows() {
            foreign("ports", self.ports.is_some())?;
        }
        if !is_rate {
            foreign("threshold_per_second", self.threshold_per_second.is_some())?;
        }
        if kind != RuleKind::LonghornRebuild {
            for (key, set) in [
                ("manager_url", self.manager_url.is_some()),
                ("volumes", self.volumes.is_some()),
                ("poll_seconds", self.poll_seconds.is_some()),
                ("node", self.node.is_some()),
                ("netns", self.netns.is_some()),
                ("netns_pid", self.netns_pid.is_some()),
                ("kubernetes_api", self.kubernetes_api.is_some()),
                (
                    "kubernetes_token_file",
                    self.kubernetes_token_file.is_some(),
                ),
                ("kubernetes_ca_file", self.kubernetes_ca_file.is_some()),
            ] {
                foreign(key, set)?;
            }
        }
        if matches!(kind, RuleKind::TcpReset) {
            // A reset ends its stream: its capture is what the recorder held,
            // there is no live window to size.
            foreign("window", self.window.is_some())?;
        }
        let ports = match &self.ports {
            Some(p) => parse_ports(p).map_err(|e| err(format!("ports: {e}")))?,
            None => DEFAULT_PORTS,
        };
        let threshold = || -> Result<u64, RuleError> {
            match self.threshold_per_second {
                Some(t) if t >= 1 => Ok(t),
                Some(_) => Err(err("threshold_per_second must be at least 1".into())),
                None => Err(err(format!(
                    "a {} rule needs threshold_per_second",
                    kind.as_str()
                ))),
            }
        };
        let condition = match kind {
            RuleKind::DState => {
                let secs = self.min_seconds.unwrap_or(DEFAULT_D_STATE_SECONDS);
                if !(1..=86_400).contains(&secs) {
                    return Err(err("min_seconds must be between 1 and 86400".into()));
                }
                Condition::DState {
                    min: Duration::from_secs(secs),
                }
            }
            RuleKind::TcpReset => Condition::TcpReset { ports },
            RuleKind::TcpRto => Condition::TcpRto { ports },
            RuleKind::ListenOverflow => Condition::ListenOverflow {
                threshold_per_second: threshold()?,
            },
            RuleKind::RetransmitRate => Condition::RetransmitRate {
                threshold_per_second: threshold()?,
            },
            RuleKind::LonghornRebuild => Condition::LonghornRebuild(Box::new(self.longhorn(&err)?)),
        };
        let default_window = match kind {
            RuleKind::DState => Duration::from_secs(2),
            RuleKind::TcpRto => Duration::from_secs(5),
            RuleKind::LonghornRebuild => DEFAULT_LONGHORN_WINDOW,
            _ => Duration::ZERO,
        };
        let window = match &self.window {
            None => default_window,
            Some(w) if w.trim() == "0" => Duration::ZERO,
            Some(w) => {
                pstack_cli::duration::parse_duration(w).map_err(|e| err(format!("window: {e}")))?
            }
        };
        if kind == RuleKind::LonghornRebuild {
            if window < Duration::from_secs(1) || window > MAX_LONGHORN_WINDOW {
                return Err(err(
                    "window (the longest one rebuild capture runs) must be between 1s and 3600s"
                        .into(),
                ));
            }
        } else if window > MAX_WINDOW {
            return Err(err("window must be at most 60s".into()));
        }
        if kind == RuleKind::TcpRto && window.is_zero() {
            return Err(err(
                "a tcp_rto rule needs a live window (e.g. \"5s\")".into()
            ));
        }
        // Its live window is a transport capture, validated like an operator's.
        let shortest = pstack_capture::validation::TRANSPORT_WINDOW.0;
        if kind == RuleKind::TcpRto && window < shortest {
            return Err(err(format!(
                "a tcp_rto rule's window must be at least {} ms (the shortest transport window)",
                shortest.as_millis()
            )));
        }
        let per_subject = self
            .max_per_subject_per_hour
            .unwrap_or(DEFAULT_PER_SUBJECT_PER_HOUR);
        let per_hour = self.max_per_hour.unwrap_or(DEFAULT_PER_HOUR);
        if !(1..=3600).contains(&per_subject) || !(1..=3600).contains(&per_hour) {
            return Err(err(
                "max_per_subject_per_hour and max_per_hour must be between 1 and 3600".into(),
            ));
        }
        if per_subject > per_hour {
            return Err(err(format!(
                "max_per_subject_per_hour ({per_subject}) exceeds max_per_hour ({per_hour})"
            )));
        }
        Ok(WatchRule {
            name: self.name.clone(),
            kind,
            condition,
            window,
            max_per_subject_per_hour: per_subject,
            max_per_hour: per_hour,
        })
    }
}

impl WatchRuleConfig {
    fn longhorn(&self, err: &dyn Fn(String) -> RuleError) -> Result<LonghornRule, RuleError> {
        let url = self.manager_url.as_deref().ok_or_else(|| {
            err(
                "a longhorn_rebuild rule needs manager_url (e.g. \"http://10.43.0.20:9500\")"
                    .into(),
            )
        })?;
        pstack_capture::longhorn::parse_base_url(url)
            .map_err(|e| err(format!("manager_url: {e}")))?;
        let k8s_name = |v: &str| {
            !v.is_empty()
                && v.len() <= 253
                && v.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
        };
        let volumes = self.volumes.clone().unwrap_or_default();
        if let Some(bad) = volumes.iter().find(|v| !k8s_name(v)) {
            return Err(err(format!("volumes: {bad:?} is not a volume name")));
        }
        let poll = self.poll_seconds.unwrap_or(DEFAULT_LONGHORN_POLL_SECONDS);
        if !(1..=300).contains(&poll) {
            return Err(err("poll_seconds must be between 1 and 300".into()));
        }
        if let Some(n) = &self.node
            && !k8s_name(n)
        {
            return Err(err(format!("node: {n:?} is not a node name")));
        }
        if self.netns.is_some() && self.netns_pid.is_some() {
            return Err(err("set netns or netns_pid, not both".into()));
        }
        if let Some(n) = &self.netns
            && (n.is_empty() || n.contains('/') || n.starts_with('.'))
        {
            return Err(err(format!("netns: {n:?} is not a name under /run/netns")));
        }
        if self.netns_pid == Some(0) {
            return Err(err("netns_pid must be a PID".into()));
        }
        let sa = std::path::Path::new(pstack_capture::longhorn::kube::SERVICE_ACCOUNT_DIR);
        let kubernetes = match &self.kubernetes_api {
            None => {
                if self.kubernetes_token_file.is_some() || self.kubernetes_ca_file.is_some() {
                    return Err(err(
                        "kubernetes_token_file and kubernetes_ca_file need kubernetes_api".into(),
                    ));
                }
                None
            }
            Some(api) => {
                let loopback = ["http://127.0.0.1:", "http://localhost:", "http://[::1]:"]
                    .iter()
                    .any(|p| api.starts_with(p));
                if !(api.starts_with("https://") || loopback) || api.contains('@') {
                    return Err(err(format!(
                        "kubernetes_api: {api:?} must be https://HOST[:PORT] (http:// only on loopback), without credentials"
                    )));
                }
                Some(pstack_capture::longhorn::kube::KubeApi {
                    base: api.trim_end_matches('/').to_string(),
                    token_file: self
                        .kubernetes_token_file
                        .clone()
                        .unwrap_or_else(|| sa.join("token")),
                    ca_file: self
                        .kubernetes_ca_file
                        .clone()
                        .or_else(|| api.starts_with("https://").then(|| sa.join("ca.crt"))),
                })
            }
        };
        Ok(LonghornRule {
            kubernetes,
            manager_url: url.to_string(),
            volumes,
            poll: Duration::from_secs(poll),
            node: self.node.clone(),
            netns: self.netns.clone(),
            netns_pid: self.netns_pid,
        })
    }
}

/// Validate a whole rule set: each rule, unique names, at most [`MAX_RULES`].
pub fn validate_all(rules: &[WatchRuleConfig]) -> Result<Vec<WatchRule>, RuleError> {
    if rules.len() > MAX_RULES {
        return Err(RuleError {
            rule: format!("#{}", MAX_RULES + 1),
            reason: format!("at most {MAX_RULES} rules"),
        });
    }
    let mut out: Vec<WatchRule> = Vec::with_capacity(rules.len());
    for r in rules {
        let rule = r.validate()?;
        if out.iter().any(|o| o.name == rule.name) {
            return Err(RuleError {
                rule: rule.name,
                reason: "two rules have this name".into(),
            });
        }
        out.push(rule);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Vec<WatchRule>, String> {
        #[derive(Deserialize)]
        struct Doc {
            #[serde(default)]
            watch: Vec<WatchRuleConfig>,
        }
        let doc: Doc = toml::from_str(text).map_err(|e| e.to_string())?;
        validate_all(&doc.watch).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_are_conservative() {
        let r = parse("[[watch]]\nname = \"stuck\"\nkind = \"d_state\"\n").unwrap();
        assert_eq!(
            r[0],
            WatchRule {
                name: "stuck".into(),
                kind: RuleKind::DState,
                condition: Condition::DState {
                    min: Duration::from_secs(10)
                },
                window: Duration::from_secs(2),
                max_per_subject_per_hour: 2,
                max_per_hour: 12,
            }
        );
        let r = parse("[[watch]]\nname = \"rst\"\nkind = \"tcp_reset\"\n").unwrap();
        assert_eq!(
            r[0].condition,
            Condition::TcpReset {
                ports: (10_000, 20_000)
            }
        );
    }

    #[test]
    fn each_kind_takes_its_own_keys() {
        let ok = [
            "name = \"a\"\nkind = \"d_state\"\nmin_seconds = 3\nwindow = \"0\"",
            "name = \"a\"\nkind = \"tcp_rto\"\nports = \"9500\"\nwindow = \"3s\"",
            // At the shortest transport window.
            "name = \"a\"\nkind = \"tcp_rto\"\nwindow = \"100ms\"",
            "name = \"a\"\nkind = \"listen_overflow\"\nthreshold_per_second = 5",
            "name = \"a\"\nkind = \"retransmit_rate\"\nthreshold_per_second = 100\nmax_per_hour = 3\nmax_per_subject_per_hour = 1",
            "name = \"a\"\nkind = \"longhorn_rebuild\"\nmanager_url = \"http://10.43.0.20:9500/v1\"",
            "name = \"a\"\nkind = \"longhorn_rebuild\"\nmanager_url = \"http://lh:9500\"\nvolumes = [\"pvc-1\"]\npoll_seconds = 2\nwindow = \"10m\"\nnode = \"node-t\"\nnetns = \"im-t\"",
            "name = \"a\"\nkind = \"longhorn_rebuild\"\nmanager_url = \"http://lh:9500\"\nkubernetes_api = \"https://10.43.0.1:443\"\nkubernetes_token_file = \"/etc/pstack/k8s-token\"",
        ];
        for body in ok {
            parse(&format!("[[watch]]\n{body}\n")).unwrap_or_else(|e| panic!("{body}: {e}"));
        }
    }

    #[test]
    fn bad_rules_are_refused_naming_the_rule_and_the_key() {
        let table: &[(&str, &str)] = &[
            ("name = \"x\"\nkind = \"cpu_hot\"", "unknown variant"),
            (
                "name = \"x\"\nkind = \"d_state\"\nports = \"1-2\"",
                "`ports` does not apply",
            ),
            (
                "name = \"x\"\nkind = \"d_state\"\nmin_seconds = 0",
                "min_seconds",
            ),
            (
                "name = \"x\"\nkind = \"tcp_reset\"\nports = \"20000-10000\"",
                "empty",
            ),
            (
                "name = \"x\"\nkind = \"tcp_reset\"\nports = \"0-5\"",
                "not a port",
            ),
            (
                "name = \"x\"\nkind = \"tcp_reset\"\nwindow = \"5s\"",
                "`window` does not apply",
            ),
            (
                "name = \"x\"\nkind = \"tcp_rto\"\nwindow = \"0\"",
                "live window",
            ),
            (
                "name = \"x\"\nkind = \"tcp_rto\"\nwindow = \"99ms\"",
                "at least 100 ms",
            ),
            (
                "name = \"x\"\nkind = \"listen_overflow\"",
                "needs threshold_per_second",
            ),
            (
                "name = \"x\"\nkind = \"retransmit_rate\"\nthreshold_per_second = 0",
                "at least 1",
            ),
            (
                "name = \"x\"\nkind = \"d_state\"\nwindow = \"soon\"",
                "window",
            ),
            (
                "name = \"x\"\nkind = \"d_state\"\nwindow = \"5m\"",
                "at most 60s",
            ),
            (
                "name = \"x\"\nkind = \"d_state\"\nmax_per_hour = 0",
                "between 1 and 3600",
            ),
            (
                "name = \"x\"\nkind = \"d_state\"\nmax_per_subject_per_hour = 5\nmax_per_hour = 2",
                "exceeds",
            ),
            ("name = \"Bad Name\"\nkind = \"d_state\"", "name must be"),
            (
                "name = \"x\"\nkind = \"longhorn_rebuild\"",
                "needs manager_url",
            ),
            (
                "name = \"x\"\nkind = \"longhorn_rebuild\"\nmanager_url = \"https://lh:9500\"",
                "manager_url",
            ),
            (
                "name = \"x\"\nkind = \"longhorn_rebuild\"\nmanager_url = \"http://lh:9500\"\nports = \"1-2\"",
                "`ports` does not apply",
            ),
            (
                "name = \"x\"\nkind = \"longhorn_rebuild\"\nmanager_url = \"http://lh:9500\"\npoll_seconds = 0",
                "poll_seconds",
            ),
            (
                "name = \"x\"\nkind = \"longhorn_rebuild\"\nmanager_url = \"http://lh:9500\"\nwindow = \"2h\"",
                "between 1s and 3600s",
            ),
            (
                "name = \"x\"\nkind = \"longhorn_rebuild\"\nmanager_url = \"http://lh:9500\"\nvolumes = [\"a b\"]",
                "not a volume name",
            ),
            (
                "name = \"x\"\nkind = \"longhorn_rebuild\"\nmanager_url = \"http://lh:9500\"\nnetns = \"a\"\nnetns_pid = 1",
                "not both",
            ),
            (
                "name = \"x\"\nkind = \"d_state\"\nmanager_url = \"http://lh:9500\"",
                "`manager_url` does not apply",
            ),
            (
                "name = \"x\"\nkind = \"tcp_reset\"\nvolumes = [\"v\"]",
                "`volumes` does not apply",
            ),
            (
                "name = \"x\"\nkind = \"longhorn_rebuild\"\nmanager_url = \"http://lh:9500\"\nkubernetes_api = \"http://10.0.0.1:6443\"",
                "only on loopback",
            ),
            (
                "name = \"x\"\nkind = \"longhorn_rebuild\"\nmanager_url = \"http://lh:9500\"\nkubernetes_token_file = \"/t\"",
                "need kubernetes_api",
            ),
            (
                "name = \"x\"\nkind = \"d_state\"\ncolour = 1",
                "unknown field",
            ),
        ];
        for (body, want) in table {
            let e = parse(&format!("[[watch]]\n{body}\n")).unwrap_err();
            assert!(e.contains(want), "{body}: {e}");
            if !want.starts_with("unknown") && !body.contains("Bad Name") {
                assert!(e.contains("\"x\""), "the rule is named: {e}");
            }
        }
        let e = parse("[[watch]]\nname = \"x\"\nkind = \"d_state\"\n[[watch]]\nname = \"x\"\nkind = \"d_state\"\n")
            .unwrap_err();
        assert!(e.contains("two rules"), "{e}");
    }

    #[test]
    fn port_ranges() {
        assert_eq!(parse_ports("10000-20000"), Ok((10_000, 20_000)));
        assert_eq!(parse_ports(" 9500 "), Ok((9500, 9500)));
        assert!(parse_ports("a-b").is_err());
        assert!(parse_ports("70000").is_err());
    }
}
