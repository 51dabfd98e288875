//! `pstackctl trace` (arrives with its issue).

/// Arguments of `pstackctl trace`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Run `pstackctl trace`.
pub fn run(_args: Args) -> anyhow::Result<i32> {
    anyhow::bail!("pstackctl trace is not built yet")
}
