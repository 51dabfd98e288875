//! Human operators of the approval page: argon2id password hashes, session
//! ids and CSRF tokens.
//!
//! Invariants:
//! - Passwords are stored only as argon2id PHC strings (random 16-byte salt,
//!   the crate's default cost); verification is the crate's constant-time
//!   comparison and runs on the blocking pool behind
//!   [`crate::login::PasswordVerifier`] (it is slow and takes 19 MiB on
//!   purpose). An unknown name is verified against [`dummy_phc`], a hash of
//!   the same cost, so it costs what a known name costs.
//! - A session id is 32 bytes from the OS CSPRNG; the database keeps only
//!   its SHA-256, so a read of the database yields no usable session.
//! - The CSRF token of a session is derived from its id
//!   (`SHA-256("pstack-csrf-v1\0" || id)`, [`csrf_token`]) and the database
//!   keeps only the token's SHA-256 ([`csrf_hash`]): a read of the database
//!   yields neither the session nor its token, and the page can be handed
//!   its token again after a reload from the cookie alone. The token must
//!   accompany every state-changing request as `X-CSRF-Token`.
//! - A disabled operator cannot log in and none of their sessions
//!   authenticates; disabling and changing a password delete the
//!   operator's sessions (`db::operators`).
//! - Human sessions are distinct from node API keys: neither stands in for
//!   the other.

use argon2::password_hash::{PasswordHash, PasswordHasher, SaltString};
use sha2::{Digest, Sha256};

/// Session lifetime.
pub const SESSION_NS: i64 = 12 * 3600 * 1_000_000_000;
/// Shortest password `users create` accepts.
pub const MIN_PASSWORD_CHARS: usize = 12;
/// The session cookie's name.
pub const COOKIE: &str = "pstack_session";

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

/// Whether `username` is one `users create` could have made (1-64 of
/// A-Z a-z 0-9 . _ - @).
pub fn valid_username(username: &str) -> bool {
    !username.is_empty()
        && username.len() <= 64
        && username
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-@".contains(&b))
}

/// Check a new username and password.
pub fn validate(username: &str, password: &str) -> Result<(), OperatorError> {
    if !valid_username(username) {
        return Err(OperatorError::Invalid(
            "username: 1-64 of A-Z a-z 0-9 . _ - @".into(),
        ));
    }
    validate_password(password)
}

/// Check a new password (`users create`, `users passwd`).
pub fn validate_password(password: &str) -> Result<(), OperatorError> {
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

/// Whether `password` matches the stored PHC string. The argon2 memory
/// (19 MiB at the default cost) is mapped for this call alone and unmapped
/// when it returns (`MappedBlocks`), so RSS drops back at once whatever
/// thread verified.
pub fn verify_password(password: &str, phc: &str) -> bool {
    let Ok(hash) = PasswordHash::new(phc) else {
        return false;
    };
    let (Some(salt), Some(expected)) = (hash.salt, hash.hash) else {
        return false;
    };
    let Ok(algorithm) = argon2::Algorithm::try_from(hash.algorithm) else {
        return false;
    };
    let version = match hash.version.map(argon2::Version::try_from) {
        None => argon2::Version::default(),
        Some(Ok(v)) => v,
        Some(Err(_)) => return false,
    };
    let Ok(params) = argon2::Params::try_from(&hash) else {
        return false;
    };
    let mut salt_buf = [0u8; 64];
    let Ok(salt) = salt.decode_b64(&mut salt_buf) else {
        return false;
    };
    let Some(mut memory) = MappedBlocks::new(params.block_count()) else {
        return false;
    };
    let argon = argon2::Argon2::new(algorithm, version, params);
    let computed = argon2::password_hash::Output::init_with(expected.len(), |out| {
        argon
            .hash_password_into_with_memory(password.as_bytes(), salt, out, memory.blocks())
            .map_err(|_| argon2::password_hash::Error::Crypto)
    });
    // `Output`'s equality is constant-time.
    computed.is_ok_and(|c| c == expected)
}

/// Anonymous memory for argon2's blocks, mapped on creation and unmapped on
/// drop. Through malloc, the first freed 19 MiB block raises glibc's mmap
/// threshold, later blocks land in per-thread arenas, and a non-main
/// arena's top chunk is returned neither by `free` (the trim threshold rose
/// too) nor by `malloc_trim`: a login burst left ~19 MiB resident per
/// blocking thread.
struct MappedBlocks {
    ptr: std::ptr::NonNull<argon2::Block>,
    len: usize,
}

impl MappedBlocks {
    /// `len` zeroed blocks, or `None` if the kernel refuses the mapping.
    fn new(len: usize) -> Option<MappedBlocks> {
        let bytes = len.checked_mul(std::mem::size_of::<argon2::Block>())?;
        if bytes == 0 {
            return None;
        }
        // SAFETY: an anonymous private mapping of `bytes` at an address the
        // kernel picks; no existing memory is touched.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return None;
        }
        Some(MappedBlocks {
            ptr: std::ptr::NonNull::new(ptr.cast())?,
            len,
        })
    }

    fn blocks(&mut self) -> &mut [argon2::Block] {
        // SAFETY: the mapping is `len` blocks long, page-aligned (Block needs
        // 64), zero-filled by the kernel (all zeros is `Block::default()`, a
        // plain array of u64), owned by `self` alone and alive until drop;
        // `&mut self` makes the slice the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for MappedBlocks {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `new` made; no slice into it
        // outlives `self`.
        unsafe {
            libc::munmap(
                self.ptr.as_ptr().cast(),
                self.len * std::mem::size_of::<argon2::Block>(),
            );
        }
    }
}

/// The PHC string an unknown name is verified against: a hash of a random
/// password at the same cost as [`hash_password`]'s, made once per process.
/// `None` only if the random source failed.
pub fn dummy_phc() -> Option<&'static str> {
    static DUMMY: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    DUMMY
        .get_or_init(|| {
            let password = hex::encode(random32().ok()?);
            hash_password(&password).ok()
        })
        .as_deref()
}

/// A fresh session: (cookie value, its stored hash, CSRF token).
pub fn new_session() -> Result<(String, String, String), OperatorError> {
    let id = hex::encode(random32()?);
    let hash = session_hash(&id);
    let csrf = csrf_token(&id);
    Ok((id, hash, csrf))
}

/// The CSRF token of the session whose cookie value is `id`.
pub fn csrf_token(id: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"pstack-csrf-v1\0");
    h.update(id.as_bytes());
    hex::encode(h.finalize())
}

/// The stored form of a CSRF token.
pub fn csrf_hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
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

    /// Unknown names must cost what known ones cost: the dummy hash has the
    /// algorithm, version and parameters of a real one.
    #[test]
    fn the_dummy_hash_costs_what_a_real_one_costs() {
        let real = hash_password("correct horse battery").unwrap();
        let dummy = dummy_phc().unwrap();
        let shape = |phc: &str| {
            let h = PasswordHash::new(phc).unwrap();
            (
                h.algorithm.to_string(),
                h.version,
                h.params.to_string(),
                h.hash.map(|o| o.len()),
            )
        };
        assert_eq!(shape(&real), shape(dummy));
        assert!(!verify_password("correct horse battery", dummy));
    }

    /// The mapped-memory verifier agrees with the argon2 crate's own, on
    /// right and wrong passwords, other parameters, and broken strings.
    #[test]
    fn mapped_verification_agrees_with_the_crates_verifier() {
        use argon2::password_hash::PasswordVerifier;
        let crate_says = |pw: &str, phc: &str| {
            argon2::Argon2::default()
                .verify_password(pw.as_bytes(), &PasswordHash::new(phc).unwrap())
                .is_ok()
        };
        let default = hash_password("correct horse battery").unwrap();
        let salt = SaltString::encode_b64(b"0123456789abcdef").unwrap();
        let small = argon2::Argon2::new(
            argon2::Algorithm::Argon2i,
            argon2::Version::V0x10,
            argon2::Params::new(64, 3, 2, Some(24)).unwrap(),
        )
        .hash_password(b"correct horse battery", &salt)
        .unwrap()
        .to_string();
        for phc in [&default, &small] {
            for pw in ["correct horse battery", "correct horse batterz", ""] {
                assert_eq!(
                    verify_password(pw, phc),
                    crate_says(pw, phc),
                    "{pw:?} {phc}"
                );
            }
        }
        assert!(verify_password("correct horse battery", &small));
        assert!(!verify_password("x", "not a phc string"));
        assert!(!verify_password(
            "x",
            "$argon2id$v=19$m=19456,t=2,p=1$c2FsdHNhbHQ"
        ));
    }

    #[test]
    fn csrf_tokens_derive_from_the_session_and_are_stored_hashed() {
        let (id, hash, csrf) = new_session().unwrap();
        assert_eq!(csrf, csrf_token(&id));
        assert_ne!(csrf, id);
        assert_ne!(csrf_hash(&csrf), csrf);
        assert_ne!(csrf_hash(&csrf), hash);
        assert_eq!(csrf_hash(&csrf).len(), 64);
    }
}
