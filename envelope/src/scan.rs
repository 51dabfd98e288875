//! Byte scanning shared by the canonical writer and reader: where the next
//! byte that JSON strings treat specially (`"`, `\`, a control below U+0020)
//! is, and RFC 8785's member order for names.

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// Whether some byte of `w` is zero (exact: never misses one; may flag a byte
/// above a true zero, which the caller's byte loop then sorts out).
#[inline(always)]
fn has_zero(w: u64) -> bool {
    w.wrapping_sub(ONES) & !w & HIGHS != 0
}

/// Whether the 8 bytes of `w` hold a `"`, a `\` or a byte below 0x20.
#[inline(always)]
fn word_is_special(w: u64) -> bool {
    // A byte below 0x20 is one whose value minus 0x20 borrows with the high
    // bit clear before the subtraction.
    let below_space = w.wrapping_sub(ONES * 0x20) & !w & HIGHS != 0;
    below_space || has_zero(w ^ (ONES * b'"' as u64)) || has_zero(w ^ (ONES * b'\\' as u64))
}

#[inline(always)]
fn byte_is_special(b: u8) -> bool {
    b < 0x20 || b == b'"' || b == b'\\'
}

/// Whether a 16-byte block holds a special byte. Written as a plain loop
/// over a fixed-size block so the compiler turns it into SIMD compares.
#[inline(always)]
fn block_is_special(block: &[u8; 16]) -> bool {
    let mut any = false;
    for &b in block {
        any |= byte_is_special(b);
    }
    any
}

/// Index of the first byte at or after `from` that is `"`, `\` or below
/// 0x20, or `bytes.len()` when there is none. Sixteen bytes at a time, then
/// eight, then one.
#[inline]
pub(crate) fn find_special(bytes: &[u8], from: usize) -> usize {
    let mut i = from;
    while let Some(block) = bytes.get(i..i + 16) {
        let mut b16 = [0u8; 16];
        b16.copy_from_slice(block);
        if block_is_special(&b16) {
            break;
        }
        i += 16;
    }
    if let Some(block) = bytes.get(i..i + 8) {
        let mut word = [0u8; 8];
        word.copy_from_slice(block);
        if !word_is_special(u64::from_le_bytes(word)) {
            i += 8;
        }
    }
    while i < bytes.len() && !byte_is_special(bytes[i]) {
        i += 1;
    }
    i
}

/// Whether member name `a` sorts strictly before `b` in RFC 8785 order (by
/// UTF-16 code units). UTF-8 byte order is code point order, which differs
/// from UTF-16 order only where a character above U+FFFF (lead byte
/// 0xF0..=0xF4, a surrogate pair in UTF-16) meets one in U+E000..=U+FFFF
/// (lead byte 0xEE or 0xEF) at the first difference.
pub(crate) fn name_before(a: &[u8], b: &[u8]) -> bool {
    match a.iter().zip(b).position(|(x, y)| x != y) {
        None => a.len() < b.len(),
        Some(i) => {
            let (x, y) = (a[i], b[i]);
            let astral = |c: u8| c >= 0xF0;
            let high_bmp = |c: u8| c == 0xEE || c == 0xEF;
            if (astral(x) && high_bmp(y)) || (high_bmp(x) && astral(y)) {
                x > y
            } else {
                x < y
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find_special_agrees_with_a_byte_loop() {
        let mut text = Vec::new();
        for b in 0u8..=255 {
            text.extend_from_slice(b"abcdefghijklmnopq");
            text.push(b);
        }
        for from in 0..text.len() {
            let expected = (from..text.len())
                .find(|&i| byte_is_special(text[i]))
                .unwrap_or(text.len());
            assert_eq!(find_special(&text, from), expected, "from {from}");
        }
    }

    #[test]
    fn name_order_is_utf16_order() {
        let names = [
            "",
            "1",
            "\r",
            "a",
            "ab",
            "b",
            "\u{80}",
            "\u{f6}",
            "\u{20ac}",
            "\u{d7ff}",
            "\u{e000}",
            "\u{fb33}",
            "\u{ffff}",
            "\u{10000}",
            "\u{1f600}",
            "a\u{e000}",
            "a\u{1f600}",
        ];
        for a in names {
            for b in names {
                let utf16 = a.encode_utf16().lt(b.encode_utf16());
                assert_eq!(
                    name_before(a.as_bytes(), b.as_bytes()),
                    utf16,
                    "{a:?} {b:?}"
                );
            }
        }
    }
}
