//! The engines' progress ([`pstack_capture::Progress`]) drawn on stderr.

use std::cell::RefCell;

use pstack_capture::Progress;

/// Draws one phase at a time on stderr (when it is a terminal) and prints
/// notes as lines.
#[derive(Debug, Default)]
pub struct Stderr {
    current: RefCell<Option<pstack_cli::progress::Progress>>,
}

impl Stderr {
    /// Show one progress event.
    pub fn show(&self, p: Progress<'_>) {
        match p {
            Progress::Phase { what, expected } => {
                if let Some(old) = self.current.replace(None) {
                    old.finish();
                }
                *self.current.borrow_mut() =
                    Some(pstack_cli::progress::Progress::start(what, expected));
            }
            Progress::PhaseDone => {
                if let Some(old) = self.current.replace(None) {
                    old.finish();
                }
            }
            Progress::Note(text) => {
                let current = self.current.borrow();
                let _clear = current.as_ref().and_then(|p| p.clear_line());
                eprintln!("{text}");
            }
        }
    }
}
