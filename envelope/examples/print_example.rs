//! Print the built-in example envelope, sealed: the source of
//! `examples/process-d-state.envelope.json`
//! (`cargo run -p pstack-envelope --example print_example > examples/process-d-state.envelope.json`).

use std::io::Write;

fn main() {
    let env = pstack_envelope::example::example_sealed();
    std::io::stdout()
        .write_all(&env.to_json_pretty())
        .expect("write stdout");
}
