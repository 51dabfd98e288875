//! Human operators of the approval page: argon2id password hashes, session
//! ids and CSRF tokens.
//!
//! Invariants:
//! - Passwords are stored only as argon2id PHC strings (random 16-byte salt,
//!   the crate's default cost); verification is the crate's constant-time
//!   comparison and runs on the blocking pool (it is slow on purpose).
//! - A session id is 32 bytes from the OS CSPRNG; the database keeps only
//!   its SHA-256, so a read of the database yields no usable session. The
//!   CSRF token (another 32 random bytes) is per session and must accompany
//!   every state-changing request as `X-CSRF-Token`.
//! - Human sessions are distinct from node API keys: neither stands in for
//!   the other.

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use sha2::{Digest, Sha256};

/// Session lifetime.
pub const SESSION_NS: i64 = 12 * 3600 * 1_000_000_000;
/// Shortest password `users create` accepts.
pub const MIN_PASSWORD_CHARS: usize = 12;
/// The session cookie's name.
pub const COOKIE: &str = "pstack_session";

/// Failed logins allowed per username within [`THROTTLE_WINDOW_NS`].
pub const MAX_LOGIN_FAILURES: u32 = 5;
/// The throttle's window.
pub const THROTTLE_WINDOW_NS: i64 = 15 * 60 * 1_000_000_000;
const THROTTLE_MAX_NAMES: usize = 10_000;

/// Failed logins per username in memory (per server process): after
/// [`MAX_LOGIN_FAILURES`] within the window, that name is refused until the
/// window since its first failure passes; a success clears it. Bounded: past
/// 10,000 names, entries outside their window are dropped first, then all.
#[derive(Debug, Clone, Default)]
pub struct LoginThrottle {
    failures: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, (u32, i64)>>>,
}

impl LoginThrottle {
    fn map(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, (u32, i64)>> {
        self.failures.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `user` is refused now: the ns until it is not, if so.
    pub fn blocked(&self, user: &str, now_ns: i64) -> Option<i64> {
        let m = self.map();
        let (n, since) = m.get(user)?;
        let left = since + THROTTLE_WINDOW_NS - now_ns;
        (*n >= MAX_LOGIN_FAILURES && left > 0).then_some(left)
    }

    /// Count a failure.
    pub fn failed(&self, user: &str, now_ns: i64) {
        let mut m = self.map();
        if m.len() >= THROTTLE_MAX_NAMES && !m.contains_key(user) {
            m.retain(|_, (_, since)| now_ns - *since < THROTTLE_WINDOW_NS);
            if m.len() >= THROTTLE_MAX_NAMES {
                m.clear();
            }
        }
        let e = m.entry(user.to_string()).or_insert((0, now_ns));
        if now_ns - e.1 >= THROTTLE_WINDOW_NS {
            *e = (0, now_ns);
        }
        e.0 += 1;
    }

    /// A success clears the name.
    pub fn succeeded(&self, user: &str) {
        self.map().remove(user);
    }
}

/// Failures of operator credentials.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    /// The random source failed.
    #[error("random source failed: {0}")]
    Random(String),
    /// Hashing failed.
    #[error("password hashing failed: {0}")]
    Hash(String),
    /// Refused input.
    #[error("{0}")]
    Invalid(String),
}

fn random32() -> Result<[u8; 32], OperatorError> {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b).map_err(|e| OperatorError::Random(e.to_string()))?;
    Ok(b)
}

/// Check a new username and password.
pub fn validate(username: &str, password: &str) -> Result<(), OperatorError> {
    if username.is_empty()
        || username.len() > 64
        || !username
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-@".contains(&b))
    {
        return Err(OperatorError::Invalid(
            "username: 1-64 of A-Z a-z 0-9 . _ - @".into(),
        ));
    }
    if password.chars().count() < MIN_PASSWORD_CHARS {
        return Err(OperatorError::Invalid(format!(
            "password: at least {MIN_PASSWORD_CHARS} characters"
        )));
    }
    Ok(())
}

/// The argon2id PHC string of `password`.
pub fn hash_password(password: &str) -> Result<String, OperatorError> {
    let salt_bytes = random32()?;
    let salt = SaltString::encode_b64(&salt_bytes[..16])
        .map_err(|e| OperatorError::Hash(e.to_string()))?;
    argon2::Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| OperatorError::Hash(e.to_string()))
}

/// Whether `password` matches the stored PHC string.
pub fn verify_password(password: &str, phc: &str) -> bool {
    match PasswordHash::new(phc) {
        Ok(h) => argon2::Argon2::default()
            .verify_password(password.as_bytes(), &h)
            .is_ok(),
        Err(_) => false,
    }
}

/// A fresh session: (cookie value, its stored hash, CSRF token).
pub fn new_session() -> Result<(String, String, String), OperatorError> {
    let id = hex::encode(random32()?);
    let hash = session_hash(&id);
    let csrf = hex::encode(random32()?);
    Ok((id, hash, csrf))
}

/// The stored form of a session cookie value.
pub fn session_hash(id: &str) -> String {
    hex::encode(Sha256::digest(id.as_bytes()))
}

/// The session cookie's value in a `Cookie` header.
pub fn cookie_value(header: &str) -> Option<&str> {
    header.split(';').find_map(|kv| {
        let (k, v) = kv.trim().split_once('=')?;
        (k == COOKIE && !v.is_empty()).then_some(v)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_verify_and_cookies_parse() {
        let h = hash_password("correct horse battery").unwrap();
        assert!(h.starts_with("$argon2id$"));
        assert!(verify_password("correct horse battery", &h));
        assert!(!verify_password("correct horse batterz", &h));
        assert!(validate("ops", "short").is_err());
        assert!(validate("bad name", "long enough password").is_err());
        assert_eq!(cookie_value("a=b; pstack_session=xyz; c=d"), Some("xyz"));
        assert_eq!(cookie_value("pstack_sessionx=1"), None);
    }
}
