//! Man pages and shell completions generated from a binary's clap
//! definition, so they never drift from `--help`.
//!
//! Each binary (`pstackctl`, `pstackd`, `pstack-store`) calls
//! [`write_if_requested`] first thing in `main`: with `PSTACK_WRITE_ASSETS=DIR`
//! in its environment it writes its pages and completions under `DIR` and
//! exits 0 instead of running; `packaging/build` does this once per binary.
//! The clap definition stays in the binary that parses it, and nothing here
//! runs unless that variable is set.
//!
//! Layout under `DIR` (the packages copy it to the standard places):
//! - `man/man1/NAME.1` and `NAME-SUBCOMMAND.1` for each subcommand;
//! - `completions/bash/NAME`, `completions/zsh/_NAME`, `completions/fish/NAME.fish`.

use std::path::{Path, PathBuf};

use clap_complete::Shell;

/// The environment variable that asks a binary to write its assets.
pub const ENV: &str = "PSTACK_WRITE_ASSETS";

/// Why assets could not be written.
#[derive(Debug, thiserror::Error)]
#[error("{}: {source}", path.display())]
pub struct AssetsError {
    path: PathBuf,
    source: std::io::Error,
}

fn at(path: &Path) -> impl FnOnce(std::io::Error) -> AssetsError + '_ {
    move |source| AssetsError {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes `cmd`'s man pages and bash/zsh/fish completions under `dir`;
/// returns the files written.
pub fn write_assets(cmd: clap::Command, dir: &Path) -> Result<Vec<PathBuf>, AssetsError> {
    let name = cmd.get_name().to_string();
    let mut written = Vec::new();

    let man = dir.join("man/man1");
    std::fs::create_dir_all(&man).map_err(at(&man))?;
    // Before `build()`: clap_mangen drops the `help` subcommand (no page per
    // `pstackctl help capture`) only while it has not been added yet.
    clap_mangen::generate_to(cmd.clone(), &man).map_err(at(&man))?;
    let mut cmd = cmd;
    cmd.build();
    let prefix = name.clone();
    for entry in std::fs::read_dir(&man).map_err(at(&man))? {
        let path = entry.map_err(at(&man))?.path();
        let file = path.file_name().and_then(|f| f.to_str()).unwrap_or("");
        if file == format!("{prefix}.1") || file.starts_with(&format!("{prefix}-")) {
            written.push(path);
        }
    }

    for (shell, sub, file) in [
        (Shell::Bash, "bash", name.clone()),
        (Shell::Zsh, "zsh", format!("_{name}")),
        (Shell::Fish, "fish", format!("{name}.fish")),
    ] {
        let out = dir.join("completions").join(sub);
        std::fs::create_dir_all(&out).map_err(at(&out))?;
        let path = out.join(file);
        let mut f = std::fs::File::create(&path).map_err(at(&path))?;
        clap_complete::generate(shell, &mut cmd, name.clone(), &mut f);
        written.push(path);
    }
    written.sort();
    Ok(written)
}

/// If `PSTACK_WRITE_ASSETS=DIR` is set, writes the assets of the command
/// `cmd` builds under `DIR`, lists them on stdout and exits (0, or 2 with the
/// reason on stderr). Returns without doing anything otherwise.
pub fn write_if_requested(cmd: impl FnOnce() -> clap::Command) {
    let Some(dir) = std::env::var_os(ENV) else {
        return;
    };
    let dir = PathBuf::from(dir);
    let cmd = cmd();
    let name = cmd.get_name().to_string();
    match write_assets(cmd, &dir) {
        Ok(files) => {
            for f in files {
                println!("{}", f.display());
            }
            std::process::exit(0);
        }
        Err(e) => {
            eprintln!("{name}: cannot write man pages and completions ({ENV}): {e}");
            std::process::exit(2);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_pages_for_each_subcommand_and_three_shells() {
        let cmd = clap::Command::new("demo")
            .version("1")
            .about("demo tool")
            .subcommand(clap::Command::new("run").about("run it"));
        let dir = tempfile::tempdir().unwrap();
        let files = write_assets(cmd, dir.path()).unwrap();
        let rel: Vec<String> = files
            .iter()
            .map(|f| f.strip_prefix(dir.path()).unwrap().display().to_string())
            .collect();
        assert_eq!(
            rel,
            [
                "completions/bash/demo",
                "completions/fish/demo.fish",
                "completions/zsh/_demo",
                "man/man1/demo-run.1",
                "man/man1/demo.1",
            ]
        );
        let page = std::fs::read_to_string(dir.path().join("man/man1/demo.1")).unwrap();
        assert!(page.contains(".TH demo 1"), "{page}");
        let bash = std::fs::read_to_string(dir.path().join("completions/bash/demo")).unwrap();
        assert!(bash.contains("complete -F _demo"), "{bash}");
    }

    #[test]
    fn unwritable_directory_is_a_typed_error() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("plain-file");
        std::fs::write(&file, b"x").unwrap();
        let err = write_assets(clap::Command::new("demo"), &file).unwrap_err();
        assert!(err.to_string().contains("plain-file"), "{err}");
    }
}
