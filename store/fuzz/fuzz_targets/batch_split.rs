//! The store's ingest front end on hostile bodies: content decoding (identity, gzip,
//! unknown), batch splitting (one object, a JSON array, NDJSON) and per-item
//! verification. Never a panic; the limits hold (no more items than `max_items`, a
//! decoded body never above `max_decoded_bytes`, every item a slice of the body); a
//! gzip of the same body splits the same way. The first byte picks encoding and framing.
//! Bounded run: `scripts/fuzz 60`.
#![no_main]

use std::io::Write;

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use pstack_store_core::ingest::{IngestLimits, decode_body, split_items, verify_items};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, body)) = data.split_first() else {
        return;
    };
    let limits = IngestLimits {
        max_body_bytes: 1 << 20,
        max_decoded_bytes: 1 << 20,
        max_items: 64,
        max_envelope_bytes: 64 << 10,
        ..IngestLimits::default()
    };
    let ndjson = mode & 1 == 1;
    let encoding = match (mode >> 1) % 4 {
        0 => None,
        1 => Some("gzip"),
        2 => Some("identity"),
        _ => Some("br"),
    };
    let Ok(decoded) = decode_body(Bytes::copy_from_slice(body), encoding, &limits) else {
        return;
    };
    assert!(decoded.len() <= limits.max_decoded_bytes);
    let Ok((framing, items)) = split_items(&decoded, ndjson, &limits) else {
        return;
    };
    assert!(!items.is_empty() && items.len() <= limits.max_items);
    let range = decoded.as_ptr() as usize..decoded.as_ptr() as usize + decoded.len() + 1;
    for item in &items {
        assert!(range.contains(&(item.as_ptr() as usize)), "an item outside the body");
    }
    let verdicts = verify_items(&decoded, &items, &limits);
    assert_eq!(verdicts.len(), items.len());
    // The same plain body, gzipped, splits into the same items.
    if encoding.is_none() {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&decoded).unwrap();
        let zipped = gz.finish().unwrap();
        let again = decode_body(Bytes::from(zipped), Some("gzip"), &limits).expect("our own gzip decodes");
        let (f2, items2) = split_items(&again, ndjson, &limits).expect("same body splits again");
        assert_eq!(f2, framing);
        assert_eq!(items2, items);
    }
});
