//! `pstackctl capture` (arrives with its issue).

/// Arguments of `pstackctl capture`.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Run `pstackctl capture`.
pub fn run(_args: Args) -> anyhow::Result<i32> {
    anyhow::bail!("pstackctl capture is not built yet")
}
