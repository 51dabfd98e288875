//! API keys: how nodes authenticate to the store.
//!
//! A key reads `psk_<id>_<secret>`: `id` is 16 lowercase hex digits (8 random
//! bytes) that name the key in listings, logs and the `key_id` recorded on
//! every envelope; `secret` is 64 hex digits (32 random bytes from the kernel's
//! CSPRNG). The store keeps only `sha256(whole key)`, never the key.
//!
//! Why SHA-256 and not a password hash (argon2, scrypt): slow hashes defend
//! *low-entropy* secrets against offline guessing. A 256-bit random secret
//! cannot be guessed whatever the hash speed, so a fast hash loses nothing and
//! keeps per-request authentication cheap (one indexed lookup, one hash, one
//! constant-time compare). A stolen database therefore yields no usable key.
//!
//! The plaintext key is shown once, by `pstack-store keys create`, and is never
//! logged. Revocation is immediate: every request looks its key up afresh.

use sha2::{Digest, Sha256};

/// Prefix of every key.
pub const KEY_PREFIX: &str = "psk_";

/// A freshly generated key: the plaintext (shown once) and what is stored.
#[derive(Debug)]
pub struct NewKey {
    /// Public id.
    pub id: String,
    /// The full key, `psk_<id>_<secret>`. Give it to the node; never store it.
    pub plaintext: String,
    /// Hex SHA-256 of `plaintext`.
    pub hash: String,
}

/// Why a key could not be generated or parsed.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The kernel's random source failed.
    #[error("cannot read random bytes: {0}")]
    Random(String),
    /// A presented key is not of the form `psk_<16 hex>_<64 hex>`.
    #[error("malformed API key (expected psk_<16 hex>_<64 hex>)")]
    Malformed,
}

/// Generate a new key.
pub fn generate() -> Result<NewKey, KeyError> {
    let mut id = [0u8; 8];
    let mut secret = [0u8; 32];
    getrandom::fill(&mut id).map_err(|e| KeyError::Random(e.to_string()))?;
    getrandom::fill(&mut secret).map_err(|e| KeyError::Random(e.to_string()))?;
    let id = hex::encode(id);
    let plaintext = format!("{KEY_PREFIX}{id}_{}", hex::encode(secret));
    let hash = hash_key(&plaintext);
    Ok(NewKey {
        id,
        plaintext,
        hash,
    })
}

/// Hex SHA-256 of a presented key.
pub fn hash_key(plaintext: &str) -> String {
    hex::encode(Sha256::digest(plaintext.as_bytes()))
}

/// The public id of a presented key, if it has the right shape.
pub fn parse_id(plaintext: &str) -> Result<&str, KeyError> {
    let rest = plaintext
        .strip_prefix(KEY_PREFIX)
        .ok_or(KeyError::Malformed)?;
    let (id, secret) = rest.split_once('_').ok_or(KeyError::Malformed)?;
    let hex_of = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    if hex_of(id, 16) && hex_of(secret, 64) {
        Ok(id)
    } else {
        Err(KeyError::Malformed)
    }
}

/// Compare two hex hashes without an early exit on the first difference.
pub fn hashes_equal(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_parse_and_differ() {
        let a = generate().unwrap();
        let b = generate().unwrap();
        assert_ne!(a.plaintext, b.plaintext);
        assert_eq!(parse_id(&a.plaintext).unwrap(), a.id);
        assert!(hashes_equal(&hash_key(&a.plaintext), &a.hash));
        assert!(!hashes_equal(&a.hash, &b.hash));
    }

    #[test]
    fn malformed_keys_are_refused() {
        for bad in [
            "",
            "psk_",
            "psk_zz_zz",
            "Bearer x",
            &format!("psk_{}_{}", "a".repeat(16), "b".repeat(63)),
        ] {
            assert!(parse_id(bad).is_err(), "{bad}");
        }
    }
}
