//! How an envelope's bytes are kept in `envelopes.body`: as received, or as
//! one LZ4 block of them, named by `envelopes.body_codec`.
//!
//! Invariants:
//! - **Exact bytes back.** [`decode`] returns exactly the bytes [`compress`]
//!   was given, whatever the codec; a body that cannot be decoded to them is
//!   [`StoreError::Corrupt`], never a guess.
//! - **Only when it pays.** A body is compressed only when the block is
//!   smaller than the bytes; otherwise it is kept raw (codec 0), so the
//!   stored size is never above the received size.
//! - **Bounded decoding.** A block declares its decoded length; a length
//!   above [`MAX_DECODED_BYTES`] is refused before anything is allocated.
//! - **Old rows read as before.** Rows written before the codec column hold
//!   raw bytes and read as codec 0 (the column's default).
//!
//! Why compress at all: on SQLite every body is written twice (a WAL frame,
//! then the checkpoint's copy into the database file), and that copying was
//! the largest part of ingest's CPU (BENCHMARKS.md, issue 31 item 5). JSON
//! envelopes shrink ~4× as LZ4 blocks (a real 25-thread capture: 65,403
//! bytes to 14,976), for ~15 µs of CPU per 21 KiB envelope.
//! LZ4 rather than zstd or gzip: the cheapest to encode and decode, which is
//! what ingest and every read pay; the ratio is second.

use super::StoreError;

/// `envelopes.body_codec`: the bytes as received.
pub const CODEC_RAW: i64 = 0;
/// `envelopes.body_codec`: an LZ4 block of the bytes, its decoded length
/// prepended as a little-endian u32 (`lz4_flex`'s size-prepended form).
pub const CODEC_LZ4: i64 = 1;

/// The most a stored block may decode to (the ingest limit is far below).
pub const MAX_DECODED_BYTES: usize = 256 << 20;

/// The LZ4 block of `raw` when it is smaller than `raw`; `None` keeps the
/// body raw.
pub fn compress(raw: &[u8]) -> Option<Vec<u8>> {
    let block = lz4_flex::block::compress_prepend_size(raw);
    (block.len() < raw.len()).then_some(block)
}

/// What goes into `envelopes.body` and `envelopes.body_codec` for `raw`
/// and what [`compress`] made of it.
pub fn stored_form<'a>(raw: &'a [u8], block: Option<&'a [u8]>) -> (&'a [u8], i64) {
    match block {
        Some(block) => (block, CODEC_LZ4),
        None => (raw, CODEC_RAW),
    }
}

/// The bytes received, from a stored body of `digest` (named in errors).
pub fn decode(digest: &str, codec: i64, stored: Vec<u8>) -> Result<Vec<u8>, StoreError> {
    let corrupt = |reason: String| StoreError::Corrupt {
        digest: digest.to_string(),
        reason,
    };
    match codec {
        CODEC_RAW => Ok(stored),
        CODEC_LZ4 => {
            let declared = stored
                .get(..4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
                .ok_or_else(|| corrupt("stored LZ4 body is shorter than its length".into()))?;
            if declared > MAX_DECODED_BYTES {
                return Err(corrupt(format!(
                    "stored LZ4 body declares {declared} bytes; at most {MAX_DECODED_BYTES} are read"
                )));
            }
            let raw = lz4_flex::block::decompress_size_prepended(&stored)
                .map_err(|e| corrupt(format!("stored LZ4 body does not decode: {e}")))?;
            // The decoder stops where the block ends, short of a length
            // that was damaged upward.
            if raw.len() != declared {
                return Err(corrupt(format!(
                    "stored LZ4 body declares {declared} bytes and decodes to {}",
                    raw.len()
                )));
            }
            Ok(raw)
        }
        other => Err(corrupt(format!("unknown body codec {other}"))),
    }
}

/// `envelopes.claim_codes` of an envelope: its claims' codes as a JSON array
/// of strings, in claim order.
pub fn claim_codes_column(codes: &[String]) -> String {
    serde_json::to_string(codes).unwrap_or_else(|_| "[]".into())
}

/// The codes back from [`claim_codes_column`]'s form.
pub fn parse_claim_codes(column: &str) -> Vec<String> {
    serde_json::from_str(column).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope_like(n: usize) -> Vec<u8> {
        let mut s = String::from("{\"surfaces\":[");
        for i in 0..n {
            s.push_str(&format!(
                "{{\"id\":\"task/{i}/stat\",\"status\":\"ok\",\"facts\":{{\"state\":\"S\",\"wchan\":\"futex_wait_queue\"}}}},"
            ));
        }
        s.push_str("{}]}");
        s.into_bytes()
    }

    #[test]
    fn compressible_bodies_are_kept_as_lz4_and_read_back_exactly() {
        let raw = envelope_like(200);
        let block = compress(&raw);
        let (stored, codec) = stored_form(&raw, block.as_deref());
        assert_eq!(codec, CODEC_LZ4);
        assert!(
            stored.len() * 3 < raw.len(),
            "{} of {}",
            stored.len(),
            raw.len()
        );
        assert_eq!(decode("d", codec, stored.to_vec()).unwrap(), raw);
    }

    #[test]
    fn bodies_that_do_not_shrink_are_kept_raw() {
        // A pseudo-random body: nothing for LZ4 to find.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let raw: Vec<u8> = (0..4096)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let block = compress(&raw);
        let (stored, codec) = stored_form(&raw, block.as_deref());
        assert_eq!(codec, CODEC_RAW);
        assert_eq!(stored, raw);
        assert_eq!(decode("d", CODEC_RAW, stored.to_vec()).unwrap(), raw);
        // The empty body too (a block of it would be longer).
        assert_eq!(compress(b""), None);
    }

    #[test]
    fn damaged_blocks_are_corrupt_not_guessed() {
        let raw = envelope_like(50);
        let good = compress(&raw).unwrap();
        let cases: Vec<(&str, i64, Vec<u8>)> = vec![
            ("short", CODEC_LZ4, vec![1, 2]),
            ("truncated", CODEC_LZ4, good[..good.len() / 2].to_vec()),
            ("length above the bound", CODEC_LZ4, {
                let mut b = good.clone();
                b[..4].copy_from_slice(&(u32::MAX).to_le_bytes());
                b
            }),
            ("length at the bound + 1", CODEC_LZ4, {
                let mut b = good.clone();
                b[..4].copy_from_slice(&((MAX_DECODED_BYTES + 1) as u32).to_le_bytes());
                b
            }),
            ("unknown codec", 7, good.clone()),
        ];
        for (name, codec, bytes) in cases {
            match decode("sha256:x", codec, bytes) {
                Err(StoreError::Corrupt { digest, reason }) => {
                    assert_eq!(digest, "sha256:x", "{name}");
                    assert!(!reason.is_empty(), "{name}");
                }
                other => panic!("{name}: {other:?}"),
            }
        }
        // A wrong declared length within the bound, up or down.
        let mut wrong = good.clone();
        wrong[..4].copy_from_slice(&((raw.len() + 1) as u32).to_le_bytes());
        assert!(decode("d", CODEC_LZ4, wrong).is_err());
        let mut wrong = good.clone();
        wrong[..4].copy_from_slice(&((raw.len() - 1) as u32).to_le_bytes());
        assert!(decode("d", CODEC_LZ4, wrong).is_err());
    }

    #[test]
    fn claim_codes_round_trip_whatever_they_hold() {
        let codes: Vec<String> = vec![
            "thread_in_d_state".into(),
            "odd\ncode \"quoted\"".into(),
            String::new(),
        ];
        let column = claim_codes_column(&codes);
        assert_eq!(parse_claim_codes(&column), codes);
        assert_eq!(claim_codes_column(&[]), "[]");
        assert!(parse_claim_codes("not json").is_empty());
    }
}
