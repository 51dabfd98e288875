//! Grant delivery over HTTP: the one place the gate sends a token anywhere.
//!
//! Invariants:
//! - Only addresses the SSRF guard allowed are connected to: IP literals
//!   are checked before sending, names are resolved by
//!   [`GuardedResolver`] inside the client (and once before, for a clear
//!   error), and proxies from the environment are ignored so the guarded
//!   address is the one connected to.
//! - Redirects are never followed; each attempt has a 5 s timeout; at most
//!   3 attempts (500 ms, then 1500 ms apart) on a network error, timeout or
//!   5xx; a 3xx or 4xx ends delivery.
//! - With a secret, `X-Obs-Signature-256: sha256=<hex HMAC-SHA256 of the
//!   exact body bytes sent>`.
//! - Nothing here logs or reports the URL's path or query, the secret or
//!   the body: outcomes name the host only.

use std::sync::Arc;
use std::time::Duration;

use ring::hmac;
use serde::Serialize;

use crate::ssrf::{self, GuardedResolver};

/// The signature header.
pub const SIGNATURE_HEADER: &str = "X-Obs-Signature-256";
/// The event name of a grant delivery.
pub const GRANT_EVENT: &str = "autosre.remediation.grant_issued";
/// Attempts at most.
pub const MAX_ATTEMPTS: u32 = 3;
/// Pause before the 2nd and 3rd attempts.
pub const BACKOFF: [Duration; 2] = [Duration::from_millis(500), Duration::from_millis(1500)];
/// Per-attempt timeout.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);

/// A callback: where to deliver, and the optional signing secret.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct Callback {
    /// The URL.
    pub url: String,
    /// HMAC secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
}

/// Why a webhook URL is unusable (checked before anything is stored).
#[derive(Debug, thiserror::Error)]
pub enum UrlError {
    /// Not an absolute http(s) URL with a host.
    #[error("webhookUrl must be an absolute http:// or https:// URL with a host")]
    Malformed,
    /// Credentials in the URL would be stored and sent in clear.
    #[error("webhookUrl must not carry user:password@")]
    Userinfo,
}

/// The host of a valid webhook URL.
pub fn callback_host(url: &str) -> Result<String, UrlError> {
    let u = reqwest::Url::parse(url).map_err(|_| UrlError::Malformed)?;
    if !matches!(u.scheme(), "http" | "https") {
        return Err(UrlError::Malformed);
    }
    if !u.username().is_empty() || u.password().is_some() {
        return Err(UrlError::Userinfo);
    }
    u.host_str()
        .filter(|h| !h.is_empty())
        .map(str::to_string)
        .ok_or(UrlError::Malformed)
}

/// What a delivery did (`grantDelivery` on the response).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Delivery {
    /// A delivery was attempted (a callback existed).
    pub attempted: bool,
    /// A 2xx was received.
    pub delivered: bool,
    /// Attempts made.
    pub attempts: u32,
    /// Host only.
    pub host: String,
    /// Why it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Hex HMAC-SHA256 of `body` under `secret`.
pub fn signature(secret: &str, body: &[u8]) -> String {
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret.as_bytes());
    format!("sha256={}", hex::encode(hmac::sign(&key, body).as_ref()))
}

/// POST `body` to the callback under the guard.
pub async fn deliver(cb: &Callback, body: &[u8], allow_private: bool) -> Delivery {
    let mut out = Delivery {
        attempted: true,
        delivered: false,
        attempts: 0,
        host: callback_host(&cb.url).unwrap_or_default(),
        error: None,
    };
    let url = match reqwest::Url::parse(&cb.url) {
        Ok(u) => u,
        Err(_) => {
            out.error = Some("malformed webhook URL".into());
            return out;
        }
    };
    // Check before the first connection (the resolver checks again at
    // connect time, for every name the client resolves).
    let port = url.port_or_known_default().unwrap_or(0);
    let host = url.host_str().unwrap_or_default();
    let literal = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<std::net::IpAddr>();
    let precheck = match literal {
        Ok(ip) => ssrf::check_all(&out.host, &[(ip, port).into()], allow_private),
        Err(_) => {
            let addrs: Vec<std::net::SocketAddr> = match tokio::net::lookup_host((host, port)).await
            {
                Ok(it) => it.collect(),
                Err(_) => Vec::new(),
            };
            ssrf::check_all(host, &addrs, allow_private)
        }
    };
    if let Err(e) = precheck {
        out.error = Some(format!("refused by the SSRF guard: {e}"));
        return out;
    }
    let client = match reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(ATTEMPT_TIMEOUT)
        .no_proxy()
        .dns_resolver(Arc::new(GuardedResolver { allow_private }))
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            out.error = Some(format!("HTTP client: {}", e.without_url()));
            return out;
        }
    };
    let sig = cb.secret.as_deref().map(|s| signature(s, body));
    for attempt in 0..MAX_ATTEMPTS {
        if attempt > 0 {
            tokio::time::sleep(BACKOFF[(attempt - 1) as usize]).await;
        }
        out.attempts = attempt + 1;
        let mut req = client
            .post(url.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_vec());
        if let Some(s) = &sig {
            req = req.header(SIGNATURE_HEADER, s);
        }
        match req.send().await {
            Ok(resp) => {
                let st = resp.status();
                if st.is_success() {
                    out.delivered = true;
                    out.error = None;
                    return out;
                }
                if st.is_redirection() {
                    out.error = Some(format!("HTTP {} (redirects are not followed)", st.as_u16()));
                    return out;
                }
                out.error = Some(format!("HTTP {}", st.as_u16()));
                if st.is_client_error() {
                    return out;
                }
            }
            Err(e) => {
                let e = e.without_url();
                out.error = Some(if e.is_timeout() {
                    format!("timed out after {} s", ATTEMPT_TIMEOUT.as_secs())
                } else {
                    format!("network error: {e}")
                });
            }
        }
    }
    out
}
