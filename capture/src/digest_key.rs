//! The host's digest key on disk: the one place that creates, checks and
//! reads it. `pstackd` keeps it (`capture.digest_key_file`, default
//! `/var/lib/pstack/digest.key`); `pstackctl` uses it when it can read it, so
//! one-shot and daemon captures on a host digest alike, and otherwise a key
//! of its own run (digests then compare only within that run).
//!
//! Invariants: the file holds 64 hex digits and a newline; it is created
//! with `O_EXCL` and mode 0600 (never widened by the umask) and fsynced with
//! its directory; an existing file readable or writable by group or others
//! is refused, not used; the key never appears in logs or `Debug`.

use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use pstack_envelope::{DigestKey, KEY_BYTES};

/// The key as captures use it; swapped in place when `pstackd` reloads.
pub type SharedDigestKey = Arc<RwLock<DigestKey>>;

/// Default location (inside `pstackd`'s state directory).
pub const DEFAULT_PATH: &str = "/var/lib/pstack/digest.key";

/// Why the key file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DigestKeyError {
    /// Reading, creating or syncing it failed.
    #[error("digest key {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Group or others may read or write it.
    #[error(
        "digest key {path} has mode {mode:o}: it must be 0600 (or 0400) and owned by pstackd's user; fix with chmod 600"
    )]
    Exposed {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// Its content is not a key.
    #[error("digest key {path}: {source}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        source: pstack_envelope::BadDigestKey,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> DigestKeyError + '_ {
    move |source| DigestKeyError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// 32 bytes from the kernel's CSPRNG.
pub fn random_key() -> std::io::Result<DigestKey> {
    let mut bytes = [0u8; KEY_BYTES];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(DigestKey::from_bytes(bytes))
}

/// Read the key at `path`, checking its mode.
pub fn load(path: &Path) -> Result<DigestKey, DigestKeyError> {
    let file = std::fs::File::open(path).map_err(io(path))?;
    let mode = file.metadata().map_err(io(path))?.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(DigestKeyError::Exposed {
            path: path.to_path_buf(),
            mode,
        });
    }
    let mut text = String::new();
    file.take(4096)
        .read_to_string(&mut text)
        .map_err(io(path))?;
    DigestKey::from_hex(&text).map_err(|source| DigestKeyError::Malformed {
        path: path.to_path_buf(),
        source,
    })
}

/// Read the key at `path`; when there is none, create it (0600, its
/// directory 0700 if missing). Whether it was created is returned too.
pub fn load_or_create(path: &Path) -> Result<(DigestKey, bool), DigestKeyError> {
    match load(path) {
        Err(DigestKeyError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
        }
        other => return other.map(|k| (k, false)),
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(io(&dir))?;
    let key = random_key().map_err(io(path))?;
    let created = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path);
    let mut file = match created {
        Ok(f) => f,
        // Another process created it first: use theirs.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return load(path).map(|k| (k, false));
        }
        Err(e) => return Err(io(path)(e)),
    };
    file.write_all(format!("{}\n", key.to_hex()).as_bytes())
        .and_then(|()| file.sync_all())
        .and_then(|()| std::fs::File::open(&dir)?.sync_all())
        .map_err(io(path))?;
    Ok((key, true))
}

/// The key `pstackctl` uses: the daemon's when readable, else a fresh one.
/// The second value says which (for `--help`-level honesty in output).
pub fn for_one_shot(path: &Path) -> std::io::Result<(DigestKey, bool)> {
    match load(path) {
        Ok(k) => Ok((k, true)),
        Err(_) => random_key().map(|k| (k, false)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn created_0600_reread_identically_and_exposed_files_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state/digest.key");
        let (key, created) = load_or_create(&path).unwrap();
        assert!(created);
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o600);
        assert_eq!(
            std::fs::metadata(path.parent().unwrap()).unwrap().mode() & 0o777,
            0o700
        );
        let (again, created) = load_or_create(&path).unwrap();
        assert!(!created);
        assert_eq!(again, key);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(
            load_or_create(&path),
            Err(DigestKeyError::Exposed { mode: 0o644, .. })
        ));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&path, "not hex\n").unwrap();
        assert!(matches!(load(&path), Err(DigestKeyError::Malformed { .. })));
    }
}
