//! `pstackctl` subcommands, one module each. Each exposes a clap `Args` type and
//! `run(args) -> anyhow::Result<i32>` returning the process exit code
//! (0 ok / valid, 1 invalid evidence, 2 usage or I/O error; `trace` adds 3 when
//! the kernel cannot provide eBPF (`unsupported`) and 4 when the caller lacks
//! CAP_BPF/CAP_PERFMON (`permission_denied`)).

pub mod capture;
pub mod envelope;
pub mod longhorn;
pub mod status;
pub mod trace;
pub mod transport;
