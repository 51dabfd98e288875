//! RFC 8785 (JSON Canonicalization Scheme) for the integer-only JSON the
//! envelope carries.
//!
//! Hand-written rather than taken from a crate because the envelope forbids
//! what general JCS crates must accept (floats, unsafe integers), and a sealing
//! library has to refuse those with a typed error instead of rendering them.
//! With floats gone, JCS reduces to: object members sorted by the UTF-16 code
//! units of their names, no insignificant whitespace, integers in plain
//! decimal, and strings escaped as ECMAScript's `JSON.stringify` does (which is
//! exactly what `serde_json` emits: the two-character escapes, `\u00xx` in
//! lowercase hex for other controls, everything else literal).

use serde_json::Value;

use crate::error::EnvelopeError;
use crate::strict::MAX_SAFE_INTEGER;

/// Append the canonical form of `value` to `out`.
pub fn write_canonical(value: &Value, out: &mut Vec<u8>) -> Result<(), EnvelopeError> {
    write_value(value, out).map_err(|mut e| {
        e.prefix_path("$");
        e
    })
}

/// The canonical bytes of `value`.
pub fn to_canonical(value: &Value) -> Result<Vec<u8>, EnvelopeError> {
    let mut out = Vec::with_capacity(4096);
    write_canonical(value, &mut out)?;
    Ok(out)
}

fn write_value(value: &Value, out: &mut Vec<u8>) -> Result<(), EnvelopeError> {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => write_number(n, out)?,
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(item, out).map_err(|mut e| {
                    e.prefix_path(&format!("[{i}]"));
                    e
                })?;
            }
            out.push(b']');
        }
        Value::Object(map) => {
            let mut members: Vec<(&String, &Value)> = map.iter().collect();
            // serde_json's map is ordered by UTF-8 bytes, which differs from
            // UTF-16 order only when a name holds a character above U+FFFF;
            // sort only then.
            if members
                .iter()
                .any(|(k, _)| k.chars().any(|c| c as u32 > 0xFFFF))
            {
                members.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
            }
            out.push(b'{');
            for (i, (k, v)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(k, out);
                out.push(b':');
                write_value(v, out).map_err(|mut e| {
                    e.prefix_path(&format!(".{k}"));
                    e
                })?;
            }
            out.push(b'}');
        }
    }
    Ok(())
}

fn write_number(n: &serde_json::Number, out: &mut Vec<u8>) -> Result<(), EnvelopeError> {
    if let Some(u) = n.as_u64() {
        if u > MAX_SAFE_INTEGER {
            return Err(EnvelopeError::NumberOutOfRange {
                path: String::new(),
                value: u.to_string(),
            });
        }
        out.extend_from_slice(u.to_string().as_bytes());
    } else if let Some(i) = n.as_i64() {
        if i.unsigned_abs() > MAX_SAFE_INTEGER {
            return Err(EnvelopeError::NumberOutOfRange {
                path: String::new(),
                value: i.to_string(),
            });
        }
        out.extend_from_slice(i.to_string().as_bytes());
    } else {
        return Err(EnvelopeError::Float {
            path: String::new(),
            value: n.to_string(),
        });
    }
    Ok(())
}

fn write_string(s: &str, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0x00..=0x1f => &[],
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        if escape.is_empty() {
            out.extend_from_slice(b"\\u00");
            out.push(HEX[(b >> 4) as usize]);
            out.push(HEX[(b & 0xf) as usize]);
        } else {
            out.extend_from_slice(escape);
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn canon(v: &Value) -> String {
        String::from_utf8(to_canonical(v).unwrap()).unwrap()
    }

    #[test]
    fn rfc8785_key_order_is_by_utf16_code_units() {
        // RFC 8785 section 3.2.3's sorting example: names holding U+20AC,
        // U+1F600 (a surrogate pair) and U+FB33 sort by UTF-16 units, so the
        // supplementary character comes before U+FB33 though its UTF-8 is larger.
        let input = r#"{"\u20ac":"Euro Sign","\r":"Carriage Return","\ufb33":"Hebrew Letter Dalet With Dagesh","1":"One","\ud83d\ude00":"Emoji: Grinning Face","\u0080":"Control","\u00f6":"Latin Small Letter O With Diaeresis"}"#;
        let v: Value = serde_json::from_str(input).unwrap();
        let s = canon(&v);
        let order = [
            "\\r",
            "1",
            "\u{80}",
            "\u{f6}",
            "\u{20ac}",
            "\u{1f600}",
            "\u{fb33}",
        ];
        let positions: Vec<usize> = order
            .iter()
            .map(|k| {
                s.find(&format!("\"{k}\":"))
                    .unwrap_or_else(|| panic!("{k:?} in {s}"))
            })
            .collect();
        let mut sorted = positions.clone();
        sorted.sort_unstable();
        assert_eq!(positions, sorted, "canonical text: {s}");
    }

    #[test]
    fn rfc8785_string_escaping() {
        // Controls use the short escapes where JSON has them, else \u00xx in
        // lowercase; '/' , DEL, U+2028 and non-ASCII stay literal.
        let v = json!("\u{0}\u{8}\t\n\u{b}\u{c}\r\u{1f}\"\\/\u{7f}\u{2028}é😀");
        assert_eq!(
            canon(&v),
            "\"\\u0000\\b\\t\\n\\u000b\\f\\r\\u001f\\\"\\\\/\u{7f}\u{2028}é😀\""
        );
    }

    #[test]
    fn rfc8785_integer_forms_and_nesting() {
        let v = json!({"b": [1, -1, 0, 9007199254740991_u64, -9007199254740991_i64], "a": {"z": null, "y": true, "x": false}});
        assert_eq!(
            canon(&v),
            r#"{"a":{"x":false,"y":true,"z":null},"b":[1,-1,0,9007199254740991,-9007199254740991]}"#
        );
    }

    #[test]
    fn rfc8785_rejects_floats_and_unsafe_integers_by_path() {
        let v = json!({"a": {"b": [1, 2.5]}});
        assert!(matches!(
            to_canonical(&v),
            Err(EnvelopeError::Float { ref path, .. }) if path == "$.a.b[1]"
        ));
        let v = json!({"n": 9007199254740992_u64});
        assert!(matches!(
            to_canonical(&v),
            Err(EnvelopeError::NumberOutOfRange { ref path, .. }) if path == "$.n"
        ));
    }
}
