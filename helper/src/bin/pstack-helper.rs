//! `pstack-helper`: performs pstack's risky procfs reads in a confined,
//! killable process. Spawned by the agent with pipes on stdin/stdout; reads
//! request frames from stdin and streams one response frame per surface to
//! stdout (see `pstack_helper::protocol`). Exits 0 at EOF, 3 if it cannot
//! confine itself, 4 on a framing error. Not meant to be run by hand.

use std::io::Write;

fn main() {
    let expected_parent = std::env::var("PSTACK_HELPER_PARENT")
        .ok()
        .and_then(|s| s.parse().ok());
    if let Err(e) = pstack_helper::confine::confine(expected_parent) {
        let _ = writeln!(std::io::stderr(), "pstack-helper: refusing to serve: {e}");
        std::process::exit(3);
    }
    let mut input = std::io::stdin().lock();
    let mut output = std::io::BufWriter::new(std::io::stdout().lock());
    if let Err(e) = pstack_helper::serve::serve(&mut input, &mut output) {
        let _ = writeln!(std::io::stderr(), "pstack-helper: {e}");
        std::process::exit(4);
    }
}
