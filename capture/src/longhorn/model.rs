//! The Longhorn manager's REST shapes, read as the manager writes them, and
//! the address pairs inside its error texts.
//!
//! Shapes (checked with `git show <tag>:<path>` on longhorn/longhorn-manager):
//! - `RebuildStatus`: `replica`, `state`, `progress`, `isRebuilding`, `error`,
//!   and `fromReplica` (a replica *name*, or the raw `tcp://` address when no
//!   replica matches: `datastore.ReplicaAddressToReplicaName`) in v1.6.0–v1.10.0
//!   (`api/model.go` v1.9.0 l.561–569), `fromReplicaList` ([]string) from
//!   v1.11.0 (`api/model.go` v1.11.0 l.603–611). `fromReplicaAddress` is an
//!   Engine-CR field and is *not* read here.
//! - `Instance` (embedded in `Replica` and `Controller`): `name`, `hostId`,
//!   `address` (the pod IP: `r.Status.IP`, not the storage-network IP),
//!   `running`, `instanceManagerName` (`api/model.go` v1.9.0 l.207–215);
//!   `Replica` adds `mode` (RW/WO/ERR), `failedAt`, `dataEngine` (l.230–239).
//! - `InstanceManager`: `instanceReplicas` / `instanceEngines` (and the older
//!   `instances`) maps of `InstanceProcess{spec,status}` whose status carries
//!   `portStart`/`portEnd` (`api/model.go` v1.9.0 l.571–584,
//!   `k8s/pkg/apis/longhorn/v1beta2/instancemanager.go` v1.9.0 l.119–140).
//! - `state` values: `in_progress`, `complete`, `error` (engine
//!   `pkg/types/types.go`), and `""` with `error = "failed to get replica
//!   rebuild status of <addr>: …"` when the engine could not ask the sync
//!   agent (engine `pkg/sync/sync.go` v1.9.0 l.830). `progress` is an int
//!   and is not bounded to 0–100.
//!
//! Everything here is a pure function of bytes: no I/O.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use serde::Deserialize;

/// What a rebuild entry says its state is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RebuildState {
    /// `in_progress`.
    InProgress,
    /// `complete`.
    Complete,
    /// `error`.
    Error,
    /// `""`: the engine could not read the sync agent's status.
    Unreported,
    /// Anything else, verbatim.
    Other(String),
}

impl RebuildState {
    fn parse(s: &str) -> RebuildState {
        match s {
            "in_progress" => RebuildState::InProgress,
            "complete" => RebuildState::Complete,
            "error" => RebuildState::Error,
            "" => RebuildState::Unreported,
            x => RebuildState::Other(x.to_string()),
        }
    }
    /// The manager's word for it.
    pub fn as_str(&self) -> &str {
        match self {
            RebuildState::InProgress => "in_progress",
            RebuildState::Complete => "complete",
            RebuildState::Error => "error",
            RebuildState::Unreported => "",
            RebuildState::Other(s) => s,
        }
    }
    /// A terminal state (the rebuild's outcome is known).
    pub fn terminal(&self) -> bool {
        matches!(self, RebuildState::Complete | RebuildState::Error)
    }
}

/// One `rebuildStatus[]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RebuildEntry {
    /// The rebuilding (target) replica's name.
    pub replica: String,
    /// Source replicas: `fromReplica` (≤ v1.10) or `fromReplicaList` (v1.11+);
    /// names, or a `tcp://ip:port` address when the manager found no name.
    pub from: Vec<String>,
    /// Which of the two fields carried `from` (`fromReplica`/`fromReplicaList`).
    pub from_field: Option<&'static str>,
    /// State.
    pub state: RebuildState,
    /// Progress as reported (not bounded to 0–100).
    pub progress: Option<i64>,
    /// `isRebuilding`.
    pub is_rebuilding: Option<bool>,
    /// `error` ("" when none).
    pub error: String,
}

/// One `replicas[]` or `controllers[]` entry (the `Instance` fields).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Instance {
    /// Object name.
    pub name: String,
    /// Node (`hostId`).
    pub host_id: String,
    /// Pod IP (`address`).
    pub address: String,
    /// Instance manager pod (`instanceManagerName`).
    pub instance_manager: String,
    /// Replica mode: RW, WO, ERR ("" for controllers).
    pub mode: String,
    /// `failedAt` ("" when never failed).
    pub failed_at: String,
    /// `dataEngine` of a replica ("" for controllers).
    pub data_engine: String,
    /// `running`.
    pub running: Option<bool>,
}

/// The parts of `GET /v1/volumes/{name}` a rebuild is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Volume {
    /// Name.
    pub name: String,
    /// `state`.
    pub state: String,
    /// `robustness`.
    pub robustness: String,
    /// `dataEngine` (`v1`/`v2`; "" on managers before it existed).
    pub data_engine: String,
    /// `replicas[]`.
    pub replicas: Vec<Instance>,
    /// `controllers[]`.
    pub controllers: Vec<Instance>,
    /// `rebuildStatus[]`.
    pub rebuild: Vec<RebuildEntry>,
    /// Whether the v1.11+ `fromReplicaList` shape was seen.
    pub shape: &'static str,
}

/// Why a body is not a volume document.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    /// Not JSON at all (an HTML page, a proxy's error).
    #[error("not a JSON document ({what}): {detail}")]
    NotJson {
        /// What it looks like.
        what: &'static str,
        /// The parser's word.
        detail: String,
    },
    /// JSON, but a field has the wrong type.
    #[error("field {field}: {detail}")]
    Field {
        /// Which field.
        field: &'static str,
        /// What is wrong.
        detail: String,
    },
}

fn sniff(body: &[u8]) -> &'static str {
    let head = String::from_utf8_lossy(&body[..body.len().min(256)]).to_ascii_lowercase();
    let head = head.trim_start();
    if head.starts_with("<!doctype html") || head.starts_with("<html") || head.contains("<body") {
        "an HTML page: is the base URL the Longhorn UI or a proxy rather than longhorn-backend:9500?"
    } else if head.is_empty() {
        "an empty body"
    } else {
        "text"
    }
}

#[derive(Deserialize)]
struct RawInstance {
    #[serde(default)]
    name: Option<String>,
    #[serde(default, rename = "hostId")]
    host_id: Option<String>,
    #[serde(default)]
    address: Option<String>,
    #[serde(default, rename = "instanceManagerName")]
    instance_manager: Option<String>,
    #[serde(default)]
    mode: Option<String>,
    #[serde(default, rename = "failedAt")]
    failed_at: Option<String>,
    #[serde(default, rename = "dataEngine")]
    data_engine: Option<String>,
    #[serde(default)]
    running: Option<bool>,
}

#[derive(Deserialize)]
struct RawRebuild {
    #[serde(default)]
    replica: Option<String>,
    #[serde(default, rename = "fromReplica")]
    from_replica: Option<String>,
    #[serde(default, rename = "fromReplicaList")]
    from_replica_list: Option<Vec<String>>,
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    progress: Option<i64>,
    #[serde(default, rename = "isRebuilding")]
    is_rebuilding: Option<bool>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
struct RawVolume {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    robustness: Option<String>,
    #[serde(default, rename = "dataEngine")]
    data_engine: Option<String>,
    #[serde(default)]
    replicas: Option<Vec<RawInstance>>,
    #[serde(default)]
    controllers: Option<Vec<RawInstance>>,
    #[serde(default, rename = "rebuildStatus")]
    rebuild: Option<Vec<RawRebuild>>,
}

fn instance(r: RawInstance) -> Instance {
    Instance {
        name: r.name.unwrap_or_default(),
        host_id: r.host_id.unwrap_or_default(),
        address: r.address.unwrap_or_default(),
        instance_manager: r.instance_manager.unwrap_or_default(),
        mode: r.mode.unwrap_or_default(),
        failed_at: r.failed_at.unwrap_or_default(),
        data_engine: r.data_engine.unwrap_or_default(),
        running: r.running,
    }
}

/// Parse a `GET /v1/volumes/{name}` body.
pub fn parse_volume(body: &[u8]) -> Result<Volume, ModelError> {
    let v: serde_json::Value = serde_json::from_slice(body).map_err(|e| ModelError::NotJson {
        what: sniff(body),
        detail: e.to_string(),
    })?;
    if !v.is_object() {
        return Err(ModelError::Field {
            field: "(document)",
            detail: "not a JSON object".into(),
        });
    }
    if v.get("type").and_then(|t| t.as_str()) == Some("collection") {
        return Err(ModelError::Field {
            field: "type",
            detail: "a collection, not one volume: the URL names a list endpoint".into(),
        });
    }
    let raw: RawVolume = serde_json::from_value(v).map_err(|e| ModelError::Field {
        field: "(volume)",
        detail: e.to_string(),
    })?;
    let mut shape = "v1.6-v1.10 (fromReplica)";
    let rebuild = raw
        .rebuild
        .unwrap_or_default()
        .into_iter()
        .map(|r| {
            let (from, from_field) = match (r.from_replica_list, r.from_replica) {
                (Some(l), _) => {
                    shape = "v1.11+ (fromReplicaList)";
                    (
                        l.into_iter().filter(|s| !s.is_empty()).collect(),
                        Some("fromReplicaList"),
                    )
                }
                (None, Some(s)) if !s.is_empty() => (vec![s], Some("fromReplica")),
                (None, Some(_)) => (Vec::new(), Some("fromReplica")),
                (None, None) => (Vec::new(), None),
            };
            RebuildEntry {
                replica: r.replica.unwrap_or_default(),
                from,
                from_field,
                state: RebuildState::parse(r.state.as_deref().unwrap_or("")),
                progress: r.progress,
                is_rebuilding: r.is_rebuilding,
                error: r.error.unwrap_or_default(),
            }
        })
        .collect();
    Ok(Volume {
        name: raw.name.unwrap_or_default(),
        state: raw.state.unwrap_or_default(),
        robustness: raw.robustness.unwrap_or_default(),
        data_engine: raw.data_engine.unwrap_or_default(),
        replicas: raw
            .replicas
            .unwrap_or_default()
            .into_iter()
            .map(instance)
            .collect(),
        controllers: raw
            .controllers
            .unwrap_or_default()
            .into_iter()
            .map(instance)
            .collect(),
        rebuild,
        shape,
    })
}

/// Parse a `GET /v1/volumes` body: a go-rancher collection
/// `{"type":"collection","data":[…]}` (no pagination on the manager), each
/// volume with its own bytes (re-encoded from the list, so one volume's
/// reading can be sealed on its own).
pub fn parse_volume_list(body: &[u8]) -> Result<Vec<(Volume, Vec<u8>)>, ModelError> {
    let v: serde_json::Value = serde_json::from_slice(body).map_err(|e| ModelError::NotJson {
        what: sniff(body),
        detail: e.to_string(),
    })?;
    if v.get("type").and_then(|t| t.as_str()) != Some("collection") {
        return Err(ModelError::Field {
            field: "type",
            detail: "not a collection: the URL does not name the volume list".into(),
        });
    }
    let data = v
        .get("data")
        .and_then(|d| d.as_array())
        .ok_or(ModelError::Field {
            field: "data",
            detail: "a collection without a data array".into(),
        })?;
    data.iter()
        .map(|item| {
            let bytes = serde_json::to_vec(item).map_err(|e| ModelError::Field {
                field: "data",
                detail: e.to_string(),
            })?;
            Ok((parse_volume(&bytes)?, bytes))
        })
        .collect()
}

/// A replica's (or engine's) port block `portStart..=portEnd`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct PortBlock {
    /// `portStart` (P).
    pub start: u16,
    /// `portEnd` (P+9 for a v1 replica).
    pub end: u16,
}

impl PortBlock {
    /// Whether `p` is in the block.
    pub fn contains(&self, p: u16) -> bool {
        (self.start..=self.end).contains(&p)
    }
}

/// Port blocks from `GET /v1/instancemanagers/{name}`, by instance name:
/// `instanceReplicas`, then `instanceEngines`, then the deprecated `instances`.
pub fn parse_instance_manager(body: &[u8]) -> Result<BTreeMap<String, PortBlock>, ModelError> {
    let v: serde_json::Value = serde_json::from_slice(body).map_err(|e| ModelError::NotJson {
        what: sniff(body),
        detail: e.to_string(),
    })?;
    let mut out = BTreeMap::new();
    for field in ["instances", "instanceEngines", "instanceReplicas"] {
        let Some(map) = v.get(field) else { continue };
        if map.is_null() {
            continue;
        }
        let map = map.as_object().ok_or(ModelError::Field {
            field: "instanceReplicas",
            detail: format!("{field} is not an object"),
        })?;
        for (name, p) in map {
            let port = |k: &str| {
                p.pointer(&format!("/status/{k}"))
                    .and_then(|x| x.as_u64())
                    .and_then(|x| u16::try_from(x).ok())
            };
            if let (Some(start), Some(end)) = (port("portStart"), port("portEnd"))
                && start > 0
                && end >= start
            {
                out.insert(name.clone(), PortBlock { start, end });
            }
        }
    }
    Ok(out)
}

/// An address pair or endpoint named by an error text.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ErrorAddrs {
    /// `read tcp A:p->B:q` / `write tcp …` / `dial tcp …`: (local, remote) of
    /// the process that hit the error.
    pub pairs: Vec<(SocketAddr, SocketAddr)>,
    /// `to HOST:PORT` / `of tcp://HOST:PORT` / `dial tcp HOST:PORT`: endpoints named.
    pub endpoints: Vec<SocketAddr>,
    /// The errno text after the pair (`connection reset by peer`, …), if any.
    pub cause: Option<String>,
}

fn sockaddr_at(s: &str) -> Option<(SocketAddr, usize)> {
    // Longest prefix of address characters that parses as ip:port.
    let n = s
        .bytes()
        .take_while(|b| b.is_ascii_hexdigit() || b".:[]".contains(b))
        .count();
    let cand = s[..n].trim_end_matches([':', '.']);
    cand.parse::<SocketAddr>().ok().map(|a| (a, cand.len()))
}

/// The connections an error text names: the Go `net.OpError` form
/// `read tcp 10.42.8.200:43126->10.42.9.96:10122: read: connection reset by
/// peer` (#11006), `to 10.42.8.200:10124`, `tcp://10.42.1.12:10000`.
pub fn parse_error_addrs(text: &str) -> ErrorAddrs {
    let mut out = ErrorAddrs {
        pairs: Vec::new(),
        endpoints: Vec::new(),
        cause: None,
    };
    let mut i = 0;
    while i < text.len() {
        let rest = &text[i..];
        if let Some((a, n)) = sockaddr_at(rest)
            && (i == 0 || !text.as_bytes()[i - 1].is_ascii_alphanumeric())
        {
            let after = &rest[n..];
            if let Some(b_str) = after.strip_prefix("->")
                && let Some((b, m)) = sockaddr_at(b_str)
            {
                if !out.pairs.contains(&(a, b)) {
                    out.pairs.push((a, b));
                }
                let tail = &b_str[m..];
                // `: read: connection reset by peer` → the last `: ` segment.
                if out.cause.is_none()
                    && let Some(c) = tail
                        .split(['\n', '"'])
                        .next()
                        .and_then(|l| l.rsplit(": ").next())
                    && !c.trim().is_empty()
                {
                    out.cause = Some(c.trim().to_string());
                }
                i += n + 2 + m;
                continue;
            }
            if !out.endpoints.contains(&a) && !out.pairs.iter().any(|(x, y)| *x == a || *y == a) {
                out.endpoints.push(a);
            }
            i += n.max(1);
            continue;
        }
        i += rest.chars().next().map(char::len_utf8).unwrap_or(1);
    }
    out
}

/// `tcp://10.42.1.12:10000` or `10.42.1.12:10000` → the IP.
pub fn address_ip(s: &str) -> Option<IpAddr> {
    let s = s.strip_prefix("tcp://").unwrap_or(s);
    s.parse::<SocketAddr>()
        .map(|a| a.ip())
        .ok()
        .or_else(|| s.parse::<IpAddr>().ok())
}

/// The Longhorn settings that bound a rebuild's failure, recorded as facts
/// (longhorn-manager `types/setting.go`): `engine-replica-timeout` (8 s: the
/// engine marks a replica ERR), `replica-file-sync-http-client-timeout`
/// (30 s), `long-grpc-timeout` (86400 s: `FilesSync`),
/// `replica-rebuild-concurrent-sync-limit` (1–5 sources, v1.11+) and
/// `storage-network` ("" = the pod network).
pub const BOUNDING_SETTINGS: [&str; 5] = [
    "engine-replica-timeout",
    "replica-file-sync-http-client-timeout",
    "long-grpc-timeout",
    "replica-rebuild-concurrent-sync-limit",
    "storage-network",
];

#[derive(Deserialize)]
struct RawSetting {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    value: Option<String>,
}

#[derive(Deserialize)]
struct RawSettings {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    data: Option<Vec<RawSetting>>,
}

/// `GET /v1/settings` (a go-rancher collection of `api/model.go` `Setting
/// {name, value, applied, definition}`, v1.9.0 l.199-205): name → value.
pub fn parse_settings(body: &[u8]) -> Result<BTreeMap<String, String>, ModelError> {
    let raw: RawSettings = serde_json::from_slice(body).map_err(|e| ModelError::NotJson {
        what: sniff(body),
        detail: e.to_string(),
    })?;
    match (raw.kind.as_deref(), raw.data) {
        (Some("collection"), Some(data)) => Ok(data
            .into_iter()
            .filter_map(|s| Some((s.name?, s.value.unwrap_or_default())))
            .collect()),
        _ => Err(ModelError::Field {
            field: "type",
            detail: "not a collection of settings".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_texts_yield_their_address_pairs() {
        // longhorn#11006, the target IM's log, verbatim: engine v1.9.0
        // `pkg/sync/rpc/server.go` l.539 ("replica %v failed to send file %v
        // to %v:%v") around `pkg/replica/client/client.go` l.465 ("failed to
        // send file %v to %v:%v") around the gRPC error.
        let e = parse_error_addrs(
            "replica tcp://10.42.9.96:10120 failed to send file volume-snap-9e536535-4400-4596-9533-4156d0051934.img to 10.42.8.200:10124: failed to send file volume-snap-9e536535-4400-4596-9533-4156d0051934.img to 10.42.8.200:10124: rpc error: code = Unavailable desc = error reading from server: read tcp 10.42.8.200:43126->10.42.9.96:10122: read: connection reset by peer",
        );
        assert_eq!(
            e.pairs,
            vec![(
                "10.42.8.200:43126".parse().unwrap(),
                "10.42.9.96:10122".parse().unwrap()
            )]
        );
        assert!(e.endpoints.contains(&"10.42.8.200:10124".parse().unwrap()));
        assert_eq!(e.cause.as_deref(), Some("connection reset by peer"));
        let e = parse_error_addrs(
            "failed to get replica rebuild status of tcp://10.42.1.12:10000: rpc error: code = Unavailable desc = connection error",
        );
        assert!(e.pairs.is_empty());
        assert_eq!(e.endpoints, vec!["10.42.1.12:10000".parse().unwrap()]);
        let e = parse_error_addrs("write tcp [fd00::1]:5->[fd00::2]:10002: broken pipe");
        assert_eq!(e.pairs.len(), 1);
        assert_eq!(e.cause.as_deref(), Some("broken pipe"));
        for none in [
            "",
            "no addresses here",
            "version 1.9.0: 2024",
            "x10.0.0.1:5",
        ] {
            let e = parse_error_addrs(none);
            assert!(
                e.pairs.is_empty() && e.endpoints.is_empty(),
                "{none}: {e:?}"
            );
        }
    }

    #[test]
    fn the_volume_list_is_a_collection_of_volumes() {
        let one = include_str!("fixtures/v1.9-in-progress.json");
        let list = format!(
            r#"{{"type":"collection","resourceType":"volume","links":{{}},"data":[{one}]}}"#
        );
        let vs = parse_volume_list(list.as_bytes()).unwrap();
        assert_eq!(vs.len(), 1);
        assert_eq!(vs[0].0.name, "pvc-7");
        assert_eq!(parse_volume(&vs[0].1).unwrap(), vs[0].0);
        assert!(
            parse_volume_list(one.as_bytes()).is_err(),
            "one volume is not the list"
        );
        let e = parse_volume_list(b"<html><body>UI</body></html>").unwrap_err();
        assert!(e.to_string().contains("HTML"), "{e}");
    }

    #[test]
    fn settings_are_a_collection_of_name_and_value() {
        let body = br#"{"type":"collection","resourceType":"setting","data":[{"type":"setting","name":"engine-replica-timeout","value":"8","applied":true,"definition":{}},{"type":"setting","name":"storage-network","value":"","applied":true}]}"#;
        let s = parse_settings(body).unwrap();
        assert_eq!(s["engine-replica-timeout"], "8");
        assert_eq!(s["storage-network"], "");
        assert!(parse_settings(b"<html></html>").is_err());
        assert!(parse_settings(br#"{"type":"setting","name":"x","value":"1"}"#).is_err());
    }

    #[test]
    fn html_and_collections_are_not_volumes() {
        let e = parse_volume(b"<!DOCTYPE html><html><body>Longhorn</body></html>").unwrap_err();
        assert!(e.to_string().contains("HTML page"), "{e}");
        let e = parse_volume(br#"{"type":"collection","data":[]}"#).unwrap_err();
        assert!(matches!(e, ModelError::Field { field: "type", .. }));
        let e = parse_volume(br#"{"rebuildStatus":{"tcp://1.2.3.4:5":{}}}"#).unwrap_err();
        assert!(
            matches!(e, ModelError::Field { .. }),
            "the CR map is not the REST array"
        );
    }
}
