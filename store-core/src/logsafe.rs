//! Caller-supplied text in log lines: escaped and length-capped (issue 28).
//!
//! Every value a caller chose (a username, a `runnerId`, a name, an id from
//! a request path or body, a host from a callback URL, an error message that
//! may quote any of those) reaches a `tracing` field through [`text`], so a
//! text log stays one event per line whatever was sent:
//!
//! Invariants of what [`Text`] writes:
//! - **Quoted and escaped.** It is wrapped in `"`; inside, `"` and `\` are
//!   backslash-escaped, `\n` `\r` `\t` are written as those two-character
//!   escapes, and every other control character (C0, DEL, C1 — ESC included)
//!   and the Unicode line/paragraph separators and bidirectional overrides
//!   are written as `\u{..}`. A caller can thus neither end the line (and
//!   forge the next one), nor pose as another `key=value` field, nor send a
//!   terminal escape sequence.
//! - **Capped.** At most [`MAX_LOG_CHARS`] characters of the value are
//!   written; a longer value ends with `…` and its original length in bytes,
//!   `…(1000000 bytes)`. The value is formatted straight into the log line,
//!   never copied whole first.
//! - Display and Debug write the same, so `%` and `?` fields agree.

use std::fmt;

/// Characters of a caller-supplied value written to a log line.
pub const MAX_LOG_CHARS: usize = 256;

/// A value that logs escaped and capped (see the module doc).
#[derive(Clone, Copy)]
pub struct Text<T>(T);

/// Wrap a caller-supplied value for a log field: `user = %logsafe::text(&name)`.
pub fn text<T: fmt::Display>(value: T) -> Text<T> {
    Text(value)
}

/// Counts and escapes what the wrapped value writes; stops writing (not
/// counting) at the cap.
struct Escaper<'a, 'b> {
    out: &'a mut fmt::Formatter<'b>,
    chars: usize,
    bytes: usize,
    cut: bool,
}

/// Whether a character is written as `\u{..}`: control characters, the
/// line and paragraph separators, and bidirectional formatting (which can
/// make a terminal show text in another order than it was written).
fn needs_unicode_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}' | '\u{2029}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}'
                | '\u{2066}'..='\u{2069}'
        )
}

impl fmt::Write for Escaper<'_, '_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for c in s.chars() {
            self.bytes += c.len_utf8();
            if self.chars >= MAX_LOG_CHARS {
                self.cut = true;
                continue;
            }
            self.chars += 1;
            match c {
                '"' => self.out.write_str("\\\"")?,
                '\\' => self.out.write_str("\\\\")?,
                '\n' => self.out.write_str("\\n")?,
                '\r' => self.out.write_str("\\r")?,
                '\t' => self.out.write_str("\\t")?,
                c if needs_unicode_escape(c) => write!(self.out, "\\u{{{:x}}}", c as u32)?,
                c => self.out.write_char(c)?,
            }
        }
        Ok(())
    }
}

impl<T: fmt::Display> fmt::Display for Text<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use fmt::Write;
        f.write_char('"')?;
        let mut e = Escaper {
            out: f,
            chars: 0,
            bytes: 0,
            cut: false,
        };
        write!(e, "{}", self.0)?;
        let (cut, bytes) = (e.cut, e.bytes);
        // Cut short: say so, and how long the value really was.
        if cut {
            write!(f, "…({bytes} bytes)")?;
        }
        f.write_char('"')
    }
}

impl<T: fmt::Display> fmt::Debug for Text<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newlines_quotes_and_terminal_escapes_are_escaped() {
        let forged = "mallory\n2026-01-01T00:00:00Z INFO operator logged in user=admin";
        let shown = text(forged).to_string();
        assert!(!shown.contains('\n'), "{shown}");
        assert_eq!(
            shown,
            "\"mallory\\n2026-01-01T00:00:00Z INFO operator logged in user=admin\""
        );
        assert_eq!(text("\x1b[31mred").to_string(), "\"\\u{1b}[31mred\"");
        assert_eq!(text("a\"b\\c\r\t").to_string(), "\"a\\\"b\\\\c\\r\\t\"");
        assert_eq!(
            text("x\u{202E}y\u{2028}z\u{85}").to_string(),
            "\"x\\u{202e}y\\u{2028}z\\u{85}\""
        );
        // Printable non-ASCII text stays readable.
        assert_eq!(text("José 日本").to_string(), "\"José 日本\"");
        // Debug agrees with Display.
        assert_eq!(format!("{:?}", text("a\nb")), text("a\nb").to_string());
    }

    #[test]
    fn values_are_cut_at_the_cap_with_their_length() {
        let exact = "a".repeat(MAX_LOG_CHARS);
        assert_eq!(text(&exact).to_string(), format!("\"{exact}\""));
        let one_more = "a".repeat(MAX_LOG_CHARS + 1);
        assert_eq!(
            text(&one_more).to_string(),
            format!("\"{exact}…({} bytes)\"", MAX_LOG_CHARS + 1)
        );
        let huge = "\x1b".repeat(1_000_000);
        let shown = text(&huge).to_string();
        assert!(shown.len() < 2 * 1024, "{} bytes", shown.len());
        assert!(shown.ends_with("…(1000000 bytes)\""), "{shown}");
        assert!(!shown.contains('\x1b'));
        // Multi-byte characters at the cap: exact fit is not marked cut.
        let wide = "日".repeat(MAX_LOG_CHARS);
        assert_eq!(text(&wide).to_string(), format!("\"{wide}\""));
        let wider = "日".repeat(MAX_LOG_CHARS + 1);
        assert!(text(&wider).to_string().ends_with("…(771 bytes)\""));
        // Display values (errors) are capped the same way.
        let err = std::io::Error::other("x".repeat(10_000));
        assert!(text(&err).to_string().ends_with("…(10000 bytes)\""));
    }
}
