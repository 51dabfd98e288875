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
//! Invariants:
//! - **Through the one HTTP client** ([`client::fetch`]) with
//!   [`EVENTS_DEADLINE`]; a refusal, a timeout, a 401/403 (a bad or expired
//!   token, a missing RBAC rule) or a body that is not an `EventList` is a
//!   typed surface status, never "no events".
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

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawEvent {
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
    let raw: RawList =
        serde_json::from_slice(body).map_err(|e| EventsError::NotJson(e.to_string()))?;
    let kind = raw.kind.unwrap_or_default();
    let items = match raw.items {
        Some(i) if kind.is_empty() || kind == "EventList" => i,
        _ => return Err(EventsError::NotEventList(kind)),
    };
    let nonempty = |s: Option<String>| s.filter(|x| !x.is_empty());
    Ok(items
        .into_iter()
        .map(|e| {
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
            }
        })
        .collect())
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
    let at = crate::supervisor::clock::wall_time_now();
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
