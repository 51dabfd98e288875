//! The compiled eBPF objects, embedded so building pstack needs no clang.
//!
//! They are built from `ebpf/bpf/*.bpf.c` by `ebpf/build.sh` (Debian clang 14,
//! reproducible flags) and committed; `ebpf/build.sh --check` (run by
//! `scripts/setup.d/30-ebpf.sh` and by this crate's tests) proves the
//! committed bytes are what the sources produce.

/// `ebpf/bpf/tcp.bpf.o`: retransmit, reset (both directions), state-change programs.
pub static TCP: &[u8] = aya::include_bytes_aligned!("../bpf/tcp.bpf.o");

/// `ebpf/bpf/offcpu.bpf.o`: sched_switch / sched_wakeup off-CPU programs.
pub static OFFCPU: &[u8] = aya::include_bytes_aligned!("../bpf/offcpu.bpf.o");
