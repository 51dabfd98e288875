//! The synchronous client for `pstackd`'s Unix-socket API, used by
//! `pstackctl` (which has no async runtime of its own). HTTP/1 is hyper's
//! (`hyper::client::conn::http1`) on a current-thread tokio runtime made for
//! each call; nothing here reads or writes HTTP by hand.
//!
//! Invariants:
//! - Every call is bounded by its timeout as a whole (connect, send, head,
//!   body, every streamed event): past it the answer is
//!   [`ClientError::Timeout`], whatever the daemon is doing.
//! - No body is buffered past [`MAX_RESPONSE_BYTES`]: a `Content-Length`
//!   above it is refused before any body byte is read, and a streamed body is
//!   counted frame by frame and dropped as soon as it passes the cap. A
//!   streamed event line has the same cap.
//! - A daemon that answers (413, 403) and closes before reading our whole
//!   body still yields its answer; a signal interrupting a read (EINTR) is
//!   retried, never reported.
//! - One request per connection (`Connection: close`).
//! - An envelope received from the daemon is verified
//!   (`pstack_envelope::verify`) before it is returned: the client trusts the
//!   bytes, not the daemon.
//! - "No daemon" (socket missing, nothing listening) is its own error so a
//!   caller can fall back to a one-shot capture; every other failure is not.
//! - Nothing is logged; errors carry the daemon's message, never our
//!   request's headers or body.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Incoming};
use hyper::header::{HeaderName, HeaderValue};
use hyper_util::rt::TokioIo;
use pstack_envelope::Envelope;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use pstackd_api::CaptureRequest;
use pstackd_api::status::WatchStatus;
use pstackd_api::{CaptureStarted, DaemonStatus, ErrorBody, WatchEvent};

pub use pstackd_api::CaptureEvent;
pub use pstackd_api::limits::{DEFAULT_SOCKET, MAX_RESPONSE_BYTES};

/// Why a call to the daemon failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing listens at the path (missing file, refused connection).
    #[error("pstackd is not running at {path}: {source}")]
    NoDaemon {
        /// The socket path.
        path: PathBuf,
        /// The connect error.
        source: std::io::Error,
    },
    /// The socket exists but we may not connect (file mode).
    #[error("permission denied connecting to {path} (are you root or in the pstack group?)")]
    SocketPermission {
        /// The socket path.
        path: PathBuf,
    },
    /// The daemon answered with an error status.
    #[error("pstackd answered {status} {code}: {message}")]
    Api {
        /// HTTP status.
        status: u16,
        /// The error code from the body (or `unknown`).
        code: String,
        /// The message from the body.
        message: String,
        /// `Retry-After` seconds, when sent.
        retry_after: Option<u64>,
    },
    /// The call took longer than its timeout.
    #[error("pstackd did not answer within {0:?}")]
    Timeout(Duration),
    /// Reading or writing the socket failed.
    #[error("socket I/O: {0}")]
    Io(std::io::Error),
    /// The response is not HTTP we understand.
    #[error("malformed response from pstackd: {0}")]
    Protocol(String),
    /// The envelope returned does not verify.
    #[error("pstackd returned an envelope that does not verify: {0}")]
    InvalidEnvelope(pstack_envelope::Rejection),
}

/// A raw HTTP response.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    /// Status code.
    pub status: u16,
    /// Headers, names lowercased.
    pub headers: Vec<(String, String)>,
    /// Body (de-chunked).
    pub body: Vec<u8>,
}

impl HttpResponse {
    /// First header named `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Send one request and read the whole response.
pub fn request(
    socket: &Path,
    method: &str,
    target: &str,
    body: Option<&[u8]>,
    timeout: Duration,
) -> Result<HttpResponse, ClientError> {
    request_with(socket, method, target, body, &[], timeout)
}

/// [`request`] with extra request headers.
pub fn request_with(
    socket: &Path,
    method: &str,
    target: &str,
    body: Option<&[u8]>,
    extra_headers: &[(&str, &str)],
    timeout: Duration,
) -> Result<HttpResponse, ClientError> {
    let req = build_request(method, target, body, extra_headers, "application/json")?;
    run(timeout, async {
        let (head, body, io) = send(socket, req).await?;
        let body = read_capped(body, MAX_RESPONSE_BYTES, &io).await?;
        Ok(HttpResponse {
            status: head.status.as_u16(),
            headers: head
                .headers
                .iter()
                .map(|(k, v)| {
                    (
                        k.as_str().to_owned(),
                        String::from_utf8_lossy(v.as_bytes()).trim().to_owned(),
                    )
                })
                .collect(),
            body,
        })
    })
}

/// A fresh current-thread runtime for one call.
fn runtime() -> Result<tokio::runtime::Runtime, ClientError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(ClientError::Io)
}

/// Run `call` on a fresh current-thread runtime, bounded by `timeout`. A
/// caller already inside a runtime (which may not block on another) gets
/// the call run on a thread of its own.
fn run<T: Send>(
    timeout: Duration,
    call: impl std::future::Future<Output = Result<T, ClientError>> + Send,
) -> Result<T, ClientError> {
    let here = move || {
        runtime()?.block_on(async {
            tokio::time::timeout(timeout, call)
                .await
                .unwrap_or(Err(ClientError::Timeout(timeout)))
        })
    };
    if tokio::runtime::Handle::try_current().is_err() {
        return here();
    }
    std::thread::scope(|s| {
        s.spawn(here)
            .join()
            .unwrap_or_else(|_| Err(ClientError::Protocol("the client thread panicked".into())))
    })
}

fn build_request(
    method: &str,
    target: &str,
    body: Option<&[u8]>,
    extra_headers: &[(&str, &str)],
    accept: &'static str,
) -> Result<hyper::Request<Full<Bytes>>, ClientError> {
    let bad = |what: &str| ClientError::Protocol(format!("cannot send {what}"));
    let mut req = hyper::Request::builder()
        .method(hyper::Method::from_bytes(method.as_bytes()).map_err(|_| bad("this method"))?)
        .uri(target)
        .header(hyper::header::HOST, "pstackd")
        .header(hyper::header::CONNECTION, "close")
        .header(hyper::header::ACCEPT, accept);
    if body.is_some() {
        req = req.header(hyper::header::CONTENT_TYPE, "application/json");
    }
    for (k, v) in extra_headers {
        req = req.header(
            HeaderName::from_bytes(k.as_bytes()).map_err(|_| bad("a header name"))?,
            HeaderValue::from_str(v).map_err(|_| bad("a header value"))?,
        );
    }
    req.body(Full::new(Bytes::copy_from_slice(body.unwrap_or_default())))
        .map_err(|_| bad("this request target"))
}

/// What the socket adapter saw, for error reports after hyper gave up.
#[derive(Debug, Default)]
struct Seen {
    /// The first write that failed because the daemon had closed.
    write_failed: Option<std::io::ErrorKind>,
}

type Shared = std::sync::Arc<std::sync::Mutex<Seen>>;

fn write_failed(seen: &Shared) -> Option<std::io::ErrorKind> {
    seen.lock().map_or(None, |s| s.write_failed)
}

/// Connect, send `req`, and return the response head and its body stream.
async fn send(
    socket: &Path,
    req: hyper::Request<Full<Bytes>>,
) -> Result<(hyper::http::response::Parts, Incoming, Shared), ClientError> {
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|e| connect_error(socket, e))?;
    let seen = Shared::default();
    let io = TokioIo::new(Tolerant {
        inner: stream,
        seen: seen.clone(),
        read_any: false,
    });
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| hyper_error(e, &seen))?;
    // The connection is driven on this thread while we wait on the answer;
    // it ends with the call (the runtime is dropped).
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| hyper_error(e, &seen))?;
    let (head, body) = resp.into_parts();
    Ok((head, body, seen))
}

fn connect_error(socket: &Path, e: std::io::Error) -> ClientError {
    match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
            ClientError::NoDaemon {
                path: socket.to_owned(),
                source: e,
            }
        }
        std::io::ErrorKind::PermissionDenied => ClientError::SocketPermission {
            path: socket.to_owned(),
        },
        _ => ClientError::Io(e),
    }
}

/// A hyper failure as the caller sees it: bytes that are not the HTTP we
/// expect are a protocol error; a socket failure is I/O (the failed write,
/// when the daemon closed while we sent and then sent no answer).
fn hyper_error(e: hyper::Error, seen: &Shared) -> ClientError {
    if let Some(kind) = write_failed(seen) {
        return ClientError::Io(std::io::Error::new(
            kind,
            format!("pstackd closed the connection while we sent ({e})"),
        ));
    }
    if e.is_parse() || e.is_parse_status() || e.is_incomplete_message() || e.is_parse_too_large() {
        return ClientError::Protocol(e.to_string());
    }
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return ClientError::Io(std::io::Error::new(io.kind(), io.to_string()));
        }
        source = s.source();
    }
    ClientError::Protocol(e.to_string())
}

/// The whole body, refused as soon as it passes `cap` (a declared length
/// past it before any byte is read).
async fn read_capped(
    mut body: Incoming,
    cap: usize,
    seen: &Shared,
) -> Result<Vec<u8>, ClientError> {
    let too_big = || ClientError::Protocol(format!("response exceeds {cap} bytes"));
    if body.size_hint().lower() > cap as u64 {
        return Err(too_big());
    }
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| hyper_error(e, seen))?;
        if let Ok(data) = frame.into_data() {
            if out.len() + data.len() > cap {
                return Err(too_big());
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(out)
}

/// The daemon's socket as hyper sees it. A daemon may answer (413, 403) and
/// close before reading all we send: a write that fails because the peer
/// closed is recorded and swallowed so hyper goes on to read the answer
/// already queued for us, and the reset that follows that answer reads as
/// its end. A read interrupted by a signal is retried.
struct Tolerant {
    inner: tokio::net::UnixStream,
    seen: Shared,
    read_any: bool,
}

fn closed_by_peer(kind: std::io::ErrorKind) -> bool {
    matches!(
        kind,
        std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
    )
}

impl AsyncRead for Tolerant {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                self.read_any |= buf.filled().len() > before;
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) if e.kind() == std::io::ErrorKind::Interrupted => {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            Poll::Ready(Err(e))
                if e.kind() == std::io::ErrorKind::ConnectionReset
                    && (self.read_any || write_failed(&self.seen).is_some()) =>
            {
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

impl AsyncWrite for Tolerant {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if write_failed(&self.seen).is_some() {
            return Poll::Ready(Ok(buf.len()));
        }
        match Pin::new(&mut self.inner).poll_write(cx, buf) {
            Poll::Ready(Err(e)) if closed_by_peer(e.kind()) => {
                if let Ok(mut s) = self.seen.lock() {
                    s.write_failed = Some(e.kind());
                }
                Poll::Ready(Ok(buf.len()))
            }
            Poll::Ready(Err(e)) if e.kind() == std::io::ErrorKind::Interrupted => {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            other => other,
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        if write_failed(&self.seen).is_some() {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match Pin::new(&mut self.inner).poll_shutdown(cx) {
            Poll::Ready(Err(e)) if closed_by_peer(e.kind()) => Poll::Ready(Ok(())),
            other => other,
        }
    }
}

fn api_error(resp: &HttpResponse) -> ClientError {
    // Not every error answer is the daemon's own (a proxy, hyper): a body
    // that is not an `ErrorBody` is reported as text, code `unknown`.
    let (code, message) = match serde_json::from_slice::<ErrorBody>(&resp.body) {
        Ok(b) => (b.error.code, b.error.message),
        Err(_) => (
            "unknown".to_string(),
            String::from_utf8_lossy(&resp.body)
                .chars()
                .take(500)
                .collect(),
        ),
    };
    ClientError::Api {
        status: resp.status,
        code,
        message,
        retry_after: resp.header("retry-after").and_then(|v| v.parse().ok()),
    }
}

/// A sealed envelope as the daemon sent it: verified, with the bytes it
/// came in (what the daemon spooled; written out as they are, never
/// serialized a second time).
#[derive(Debug, Clone)]
pub struct ReceivedEnvelope {
    /// The envelope, verified.
    pub envelope: Envelope,
    /// The bytes verified.
    pub bytes: Vec<u8>,
}

/// Ask the daemon for a capture; returns the verified sealed envelope and
/// its bytes.
pub fn receive_via_socket(
    socket: &Path,
    request: &CaptureRequest,
    timeout: Duration,
) -> Result<ReceivedEnvelope, ClientError> {
    let body = serde_json::to_vec(request).map_err(|e| ClientError::Protocol(e.to_string()))?;
    let resp = self::request(socket, "POST", "/v1/captures", Some(&body), timeout)?;
    if resp.status != 200 {
        return Err(api_error(&resp));
    }
    let envelope = pstack_envelope::verify(&resp.body).map_err(ClientError::InvalidEnvelope)?;
    Ok(ReceivedEnvelope {
        envelope,
        bytes: resp.body,
    })
}

/// Ask the daemon for a capture; returns the verified sealed envelope.
pub fn capture_via_socket(
    socket: &Path,
    request: &CaptureRequest,
    timeout: Duration,
) -> Result<Envelope, ClientError> {
    receive_via_socket(socket, request, timeout).map(|r| r.envelope)
}

/// Try the daemon first: `Ok(None)` when no daemon listens at `socket` (the
/// caller then captures one-shot); any other failure is an error, never a
/// silent fallback (a daemon that refuses us must not be bypassed quietly).
pub fn try_capture_via_daemon(
    socket: &Path,
    request: &CaptureRequest,
    timeout: Duration,
) -> Result<Option<ReceivedEnvelope>, ClientError> {
    match receive_via_socket(socket, request, timeout) {
        Ok(e) => Ok(Some(e)),
        Err(ClientError::NoDaemon { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Ask the daemon for a capture of any kind; returns every envelope it
/// produced, each verified, in the daemon's order (the order `--json`
/// prints). A process capture answers one JSON envelope, other kinds NDJSON.
pub fn capture_kind_via_socket(
    socket: &Path,
    request: &CaptureRequest,
    timeout: Duration,
) -> Result<Vec<Envelope>, ClientError> {
    let body = serde_json::to_vec(request).map_err(|e| ClientError::Protocol(e.to_string()))?;
    let resp = self::request(socket, "POST", "/v1/captures", Some(&body), timeout)?;
    if resp.status != 200 {
        return Err(api_error(&resp));
    }
    resp.body
        .split(|b| *b == b'\n')
        .filter(|line| !line.iter().all(u8::is_ascii_whitespace))
        .map(|line| pstack_envelope::verify(line).map_err(ClientError::InvalidEnvelope))
        .collect()
}

/// [`capture_kind_via_socket`], or `Ok(None)` when no daemon listens at
/// `socket` (the caller then captures one-shot). Any other failure is an
/// error, never a silent fallback.
pub fn try_capture_kind_via_daemon(
    socket: &Path,
    request: &CaptureRequest,
    timeout: Duration,
) -> Result<Option<Vec<Envelope>>, ClientError> {
    match capture_kind_via_socket(socket, request, timeout) {
        Ok(e) => Ok(Some(e)),
        Err(ClientError::NoDaemon { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// `POST /v1/captures` with `Prefer: respond-async`: the daemon admits the
/// capture (or refuses it, as it would a synchronous one) and answers its
/// id at once; follow it with [`follow_capture`].
pub fn start_capture(
    socket: &Path,
    request: &CaptureRequest,
    timeout: Duration,
) -> Result<String, ClientError> {
    let body = serde_json::to_vec(request).map_err(|e| ClientError::Protocol(e.to_string()))?;
    let resp = request_with(
        socket,
        "POST",
        "/v1/captures",
        Some(&body),
        &[("Prefer", "respond-async")],
        timeout,
    )?;
    if resp.status != 202 {
        return Err(api_error(&resp));
    }
    let started: CaptureStarted =
        serde_json::from_slice(&resp.body).map_err(|e| ClientError::Protocol(e.to_string()))?;
    if started.id.len() == 32 && started.id.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(started.id)
    } else {
        Err(ClientError::Protocol(format!(
            "202 without a capture id: {:?}",
            started.id
        )))
    }
}

/// Follow `GET /v1/captures/{id}/events` to the capture's outcome, handing
/// each event to `on_event` as it arrives. Returns the last event (`done`
/// or `failed`); an envelope event is verified before it is handed on.
/// `timeout` bounds the whole call.
pub fn follow_capture(
    socket: &Path,
    id: &str,
    timeout: Duration,
    on_event: &mut dyn FnMut(&CaptureEvent),
) -> Result<CaptureEvent, ClientError> {
    // `on_event` runs between our waits, never inside the runtime, so it may
    // call this client itself.
    let rt = runtime()?;
    let deadline = tokio::time::Instant::now() + timeout;
    let target = format!("/v1/captures/{id}/events");
    let mut lines = open_ndjson(&rt, socket, &target, deadline, timeout)?;
    while let Some(line) = within(&rt, deadline, timeout, lines.next_line())? {
        let event: CaptureEvent = serde_json::from_slice(&line)
            .map_err(|e| ClientError::Protocol(format!("bad capture event: {e}")))?;
        if let CaptureEvent::Envelope { envelope, .. } = &event {
            pstack_envelope::verify(envelope.as_bytes()).map_err(ClientError::InvalidEnvelope)?;
        }
        on_event(&event);
        if matches!(
            event,
            CaptureEvent::Done { .. } | CaptureEvent::Failed { .. }
        ) {
            return Ok(event);
        }
    }
    Err(ClientError::Protocol(
        "the event stream ended before the capture's outcome".into(),
    ))
}

/// `GET target` as NDJSON: its lines, or the API error it answered.
fn open_ndjson(
    rt: &tokio::runtime::Runtime,
    socket: &Path,
    target: &str,
    deadline: tokio::time::Instant,
    timeout: Duration,
) -> Result<NdjsonLines, ClientError> {
    let req = build_request("GET", target, None, &[], "application/x-ndjson")?;
    let (head, body, seen) = within(rt, deadline, timeout, send(socket, req))?;
    if head.status != hyper::StatusCode::OK {
        let resp = HttpResponse {
            status: head.status.as_u16(),
            headers: Vec::new(),
            body: within(
                rt,
                deadline,
                timeout,
                read_capped(body, MAX_RESPONSE_BYTES, &seen),
            )?,
        };
        return Err(api_error(&resp));
    }
    Ok(NdjsonLines::new(body, seen, MAX_RESPONSE_BYTES))
}

/// Wait on `call` until `deadline` (the whole call's `timeout`).
fn within<T>(
    rt: &tokio::runtime::Runtime,
    deadline: tokio::time::Instant,
    timeout: Duration,
    call: impl std::future::Future<Output = Result<T, ClientError>>,
) -> Result<T, ClientError> {
    rt.block_on(async {
        tokio::time::timeout_at(deadline, call)
            .await
            .unwrap_or(Err(ClientError::Timeout(timeout)))
    })
}

/// Non-blank lines of an NDJSON body, each handed on as soon as its newline
/// arrives, whatever the framing; a line longer than `cap` is refused before
/// more of it is buffered.
struct NdjsonLines {
    body: Incoming,
    seen: Shared,
    cap: usize,
    pending: Vec<u8>,
    scanned: usize,
    ended: bool,
}

impl NdjsonLines {
    fn new(body: Incoming, seen: Shared, cap: usize) -> Self {
        Self {
            body,
            seen,
            cap,
            pending: Vec::new(),
            scanned: 0,
            ended: false,
        }
    }

    fn too_long(&self) -> ClientError {
        ClientError::Protocol(format!("an event line exceeds {} bytes", self.cap))
    }

    async fn next_line(&mut self) -> Result<Option<Vec<u8>>, ClientError> {
        loop {
            // `scanned` bytes of `pending` are known to hold no newline.
            while let Some(at) = self.pending[self.scanned..]
                .iter()
                .position(|b| *b == b'\n')
            {
                let nl = self.scanned + at;
                self.scanned = 0;
                if nl > self.cap {
                    return Err(self.too_long());
                }
                let line: Vec<u8> = self.pending.drain(..=nl).collect();
                if !line.iter().all(u8::is_ascii_whitespace) {
                    return Ok(Some(line));
                }
            }
            self.scanned = self.pending.len();
            if self.pending.len() > self.cap {
                return Err(self.too_long());
            }
            if self.ended {
                // A last line without its newline is still a line.
                let rest = std::mem::take(&mut self.pending);
                return Ok((!rest.iter().all(u8::is_ascii_whitespace)).then_some(rest));
            }
            match self.body.frame().await {
                None => self.ended = true,
                Some(frame) => {
                    let frame = frame.map_err(|e| hyper_error(e, &self.seen))?;
                    if let Ok(data) = frame.into_data() {
                        self.pending.extend_from_slice(&data);
                    }
                }
            }
        }
    }
}

/// `GET /v1/watch`: the watch rules and their counters.
pub fn watch(socket: &Path, timeout: Duration) -> Result<WatchStatus, ClientError> {
    let resp = request(socket, "GET", "/v1/watch", None, timeout)?;
    if resp.status != 200 {
        return Err(api_error(&resp));
    }
    serde_json::from_slice(&resp.body).map_err(|e| ClientError::Protocol(e.to_string()))
}

/// Follow `GET /v1/watch/events` (the recent events, then live ones),
/// handing each to `on_event` as its line and its typed reading, for
/// `follow` (or until the daemon closes the stream). `on_event` returning
/// false stops early.
pub fn follow_watch_events(
    socket: &Path,
    follow: Duration,
    on_event: &mut dyn FnMut(&str, &WatchEvent) -> bool,
) -> Result<(), ClientError> {
    let rt = runtime()?;
    let deadline = tokio::time::Instant::now() + follow;
    let mut lines = match open_ndjson(&rt, socket, "/v1/watch/events", deadline, follow) {
        Err(ClientError::Timeout(_)) => return Ok(()),
        other => other?,
    };
    loop {
        let line = match within(&rt, deadline, follow, lines.next_line()) {
            Ok(Some(l)) => l,
            Ok(None) | Err(ClientError::Timeout(_)) => return Ok(()),
            Err(e) => return Err(e),
        };
        let event: WatchEvent = serde_json::from_slice(&line)
            .map_err(|e| ClientError::Protocol(format!("bad watch event: {e}")))?;
        let text = String::from_utf8_lossy(&line);
        if !on_event(text.trim_end(), &event) {
            return Ok(());
        }
    }
}

/// `GET /v1/status`.
pub fn status(socket: &Path, timeout: Duration) -> Result<DaemonStatus, ClientError> {
    let resp = request(socket, "GET", "/v1/status", None, timeout)?;
    if resp.status != 200 {
        return Err(api_error(&resp));
    }
    serde_json::from_slice(&resp.body).map_err(|e| ClientError::Protocol(e.to_string()))
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::unix::net::{UnixListener, UnixStream};
    use std::time::Instant;

    use super::*;

    /// A one-connection server on a Unix socket in a tempdir: `serve` gets
    /// the accepted stream and writes raw bytes (the test's side only).
    fn server<T: Send + 'static>(
        serve: impl FnOnce(UnixStream) -> T + Send + 'static,
    ) -> (tempfile::TempDir, PathBuf, std::thread::JoinHandle<T>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pstackd.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let t = std::thread::spawn(move || serve(listener.accept().unwrap().0));
        (dir, path, t)
    }

    /// Read the request head (through its blank line); returns its length.
    fn read_head(s: &mut UnixStream) -> usize {
        let mut head = Vec::new();
        let mut b = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            assert_eq!(s.read(&mut b).unwrap(), 1, "request head cut short");
            head.push(b[0]);
        }
        head.len()
    }

    #[test]
    fn a_response_split_across_many_small_writes_is_read_whole() {
        let (_d, path, t) = server(|mut s| {
            read_head(&mut s);
            let raw = b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\nRetry-After: 7\r\n\r\nhello world";
            for b in raw {
                s.write_all(&[*b]).unwrap();
                s.flush().unwrap();
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        let r = request(&path, "GET", "/v1/status", None, Duration::from_secs(5)).unwrap();
        assert_eq!((r.status, r.body.as_slice()), (200, &b"hello world"[..]));
        assert_eq!(r.header("retry-after"), Some("7"));
        t.join().unwrap();
    }

    fn done_line() -> String {
        let done = serde_json::json!({"type": "done", "digests": [], "spool_status": "spooled"});
        serde_json::from_value::<CaptureEvent>(done.clone()).expect("a done event");
        done.to_string()
    }

    #[test]
    fn chunked_ndjson_split_across_chunks_is_handed_on_line_by_line_as_it_arrives() {
        let (seen_tx, seen_rx) = std::sync::mpsc::channel::<()>();
        let (_d, path, t) = server(move |mut s| {
            read_head(&mut s);
            let a = r#"{"type":"note","text":"first"}"#;
            let b = r#"{"type":"note","text":"second"}"#;
            let stream = format!("{a}\n\n{b}\n{}\n", done_line());
            let (one, rest) = stream.as_bytes().split_at(a.len() + 1);
            s.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n")
                .unwrap();
            // The first line in three chunks, cut mid-token.
            for part in [&one[..5], &one[5..20], &one[20..]] {
                write!(s, "{:x}\r\n", part.len()).unwrap();
                s.write_all(part).unwrap();
                s.write_all(b"\r\n").unwrap();
                s.flush().unwrap();
            }
            // The rest only once the client has handed the first line on.
            seen_rx
                .recv_timeout(Duration::from_secs(5))
                .expect("the first event was handed on before the stream ended");
            for part in rest.chunks(7) {
                write!(s, "{:x}\r\n", part.len()).unwrap();
                s.write_all(part).unwrap();
                s.write_all(b"\r\n").unwrap();
            }
            s.write_all(b"0\r\n\r\n").unwrap();
        });
        let mut got = Vec::new();
        let last = follow_capture(
            &path,
            "0".repeat(32).as_str(),
            Duration::from_secs(10),
            &mut |e| {
                if got.is_empty() {
                    seen_tx.send(()).unwrap();
                }
                got.push(e.clone());
            },
        )
        .unwrap();
        assert!(matches!(last, CaptureEvent::Done { .. }), "{last:?}");
        let notes: Vec<_> = got
            .iter()
            .filter_map(|e| match e {
                CaptureEvent::Note { text } => Some(text.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(notes, ["first", "second"]);
        assert_eq!(got.len(), 3);
        t.join().unwrap();
    }

    #[test]
    fn an_event_line_past_the_cap_is_refused() {
        let (_d, path, t) = server(|mut s| {
            read_head(&mut s);
            s.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                .unwrap();
            let chunk = vec![b'x'; 1 << 20];
            let mut sent = 0usize;
            while sent < 2 * MAX_RESPONSE_BYTES {
                let ok = write!(s, "{:x}\r\n", chunk.len())
                    .and_then(|()| s.write_all(&chunk))
                    .and_then(|()| s.write_all(b"\r\n"));
                if ok.is_err() {
                    break;
                }
                sent += chunk.len();
            }
            sent
        });
        let e = follow_capture(&path, "ab", Duration::from_secs(30), &mut |_| {}).unwrap_err();
        assert!(
            matches!(&e, ClientError::Protocol(m) if m.contains("exceeds")),
            "{e}"
        );
        let sent = t.join().unwrap();
        assert!(
            sent < MAX_RESPONSE_BYTES + (8 << 20),
            "server wrote {sent} bytes"
        );
    }

    #[test]
    fn a_body_past_the_cap_is_a_protocol_error_without_reading_it_all() {
        // Streamed: the client stops reading soon after the cap.
        let (_d, path, t) = server(|mut s| {
            read_head(&mut s);
            s.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                .unwrap();
            let chunk = vec![b'y'; 1 << 20];
            let mut sent = 0usize;
            while sent < 4 * MAX_RESPONSE_BYTES {
                let ok = write!(s, "{:x}\r\n", chunk.len())
                    .and_then(|()| s.write_all(&chunk))
                    .and_then(|()| s.write_all(b"\r\n"));
                if ok.is_err() {
                    break;
                }
                sent += chunk.len();
            }
            sent
        });
        let e = request(&path, "GET", "/v1/status", None, Duration::from_secs(30)).unwrap_err();
        assert!(
            matches!(&e, ClientError::Protocol(m) if m.contains("exceeds")),
            "{e}"
        );
        let sent = t.join().unwrap();
        assert!(
            sent < MAX_RESPONSE_BYTES + (8 << 20),
            "server wrote {sent} bytes"
        );

        // Declared: refused on the head, before any body byte.
        let (_d, path, t) = server(|mut s| {
            read_head(&mut s);
            write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n",
                MAX_RESPONSE_BYTES + 1
            )
            .unwrap();
            std::thread::sleep(Duration::from_secs(3));
        });
        let started = Instant::now();
        let e = request(&path, "GET", "/v1/status", None, Duration::from_secs(10)).unwrap_err();
        assert!(
            matches!(&e, ClientError::Protocol(m) if m.contains("exceeds")),
            "{e}"
        );
        assert!(started.elapsed() < Duration::from_secs(2));
        t.join().unwrap();
    }

    #[test]
    fn a_server_that_never_answers_times_out_within_the_deadline() {
        let (_d, path, t) = server(|mut s| {
            read_head(&mut s);
            std::thread::sleep(Duration::from_secs(3));
        });
        let started = Instant::now();
        let e = request(&path, "GET", "/v1/status", None, Duration::from_millis(300)).unwrap_err();
        assert!(matches!(e, ClientError::Timeout(_)), "{e}");
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_secs(2),
            "{took:?}"
        );
        t.join().unwrap();
    }

    #[test]
    fn a_413_sent_while_we_still_send_a_large_body_is_returned() {
        let (_d, path, t) = server(|mut s| {
            read_head(&mut s);
            let body = r#"{"error":{"code":"body_too_large","message":"too big"}}"#;
            write!(
                s,
                "HTTP/1.1 413 Payload Too Large\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
            .unwrap();
            // Closed with most of the request body unread.
        });
        let big = vec![b'z'; 16 << 20];
        let r = request(
            &path,
            "POST",
            "/v1/captures",
            Some(&big),
            Duration::from_secs(10),
        )
        .unwrap();
        assert_eq!(r.status, 413);
        assert!(matches!(api_error(&r), ClientError::Api { code, .. } if code == "body_too_large"));
        t.join().unwrap();
    }

    #[test]
    fn garbage_instead_of_http_is_a_protocol_error() {
        for garbage in [
            &b"SSH-2.0-OpenSSH_9.6\r\n\r\n"[..],
            b"HTTP/1.1 abc OK\r\n\r\n",
            b"",
        ] {
            let (_d, path, t) = server(move |mut s| {
                read_head(&mut s);
                s.write_all(garbage).unwrap();
            });
            let e = request(&path, "GET", "/v1/status", None, Duration::from_secs(5)).unwrap_err();
            assert!(matches!(e, ClientError::Protocol(_)), "{garbage:?}: {e}");
            t.join().unwrap();
        }
    }

    #[test]
    fn missing_socket_is_no_daemon() {
        let e = status(
            Path::new("/nonexistent/pstackd.sock"),
            Duration::from_secs(1),
        )
        .unwrap_err();
        assert!(matches!(e, ClientError::NoDaemon { .. }), "{e}");
    }
}
