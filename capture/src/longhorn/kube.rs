//! Kubernetes Events of a rebuild, read through the API server when this
//! process has a service account: `GET
//! /api/v1/namespaces/longhorn-system/events?fieldSelector=involvedObject.name=<name>`.
//! Longhorn records `FailedRebuilding` on a failed rebuild (manager
//! `controller/engine_controller.go` v1.9.0, `startRebuilding`), and the
//! rebuild's `rebuildStatus` entry is gone by then, so the Event is often
//! the only place its error text survives.
//!
//! Shapes: `EventList{metadata, items []Event}` and `Event{metadata,
//! involvedObject ObjectReference{kind, namespace, name, uid, …}, reason,
//! message, source EventSource{component, host}, firstTimestamp,
//! lastTimestamp, count, type, eventTime, reportingComponent, …}` (k8s.io/api
//! `core/v1/types.go`, `type Event struct` / `type EventList struct`).
//!
//! The rule's Engine Events come from a watch ([`run_engine_event_watch`]):
//! `GET …/events?fieldSelector=involvedObject.kind%3DEngine&watch=1&resourceVersion=…`
//! after a list for the starting resourceVersion, re-opened from the last
//! resourceVersion after each bounded session, listed again on 410.
//!
//! Invariants:
//! - **Through the one HTTP client** ([`client::fetch`]) with
//!   [`EVENTS_DEADLINE`]; a refusal, a timeout, a 401/403 (a bad or expired
//!   token, a missing RBAC rule) or a body that is not an `EventList` is a
//!   typed surface status, never "no events".
//! - **A watch is bounded**: [`WATCH_SESSION`] per request, [`MAX_WATCH_LINE`]
//!   per line, [`MAX_WATCH_ITEMS`] per session; a failure is reported and
//!   retried with a capped backoff, never a silent stop.
//! - **The token is a secret**: read from its file at each call, sent in one
//!   header marked sensitive, never logged, never in an envelope or error.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use pstack_envelope::SurfaceStatus;
use serde::{Deserialize, Serialize};

use super::client::{self, ApiFailure, Auth};

/// Namespace Longhorn runs in.
pub const NAMESPACE: &str = "longhorn-system";
/// Where a pod's service account is mounted.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// Connect and whole-request deadline of one Events read.
pub const EVENTS_DEADLINE: Duration = Duration::from_secs(5);

/// How to reach the Kubernetes API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeApi {
    /// `https://host:port` (`http://` only for a loopback test server).
    pub base: String,
    /// The bearer token's file (read at each call).
    pub token_file: PathBuf,
    /// CA bundle of the API server (None: the system roots).
    pub ca_file: Option<PathBuf>,
}

impl KubeApi {
    /// The in-cluster API: `KUBERNETES_SERVICE_HOST`/`_PORT` and the
    /// mounted service account's `token` and `ca.crt`; None outside a pod
    /// (no host in the environment, or no token file).
    pub fn in_cluster() -> Option<KubeApi> {
        let host = std::env::var("KUBERNETES_SERVICE_HOST").ok()?;
        let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".into());
        let dir = PathBuf::from(SERVICE_ACCOUNT_DIR);
        let token_file = dir.join("token");
        if host.is_empty() || !token_file.exists() {
            return None;
        }
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host
        };
        Some(KubeApi {
            base: format!("https://{host}:{port}"),
            token_file,
            ca_file: Some(dir.join("ca.crt")),
        })
    }
}

/// One Event, the fields a rebuild's evidence needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Event {
    /// `involvedObject.kind`.
    pub kind: String,
    /// `involvedObject.name`.
    pub name: String,
    /// `reason` (`FailedRebuilding`, …).
    pub reason: String,
    /// `type` (`Normal`/`Warning`).
    #[serde(rename = "type")]
    pub event_type: String,
    /// `message`.
    pub message: String,
    /// `count`.
    pub count: i64,
    /// `lastTimestamp`, else `eventTime`, else `firstTimestamp`.
    pub last: String,
    /// `source.component`, else `reportingComponent`.
    pub component: String,
    /// `metadata.resourceVersion` ("" when absent).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub resource_version: String,
}

#[derive(Deserialize)]
struct RawRef {
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    name: Option<String>,
}

#[derive(Deserialize)]
struct RawSource {
    #[serde(default)]
    component: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct RawMeta {
    #[serde(default)]
    resource_version: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawEvent {
    #[serde(default)]
    metadata: Option<RawMeta>,
    #[serde(default)]
    involved_object: Option<RawRef>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default, rename = "type")]
    event_type: Option<String>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    count: Option<i64>,
    #[serde(default)]
    first_timestamp: Option<String>,
    #[serde(default)]
    last_timestamp: Option<String>,
    #[serde(default)]
    event_time: Option<String>,
    #[serde(default)]
    source: Option<RawSource>,
    #[serde(default)]
    reporting_component: Option<String>,
}

#[derive(Deserialize)]
struct RawList {
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    metadata: Option<RawMeta>,
    items: Option<Vec<RawEvent>>,
}

/// Why a body is not an `EventList`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventsError {
    /// Not JSON.
    #[error("not a JSON document: {0}")]
    NotJson(String),
    /// JSON of another kind (a `Status`, …).
    #[error("not an EventList (kind {0:?})")]
    NotEventList(String),
}

/// Parse a `GET …/events` body.
pub fn parse_event_list(body: &[u8]) -> Result<Vec<Event>, EventsError> {
    parse_event_list_rv(body).map(|(e, _)| e)
}

/// Parse a `GET …/events` body: the Events and the list's
/// `metadata.resourceVersion` (where a watch starts).
pub fn parse_event_list_rv(body: &[u8]) -> Result<(Vec<Event>, String), EventsError> {
    let raw: RawList =
        serde_json::from_slice(body).map_err(|e| EventsError::NotJson(e.to_string()))?;
    let kind = raw.kind.unwrap_or_default();
    let items = match raw.items {
        Some(i) if kind.is_empty() || kind == "EventList" => i,
        _ => return Err(EventsError::NotEventList(kind)),
    };
    let rv = raw
        .metadata
        .and_then(|m| m.resource_version)
        .unwrap_or_default();
    Ok((items.into_iter().map(event_of).collect(), rv))
}

fn event_of(e: RawEvent) -> Event {
    let nonempty = |s: Option<String>| s.filter(|x| !x.is_empty());
    let (kind, name) = e
        .involved_object
        .map(|r| (r.kind.unwrap_or_default(), r.name.unwrap_or_default()))
        .unwrap_or_default();
    Event {
        kind,
        name,
        reason: e.reason.unwrap_or_default(),
        event_type: e.event_type.unwrap_or_default(),
        message: e.message.unwrap_or_default(),
        count: e.count.unwrap_or(1).max(1),
        last: nonempty(e.last_timestamp)
            .or(nonempty(e.event_time))
            .or(nonempty(e.first_timestamp))
            .unwrap_or_default(),
        component: nonempty(e.source.and_then(|s| s.component))
            .or(nonempty(e.reporting_component))
            .unwrap_or_default(),
        resource_version: e
            .metadata
            .and_then(|m| m.resource_version)
            .unwrap_or_default(),
    }
}

/// One Events read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventsRead {
    /// The object whose Events were asked for.
    pub object: String,
    /// The URL (no secret in it).
    pub url: String,
    /// RFC 3339 wall time when it was sent.
    pub at: String,
    /// The Events, or why not.
    pub result: Result<(Vec<Event>, Vec<u8>), ApiFailure>,
    /// µs.
    pub elapsed_us: u64,
}

/// The exact `kubectl` command that reads what [`fetch_events`] reads.
pub fn kubectl_events(object: &str) -> String {
    format!("kubectl get events -n {NAMESPACE} --field-selector involvedObject.name={object}")
}

/// `GET {base}/api/v1/namespaces/longhorn-system/events?fieldSelector=involvedObject.name={object}`.
pub fn fetch_events(api: &KubeApi, object: &str) -> EventsRead {
    let t = Instant::now();
    let at = crate::clock::wall_time_now();
    let url = format!(
        "{}/api/v1/namespaces/{NAMESPACE}/events?fieldSelector=involvedObject.name%3D{object}",
        api.base.trim_end_matches('/')
    );
    let result = (|| {
        let fail = |status, message: String| ApiFailure {
            status,
            errno: None,
            message,
        };
        let token = std::fs::read_to_string(&api.token_file).map_err(|e| {
            let status = if e.kind() == std::io::ErrorKind::PermissionDenied {
                SurfaceStatus::PermissionDenied
            } else {
                SurfaceStatus::Error
            };
            ApiFailure {
                status,
                errno: e.raw_os_error(),
                message: format!(
                    "reading the service-account token {}: {e}",
                    api.token_file.display()
                ),
            }
        })?;
        let ca_pem = match &api.ca_file {
            Some(p) if api.base.starts_with("https://") => Some(std::fs::read(p).map_err(|e| {
                fail(
                    SurfaceStatus::Error,
                    format!("reading the API server's CA {}: {e}", p.display()),
                )
            })?),
            _ => None,
        };
        let auth = Auth {
            bearer: Some(token.trim().to_string()),
            ca_pem,
        };
        let body = client::fetch(
            &url,
            EVENTS_DEADLINE,
            &auth,
            &format!("no namespace {NAMESPACE}"),
        )
        .map_err(|mut f| {
            if f.status == SurfaceStatus::PermissionDenied {
                f.message = format!(
                    "{}: the API server refused the service account's token (expired, wrong audience) or RBAC does not allow listing events in {NAMESPACE}",
                    f.message
                );
            }
            f
        })?;
        let events = parse_event_list(&body).map_err(|e| {
            fail(
                SurfaceStatus::Error,
                format!("the API server's answer: {e}"),
            )
        })?;
        Ok((events, body))
    })();
    EventsRead {
        object: object.to_string(),
        url,
        at,
        result,
        elapsed_us: t.elapsed().as_micros() as u64,
    }
}

/// How long one watch request lasts (`timeoutSeconds`); the watch is then
/// re-opened from the last `resourceVersion`, so a rule reloaded away or a
/// pstackd draining is noticed within it at worst.
pub const WATCH_SESSION: Duration = Duration::from_secs(30);
/// Longest watch line (one `WatchEvent`) accepted; a longer one ends the
/// session with a typed failure.
pub const MAX_WATCH_LINE: usize = 256 << 10;
/// Most Events handed on per watch session; past it the session ends and
/// re-opens from the last `resourceVersion` (a flood never starves the rest).
pub const MAX_WATCH_ITEMS: usize = 2_000;
/// Most Engine Events one list (the watch's starting point) returns.
pub const LIST_LIMIT: usize = 500;

/// One line of a watch stream (`k8s.io/apimachinery` `metav1.WatchEvent`:
/// `{"type": ADDED|MODIFIED|DELETED|BOOKMARK|ERROR, "object": …}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchItem {
    /// `ADDED` or `MODIFIED` (Kubernetes aggregates a repeated Event by
    /// bumping `count`).
    Event(Event),
    /// `DELETED` (an Event expired) or `BOOKMARK`: only its resourceVersion.
    Progress(String),
    /// `ERROR` with a `Status`; `code` 410 means the resourceVersion is too
    /// old and the watch must list again.
    Error {
        /// `code`.
        code: i64,
        /// `message`.
        message: String,
    },
}

#[derive(Deserialize)]
struct RawWatch {
    #[serde(rename = "type")]
    kind: String,
    object: serde_json::Value,
}

/// Parse one watch line.
pub fn parse_watch_line(line: &[u8]) -> Result<WatchItem, EventsError> {
    let raw: RawWatch =
        serde_json::from_slice(line).map_err(|e| EventsError::NotJson(e.to_string()))?;
    match raw.kind.as_str() {
        "ADDED" | "MODIFIED" => {
            let e: RawEvent = serde_json::from_value(raw.object)
                .map_err(|e| EventsError::NotJson(e.to_string()))?;
            Ok(WatchItem::Event(event_of(e)))
        }
        "DELETED" | "BOOKMARK" => Ok(WatchItem::Progress(
            raw.object
                .pointer("/metadata/resourceVersion")
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_string(),
        )),
        "ERROR" => Ok(WatchItem::Error {
            code: raw
                .object
                .get("code")
                .and_then(serde_json::Value::as_i64)
                .unwrap_or(0),
            message: raw
                .object
                .get("message")
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_string(),
        }),
        other => Err(EventsError::NotEventList(format!("watch type {other}"))),
    }
}

fn auth_for(api: &KubeApi) -> Result<Auth, ApiFailure> {
    let token = std::fs::read_to_string(&api.token_file).map_err(|e| ApiFailure {
        status: if e.kind() == std::io::ErrorKind::PermissionDenied {
            SurfaceStatus::PermissionDenied
        } else {
            SurfaceStatus::Error
        },
        errno: e.raw_os_error(),
        message: format!(
            "reading the service-account token {}: {e}",
            api.token_file.display()
        ),
    })?;
    let ca_pem = match &api.ca_file {
        Some(p) if api.base.starts_with("https://") => {
            Some(std::fs::read(p).map_err(|e| ApiFailure {
                status: SurfaceStatus::Error,
                errno: e.raw_os_error(),
                message: format!("reading the API server's CA {}: {e}", p.display()),
            })?)
        }
        _ => None,
    };
    Ok(Auth {
        bearer: Some(token.trim().to_string()),
        ca_pem,
    })
}

/// The Engine Events URL: a list (`rv` None) or a watch from `rv`.
pub fn engine_events_url(api: &KubeApi, rv: Option<&str>) -> String {
    let base = format!(
        "{}/api/v1/namespaces/{NAMESPACE}/events?fieldSelector=involvedObject.kind%3DEngine",
        api.base.trim_end_matches('/')
    );
    match rv {
        None => format!("{base}&limit={LIST_LIMIT}"),
        Some(rv) => format!(
            "{base}&watch=1&allowWatchBookmarks=true&timeoutSeconds={}&resourceVersion={}",
            WATCH_SESSION.as_secs(),
            rv.bytes()
                .filter(u8::is_ascii_alphanumeric)
                .map(char::from)
                .collect::<String>()
        ),
    }
}

/// List the Engine Events: the Events and the `resourceVersion` a watch
/// starts from.
pub fn list_engine_events(api: &KubeApi) -> Result<(Vec<Event>, String), ApiFailure> {
    let auth = auth_for(api)?;
    let url = engine_events_url(api, None);
    let body = client::fetch(
        &url,
        EVENTS_DEADLINE,
        &auth,
        &format!("no namespace {NAMESPACE}"),
    )?;
    parse_event_list_rv(&body).map_err(|e| ApiFailure {
        status: SurfaceStatus::Error,
        errno: None,
        message: format!("the API server's answer: {e}"),
    })
}

/// How a watch session ended (without a transport failure).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEnd {
    /// The server closed it (its `timeoutSeconds`): re-open from `rv`.
    Closed,
    /// [`MAX_WATCH_ITEMS`] were handed on: re-open from `rv`.
    ItemBound,
    /// 410: the resourceVersion expired; list again.
    Expired,
    /// `stop` was set.
    Stopped,
}

/// One watch session from `rv` (blocking; its own runtime): each Event to
/// `on_event`, `rv` advanced as lines arrive. Bounded by
/// [`WATCH_SESSION`] (plus the connect deadline), [`MAX_WATCH_LINE`] and
/// [`MAX_WATCH_ITEMS`]; `stop` is checked at least every 200 ms.
pub fn watch_engine_events(
    api: &KubeApi,
    rv: &mut String,
    stop: &std::sync::atomic::AtomicBool,
    on_event: &mut dyn FnMut(Event),
) -> Result<SessionEnd, ApiFailure> {
    use std::sync::atomic::Ordering;
    let fail = |status, message: String| ApiFailure {
        status,
        errno: None,
        message,
    };
    let auth = auth_for(api)?;
    let url = engine_events_url(api, Some(rv));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| fail(SurfaceStatus::Error, format!("runtime: {e}")))?;
    rt.block_on(async {
        let mut builder = reqwest::Client::builder()
            .connect_timeout(EVENTS_DEADLINE)
            .timeout(WATCH_SESSION + EVENTS_DEADLINE * 2)
            .no_proxy();
        if let Some(pem) = &auth.ca_pem {
            let ca = reqwest::Certificate::from_pem(pem).map_err(|e| {
                fail(
                    SurfaceStatus::Error,
                    format!("the CA certificate is not PEM: {e}"),
                )
            })?;
            builder = builder
                .tls_built_in_root_certs(false)
                .add_root_certificate(ca);
        }
        let http = builder
            .build()
            .map_err(|e| fail(SurfaceStatus::Error, e.to_string()))?;
        let mut req = http
            .get(&url)
            .header(reqwest::header::ACCEPT, "application/json");
        if let Some(token) = &auth.bearer {
            let mut v = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| {
                    fail(
                        SurfaceStatus::Error,
                        "the token has characters a header cannot carry".into(),
                    )
                })?;
            v.set_sensitive(true);
            req = req.header(reqwest::header::AUTHORIZATION, v);
        }
        let mut resp = req
            .send()
            .await
            .map_err(|e| client::http_failure(&e, &url))?;
        match resp.status().as_u16() {
            200 => {}
            410 => return Ok(SessionEnd::Expired),
            c @ (401 | 403) => {
                return Err(fail(
                    SurfaceStatus::PermissionDenied,
                    format!("HTTP {c}: the API server refused the service account's token or RBAC does not allow watching events in {NAMESPACE}"),
                ));
            }
            c => return Err(fail(SurfaceStatus::Error, format!("HTTP {c}"))),
        }
        let mut line = Vec::new();
        let mut items = 0usize;
        loop {
            if stop.load(Ordering::SeqCst) {
                return Ok(SessionEnd::Stopped);
            }
            let chunk = match tokio::time::timeout(
                Duration::from_millis(200),
                resp.chunk(),
            )
            .await
            {
                Err(_) => continue,
                Ok(c) => c.map_err(|e| client::http_failure(&e, &url))?,
            };
            let Some(chunk) = chunk else {
                return Ok(SessionEnd::Closed);
            };
            for b in chunk {
                if b != b'\n' {
                    line.push(b);
                    if line.len() > MAX_WATCH_LINE {
                        return Err(fail(
                            SurfaceStatus::Truncated,
                            format!("a watch line exceeds {MAX_WATCH_LINE} bytes"),
                        ));
                    }
                    continue;
                }
                let l = std::mem::take(&mut line);
                if l.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                match parse_watch_line(&l).map_err(|e| {
                    fail(SurfaceStatus::Error, format!("the API server's watch line: {e}"))
                })? {
                    WatchItem::Event(e) => {
                        if !e.resource_version.is_empty() {
                            rv.clone_from(&e.resource_version);
                        }
                        on_event(e);
                        items += 1;
                        if items >= MAX_WATCH_ITEMS {
                            return Ok(SessionEnd::ItemBound);
                        }
                    }
                    WatchItem::Progress(v) => {
                        if !v.is_empty() {
                            *rv = v;
                        }
                    }
                    WatchItem::Error { code: 410, .. } => return Ok(SessionEnd::Expired),
                    WatchItem::Error { code, message } => {
                        return Err(fail(
                            SurfaceStatus::Error,
                            format!("the watch ended with a Status {code}: {message:?}"),
                        ));
                    }
                }
            }
        }
    })
}

/// What the long-running Engine Events watch reports to its owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchReport {
    /// Listing or watching works (again); `rv` is where it watches from.
    Healthy {
        /// The resourceVersion.
        rv: String,
    },
    /// An Event arrived.
    Event(Event),
    /// A list or a session failed; the watch retries after a backoff.
    Failed(ApiFailure),
}

/// Watch the Engine Events until `stop` (blocking): list for the starting
/// resourceVersion (the listed Events are history and are not reported),
/// then watch sessions back to back from the last resourceVersion; a 410
/// lists again; a failure is reported and retried after a backoff doubling
/// from 250 ms to 10 s.
pub fn run_engine_event_watch(
    api: &KubeApi,
    stop: &std::sync::atomic::AtomicBool,
    report: &mut dyn FnMut(WatchReport),
) {
    use std::sync::atomic::Ordering;
    let mut rv: Option<String> = None;
    let mut backoff = Duration::from_millis(250);
    let mut healthy = false;
    while !stop.load(Ordering::SeqCst) {
        let result = match rv.as_mut() {
            None => list_engine_events(api).map(|(_, v)| {
                rv = Some(v);
                SessionEnd::Closed
            }),
            Some(v) => {
                // Recovered as soon as an Event arrives, not at the session's end.
                let mut on = |e: Event| {
                    if !healthy {
                        healthy = true;
                        report(WatchReport::Healthy {
                            rv: e.resource_version.clone(),
                        });
                    }
                    report(WatchReport::Event(e))
                };
                watch_engine_events(api, v, stop, &mut on)
            }
        };
        match result {
            Ok(end) => {
                backoff = Duration::from_millis(250);
                if end == SessionEnd::Expired {
                    rv = None;
                }
                if !healthy && let Some(v) = &rv {
                    healthy = true;
                    report(WatchReport::Healthy { rv: v.clone() });
                }
            }
            Err(f) => {
                healthy = false;
                report(WatchReport::Failed(f));
                let until = Instant::now() + backoff;
                while Instant::now() < until && !stop.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(50));
                }
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
        }
    }
}

/// A Replica CR's `RebuildFailed` condition (longhorn-manager
/// `k8s/pkg/apis/longhorn/v1beta2/replica.go` v1.9.0 l.13-19: reasons
/// `Disconnection`, `General`, or a node reason such as
/// `KubernetesNodeNotReady`, set by `updateReplicaRebuildFailedCondition`,
/// `controller/engine_controller.go` l.1992-2041, outside backoff only).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RebuildFailedCondition {
    /// `status` (`True`/`False`).
    pub status: String,
    /// `reason`: Longhorn's own network-or-not verdict.
    pub reason: String,
    /// `message`: the rebuild's error text.
    pub message: String,
}

/// Parse a `GET …/replicas/{name}` body: its `RebuildFailed` condition, if any.
pub fn parse_replica_rebuild_failed(
    body: &[u8],
) -> Result<Option<RebuildFailedCondition>, EventsError> {
    let v: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| EventsError::NotJson(e.to_string()))?;
    let kind = v.get("kind").and_then(|k| k.as_str()).unwrap_or_default();
    if kind != "Replica" {
        return Err(EventsError::NotEventList(format!("{kind} (want Replica)")));
    }
    let s = |c: &serde_json::Value, k: &str| {
        c.get(k)
            .and_then(|x| x.as_str())
            .unwrap_or_default()
            .to_string()
    };
    Ok(v.pointer("/status/conditions")
        .and_then(|c| c.as_array())
        .and_then(|cs| cs.iter().find(|c| s(c, "type") == "RebuildFailed"))
        .map(|c| RebuildFailedCondition {
            status: s(c, "status"),
            reason: s(c, "reason"),
            message: s(c, "message"),
        }))
}

/// `GET {base}/apis/longhorn.io/v1beta2/namespaces/longhorn-system/replicas/{name}`:
/// the Replica CR's `RebuildFailed` condition.
pub fn fetch_replica_rebuild_failed(
    api: &KubeApi,
    replica: &str,
) -> Result<Option<RebuildFailedCondition>, ApiFailure> {
    fetch_replica_cr(api, replica, parse_replica_rebuild_failed)
}

/// `GET` one Replica CR (its name reduced to the characters a Kubernetes
/// name may hold) and read it with `parse`.
fn fetch_replica_cr<T>(
    api: &KubeApi,
    replica: &str,
    parse: impl FnOnce(&[u8]) -> Result<T, EventsError>,
) -> Result<T, ApiFailure> {
    let auth = auth_for(api)?;
    let name: String = replica
        .bytes()
        .filter(|b| b.is_ascii_alphanumeric() || b"-.".contains(b))
        .map(char::from)
        .collect();
    let url = format!(
        "{}/apis/longhorn.io/v1beta2/namespaces/{NAMESPACE}/replicas/{name}",
        api.base.trim_end_matches('/')
    );
    let body = client::fetch(&url, EVENTS_DEADLINE, &auth, &format!("no replica {name}"))?;
    parse(&body).map_err(|e| ApiFailure {
        status: SurfaceStatus::Error,
        errno: None,
        message: format!("the API server's answer: {e}"),
    })
}

/// A Replica CR's data-path address: `status.storageIP` and `status.port`
/// (longhorn-manager `k8s/pkg/apis/longhorn/v1beta2/instancemanager.go`
/// `InstanceStatus`, v1.9.0; the volume controller dials
/// `StorageIP:Port`, `controller/volume_controller.go` l.1930). Under a
/// storage network it is the Multus address, not the pod IP the REST API
/// gives as `replicas[].address`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct StorageAddress {
    /// `status.storageIP`.
    pub ip: std::net::IpAddr,
    /// `status.port` (0 when not set).
    pub port: u16,
}

/// Parse a `GET …/replicas/{name}` body: its storage address, if set and
/// an IP (an empty or unparsable `storageIP` is None, never a guess).
pub fn parse_replica_storage(body: &[u8]) -> Result<Option<StorageAddress>, EventsError> {
    let v: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| EventsError::NotJson(e.to_string()))?;
    let kind = v.get("kind").and_then(|k| k.as_str()).unwrap_or_default();
    if kind != "Replica" {
        return Err(EventsError::NotEventList(format!("{kind} (want Replica)")));
    }
    let ip = v
        .pointer("/status/storageIP")
        .and_then(|x| x.as_str())
        .and_then(|s| s.trim().parse::<std::net::IpAddr>().ok());
    let port = v
        .pointer("/status/port")
        .and_then(|x| x.as_u64())
        .and_then(|p| u16::try_from(p).ok())
        .unwrap_or(0);
    Ok(ip.map(|ip| StorageAddress { ip, port }))
}

/// `GET {base}/apis/longhorn.io/v1beta2/namespaces/longhorn-system/replicas/{name}`:
/// the Replica CR's storage address.
pub fn fetch_replica_storage(
    api: &KubeApi,
    replica: &str,
) -> Result<Option<StorageAddress>, ApiFailure> {
    fetch_replica_cr(api, replica, parse_replica_storage)
}

#[cfg(test)]
mod replica_tests {
    use super::*;

    #[test]
    fn a_replica_cr_gives_its_storage_address_or_none() {
        let body = br#"{"kind":"Replica","status":{"storageIP":"10.79.0.2","port":10000,"ip":"10.78.0.2"}}"#;
        assert_eq!(
            parse_replica_storage(body).unwrap(),
            Some(StorageAddress {
                ip: "10.79.0.2".parse().unwrap(),
                port: 10000
            })
        );
        for none in [
            &br#"{"kind":"Replica","status":{"storageIP":"","port":0}}"#[..],
            br#"{"kind":"Replica","status":{"storageIP":"not-an-ip"}}"#,
            br#"{"kind":"Replica","status":{}}"#,
        ] {
            assert_eq!(parse_replica_storage(none).unwrap(), None);
        }
        // A port beyond u16 is not wrapped.
        let big = br#"{"kind":"Replica","status":{"storageIP":"10.79.0.2","port":70000}}"#;
        assert_eq!(parse_replica_storage(big).unwrap().unwrap().port, 0);
        assert!(parse_replica_storage(br#"{"kind":"Engine"}"#).is_err());
        assert!(parse_replica_storage(b"<html>").is_err());
    }

    #[test]
    fn the_rebuild_failed_condition_is_read_from_the_replica_cr() {
        let body = br#"{"apiVersion":"longhorn.io/v1beta2","kind":"Replica","metadata":{"name":"pvc-7-r-t"},"spec":{"failedAt":"2026-12-07T08:00:00Z"},"status":{"conditions":[{"type":"InstanceCreation","status":"True","reason":"","message":""},{"type":"RebuildFailed","status":"True","reason":"Disconnection","message":"rpc error: code = Unavailable desc = error reading from server"}]}}"#;
        let c = parse_replica_rebuild_failed(body).unwrap().unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", "Disconnection")
        );
        let none = br#"{"kind":"Replica","status":{"conditions":[]}}"#;
        assert_eq!(parse_replica_rebuild_failed(none).unwrap(), None);
        assert!(parse_replica_rebuild_failed(br#"{"kind":"Status","code":404}"#).is_err());
        assert!(parse_replica_rebuild_failed(b"<html>").is_err());
    }
}

#[cfg(test)]
mod reconnect_tests {
    //! The watch against a loopback API server that closes sessions, answers
    //! 410 and sends an over-long line: it re-opens from the last
    //! resourceVersion, lists again on 410, and reports the bound as a failure.
    use super::*;
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    fn event_line(rv: u64, reason: &str) -> String {
        format!(
            r#"{{"type":"ADDED","object":{{"kind":"Event","metadata":{{"resourceVersion":"{rv}"}},"involvedObject":{{"kind":"Engine","name":"pvc-7-e-0"}},"reason":"{reason}","message":"m","type":"Normal"}}}}"#
        )
    }

    #[test]
    fn the_watch_reopens_from_its_resource_version_lists_again_on_410_and_bounds_a_line() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::<String>::new()));
        let seen = requests.clone();
        std::thread::spawn(move || {
            for (i, s) in l.incoming().enumerate() {
                let Ok(mut s) = s else { continue };
                let mut buf = vec![0u8; 4096];
                let n = s.read(&mut buf).unwrap_or(0);
                let head = String::from_utf8_lossy(&buf[..n]).to_string();
                let target = head.split(' ').nth(1).unwrap_or("").to_string();
                seen.lock().unwrap().push(target.clone());
                let stream = |s: &mut std::net::TcpStream, body: &str| {
                    let _ = write!(
                        s,
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n{body}"
                    );
                };
                match i {
                    // list → rv 5
                    0 | 3 => stream(
                        &mut s,
                        r#"{"kind":"EventList","metadata":{"resourceVersion":"5"},"items":[]}"#,
                    ),
                    // session 1: one Event, then the server closes it
                    1 => stream(&mut s, &format!("{}\n", event_line(6, "Rebuilding"))),
                    // session 2 (from 6): the resourceVersion is gone
                    2 => stream(
                        &mut s,
                        "{\"type\":\"ERROR\",\"object\":{\"kind\":\"Status\",\"code\":410,\"message\":\"too old resource version\"}}\n",
                    ),
                    // session 3 (from 5, after the new list): a line past the bound
                    4 => stream(&mut s, &"x".repeat(MAX_WATCH_LINE + 10)),
                    _ => stream(&mut s, &format!("{}\n", event_line(9, "Rebuilt"))),
                }
            }
        });
        let dir = tempfile::tempdir().unwrap();
        let token_file = dir.path().join("token");
        std::fs::write(&token_file, "t").unwrap();
        let api = KubeApi {
            base: format!("http://{addr}"),
            token_file,
            ca_file: None,
        };
        let stop = AtomicBool::new(false);
        let mut reports = Vec::new();
        run_engine_event_watch(&api, &stop, &mut |r| {
            let last = matches!(&r, WatchReport::Event(e) if e.reason == "Rebuilt");
            reports.push(r);
            if last {
                stop.store(true, Ordering::SeqCst);
            }
        });
        let reqs = requests.lock().unwrap().clone();
        assert!(reqs[0].ends_with("&limit=500"), "{reqs:?}");
        assert!(
            reqs[1].contains("watch=1") && reqs[1].ends_with("resourceVersion=5"),
            "{reqs:?}"
        );
        assert!(
            reqs[2].ends_with("resourceVersion=6"),
            "re-opened from the last: {reqs:?}"
        );
        assert!(reqs[3].ends_with("&limit=500"), "410 lists again: {reqs:?}");
        assert!(reqs[4].ends_with("resourceVersion=5"), "{reqs:?}");
        let kinds: Vec<String> = reports
            .iter()
            .map(|r| match r {
                WatchReport::Healthy { rv } => format!("healthy {rv}"),
                WatchReport::Event(e) => format!("event {} {}", e.reason, e.resource_version),
                WatchReport::Failed(f) => format!("failed {:?}", f.status),
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "healthy 5",
                "event Rebuilding 6",
                "failed Truncated",
                "healthy 9",
                "event Rebuilt 9"
            ],
            "{reqs:?}"
        );
    }
}

#[cfg(test)]
mod watch_tests {
    use super::*;

    #[test]
    fn watch_lines_are_events_progress_or_errors() {
        let added = br#"{"type":"ADDED","object":{"kind":"Event","metadata":{"name":"pvc-7-e-0.1","resourceVersion":"812"},"involvedObject":{"kind":"Engine","name":"pvc-7-e-0"},"reason":"Rebuilding","message":"Start rebuilding replica pvc-7-r-t with Address 10.78.0.3:10500 for normal engine pvc-7-e-0 and volume pvc-7","type":"Normal","count":1,"lastTimestamp":"2026-12-07T08:00:00Z","source":{"component":"longhorn-engine-controller"}}}"#;
        let WatchItem::Event(e) = parse_watch_line(added).unwrap() else {
            panic!()
        };
        assert_eq!(
            (e.reason.as_str(), e.resource_version.as_str()),
            ("Rebuilding", "812")
        );
        assert_eq!(
            parse_watch_line(br#"{"type":"BOOKMARK","object":{"kind":"Event","metadata":{"resourceVersion":"900"}}}"#).unwrap(),
            WatchItem::Progress("900".into())
        );
        assert_eq!(
            parse_watch_line(br#"{"type":"ERROR","object":{"kind":"Status","code":410,"message":"too old resource version: 1 (812)"}}"#).unwrap(),
            WatchItem::Error { code: 410, message: "too old resource version: 1 (812)".into() }
        );
        assert!(parse_watch_line(b"<html>").is_err());
        assert!(parse_watch_line(br#"{"type":"WHAT","object":{}}"#).is_err());
    }

    #[test]
    fn the_watch_url_is_bounded_and_its_resource_version_cannot_inject() {
        let api = KubeApi {
            base: "http://127.0.0.1:6443/".into(),
            token_file: "/nonexistent".into(),
            ca_file: None,
        };
        let u = engine_events_url(&api, Some("81&watch=0"));
        assert!(u.ends_with("&resourceVersion=81watch0"), "{u}");
        assert!(u.contains("timeoutSeconds=30"), "{u}");
        assert!(engine_events_url(&api, None).ends_with("&limit=500"));
    }
}

#[cfg(test)]
mod https_tests {
    //! The in-cluster case for real: the API server is `https://` with a
    //! certificate signed by the cluster's CA (`ca.crt` of the service
    //! account). `openssl s_server -WWW` plays the API server, serving an
    //! `EventList` document at the exact path pstack asks for.

    use super::*;
    use std::path::Path;
    use std::process::{Child, Command, Stdio};

    fn openssl(dir: &Path, args: &[&str]) -> bool {
        Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// `ca.pem` signs `srv.pem` (localhost, 127.0.0.1); `other.pem` is an
    /// unrelated CA.
    fn mint(dir: &Path) -> bool {
        let ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
        let a = |s: &str| s.split(' ').map(str::to_string).collect::<Vec<_>>();
        let run = |s: String| {
            let v = a(&s);
            openssl(dir, &v.iter().map(String::as_str).collect::<Vec<_>>())
        };
        std::fs::write(
            dir.join("san.ext"),
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
        )
        .unwrap();
        run(format!("req -x509 {ec} -keyout ca.key -out ca.pem -days 2 -subj /CN=cluster-ca"))
            && run(format!("req -x509 {ec} -keyout other.key -out other.pem -days 2 -subj /CN=other-ca"))
            && run(format!("req {ec} -keyout srv.key -out srv.csr -subj /CN=localhost"))
            && run("x509 -req -in srv.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out srv.pem -days 2 -extfile san.ext".into())
    }

    struct Server(Child);
    impl Drop for Server {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    fn serve(dir: &Path) -> (Server, u16) {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("openssl")
            .args(["s_server", "-quiet", "-WWW", "-accept"])
            .arg(format!("127.0.0.1:{port}"))
            .args(["-cert", "../srv.pem", "-key", "../srv.key"])
            .current_dir(dir.join("www"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("openssl s_server");
        let server = Server(child);
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "s_server never listened");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        (server, port)
    }

    #[test]
    fn events_over_https_verify_the_cluster_ca_and_refuse_another() {
        pstack_testkit::require!(
            pstack_testkit::have_tool("openssl"),
            "openssl is not installed (scripts/setup.d/50-daemon.sh installs it) to play the API server"
        );
        let dir = tempfile::tempdir().unwrap();
        assert!(mint(dir.path()), "openssl could not mint the certificates");
        let events = dir.path().join("www/api/v1/namespaces/longhorn-system");
        std::fs::create_dir_all(&events).unwrap();
        std::fs::write(
            events.join("events?fieldSelector=involvedObject.name%3Dpvc-7-e-0"),
            r#"{"kind":"EventList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[{"metadata":{"name":"pvc-7-e-0.1","namespace":"longhorn-system"},"involvedObject":{"kind":"Engine","namespace":"longhorn-system","name":"pvc-7-e-0"},"reason":"FailedRebuilding","message":"Failed rebuilding replica with Address 10.78.0.3:10020","type":"Warning","count":1,"lastTimestamp":"2026-12-03T19:40:12Z","source":{"component":"longhorn-engine-controller"}}]}"#,
        )
        .unwrap();
        let token_file = dir.path().join("token");
        std::fs::write(&token_file, "test-token\n").unwrap();
        let (_server, port) = serve(dir.path());
        let api = |ca: &str| KubeApi {
            base: format!("https://localhost:{port}"),
            token_file: token_file.clone(),
            ca_file: Some(dir.path().join(ca)),
        };

        let read = fetch_events(&api("ca.pem"), "pvc-7-e-0");
        let (got, _) = read.result.expect("the cluster CA verifies the server");
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].reason, "FailedRebuilding");
        assert_eq!(got[0].kind, "Engine");

        // Another CA: the handshake is refused, a typed failure, not "no events".
        let read = fetch_events(&api("other.pem"), "pvc-7-e-0");
        let failure = read.result.expect_err("a server the CA did not sign");
        assert_ne!(failure.status, SurfaceStatus::Ok);
        assert!(
            failure.message.to_lowercase().contains("certificate")
                || failure.message.contains("UnknownIssuer"),
            "{}",
            failure.message
        );
    }
}
