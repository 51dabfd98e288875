//! A typed client of the store's HTTP API, for the query CLI
//! (`pstack-store envelopes|subjects|unknowns|receipts`) and anything else
//! that reads the store. One HTTP client (reqwest, rustls for `https://`).
//!
//! Invariants: the API key is sent only in the `Authorization` header and
//! never appears in an error or a log; every request has a timeout; an
//! answer that is not 2xx becomes a typed [`ClientError`] carrying the
//! store's own `error.code` and message.

use std::time::Duration;

use serde_json::Value;

/// Why a query failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The URL is not an http(s) URL.
    #[error("--url {0:?} is not an http:// or https:// URL")]
    BadUrl(String),
    /// A CA certificate could not be read or parsed.
    #[error("--ca-cert {path}: {message}")]
    CaCert {
        /// The file.
        path: String,
        /// Why.
        message: String,
    },
    /// The store could not be reached (connection, TLS, timeout).
    #[error("cannot reach the store at {url}: {message}")]
    Unreachable {
        /// The base URL.
        url: String,
        /// The transport's reason, with its causes.
        message: String,
    },
    /// The store answered 404.
    #[error("not found: {message}")]
    NotFound {
        /// The store's `error.code`.
        code: String,
        /// The store's message.
        message: String,
    },
    /// The store refused the query as malformed (400, 422).
    #[error("the store refused the query ({code}): {message}")]
    BadQuery {
        /// The store's `error.code`.
        code: String,
        /// The store's message.
        message: String,
    },
    /// The store refused the key (401, 403).
    #[error("the store refused the API key ({code}): {message}")]
    Unauthorized {
        /// The store's `error.code`.
        code: String,
        /// The store's message.
        message: String,
    },
    /// Any other non-2xx answer.
    #[error("the store answered HTTP {status} ({code}): {message}")]
    Status {
        /// HTTP status.
        status: u16,
        /// The store's `error.code`.
        code: String,
        /// The store's message.
        message: String,
    },
    /// A 2xx answer that is not the JSON expected.
    #[error("the store's answer is not the JSON expected: {0}")]
    Decode(String),
}

/// Connection settings of [`StoreClient`].
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Base URL, e.g. `http://127.0.0.1:7470` or `https://store.example:443`.
    pub url: String,
    /// `psk_...` key, sent as `Authorization: Bearer`.
    pub api_key: Option<String>,
    /// PEM of a CA to trust besides the public roots (a private CA in front of the store).
    pub ca_cert_pem: Option<(String, Vec<u8>)>,
    /// Per-request timeout.
    pub timeout: Duration,
}

/// A client of one store.
#[derive(Debug, Clone)]
pub struct StoreClient {
    base: String,
    key: Option<String>,
    http: reqwest::Client,
}

/// The full chain of a transport error (reqwest hides the TLS reason in its sources).
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut next = e.source();
    while let Some(s) = next {
        let text = s.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        next = s.source();
    }
    parts.join(": ")
}

impl StoreClient {
    /// Build a client; nothing is sent yet.
    pub fn new(config: &ClientConfig) -> Result<StoreClient, ClientError> {
        let base = config.url.trim_end_matches('/').to_string();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(ClientError::BadUrl(config.url.clone()));
        }
        let mut builder = reqwest::Client::builder()
            .timeout(config.timeout)
            .connect_timeout(config.timeout.min(Duration::from_secs(10)))
            .user_agent(concat!("pstack-store/", env!("CARGO_PKG_VERSION")));
        if let Some((path, pem)) = &config.ca_cert_pem {
            let cert = reqwest::Certificate::from_pem(pem).map_err(|e| ClientError::CaCert {
                path: path.clone(),
                message: chain(&e),
            })?;
            builder = builder.add_root_certificate(cert);
        }
        let http = builder.build().map_err(|e| ClientError::Unreachable {
            url: base.clone(),
            message: chain(&e),
        })?;
        Ok(StoreClient {
            base,
            key: config.api_key.clone(),
            http,
        })
    }

    async fn get(
        &self,
        path: &str,
        query: &[(&str, String)],
    ) -> Result<reqwest::Response, ClientError> {
        let req = self.http.get(format!("{}{path}", self.base)).query(query);
        self.send(req).await
    }

    /// Send with the key; a non-2xx answer becomes a [`ClientError`] (with
    /// the refused field, when the store names one).
    async fn send(
        &self,
        mut req: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, ClientError> {
        if let Some(k) = &self.key {
            req = req.bearer_auth(k);
        }
        let resp = req.send().await.map_err(|e| ClientError::Unreachable {
            url: self.base.clone(),
            message: chain(&e),
        })?;
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        let code = body["error"]["code"].as_str().unwrap_or("").to_string();
        let mut message = body["error"]["message"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| status.canonical_reason().unwrap_or("").to_string());
        if let Some(field) = body["error"]["field"].as_str() {
            message.push_str(&format!(" (field {field})"));
        }
        Err(match status.as_u16() {
            404 => ClientError::NotFound { code, message },
            400 | 422 => ClientError::BadQuery { code, message },
            401 | 403 => ClientError::Unauthorized { code, message },
            s => ClientError::Status {
                status: s,
                code,
                message,
            },
        })
    }

    /// POST a JSON body; the JSON answer.
    pub async fn post_json(&self, path: &str, body: &Value) -> Result<Value, ClientError> {
        let req = self.http.post(format!("{}{path}", self.base)).json(body);
        self.send(req)
            .await?
            .json()
            .await
            .map_err(|e| ClientError::Decode(chain(&e)))
    }

    /// GET a JSON answer.
    pub async fn get_json(
        &self,
        path: &str,
        query: &[(&str, String)],
    ) -> Result<Value, ClientError> {
        self.json(path, query).await
    }

    async fn json(&self, path: &str, query: &[(&str, String)]) -> Result<Value, ClientError> {
        self.get(path, query)
            .await?
            .json()
            .await
            .map_err(|e| ClientError::Decode(chain(&e)))
    }

    /// The stored bytes of an envelope (exactly as shipped).
    pub async fn envelope(&self, digest: &str) -> Result<Vec<u8>, ClientError> {
        let resp = self.get(&format!("/v1/envelopes/{digest}"), &[]).await?;
        resp.bytes()
            .await
            .map(|b| b.to_vec())
            .map_err(|e| ClientError::Decode(chain(&e)))
    }

    /// The compact handoff of an envelope.
    pub async fn handoff(&self, digest: &str) -> Result<Value, ClientError> {
        self.json(&format!("/v1/handoff/{digest}"), &[]).await
    }

    /// A subject's history, newest first: `{"items": [...], "next": cursor}`.
    /// `selector` is `subject=<key>` or `kind=` plus identity fields.
    pub async fn history(
        &self,
        selector: &[(String, String)],
        limit: u32,
        before: Option<&str>,
    ) -> Result<Value, ClientError> {
        let mut q: Vec<(&str, String)> = selector
            .iter()
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect();
        q.push(("limit", limit.to_string()));
        if let Some(b) = before {
            q.push(("before", b.to_string()));
        }
        self.json("/v1/subjects", &q).await
    }

    /// The fleet's unknowns: `{"items": [...]}`.
    pub async fn unknowns(
        &self,
        open_only: bool,
        owner: Option<&str>,
        limit: u32,
        offset: u64,
    ) -> Result<Value, ClientError> {
        let mut q = vec![
            ("open", open_only.to_string()),
            ("limit", limit.to_string()),
            ("offset", offset.to_string()),
        ];
        if let Some(o) = owner {
            q.push(("owner", o.to_string()));
        }
        self.json("/v1/unknowns", &q).await
    }

    /// A subject's receipt chain: `{"items": [...]}`.
    pub async fn receipts(&self, subject_key: &str) -> Result<Value, ClientError> {
        self.json("/v1/receipts", &[("subject", subject_key.to_string())])
            .await
    }
}
