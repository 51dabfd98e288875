//! Output rules shared by every pstack CLI.
//!
//! - A closed stdout (the reader of a pipe went away: `| head`, `| true`) is
//!   not an error worth a message: writes go through [`out`]/[`outln!`],
//!   which return the `io::Error`; the binary's `main` asks
//!   [`is_broken_pipe`] and exits 0 quietly, as ripgrep does. Nothing panics.
//! - Colour (ANSI escapes) only when the stream is a terminal, `NO_COLOR` is
//!   unset or empty (<https://no-color.org>) and `TERM` is not `dumb`.
//! - Table cells are cut to their column with `…`; the full value is in `--json`.

use std::borrow::Cow;
use std::error::Error;
use std::io::{self, IsTerminal, Write};

/// Write formatted text to stdout (no panic on a closed pipe; see [`out`]).
#[macro_export]
macro_rules! outln {
    () => { $crate::output::out(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::output::out(format_args!("{}\n", format_args!($($arg)*))) };
}

/// Like [`outln!`] without the newline.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => { $crate::output::out(format_args!($($arg)*)) };
}

/// Write to stdout and flush; the error (e.g. `BrokenPipe`) is returned, never a panic.
pub fn out(args: std::fmt::Arguments<'_>) -> io::Result<()> {
    let mut stdout = io::stdout().lock();
    stdout.write_fmt(args)?;
    stdout.flush()
}

/// Write bytes to stdout and flush.
pub fn out_bytes(bytes: &[u8]) -> io::Result<()> {
    let mut stdout = io::stdout().lock();
    stdout.write_all(bytes)?;
    stdout.flush()
}

/// Whether `err` or any error in its `source()` chain is a closed pipe.
pub fn is_broken_pipe(err: &(dyn Error + 'static)) -> bool {
    let mut next = Some(err);
    while let Some(e) = next {
        if e.downcast_ref::<io::Error>()
            .is_some_and(|io| io.kind() == io::ErrorKind::BrokenPipe)
        {
            return true;
        }
        next = e.source();
    }
    false
}

/// Colour decision for a stream that is (or is not) a terminal, given the
/// environment: `NO_COLOR` set to anything non-empty, or `TERM=dumb`, turns it off.
pub fn color_wanted(is_terminal: bool) -> bool {
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    let dumb = std::env::var_os("TERM").is_some_and(|t| t == "dumb");
    is_terminal && !no_color && !dumb
}

/// Colour on stdout.
pub fn stdout_color() -> bool {
    color_wanted(io::stdout().is_terminal())
}

/// Columns of the terminal on stdout; `None` when stdout is not a terminal
/// (a pipe or file gets whole lines). `COLUMNS` overrides the kernel's answer.
pub fn terminal_columns() -> Option<usize> {
    if !io::stdout().is_terminal() {
        return None;
    }
    if let Some(c) = std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.parse::<usize>().ok())
        .filter(|c| *c > 0)
    {
        return Some(c);
    }
    let mut ws = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one winsize into the live struct we pass.
    let rc = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut ws) };
    (rc == 0 && ws.ws_col > 0).then_some(usize::from(ws.ws_col))
}

/// `text` cut to at most `width` characters, the last one `…` when cut.
pub fn ellipsize(text: &str, width: usize) -> Cow<'_, str> {
    if text.chars().count() <= width {
        return Cow::Borrowed(text);
    }
    if width == 0 {
        return Cow::Borrowed("");
    }
    let mut cut: String = text.chars().take(width - 1).collect();
    cut.push('…');
    Cow::Owned(cut)
}

/// `text` cut with [`ellipsize`] and left-aligned in exactly `width` columns.
pub fn cell(text: &str, width: usize) -> String {
    format!("{:<width$}", ellipsize(text, width))
}

/// A line cut to the terminal's width (unchanged when there is no terminal).
pub fn fit_line(line: &str, columns: Option<usize>) -> Cow<'_, str> {
    match columns {
        Some(c) => ellipsize(line, c),
        None => Cow::Borrowed(line),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ellipsis_cuts_by_characters() {
        assert_eq!(
            ellipsize("poll_schedule_timeout.constprop.0", 20),
            "poll_schedule_timeo…"
        );
        assert_eq!(
            ellipsize("poll_schedule_timeout.constprop.0", 20)
                .chars()
                .count(),
            20
        );
        assert_eq!(ellipsize("futex", 20), "futex");
        assert_eq!(ellipsize("äöüäöü", 4), "äöü…");
        assert_eq!(ellipsize("abc", 0), "");
        assert_eq!(cell("futex_wait_queue", 8), "futex_w…");
        assert_eq!(cell("ab", 4), "ab  ");
    }

    #[test]
    fn broken_pipe_is_found_through_sources() {
        #[derive(Debug)]
        struct Wrap(io::Error);
        impl std::fmt::Display for Wrap {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("writing the summary")
            }
        }
        impl Error for Wrap {
            fn source(&self) -> Option<&(dyn Error + 'static)> {
                Some(&self.0)
            }
        }
        let wrapped = Wrap(io::Error::from(io::ErrorKind::BrokenPipe));
        assert!(is_broken_pipe(&wrapped));
        let other = Wrap(io::Error::from(io::ErrorKind::PermissionDenied));
        assert!(!is_broken_pipe(&other));
    }
}
