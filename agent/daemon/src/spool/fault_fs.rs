//! A fault-injecting, in-memory [`SpoolFs`] for tests, with crash semantics.
//!
//! # The POSIX model it implements
//!
//! - A file (inode) has *current* bytes (what reads see) and *durable* bytes
//!   (what its last successful `fsync` saw). A directory has *current*
//!   entries (name → inode or subdirectory) and *durable* entries (what its
//!   last successful `fsync` saw). Creating directories is durable at once
//!   (the spool creates them before anything else).
//! - At a [`FaultFs::crash`], everything not made durable is lost, as
//!   hostilely as POSIX allows: every directory entry that changed since its
//!   directory's last fsync *independently* keeps its old or its new binding
//!   (so a rename can survive half: both names, or neither), and every file
//!   whose current bytes run past its durable bytes keeps its durable bytes
//!   plus a random prefix of the rest (a torn write). Inodes no name reaches
//!   afterwards are gone.
//! - A crash can also be scheduled: [`FaultFs::crash_after`]`(n)` lets `n`
//!   more calls run, then every call fails (`EIO`, no effect) as if the
//!   process had died between two system calls, until `crash()` is called.
//!
//! # Injectable faults (each fires once, on the next call it applies to)
//!
//! - [`Fault::TornWrite`]: the write stores a random prefix, then fails `EIO`.
//! - [`Fault::Enospc`]: the create or write fails `ENOSPC` (a write stores a
//!   random prefix first).
//! - [`Fault::FsyncEio`]: a file fsync fails `EIO`; nothing becomes durable.
//! - [`Fault::DirFsyncEio`]: a directory fsync fails `EIO`.
//! - [`Fault::LostRename`]: the rename succeeds, but the storage forgets it
//!   at the next crash even if the directory was fsynced: the directory
//!   comes back as it was just before the rename (the source name holds the
//!   file with its fsynced bytes; the target name its old durable binding).
//! - [`Fault::ReadEio`]: a read fails `EIO`.
//! - [`Fault::SilentTornWrite`]: a lying disk — the write reports success
//!   but only a random prefix is stored (and fsync makes that durable).
//!
//! Every fault that fired is logged; the model test reads the log to know
//! what the spool had to cope with.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use super::fs::{EntryKind, ListedEntry, ReadError, SpoolFile, SpoolFs};

/// A fault to inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fault {
    TornWrite,
    Enospc,
    FsyncEio,
    DirFsyncEio,
    LostRename,
    ReadEio,
    SilentTornWrite,
}

impl Fault {
    pub const ALL: [Fault; 7] = [
        Fault::TornWrite,
        Fault::Enospc,
        Fault::FsyncEio,
        Fault::DirFsyncEio,
        Fault::LostRename,
        Fault::ReadEio,
        Fault::SilentTornWrite,
    ];
}

/// A fault that fired, and on which path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fired {
    pub fault: Fault,
    pub path: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Node {
    File(u64),
    Dir,
}

#[derive(Debug, Default)]
struct Dir {
    current: BTreeMap<OsString, Node>,
    durable: BTreeMap<OsString, Node>,
}

#[derive(Debug)]
struct Inode {
    current: Vec<u8>,
    durable: Vec<u8>,
    mtime: SystemTime,
}

/// A rename the storage will forget: the old bindings of both names.
#[derive(Debug)]
struct Pin {
    dir: PathBuf,
    from: OsString,
    from_old: Option<Node>,
    to: OsString,
    to_old: Option<Node>,
}

#[derive(Debug)]
struct State {
    dirs: HashMap<PathBuf, Dir>,
    inodes: HashMap<u64, Inode>,
    next_ino: u64,
    clock: u64,
    armed: Vec<Fault>,
    fired: Vec<Fired>,
    pins: Vec<Pin>,
    /// Calls left before the process "dies"; `Some(0)` = dead.
    crash_after: Option<u32>,
    rng: fastrand::Rng,
}

/// The double. Cloning shares the filesystem.
#[derive(Debug, Clone)]
pub struct FaultFs(Arc<Mutex<State>>);

/// `EIO`; `why` only documents the call site.
fn eio(_why: &str) -> io::Error {
    io::Error::from_raw_os_error(libc::EIO)
}

fn split(path: &Path) -> (PathBuf, OsString) {
    (
        path.parent().map(Path::to_owned).unwrap_or_default(),
        path.file_name().map(OsString::from).unwrap_or_default(),
    )
}

impl State {
    /// One call begins: fails if the process is "dead", and counts down to
    /// the scheduled death.
    fn enter(&mut self) -> io::Result<()> {
        match &mut self.crash_after {
            Some(0) => Err(eio("crashed")),
            Some(n) => {
                *n -= 1;
                Ok(())
            }
            None => Ok(()),
        }
    }

    fn take(&mut self, fault: Fault, path: &Path) -> bool {
        if let Some(i) = self.armed.iter().position(|f| *f == fault) {
            self.armed.remove(i);
            self.fired.push(Fired {
                fault,
                path: path.to_owned(),
            });
            true
        } else {
            false
        }
    }

    fn tick(&mut self) -> SystemTime {
        self.clock += 1;
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + self.clock)
    }

    fn lookup(&self, path: &Path) -> Option<Node> {
        let (dir, name) = split(path);
        if self.dirs.contains_key(path) {
            return Some(Node::Dir);
        }
        self.dirs.get(&dir)?.current.get(&name).copied()
    }

    fn dir_mut(&mut self, dir: &Path) -> io::Result<&mut Dir> {
        self.dirs
            .get_mut(dir)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))
    }
}

struct FaultFile {
    fs: FaultFs,
    ino: u64,
    path: PathBuf,
}

impl SpoolFile for FaultFile {
    fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        let mut s = self.fs.lock();
        s.enter()?;
        let cut = s.rng.usize(0..bytes.len().max(1));
        let (stored, result) = if s.take(Fault::TornWrite, &self.path) {
            (&bytes[..cut], Err(eio("torn write")))
        } else if s.take(Fault::Enospc, &self.path) {
            (
                &bytes[..cut],
                Err(io::Error::from_raw_os_error(libc::ENOSPC)),
            )
        } else if s.take(Fault::SilentTornWrite, &self.path) {
            (&bytes[..cut], Ok(()))
        } else {
            (bytes, Ok(()))
        };
        let now = s.tick();
        let inode = s.inodes.get_mut(&self.ino).expect("open inode");
        inode.current.extend_from_slice(stored);
        inode.mtime = now;
        result
    }

    fn sync(&mut self) -> io::Result<()> {
        let mut s = self.fs.lock();
        s.enter()?;
        if s.take(Fault::FsyncEio, &self.path) {
            return Err(eio("fsync"));
        }
        let inode = s.inodes.get_mut(&self.ino).expect("open inode");
        inode.durable = inode.current.clone();
        Ok(())
    }
}

impl FaultFs {
    /// An empty filesystem; `seed` drives every random choice it makes.
    pub fn new(seed: u64) -> FaultFs {
        let mut dirs = HashMap::new();
        dirs.insert(PathBuf::from("/"), Dir::default());
        FaultFs(Arc::new(Mutex::new(State {
            dirs,
            inodes: HashMap::new(),
            next_ino: 1,
            clock: 0,
            armed: Vec::new(),
            fired: Vec::new(),
            pins: Vec::new(),
            crash_after: None,
            rng: fastrand::Rng::with_seed(seed),
        })))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Arm `fault` for the next call it applies to.
    pub fn arm(&self, fault: Fault) {
        self.lock().armed.push(fault);
    }

    /// Faults armed and not yet fired.
    pub fn armed(&self) -> Vec<Fault> {
        self.lock().armed.clone()
    }

    /// The faults that fired since the last call.
    pub fn take_fired(&self) -> Vec<Fired> {
        std::mem::take(&mut self.lock().fired)
    }

    /// Let `calls` more calls run, then fail every call as a dead process.
    pub fn crash_after(&self, calls: u32) {
        self.lock().crash_after = Some(calls);
    }

    /// Cancel a scheduled death that has not happened.
    pub fn cancel_crash(&self) {
        let mut s = self.lock();
        if s.crash_after != Some(0) {
            s.crash_after = None;
        }
    }

    /// Whether the scheduled death has happened.
    pub fn is_dead(&self) -> bool {
        self.lock().crash_after == Some(0)
    }

    /// The machine crashes: drop everything not durable (see the module
    /// comment). Armed faults and scheduled deaths are cleared.
    pub fn crash(&self) {
        let mut s = self.lock();
        let s = &mut *s;
        s.crash_after = None;
        s.armed.clear();
        // A lost rename reverts both names, whatever else survives.
        let mut forced = std::collections::HashSet::new();
        for pin in std::mem::take(&mut s.pins) {
            if let Some(d) = s.dirs.get_mut(&pin.dir) {
                for (name, old) in [(pin.from, pin.from_old), (pin.to, pin.to_old)] {
                    forced.insert((pin.dir.clone(), name.clone()));
                    match old {
                        Some(n) => d.durable.insert(name, n),
                        None => d.durable.remove(&name),
                    };
                }
            }
        }
        for (path, d) in s.dirs.iter_mut() {
            let names: Vec<OsString> = d.current.keys().chain(d.durable.keys()).cloned().collect();
            let mut next = BTreeMap::new();
            for name in names {
                if next.contains_key(&name) {
                    continue;
                }
                let old = d.durable.get(&name).copied();
                let new = d.current.get(&name).copied();
                let pinned = forced.contains(&(path.clone(), name.clone()));
                let keep = if old == new || pinned || s.rng.bool() {
                    old
                } else {
                    new
                };
                if let Some(n) = keep {
                    next.insert(name, n);
                }
            }
            d.durable = next.clone();
            d.current = next;
        }
        let reachable: std::collections::HashSet<u64> = s
            .dirs
            .values()
            .flat_map(|d| d.current.values())
            .filter_map(|n| match n {
                Node::File(i) => Some(*i),
                Node::Dir => None,
            })
            .collect();
        s.inodes.retain(|i, _| reachable.contains(i));
        for inode in s.inodes.values_mut() {
            if inode.current.len() > inode.durable.len()
                && inode.current.starts_with(&inode.durable)
            {
                let extra = inode.current.len() - inode.durable.len();
                let keep = inode.durable.len() + s.rng.usize(0..=extra);
                inode.current.truncate(keep);
            } else {
                inode.current = inode.durable.clone();
            }
            inode.durable = inode.current.clone();
        }
    }

    /// The current bytes of a file, if `path` names one (inspection, no faults).
    pub fn peek(&self, path: &Path) -> Option<Vec<u8>> {
        let s = self.lock();
        match s.lookup(path)? {
            Node::File(i) => Some(s.inodes[&i].current.clone()),
            Node::Dir => None,
        }
    }

    /// The current file names in `dir` (inspection, no faults).
    pub fn names(&self, dir: &Path) -> Vec<String> {
        let s = self.lock();
        s.dirs
            .get(dir)
            .map(|d| {
                d.current
                    .iter()
                    .filter(|(_, n)| matches!(n, Node::File(_)))
                    .map(|(k, _)| k.to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl SpoolFs for FaultFs {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut s = self.lock();
        s.enter()?;
        let mut acc = PathBuf::from("/");
        for c in dir.components().skip(1) {
            let parent = acc.clone();
            acc.push(c);
            if !s.dirs.contains_key(&acc) {
                s.dirs.insert(acc.clone(), Dir::default());
                let name = OsString::from(c.as_os_str());
                let p = s.dir_mut(&parent)?;
                p.current.insert(name.clone(), Node::Dir);
                p.durable.insert(name, Node::Dir);
            }
        }
        Ok(())
    }

    fn create_new(&self, path: &Path) -> io::Result<Box<dyn SpoolFile>> {
        let mut s = self.lock();
        s.enter()?;
        if s.lookup(path).is_some() {
            return Err(io::Error::from_raw_os_error(libc::EEXIST));
        }
        let (dir, name) = split(path);
        if !s.dirs.contains_key(&dir) {
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        }
        // ENOSPC armed for a write may also fire at the create (no inode).
        if s.rng.bool() && s.take(Fault::Enospc, path) {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        let ino = s.next_ino;
        s.next_ino += 1;
        let mtime = s.tick();
        s.inodes.insert(
            ino,
            Inode {
                current: Vec::new(),
                durable: Vec::new(),
                mtime,
            },
        );
        s.dir_mut(&dir)?.current.insert(name, Node::File(ino));
        drop(s);
        Ok(Box::new(FaultFile {
            fs: self.clone(),
            ino,
            path: path.to_owned(),
        }))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut s = self.lock();
        s.enter()?;
        let (fdir, fname) = split(from);
        let (tdir, tname) = split(to);
        let node = match s.lookup(from) {
            Some(Node::File(i)) => Node::File(i),
            Some(Node::Dir) => return Err(io::Error::from_raw_os_error(libc::EISDIR)),
            None => return Err(io::Error::from_raw_os_error(libc::ENOENT)),
        };
        if !s.dirs.contains_key(&tdir) {
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        }
        if fdir == tdir && s.take(Fault::LostRename, from) {
            let d = &s.dirs[&fdir];
            let pin = Pin {
                dir: fdir.clone(),
                // The directory persists as if the rename never happened:
                // the source name holds the file (the create was journaled,
                // the rename was not).
                from_old: Some(node),
                to_old: d.durable.get(&tname).copied(),
                from: fname.clone(),
                to: tname.clone(),
            };
            s.pins.push(pin);
        }
        s.dir_mut(&fdir)?.current.remove(&fname);
        s.dir_mut(&tdir)?.current.insert(tname, node);
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut s = self.lock();
        s.enter()?;
        if s.take(Fault::DirFsyncEio, dir) {
            return Err(eio("directory fsync"));
        }
        let d = s.dir_mut(dir)?;
        d.durable = d.current.clone();
        // A lost rename stays lost however often the directory is synced.
        let pins: Vec<(OsString, Option<Node>, OsString, Option<Node>)> = s
            .pins
            .iter()
            .filter(|p| p.dir == dir)
            .map(|p| (p.from.clone(), p.from_old, p.to.clone(), p.to_old))
            .collect();
        let d = s.dir_mut(dir)?;
        for (from, from_old, to, to_old) in pins {
            for (name, old) in [(from, from_old), (to, to_old)] {
                match old {
                    Some(n) => d.durable.insert(name, n),
                    None => d.durable.remove(&name),
                };
            }
        }
        Ok(())
    }

    fn sync_file(&self, path: &Path) -> io::Result<()> {
        let mut s = self.lock();
        s.enter()?;
        let Some(Node::File(ino)) = s.lookup(path) else {
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        };
        if s.take(Fault::FsyncEio, path) {
            return Err(eio("fsync"));
        }
        let inode = s.inodes.get_mut(&ino).expect("linked inode");
        inode.durable = inode.current.clone();
        Ok(())
    }

    fn read_regular(&self, path: &Path, limit: u64) -> Result<Vec<u8>, ReadError> {
        let mut s = self.lock();
        s.enter().map_err(ReadError::Io)?;
        match s.lookup(path) {
            None => Err(ReadError::Io(io::Error::from_raw_os_error(libc::ENOENT))),
            Some(Node::Dir) => Err(ReadError::NotRegular("directory")),
            Some(Node::File(ino)) => {
                if s.take(Fault::ReadEio, path) {
                    return Err(ReadError::Io(eio("read")));
                }
                let data = &s.inodes[&ino].current;
                Ok(data[..data.len().min(limit as usize)].to_vec())
            }
        }
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<ListedEntry>> {
        let mut s = self.lock();
        s.enter()?;
        let d = s
            .dirs
            .get(dir)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
        let mut out: Vec<ListedEntry> = d
            .current
            .iter()
            .map(|(name, node)| match node {
                Node::Dir => ListedEntry {
                    name: name.clone(),
                    kind: EntryKind::Dir,
                    len: 0,
                    modified: SystemTime::UNIX_EPOCH,
                },
                Node::File(i) => ListedEntry {
                    name: name.clone(),
                    kind: EntryKind::File,
                    len: s.inodes[i].current.len() as u64,
                    modified: s.inodes[i].mtime,
                },
            })
            .collect();
        // readdir promises no order.
        s.rng.shuffle(&mut out);
        Ok(out)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut s = self.lock();
        s.enter()?;
        let (dir, name) = split(path);
        match s.lookup(path) {
            Some(Node::File(_)) => {
                s.dir_mut(&dir)?.current.remove(&name);
                Ok(())
            }
            Some(Node::Dir) => Err(io::Error::from_raw_os_error(libc::EISDIR)),
            None => Err(io::Error::from_raw_os_error(libc::ENOENT)),
        }
    }

    fn exists(&self, path: &Path) -> bool {
        let mut s = self.lock();
        // A dead process learns nothing; report "exists" so nothing is
        // removed on its account.
        s.enter().is_err() || s.lookup(path).is_some()
    }
}
