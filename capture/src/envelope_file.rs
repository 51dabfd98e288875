//! The one envelope-file writer: every path that writes a sealed envelope
//! to a file (`pstackctl capture -o`/`--out-dir`, `capture transport|longhorn
//! --out-dir`, `trace tcp --seal`) goes through [`write`].
//!
//! Invariants:
//! - **Whole or absent.** The bytes go to a temporary file in the target's
//!   directory (`.NAME.tmp-PID`), which is fsynced, renamed over the target
//!   and then the directory is fsynced: after [`write`] returns, a crash
//!   leaves the complete new file; before, at most the old file or none.
//!   A failed write removes its temporary file.
//! - **Private.** Files are created 0600: an envelope is evidence about other
//!   users' processes.
//! - The daemon's spool does not use this writer: it names files by digest,
//!   keeps an index and accounts ENOSPC itself (see `pstack-agent`'s
//!   `daemon::spool`), with the same tmp + fsync + rename + directory fsync.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use pstack_envelope::Envelope;

/// Write `bytes` to `path` durably and atomically (see the module doc).
pub fn write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "envelope".into());
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(&dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// The one name of an envelope's file wherever an operator keeps it
/// (`capture --out-dir`, `capture transport|longhorn --out-dir`, the default
/// of `capture`): `sha256-<hex>.json`, the digest with its colon made
/// file-name safe, so the name says which hash it is.
pub fn file_name(env: &Envelope) -> String {
    format!("{}.json", env.digest.replacen(':', "-", 1))
}

/// Write `env` pretty-printed into `dir` as [`file_name`] (creating `dir`);
/// the path written.
pub fn write_into(dir: &Path, env: &Envelope) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(file_name(env));
    write(&path, &env.to_json_pretty())?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn replaces_whole_files_0600_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("e.json");
        write(&p, b"old").unwrap();
        write(&p, b"new contents").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"new contents");
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["e.json"], "no temporary left behind");
    }

    #[test]
    fn envelope_files_are_named_by_their_digest_with_the_hash_named() {
        let env = pstack_envelope::example::example_sealed();
        let dir = tempfile::tempdir().unwrap();
        let path = write_into(dir.path(), &env).unwrap();
        let hex = env.digest.strip_prefix("sha256:").unwrap();
        assert_eq!(path, dir.path().join(format!("sha256-{hex}.json")));
        assert_eq!(file_name(&env), format!("sha256-{hex}.json"));
    }

    #[test]
    fn a_failed_write_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        // The target is a directory: rename fails after the temp file was written.
        let p = dir.path().join("taken");
        std::fs::create_dir(&p).unwrap();
        std::fs::write(p.join("x"), b"x").unwrap();
        assert!(write(&p, b"bytes").is_err());
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["taken"]);
    }
}
