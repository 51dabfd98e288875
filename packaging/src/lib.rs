//! `pstack-packaging`: what turns the workspace into installable packages.
//!
//! - [`assets`]: man pages and shell completions generated from each
//!   binary's clap definition (`packaging/build` asks each binary for them).
//!
//! The rest of `packaging/` is data and scripts: `build` (every .deb/.rpm and
//! their debug-info packages into `target/packages/`), `debian/` maintainer
//! scripts, the default configuration files, `kubernetes/` manifests; and the
//! tests in `tests/` that install the packages into a bare Debian root, score
//! the systemd units and validate the manifests.

pub mod assets;
