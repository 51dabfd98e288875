//! The progress line: during long work (a capture window, a trace), a single
//! line on stderr counts down and names the phase, redrawn in place. Only on
//! a terminal: a pipe or a log file gets nothing (a one-line announcement is
//! the caller's business). Stdout is never touched, so `--json`/`-o -` stay clean.
//!
//! Invariant: the line is erased before [`Progress::finish`] (or drop)
//! returns, so what is printed next starts on a clean line.

use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

#[derive(Debug)]
struct Shared {
    phase: String,
    stop: bool,
}

/// A running countdown on stderr; a no-op when stderr is not a terminal.
#[derive(Debug)]
pub struct Progress {
    shared: Arc<Mutex<Shared>>,
    thread: Option<JoinHandle<()>>,
}

impl Progress {
    /// Start counting down `total` with `phase` as the first label.
    pub fn start(phase: impl Into<String>, total: Duration) -> Progress {
        Progress::start_on(std::io::stderr().is_terminal(), phase, total)
    }

    /// As [`Progress::start`], drawing only when `draw` is true.
    pub fn start_on(draw: bool, phase: impl Into<String>, total: Duration) -> Progress {
        let shared = Arc::new(Mutex::new(Shared {
            phase: phase.into(),
            stop: false,
        }));
        let thread = draw.then(|| {
            let shared = Arc::clone(&shared);
            std::thread::spawn(move || draw_until_stopped(&shared, total))
        });
        Progress { shared, thread }
    }

    /// Change the label (e.g. `sampling`, `reading Hubble`).
    pub fn phase(&self, phase: impl Into<String>) {
        if let Ok(mut s) = self.shared.lock() {
            s.phase = phase.into();
        }
    }

    /// Erase the line now, so that a line printed next (e.g. a live event on
    /// stdout sharing the terminal) starts clean; the next redraw brings it back.
    /// Holds the drawing lock until the returned guard is dropped.
    pub fn clear_line(&self) -> Option<impl Drop + '_> {
        let guard = self.shared.lock().ok()?;
        if self.thread.is_some() {
            let mut err = std::io::stderr();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
        }
        Some(guard)
    }

    /// Stop and erase the line.
    pub fn finish(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Ok(mut s) = self.shared.lock() {
            s.stop = true;
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One redraw of the line: `phase — 4s left` (or `— 0s left, finishing`).
pub fn render(phase: &str, elapsed: Duration, total: Duration) -> String {
    let left = total.saturating_sub(elapsed);
    if left.is_zero() {
        format!("{phase} — finishing")
    } else {
        let ceil_secs = |d: Duration| d.as_millis().div_ceil(1000);
        format!(
            "{phase} — {}s left of {}s",
            ceil_secs(left),
            ceil_secs(total)
        )
    }
}

fn draw_until_stopped(shared: &Mutex<Shared>, total: Duration) {
    let start = Instant::now();
    let mut err = std::io::stderr();
    loop {
        {
            // Drawn under the lock, so `clear_line` never interleaves with a redraw.
            let Ok(s) = shared.lock() else { return };
            if s.stop {
                // Erase: carriage return, clear to end of line.
                let _ = write!(err, "\r\x1b[2K");
                let _ = err.flush();
                return;
            }
            let _ = write!(err, "\r\x1b[2K{}", render(&s.phase, start.elapsed(), total));
            let _ = err.flush();
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_counts_down_in_whole_seconds() {
        let total = Duration::from_secs(5);
        assert_eq!(
            render("sampling", Duration::ZERO, total),
            "sampling — 5s left of 5s"
        );
        assert_eq!(
            render("sampling", Duration::from_millis(4_100), total),
            "sampling — 1s left of 5s"
        );
        assert_eq!(render("sealing", total, total), "sealing — finishing");
    }

    #[test]
    fn not_drawn_off_a_terminal() {
        let p = Progress::start_on(false, "x", Duration::from_secs(1));
        assert!(p.thread.is_none());
        p.finish();
    }
}
