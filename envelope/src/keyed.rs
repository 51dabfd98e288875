//! Keyed digests of secret-bearing text (command-line arguments, environment
//! blocks). An unkeyed SHA-256 of `--password=hunter2` lets anyone who can
//! read an envelope confirm a guessed password offline; an HMAC-SHA-256 under
//! a key that never leaves the host does not, while two captures on the same
//! host (same key) still compare equal.
//!
//! Invariants: the key is 32 random bytes; its `Debug` never shows it; a
//! digest is `hmac-sha256:` + 64 lowercase hex digits.

use hmac::{Hmac, Mac};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::Sha256;

/// Prefix of a keyed digest.
pub const HMAC_PREFIX: &str = "hmac-sha256:";

/// Length of a key in bytes.
pub const KEY_BYTES: usize = 32;

/// A per-host digest key (kept by `pstackd` in its state directory).
#[derive(Clone, PartialEq, Eq)]
pub struct DigestKey([u8; KEY_BYTES]);

impl std::fmt::Debug for DigestKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DigestKey(<redacted>)")
    }
}

/// A key that is not 32 bytes of hex.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a digest key is {KEY_BYTES} bytes written as {} hex digits; got {got} characters", KEY_BYTES * 2)]
pub struct BadDigestKey {
    /// Characters seen (after trimming).
    pub got: usize,
}

impl DigestKey {
    /// A key of these bytes.
    pub fn from_bytes(bytes: [u8; KEY_BYTES]) -> DigestKey {
        DigestKey(bytes)
    }

    /// Parse the hex form (surrounding whitespace ignored).
    pub fn from_hex(text: &str) -> Result<DigestKey, BadDigestKey> {
        let text = text.trim();
        let mut out = [0u8; KEY_BYTES];
        hex::decode_to_slice(text, &mut out).map_err(|_| BadDigestKey { got: text.len() })?;
        Ok(DigestKey(out))
    }

    /// The hex form (what the key file holds).
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// `hmac-sha256:<hex>` of `bytes` under this key.
    pub fn digest(&self, bytes: &[u8]) -> String {
        // HMAC accepts keys of any length: new_from_slice cannot fail here.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
        mac.update(bytes);
        format!("{HMAC_PREFIX}{}", hex::encode(mac.finalize().into_bytes()))
    }
}

impl Serialize for DigestKey {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for DigestKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<DigestKey, D::Error> {
        let text = String::deserialize(d)?;
        DigestKey::from_hex(&text).map_err(serde::de::Error::custom)
    }
}

/// Whether `s` is `hmac-sha256:` + 64 lowercase hex digits.
pub fn is_hmac_digest(s: &str) -> bool {
    s.strip_prefix(HMAC_PREFIX).is_some_and(|h| {
        h.len() == 64
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_openssl_hmac_sha256() {
        // The oracle is OpenSSL, not this code: see OPENSSL_0101_JEFE.
        let key = DigestKey::from_bytes([1u8; KEY_BYTES]);
        assert_eq!(
            key.digest(b"what do ya want for nothing?"),
            format!("{HMAC_PREFIX}{}", OPENSSL_0101_JEFE)
        );
    }

    /// `printf 'what do ya want for nothing?' | openssl dgst -sha256 -mac HMAC -macopt hexkey:$(printf '01%.0s' {1..32})`
    const OPENSSL_0101_JEFE: &str =
        "8cb814d427f5ec0173e9677fdfa2a0131048f18ebdca538dac52b4d8f977708b";

    #[test]
    fn debug_hides_the_key_and_hex_round_trips() {
        let key = DigestKey::from_bytes([0xab; KEY_BYTES]);
        assert_eq!(format!("{key:?}"), "DigestKey(<redacted>)");
        assert_eq!(DigestKey::from_hex(&key.to_hex()).unwrap(), key);
        assert!(DigestKey::from_hex("abcd").is_err());
        assert!(is_hmac_digest(&key.digest(b"x")));
        assert_ne!(
            key.digest(b"x"),
            DigestKey::from_bytes([0xac; KEY_BYTES]).digest(b"x")
        );
    }
}
