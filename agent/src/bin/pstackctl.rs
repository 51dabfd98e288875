//! `pstackctl`: the operator's CLI for pstack (see `pstackctl::cli`).

use pstackctl::cli;

/// mimalloc, not glibc malloc: verifying an envelope builds and drops tens of
/// thousands of small heap objects (every fact string and map), where glibc's
/// free lists cost about a third of the verify (BENCHMARKS.md, "Envelope").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    pstack_packaging::assets::write_if_requested(cli::command);
    let parsed = match cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            std::process::exit(code);
        }
    };
    match cli::run(parsed) {
        Ok(code) => std::process::exit(code),
        // The reader of stdout went away (`| head`, `| true`): nothing more
        // to say to anyone; end quietly, as `rg` does.
        Err(e) if pstack_cli::output::is_broken_pipe(e.as_ref()) => std::process::exit(0),
        Err(e) => {
            eprintln!("pstackctl: {e:#}");
            std::process::exit(2);
        }
    }
}
