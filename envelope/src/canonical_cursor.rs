//! The byte cursor both one-pass canonical readers stand on
//! (`canonical_read`, which builds the typed model, and `canonical_check`,
//! which only checks and hashes): literal member names, canonical integers
//! and booleans, read at a position in the input. One implementation, so
//! the two readers cannot disagree on what a canonical token is.
//!
//! Every method answers `None` where the bytes are not the canonical form
//! it expects, and then the position is unspecified: the caller gives up on
//! the fast path and the general path decides.

use crate::strict::MAX_SAFE_INTEGER;

/// JSON white space (none of it appears in canonical bytes outside strings).
pub(crate) fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// A position in borrowed input.
pub(crate) struct Cursor<'a> {
    /// The whole input.
    pub(crate) b: &'a [u8],
    /// The next byte to read.
    pub(crate) pos: usize,
}

impl<'a> Cursor<'a> {
    /// Consume `c` if it is next.
    #[inline]
    pub(crate) fn eat(&mut self, c: u8) -> Option<()> {
        if self.b.get(self.pos) == Some(&c) {
            self.pos += 1;
            Some(())
        } else {
            None
        }
    }

    /// The next byte, not consumed.
    #[inline]
    pub(crate) fn peek(&self) -> Option<u8> {
        self.b.get(self.pos).copied()
    }

    /// `"name":` exactly (`tag` is the name with its quotes and colon).
    #[inline]
    pub(crate) fn key(&mut self, tag: &[u8]) -> Option<()> {
        if self.b.get(self.pos..self.pos + tag.len()) == Some(tag) {
            self.pos += tag.len();
            Some(())
        } else {
            None
        }
    }

    /// `,"name":` if the next member is `name` (an optional member).
    #[inline]
    pub(crate) fn opt_key(&mut self, tag: &[u8]) -> bool {
        let at = self.pos + 1;
        if self.b.get(self.pos) == Some(&b',') && self.b.get(at..at + tag.len()) == Some(tag) {
            self.pos = at + tag.len();
            true
        } else {
            false
        }
    }

    /// `,"name":` of a required member that is not the first.
    #[inline]
    pub(crate) fn next_key(&mut self, tag: &[u8]) -> Option<()> {
        self.eat(b',')?;
        self.key(tag)
    }

    /// A canonical unsigned integer within 2^53-1 (no leading zero).
    pub(crate) fn u64(&mut self) -> Option<u64> {
        let start = self.pos;
        let first = self.peek()?;
        if first == b'0' {
            self.pos += 1;
            return if self.peek().is_some_and(|c| c.is_ascii_digit()) {
                None
            } else {
                Some(0)
            };
        }
        if !first.is_ascii_digit() {
            return None;
        }
        let mut v: u64 = 0;
        while let Some(d) = self.peek().filter(u8::is_ascii_digit) {
            if self.pos - start >= 16 {
                return None; // 17 digits is beyond 2^53
            }
            v = v * 10 + u64::from(d - b'0');
            self.pos += 1;
        }
        (v <= MAX_SAFE_INTEGER).then_some(v)
    }

    /// A canonical unsigned integer that fits 32 bits.
    pub(crate) fn u32(&mut self) -> Option<u32> {
        u32::try_from(self.u64()?).ok()
    }

    /// A canonical integer, negative allowed (never `-0`).
    pub(crate) fn i64(&mut self) -> Option<i64> {
        if self.peek()? == b'-' {
            self.pos += 1;
            let m = self.u64()?;
            if m == 0 {
                return None;
            }
            Some(-(m as i64))
        } else {
            Some(self.u64()? as i64)
        }
    }

    /// `true` or `false`.
    pub(crate) fn bool(&mut self) -> Option<bool> {
        if self.key(b"true").is_some() {
            Some(true)
        } else if self.key(b"false").is_some() {
            Some(false)
        } else {
            None
        }
    }
}
