//! The manager API client: `GET {base}/v1/volumes/{name}` and `GET
//! {base}/v1/instancemanagers/{name}` (longhorn-manager `api/router.go`
//! v1.9.0 l.68 and l.174, the same in v1.6.0 and v1.11.0).
//!
//! Invariants:
//! - **One HTTP client**: `reqwest`, plain `http://` (the in-cluster
//!   `longhorn-backend:9500` service has no auth), no proxy from the
//!   environment, [`API_DEADLINE`] on connect and on the whole request,
//!   [`MAX_API_BYTES`] cap. A timeout, a refusal, an HTML page or a 404 is a
//!   typed surface status, never a hang and never "no volume" unless the
//!   manager said 404.
//! - **A base URL ending in `/v1` is accepted** and the `/v1` is not doubled;
//!   the normalisation is reported, not hidden.
//! - Every read carries its wall-clock time.

use std::time::{Duration, Instant};

use pstack_envelope::SurfaceStatus;

/// Most bytes read from the manager API.
pub const MAX_API_BYTES: usize = 4 << 20;
/// Connect and whole-request deadline for one manager API read.
pub const API_DEADLINE: Duration = Duration::from_secs(5);

/// A parsed base URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseUrl {
    /// Host (brackets stripped).
    pub host: String,
    /// Port.
    pub port: u16,
    /// Path before `/v1` (no trailing slash).
    pub path: String,
    /// Whether a trailing `/v1` was removed.
    pub stripped_v1: bool,
}

impl BaseUrl {
    /// `http://host:port{path}/v1{rest}`.
    pub fn url(&self, rest: &str) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        format!("http://{host}:{}{}/v1{rest}", self.port, self.path)
    }
}

/// `http://host[:port][/base][/v1]` → a base URL. Anything else is refused.
pub fn parse_base_url(u: &str) -> Result<BaseUrl, String> {
    let rest = u.strip_prefix("http://").ok_or_else(|| {
        format!("{u:?}: only http:// URLs (the in-cluster manager service) are supported")
    })?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/').to_string()),
        None => (rest, String::new()),
    };
    if authority.is_empty() || authority.contains('@') {
        return Err(format!("{u:?}: host required, credentials not allowed"));
    }
    if !path.bytes().all(|b| b.is_ascii_graphic()) || path.contains(['?', '#']) {
        return Err(format!(
            "{u:?}: path has non-printable characters or a query"
        ));
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => match p.parse::<u16>() {
            Ok(p) if p > 0 => (
                h.trim_start_matches('[').trim_end_matches(']').to_string(),
                p,
            ),
            _ => return Err(format!("{u:?}: bad port {p:?}")),
        },
        _ => (authority.to_string(), 80),
    };
    if host.is_empty()
        || host
            .bytes()
            .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
    {
        return Err(format!("{u:?}: bad host"));
    }
    let (path, stripped_v1) = match path.strip_suffix("/v1") {
        Some(p) => (p.to_string(), true),
        None => (path, false),
    };
    Ok(BaseUrl {
        host,
        port,
        path,
        stripped_v1,
    })
}

/// Why an API read failed, mapped to a surface status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiFailure {
    /// Status to record.
    pub status: SurfaceStatus,
    /// errno, if any.
    pub errno: Option<i32>,
    /// What happened.
    pub message: String,
}

/// One timed GET.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiRead {
    /// The URL asked.
    pub url: String,
    /// RFC 3339 wall time when the request was sent.
    pub at: String,
    /// Body of a 200, or why not.
    pub result: Result<Vec<u8>, ApiFailure>,
    /// µs.
    pub elapsed_us: u64,
}

fn fail(status: SurfaceStatus, errno: Option<i32>, message: String) -> ApiFailure {
    ApiFailure {
        status,
        errno,
        message,
    }
}

/// GET `{base}/v1{rest}` under `deadline`. `not_found` is what a 404 means.
pub fn get(base: &str, rest: &str, deadline: Duration, not_found: &str) -> ApiRead {
    let t = Instant::now();
    let at = crate::clock::wall_time_now();
    let parsed = parse_base_url(base);
    let url = parsed
        .as_ref()
        .map(|b| b.url(rest))
        .unwrap_or_else(|_| format!("{base}{rest}"));
    let result = match &parsed {
        Err(m) => Err(fail(SurfaceStatus::Error, None, m.clone())),
        Ok(_) => fetch(&url, deadline, &Auth::default(), not_found),
    };
    ApiRead {
        url,
        at,
        result,
        elapsed_us: t.elapsed().as_micros() as u64,
    }
}

/// What a request presents to a server that asks (the Kubernetes API; the
/// Longhorn manager asks nothing). The token is never logged or put in an
/// error: it goes into one header marked sensitive.
#[derive(Default)]
pub struct Auth {
    /// `Authorization: Bearer …`.
    pub bearer: Option<String>,
    /// PEM of the CA that signs the server's certificate (`https://`).
    pub ca_pem: Option<Vec<u8>>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("bearer", &self.bearer.as_ref().map(|_| "<redacted>"))
            .field("ca_pem", &self.ca_pem.as_ref().map(Vec::len))
            .finish()
    }
}

/// One GET of `url` through the project's HTTP client (`reqwest`, no proxy
/// from the environment) under `deadline`, capped at [`MAX_API_BYTES`]:
/// the body of a 200, or the failure as a surface status.
pub fn fetch(
    url: &str,
    deadline: Duration,
    auth: &Auth,
    not_found: &str,
) -> Result<Vec<u8>, ApiFailure> {
    // Captures run on blocking threads, never inside an async task: the
    // read gets a runtime of its own (as the kubelet read does).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| fail(SurfaceStatus::Error, None, format!("runtime: {e}")))?;
    rt.block_on(async {
        let mut builder = reqwest::Client::builder()
            .connect_timeout(deadline)
            .timeout(deadline)
            // In-cluster calls: no proxy from the environment.
            .no_proxy();
        if let Some(pem) = &auth.ca_pem {
            let ca = reqwest::Certificate::from_pem(pem).map_err(|e| {
                fail(
                    SurfaceStatus::Error,
                    None,
                    format!("the CA certificate is not PEM: {e}"),
                )
            })?;
            builder = builder
                .tls_built_in_root_certs(false)
                .add_root_certificate(ca);
        }
        let client = builder
            .build()
            .map_err(|e| fail(SurfaceStatus::Error, None, e.to_string()))?;
        let mut req = client
            .get(url)
            .header(reqwest::header::ACCEPT, "application/json");
        if let Some(token) = &auth.bearer {
            let mut v = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| {
                    fail(
                        SurfaceStatus::Error,
                        None,
                        "the token has characters a header cannot carry".into(),
                    )
                })?;
            v.set_sensitive(true);
            req = req.header(reqwest::header::AUTHORIZATION, v);
        }
        let mut resp = req.send().await.map_err(|e| http_failure(&e, url))?;
        let code = resp.status().as_u16();
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| http_failure(&e, url))? {
            body.extend_from_slice(&chunk);
            if body.len() > MAX_API_BYTES {
                return Err(fail(
                    SurfaceStatus::Truncated,
                    None,
                    format!("answer exceeds {MAX_API_BYTES} bytes"),
                ));
            }
        }
        match code {
            200 => Ok(body),
            401 | 403 => Err(fail(
                SurfaceStatus::PermissionDenied,
                None,
                format!("HTTP {code}"),
            )),
            404 => Err(fail(
                SurfaceStatus::Vanished,
                None,
                format!("HTTP 404: {not_found}"),
            )),
            c => Err(fail(SurfaceStatus::Error, None, format!("HTTP {c}"))),
        }
    })
}

/// `GET {base}/v1/volumes/{volume}`.
pub fn fetch_volume(base: &str, volume: &str) -> ApiRead {
    get(
        base,
        &format!("/volumes/{volume}"),
        API_DEADLINE,
        &format!("the manager has no volume {volume}"),
    )
}

/// `GET {base}/v1/volumes`, the volume list (longhorn-manager `api/router.go`,
/// the route registered beside `/v1/volumes/{name}`; a go-rancher collection).
pub fn fetch_volumes(base: &str) -> ApiRead {
    get(
        base,
        "/volumes",
        API_DEADLINE,
        "the manager has no volume list (is the base URL longhorn-backend:9500?)",
    )
}

/// `GET {base}/v1/settings` (longhorn-manager `api/router.go` v1.9.0 l.63).
pub fn fetch_settings(base: &str) -> ApiRead {
    get(
        base,
        "/settings",
        API_DEADLINE,
        "the manager has no settings list",
    )
}

/// `GET {base}/v1/instancemanagers/{im}`.
pub fn fetch_instance_manager(base: &str, im: &str) -> ApiRead {
    get(
        base,
        &format!("/instancemanagers/{im}"),
        API_DEADLINE,
        &format!("the manager has no instance manager {im}"),
    )
}

/// A failed manager request as a surface status: a timeout is `timeout`;
/// otherwise the OS error under it (errno kept), else `error`.
pub(crate) fn http_failure(e: &reqwest::Error, url: &str) -> ApiFailure {
    let mut io: Option<&std::io::Error> = None;
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(c) = cause {
        if let Some(x) = c.downcast_ref::<std::io::Error>() {
            io = Some(x);
            break;
        }
        cause = c.source();
    }
    let status = if e.is_timeout() {
        SurfaceStatus::Timeout
    } else if io.is_some_and(|x| x.kind() == std::io::ErrorKind::PermissionDenied) {
        SurfaceStatus::PermissionDenied
    } else {
        SurfaceStatus::Error
    };
    let detail = io.map(|x| format!(": {x}")).unwrap_or_default();
    ApiFailure {
        status,
        errno: io.and_then(std::io::Error::raw_os_error),
        message: format!("GET {url}: {e}{detail}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_plain_http_without_credentials_and_v1_is_not_doubled() {
        let b = parse_base_url("http://longhorn-backend:9500").unwrap();
        assert_eq!(
            b.url("/volumes/v"),
            "http://longhorn-backend:9500/v1/volumes/v"
        );
        assert!(!b.stripped_v1);
        let b = parse_base_url("http://10.0.0.1/api/v1/").unwrap();
        assert_eq!(b.url("/volumes/v"), "http://10.0.0.1:80/api/v1/volumes/v");
        assert!(b.stripped_v1);
        let b = parse_base_url("http://[fd00::1]:9500/v1").unwrap();
        assert_eq!(b.url(""), "http://[fd00::1]:9500/v1");
        for bad in [
            "https://x",
            "http://u:p@x",
            "http://",
            "http://x:0",
            "http://x:99999",
            "ftp://x",
            "http://x/v1?a=b",
        ] {
            assert!(parse_base_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_refused_manager_read_is_an_error_surface_with_its_errno() {
        // A loopback port nothing listens on (bound, then released).
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let r = fetch_volume(&format!("http://127.0.0.1:{port}"), "pvc-1");
        let f = r.result.unwrap_err();
        assert_eq!(f.status, SurfaceStatus::Error, "{}", f.message);
        assert_eq!(f.errno, Some(libc::ECONNREFUSED), "{}", f.message);
        assert!(!r.at.is_empty());
    }
}
