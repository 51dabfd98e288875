//! A small synchronous client for `pstackd`'s Unix-socket API, used by
//! `pstackctl` (which has no async runtime).
//!
//! Invariants:
//! - One request per connection (`Connection: close`); responses are read to
//!   EOF with a size cap ([`MAX_RESPONSE_BYTES`]) and a whole-call timeout.
//! - An envelope received from the daemon is verified
//!   (`pstack_envelope::verify`) before it is returned: the client trusts the
//!   bytes, not the daemon.
//! - "No daemon" (socket missing, nothing listening) is its own error so a
//!   caller can fall back to a one-shot capture; every other failure is not.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pstack_envelope::Envelope;

pub use crate::daemon::capture::{
    CaptureRequestBody, RequestedCaps, RequestedDeadlines, SubjectSelector,
};
pub use crate::daemon::captures::CaptureEvent;

/// Default socket path.
pub const DEFAULT_SOCKET: &str = "/run/pstack/pstackd.sock";

/// Largest response read.
pub const MAX_RESPONSE_BYTES: usize = 64 << 20;

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

fn connect(socket: &Path) -> Result<UnixStream, ClientError> {
    UnixStream::connect(socket).map_err(|e| match e.kind() {
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
    })
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
    let started = Instant::now();
    let mut stream = connect(socket)?;
    let to = |e: std::io::Error| {
        if matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ) {
            ClientError::Timeout(timeout)
        } else {
            ClientError::Io(e)
        }
    };
    stream
        .set_write_timeout(Some(timeout))
        .map_err(ClientError::Io)?;
    let mut head = format!(
        "{method} {target} HTTP/1.1\r\nHost: pstackd\r\nConnection: close\r\nAccept: application/json\r\n"
    );
    if let Some(b) = body {
        head.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            b.len()
        ));
    }
    for (k, v) in extra_headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    // A server may answer (413, 403) and close before reading the whole body:
    // remember a write failure and still read whatever answer arrived.
    let mut write_error = stream.write_all(head.as_bytes()).err();
    if write_error.is_none()
        && let Some(b) = body
    {
        write_error = stream.write_all(b).err();
    }
    if let Some(e) = write_error {
        let mut raw = Vec::new();
        let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
        let _ = (&mut stream)
            .take(MAX_RESPONSE_BYTES as u64)
            .read_to_end(&mut raw);
        return parse_response(&raw).map_err(|_| to(e));
    }
    let mut raw = Vec::new();
    let mut buf = [0u8; 16 << 10];
    loop {
        let left = timeout
            .checked_sub(started.elapsed())
            .ok_or(ClientError::Timeout(timeout))?;
        stream
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .map_err(ClientError::Io)?;
        let n = match stream.read(&mut buf) {
            Ok(n) => n,
            // A signal (e.g. a test harness's SIGCHLD) interrupted the wait.
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            // The server answered and closed with part of our body unread: the
            // kernel reports a reset after the queued answer. Parse what came.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset && !raw.is_empty() => 0,
            Err(e) => return Err(to(e)),
        };
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
        if raw.len() > MAX_RESPONSE_BYTES {
            return Err(ClientError::Protocol(format!(
                "response exceeds {MAX_RESPONSE_BYTES} bytes"
            )));
        }
    }
    parse_response(&raw)
}

/// Parse an HTTP/1.1 response read to EOF.
pub fn parse_response(raw: &[u8]) -> Result<HttpResponse, ClientError> {
    let (status, headers, end) = parse_head(raw)?;
    let rest = &raw[end + 4..];
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.to_ascii_lowercase().contains("chunked"));
    let body = if chunked {
        dechunk(rest)?
    } else if let Some((_, len)) = headers.iter().find(|(k, _)| k == "content-length") {
        let len: usize = len
            .parse()
            .map_err(|_| ClientError::Protocol(format!("bad content-length {len:?}")))?;
        if rest.len() < len {
            return Err(ClientError::Protocol(format!(
                "body truncated: {} of {len} bytes",
                rest.len()
            )));
        }
        rest[..len].to_vec()
    } else {
        rest.to_vec()
    };
    Ok(HttpResponse {
        status,
        headers,
        body,
    })
}

type Head = (u16, Vec<(String, String)>, usize);

/// The status line and headers of a response; the offset of the blank line.
fn parse_head(raw: &[u8]) -> Result<Head, ClientError> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| ClientError::Protocol("no end of headers".into()))?;
    let head = std::str::from_utf8(&raw[..end])
        .map_err(|_| ClientError::Protocol("headers are not UTF-8".into()))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let mut parts = status_line.splitn(3, ' ');
    let (Some(version), Some(code)) = (parts.next(), parts.next()) else {
        return Err(ClientError::Protocol(format!(
            "bad status line {status_line:?}"
        )));
    };
    if !version.starts_with("HTTP/1.") {
        return Err(ClientError::Protocol(format!(
            "bad status line {status_line:?}"
        )));
    }
    let status: u16 = code
        .parse()
        .map_err(|_| ClientError::Protocol(format!("bad status code {code:?}")))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Ok((status, headers, end))
}

fn dechunk(mut rest: &[u8]) -> Result<Vec<u8>, ClientError> {
    let mut out = Vec::new();
    loop {
        let line_end = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| ClientError::Protocol("truncated chunk size".into()))?;
        let size_text = std::str::from_utf8(&rest[..line_end])
            .map_err(|_| ClientError::Protocol("bad chunk size".into()))?;
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| ClientError::Protocol(format!("bad chunk size {size_text:?}")))?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        if rest.len() < size + 2 {
            return Err(ClientError::Protocol("truncated chunk".into()));
        }
        out.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

fn api_error(resp: &HttpResponse) -> ClientError {
    let v: serde_json::Value = serde_json::from_slice(&resp.body).unwrap_or_default();
    ClientError::Api {
        status: resp.status,
        code: v["error"]["code"].as_str().unwrap_or("unknown").to_string(),
        message: v["error"]["message"]
            .as_str()
            .map(str::to_owned)
            .unwrap_or_else(|| {
                String::from_utf8_lossy(&resp.body)
                    .chars()
                    .take(500)
                    .collect()
            }),
        retry_after: resp.header("retry-after").and_then(|v| v.parse().ok()),
    }
}

/// Ask the daemon for a capture; returns the verified sealed envelope.
pub fn capture_via_socket(
    socket: &Path,
    request: &CaptureRequestBody,
    timeout: Duration,
) -> Result<Envelope, ClientError> {
    let body = serde_json::to_vec(request).map_err(|e| ClientError::Protocol(e.to_string()))?;
    let resp = self::request(socket, "POST", "/v1/captures", Some(&body), timeout)?;
    if resp.status != 200 {
        return Err(api_error(&resp));
    }
    pstack_envelope::verify(&resp.body).map_err(ClientError::InvalidEnvelope)
}

/// Try the daemon first: `Ok(None)` when no daemon listens at `socket` (the
/// caller then captures one-shot); any other failure is an error, never a
/// silent fallback (a daemon that refuses us must not be bypassed quietly).
pub fn try_capture_via_daemon(
    socket: &Path,
    request: &CaptureRequestBody,
    timeout: Duration,
) -> Result<Option<Envelope>, ClientError> {
    match capture_via_socket(socket, request, timeout) {
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
    request: &pstack_capture::request::CaptureRequest,
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
    request: &pstack_capture::request::CaptureRequest,
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
    request: &pstack_capture::request::CaptureRequest,
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
    let v: serde_json::Value =
        serde_json::from_slice(&resp.body).map_err(|e| ClientError::Protocol(e.to_string()))?;
    v["id"]
        .as_str()
        .filter(|id| id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()))
        .map(str::to_owned)
        .ok_or_else(|| ClientError::Protocol(format!("202 without a capture id: {v}")))
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
    use std::io::BufRead;
    let started = Instant::now();
    let mut stream = connect(socket)?;
    stream
        .set_write_timeout(Some(timeout))
        .map_err(ClientError::Io)?;
    write!(
        stream,
        "GET /v1/captures/{id}/events HTTP/1.1\r\nHost: pstackd\r\nConnection: close\r\nAccept: application/x-ndjson\r\n\r\n"
    )
    .map_err(ClientError::Io)?;
    let mut reader = std::io::BufReader::new(stream);
    let timed = |r: &mut std::io::BufReader<UnixStream>| -> Result<(), ClientError> {
        let left = timeout
            .checked_sub(started.elapsed())
            .ok_or(ClientError::Timeout(timeout))?;
        r.get_ref()
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .map_err(ClientError::Io)
    };
    let io = |e: std::io::Error| {
        if matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ) {
            ClientError::Timeout(timeout)
        } else {
            ClientError::Io(e)
        }
    };
    // The head, then the same parser as every other answer.
    let mut head = Vec::new();
    loop {
        timed(&mut reader)?;
        let mut line = Vec::new();
        let n = (&mut reader)
            .take(16 << 10)
            .read_until(b'\n', &mut line)
            .map_err(io)?;
        if n == 0 {
            return Err(ClientError::Protocol("no end of headers".into()));
        }
        head.extend_from_slice(&line);
        if line == b"\r\n" {
            break;
        }
        if head.len() > 64 << 10 {
            return Err(ClientError::Protocol("headers too long".into()));
        }
    }
    let (status, headers, _) = parse_head(&head)?;
    if status != 200 {
        timed(&mut reader)?;
        let mut rest = Vec::new();
        (&mut reader)
            .take(MAX_RESPONSE_BYTES as u64)
            .read_to_end(&mut rest)
            .map_err(io)?;
        head.extend_from_slice(&rest);
        return Err(api_error(&parse_response(&head)?));
    }
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.to_ascii_lowercase().contains("chunked"));
    let mut pending: Vec<u8> = Vec::new();
    let mut handle =
        |bytes: &[u8], pending: &mut Vec<u8>| -> Result<Option<CaptureEvent>, ClientError> {
            pending.extend_from_slice(bytes);
            while let Some(nl) = pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = pending.drain(..=nl).collect();
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                let event: CaptureEvent = serde_json::from_slice(&line)
                    .map_err(|e| ClientError::Protocol(format!("bad capture event: {e}")))?;
                if let CaptureEvent::Envelope { envelope, .. } = &event {
                    pstack_envelope::verify(envelope.as_bytes())
                        .map_err(ClientError::InvalidEnvelope)?;
                }
                on_event(&event);
                if matches!(
                    event,
                    CaptureEvent::Done { .. } | CaptureEvent::Failed { .. }
                ) {
                    return Ok(Some(event));
                }
            }
            if pending.len() > MAX_RESPONSE_BYTES {
                return Err(ClientError::Protocol("an event line is too long".into()));
            }
            Ok(None)
        };
    loop {
        timed(&mut reader)?;
        let data = if chunked {
            let mut size_line = Vec::new();
            (&mut reader)
                .take(1024)
                .read_until(b'\n', &mut size_line)
                .map_err(io)?;
            let text = std::str::from_utf8(&size_line)
                .map_err(|_| ClientError::Protocol("bad chunk size".into()))?;
            let size = usize::from_str_radix(text.split(';').next().unwrap_or("").trim(), 16)
                .map_err(|_| ClientError::Protocol(format!("bad chunk size {text:?}")))?;
            if size == 0 {
                break;
            }
            if size > MAX_RESPONSE_BYTES {
                return Err(ClientError::Protocol("chunk too large".into()));
            }
            let mut data = vec![0u8; size + 2];
            reader.read_exact(&mut data).map_err(io)?;
            data.truncate(size);
            data
        } else {
            let buf = reader.fill_buf().map_err(io)?;
            if buf.is_empty() {
                break;
            }
            let data = buf.to_vec();
            reader.consume(data.len());
            data
        };
        if let Some(last) = handle(&data, &mut pending)? {
            return Ok(last);
        }
    }
    Err(ClientError::Protocol(
        "the event stream ended before the capture's outcome".into(),
    ))
}

/// `GET /v1/status`.
pub fn status(socket: &Path, timeout: Duration) -> Result<serde_json::Value, ClientError> {
    let resp = request(socket, "GET", "/v1/status", None, timeout)?;
    if resp.status != 200 {
        return Err(api_error(&resp));
    }
    serde_json::from_slice(&resp.body).map_err(|e| ClientError::Protocol(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_content_length_and_chunked_bodies() {
        let r = parse_response(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nhiXX").unwrap();
        assert_eq!((r.status, r.body.as_slice()), (200, &b"hi"[..]));
        let r = parse_response(b"HTTP/1.1 403 Forbidden\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n").unwrap();
        assert_eq!((r.status, r.body.as_slice()), (403, &b"abcde"[..]));
    }

    #[test]
    fn truncated_or_garbage_responses_are_protocol_errors() {
        for raw in [
            &b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc"[..],
            b"garbage",
            b"SMTP 200 OK\r\n\r\n",
            b"HTTP/1.1 abc OK\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
        ] {
            assert!(
                matches!(parse_response(raw), Err(ClientError::Protocol(_))),
                "{raw:?}"
            );
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
