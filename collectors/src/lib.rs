//! `pstack-collectors`: typed surface readers for pstack.
//!
//! Each area lives in its own module (`procfs` now; `net` and `longhorn` later).
//! Parsing is pure and tested on captured text; reading is a thin shell over
//! the kernel's files. No reader here enforces a deadline: a reader that can
//! block on the task being diagnosed must run inside `pstack-helper`, which
//! the agent can kill (see `pstack_helper`).

pub mod kubelet;
pub mod net;
pub mod procfs;
