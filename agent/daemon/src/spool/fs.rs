//! The filesystem operations the spool performs, behind one small trait, and
//! the real implementation over std/libc.
//!
//! The trait is the whole surface the spool touches: creating a file
//! exclusively and writing + fsyncing it, renaming, fsyncing a directory or a
//! file, reading a file that must be regular (`O_NONBLOCK | O_NOFOLLOW`,
//! `fstat` before any read), listing a directory (names, kinds, sizes,
//! mtimes; `lstat` semantics), unlinking, and an `lstat` existence check. A
//! fault-injecting double (`fault_fs`, tests only) implements the same trait,
//! so every durability claim in `spool/mod.rs` is checked against a
//! filesystem that tears writes, runs out of space, fails fsync, loses
//! renames and crashes between any two of these calls.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;
use std::time::SystemTime;

/// What a directory entry is (never following a symlink).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symlink, FIFO, socket or device.
    Other,
}

/// One directory entry as [`SpoolFs::list`] reports it.
#[derive(Debug, Clone)]
pub struct ListedEntry {
    /// Its name (not necessarily UTF-8).
    pub name: OsString,
    /// Its kind (`lstat`).
    pub kind: EntryKind,
    /// Its size, bytes.
    pub len: u64,
    /// Its mtime.
    pub modified: SystemTime,
}

/// Why [`SpoolFs::read_regular`] returned no bytes.
#[derive(Debug)]
pub enum ReadError {
    /// Opening, `fstat` or reading failed.
    Io(io::Error),
    /// Not a regular file: what it is.
    NotRegular(&'static str),
}

/// A file being written by [`SpoolFs::create_new`].
pub trait SpoolFile: Send {
    /// Write all of `bytes` (a short write is an error).
    fn write_all(&mut self, bytes: &[u8]) -> io::Result<()>;
    /// `fsync` the file's data and metadata.
    fn sync(&mut self) -> io::Result<()>;
}

/// The filesystem operations the spool uses. Paths are absolute.
pub trait SpoolFs: Send + Sync + std::fmt::Debug {
    /// `mkdir -p`.
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// Create `path` exclusively (`O_CREAT | O_EXCL | O_NOFOLLOW`, mode 0600).
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn SpoolFile>>;
    /// `rename(2)`.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// `fsync` a directory (makes its entries' creation, renames and
    /// unlinks durable).
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Open an existing file read-only and `fsync` it.
    fn sync_file(&self, path: &Path) -> io::Result<()>;
    /// Read a file that must be regular, at most `limit` bytes: opened
    /// `O_NONBLOCK` (a FIFO cannot block the open or the read) and
    /// `O_NOFOLLOW` (a symlink or symlink loop fails with ELOOP), checked
    /// with `fstat` before any read.
    fn read_regular(&self, path: &Path, limit: u64) -> Result<Vec<u8>, ReadError>;
    /// The entries of `dir` (not `.`/`..`); entries that vanish while being
    /// listed are left out.
    fn list(&self, dir: &Path) -> io::Result<Vec<ListedEntry>>;
    /// `unlink(2)`.
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Whether anything is at `path` (`lstat`).
    fn exists(&self, path: &Path) -> bool;
}

/// The real filesystem.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealFs;

struct RealFile(File);

impl SpoolFile for RealFile {
    fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.0.write_all(bytes)
    }

    fn sync(&mut self) -> io::Result<()> {
        self.0.sync_all()
    }
}

impl SpoolFs for RealFs {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        fs::create_dir_all(dir)
    }

    fn create_new(&self, path: &Path) -> io::Result<Box<dyn SpoolFile>> {
        let f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(path)?;
        Ok(Box::new(RealFile(f)))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }

    fn sync_file(&self, path: &Path) -> io::Result<()> {
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)?
            .sync_all()
    }

    fn read_regular(&self, path: &Path, limit: u64) -> Result<Vec<u8>, ReadError> {
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
            .map_err(ReadError::Io)?;
        let ft = file.metadata().map_err(ReadError::Io)?.file_type();
        if !ft.is_file() {
            let kind = if ft.is_dir() {
                "directory"
            } else if ft.is_fifo() {
                "fifo"
            } else if ft.is_socket() {
                "socket"
            } else if ft.is_char_device() || ft.is_block_device() {
                "device"
            } else {
                "other"
            };
            return Err(ReadError::NotRegular(kind));
        }
        let mut bytes = Vec::new();
        file.take(limit)
            .read_to_end(&mut bytes)
            .map_err(ReadError::Io)?;
        Ok(bytes)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<ListedEntry>> {
        let mut out = Vec::new();
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            // `DirEntry::metadata` does not follow symlinks.
            let Ok(meta) = entry.metadata() else {
                continue;
            };
            let ft = meta.file_type();
            let kind = if ft.is_file() {
                EntryKind::File
            } else if ft.is_dir() {
                EntryKind::Dir
            } else {
                EntryKind::Other
            };
            out.push(ListedEntry {
                name: entry.file_name(),
                kind,
                len: meta.len(),
                modified: meta.modified().unwrap_or(std::time::UNIX_EPOCH),
            });
        }
        Ok(out)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn exists(&self, path: &Path) -> bool {
        fs::symlink_metadata(path).is_ok()
    }
}
