//! Grant tokens and sealed webhook callbacks.
//!
//! Invariants:
//! - A grant token is `rgt_` + 32 bytes from the operating system's CSPRNG
//!   (hex). The store keeps only HMAC-SHA256(grant key, token); the token
//!   itself lives in the one response that mints it.
//! - Token checks compare tags in constant time (`ring::hmac::verify`).
//! - Webhook URLs and secrets are sealed with ChaCha20-Poly1305 under a key
//!   derived from the store's gate key, with a fresh random nonce per seal;
//!   an opened seal is authenticated, so a row edited by hand fails to open
//!   rather than delivering a grant somewhere else.
//! - The two keys are derived from one configured master key with distinct
//!   labels, so the hash key never doubles as the sealing key.
//! - The key's fingerprint (what replicas compare through the database,
//!   `super::shared_key`) is a third derivation with its own label: it
//!   identifies the key without revealing it or either derived key.

use ring::aead::{self, Aad, CHACHA20_POLY1305, LessSafeKey, Nonce, UnboundKey};
use ring::hmac;

/// Bytes of the fingerprint shown (128 bits: a collision between two
/// operators' keys is not a concern).
const FINGERPRINT_BYTES: usize = 16;

/// Grant-token prefix.
pub const TOKEN_PREFIX: &str = "rgt_";

/// Failures of the key material.
#[derive(Debug, thiserror::Error)]
pub enum KeyMaterialError {
    /// The operating system's random source failed.
    #[error("random source failed: {0}")]
    Random(String),
    /// A gate key file is not 64 hex digits.
    #[error("gate key must be 64 hex digits (32 bytes)")]
    BadKey,
    /// A sealed value did not open (wrong key or edited row).
    #[error("a sealed callback did not open: wrong gate key or a modified row")]
    Unseal,
}

/// The store's gate keys (derived from one 32-byte master key).
pub struct GateKeys {
    hash: hmac::Key,
    seal: LessSafeKey,
    fingerprint: String,
}

impl std::fmt::Debug for GateKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GateKeys(fingerprint {})", self.fingerprint)
    }
}

fn random<const N: usize>() -> Result<[u8; N], KeyMaterialError> {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).map_err(|e| KeyMaterialError::Random(e.to_string()))?;
    Ok(b)
}

impl GateKeys {
    /// Keys derived from `master`.
    pub fn from_master(master: &[u8; 32]) -> GateKeys {
        let m = hmac::Key::new(hmac::HMAC_SHA256, master);
        let hash = hmac::sign(&m, b"pstack-store gate: grant token hash");
        let seal = hmac::sign(&m, b"pstack-store gate: webhook callback seal");
        let fingerprint = hmac::sign(&m, b"pstack-store gate: key fingerprint");
        let unbound = UnboundKey::new(&CHACHA20_POLY1305, seal.as_ref())
            .unwrap_or_else(|_| unreachable!("a 32-byte key fits ChaCha20-Poly1305"));
        GateKeys {
            hash: hmac::Key::new(hmac::HMAC_SHA256, hash.as_ref()),
            seal: LessSafeKey::new(unbound),
            fingerprint: hex::encode(&fingerprint.as_ref()[..FINGERPRINT_BYTES]),
        }
    }

    /// The key's fingerprint: 32 hex digits naming this master key (equal
    /// keys, equal fingerprints), from which the key cannot be recovered.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// Keys from a master key written as 64 hex digits.
    pub fn from_hex(text: &str) -> Result<GateKeys, KeyMaterialError> {
        let bytes = hex::decode(text.trim()).map_err(|_| KeyMaterialError::BadKey)?;
        let master: [u8; 32] = bytes.try_into().map_err(|_| KeyMaterialError::BadKey)?;
        Ok(GateKeys::from_master(&master))
    }

    /// Keys from a fresh random master key (nothing sealed with them
    /// survives a restart).
    pub fn ephemeral() -> Result<GateKeys, KeyMaterialError> {
        Ok(GateKeys::from_master(&random::<32>()?))
    }

    /// Mint a grant token: (token, stored hash).
    pub fn mint_token(&self) -> Result<(String, String), KeyMaterialError> {
        let token = format!("{TOKEN_PREFIX}{}", hex::encode(random::<32>()?));
        let hash = self.token_hash(&token);
        Ok((token, hash))
    }

    /// The stored form of `token`.
    pub fn token_hash(&self, token: &str) -> String {
        hex::encode(hmac::sign(&self.hash, token.as_bytes()).as_ref())
    }

    /// Whether `token` is the one whose hash is `stored` (constant time).
    pub fn token_matches(&self, token: &str, stored: &str) -> bool {
        match hex::decode(stored) {
            Ok(tag) => hmac::verify(&self.hash, token.as_bytes(), &tag).is_ok(),
            Err(_) => false,
        }
    }

    /// Seal `plain`: hex(nonce ‖ ciphertext ‖ tag).
    pub fn seal(&self, plain: &[u8]) -> Result<String, KeyMaterialError> {
        let nonce = random::<12>()?;
        let mut buf = plain.to_vec();
        self.seal
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(b"callback"),
                &mut buf,
            )
            .map_err(|_| KeyMaterialError::Unseal)?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&buf);
        Ok(hex::encode(out))
    }

    /// Open a value made by [`GateKeys::seal`].
    pub fn open(&self, sealed: &str) -> Result<Vec<u8>, KeyMaterialError> {
        let bytes = hex::decode(sealed).map_err(|_| KeyMaterialError::Unseal)?;
        if bytes.len() < 12 + aead::MAX_TAG_LEN {
            return Err(KeyMaterialError::Unseal);
        }
        let (nonce, rest) = bytes.split_at(12);
        let nonce =
            Nonce::try_assume_unique_for_key(nonce).map_err(|_| KeyMaterialError::Unseal)?;
        let mut buf = rest.to_vec();
        let plain = self
            .seal
            .open_in_place(nonce, Aad::from(b"callback"), &mut buf)
            .map_err(|_| KeyMaterialError::Unseal)?;
        Ok(plain.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_hash_and_seals_round_trip() {
        let k = GateKeys::ephemeral().unwrap();
        let (t, h) = k.mint_token().unwrap();
        assert!(t.starts_with("rgt_") && t.len() == 4 + 64);
        assert!(k.token_matches(&t, &h));
        assert!(!k.token_matches(&format!("{t}x"), &h));
        assert!(!h.contains(&t[4..]));
        let s = k.seal(b"https://example.test/x").unwrap();
        assert_eq!(k.open(&s).unwrap(), b"https://example.test/x");
        let mut bad = s.clone().into_bytes();
        let last = bad.len() - 1;
        bad[last] = if bad[last] == b'0' { b'1' } else { b'0' };
        assert!(k.open(std::str::from_utf8(&bad).unwrap()).is_err());
        let other = GateKeys::ephemeral().unwrap();
        assert!(other.open(&s).is_err());
        // Fingerprints: equal for one master key, distinct otherwise, and
        // not any of the derived keys' material.
        let master = [7u8; 32];
        let (a, b) = (
            GateKeys::from_master(&master),
            GateKeys::from_master(&master),
        );
        assert_eq!(a.fingerprint(), b.fingerprint());
        assert_eq!(a.fingerprint().len(), 32);
        assert_ne!(a.fingerprint(), other.fingerprint());
        assert!(!format!("{a:?}").contains(&hex::encode(master)));
    }
}
